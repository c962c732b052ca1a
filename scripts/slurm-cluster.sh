#!/usr/bin/env bash
# A real Slurm for the fleet tests (harness/tests/it/slurm.rs): Debian's slurm-wlm
# (22.05) and munge, as a one-node cluster on the loopback interface of this
# machine, every file it writes under target/tools/slurm (no /etc/slurm, no systemd):
#
#   scripts/slurm-cluster.sh install   apt-get install slurm-wlm munge where sbatch,
#                                      slurmctld, slurmd or munged is missing (root
#                                      with apt-get only; apt-get update first when
#                                      the package lists do not know them)
#   scripts/slurm-cluster.sh start     write the configuration, start munged,
#                                      slurmctld and slurmd, wait until the node is
#                                      idle; prints `export SLURM_CONF=...`, the one
#                                      variable the client commands need (sbatch,
#                                      squeue, sacct, scancel read it)
#   scripts/slurm-cluster.sh stop      stop the three daemons this script started
#                                      (by their pid files, nothing else)
#   scripts/slurm-cluster.sh conf      print the slurm.conf path (exit 1 when absent)
#
# One node, not two. Debian's slurm-wlm 22.05.8 does run two slurmd on one host
# (tried 2026-12-05: two NodeName entries on 127.0.0.1, each with its own Port,
# `slurmd -N n1` and `slurmd -N n2`; an exclusive 2-task array put one task on
# each), but two nodes on one machine run two benchmark tasks side by side, each
# measuring under the other's load (rank excludes runs flagged as contended). The partition is `harness`; every job is exclusive on it.
# Where the cluster cannot be installed or started, `install` and `start` exit 1
# saying why loudly; `just test` then sets HARNESS_NO_SLURM=1 and the Slurm tests
# report NOT RUN (without it, they fail).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD/target/tools/slurm
conf=$root/etc/slurm.conf
log=$root/install.log
loud() {
  {
    echo
    echo "*** scripts/slurm-cluster.sh: $* ***"
    echo "*** the Slurm tests (slurm::) will report NOT RUN ***"
    echo
  } >&2
}
have() { command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; }

install() {
  have && return 0
  mkdir -p "$root"
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    loud "no Slurm here and not root with apt-get: install Debian's slurm-wlm and munge to run them"
    return 1
  fi
  echo "scripts/slurm-cluster.sh: installing Debian's slurm-wlm and munge (log: $log)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # The packages' maintainer scripts would start the daemons through invoke-rc.d;
  # this script starts its own, so a policy-rc.d refuses that for the install.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >"$log" 2>&1; then
    apt-get update -q >>"$log" 2>&1
    apt-get install -y -q --no-install-recommends slurm-wlm munge >>"$log" 2>&1
  fi
  [ "$made_policy" = 1 ] && rm -f "$policy"
  if have; then return 0; fi
  loud "apt-get install slurm-wlm munge failed (offline?): see $log"
  tail -n 5 "$log" >&2
  return 1
}

# A daemon is alive when its pid file names a process that is not a zombie (in a
# container without an init that reaps, a stopped daemon stays a zombie).
pid_alive() {
  local p
  p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null \
    && ! grep -q '^[0-9]* (.*) Z ' "/proc/$p/stat" 2>/dev/null
}

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  # The node's own figures as slurmd sees them (CPUs, sockets, memory); memory a
  # little under what it reports, so that the node is never drained for it.
  local node
  node=$(/usr/sbin/slurmd -C 2>/dev/null | head -n 1) || true
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  [ -n "$cpus" ] || cpus=$(nproc)
  [ -n "$mem" ] || mem=1024
  mem=$((mem * 9 / 10))
  mkdir -p "$root/etc" "$root/state/ctld" "$root/state/d" "$root/log" "$root/run" "$root/munge"
  chmod 700 "$root/munge"
  cat >"$conf" <<EOF
# Written by scripts/slurm-cluster.sh: a one-node test cluster on loopback.
ClusterName=harness-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${HARNESS_SLURMCTLD_PORT:-6817}
SlurmdPort=${HARNESS_SLURMD_PORT:-6818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$root/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$root/state/ctld
SlurmdSpoolDir=$root/state/d
SlurmctldPidFile=$root/run/slurmctld.pid
SlurmdPidFile=$root/run/slurmd.pid
SlurmctldLogFile=$root/log/slurmctld.log
SlurmdLogFile=$root/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$root/state/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmdTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=harness Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
EOF
}

start() {
  have || { loud "Slurm is not installed: run scripts/slurm-cluster.sh install"; return 1; }
  export SLURM_CONF=$conf
  if pid_alive "$root/run/munged.pid" && pid_alive "$root/run/slurmctld.pid" && pid_alive "$root/run/slurmd.pid" \
    && scontrol ping >/dev/null 2>&1; then
    echo "export SLURM_CONF=$conf"
    return 0
  fi
  stop >/dev/null 2>&1
  write_conf
  # munge: a key of our own, a socket of our own (slurm.conf's AuthInfo names it).
  if [ ! -s "$root/munge/munge.key" ]; then
    dd if=/dev/urandom of="$root/munge/munge.key" bs=1 count=1024 status=none
  fi
  chmod 400 "$root/munge/munge.key"
  /usr/sbin/munged --force --key-file="$root/munge/munge.key" --socket="$root/munge/munge.socket" \
    --pid-file="$root/run/munged.pid" --log-file="$root/log/munged.log" \
    --seed-file="$root/munge/munged.seed" || { loud "munged did not start: see $root/log/munged.log"; return 1; }
  /usr/sbin/slurmctld -f "$conf" || { loud "slurmctld did not start: see $root/log/slurmctld.log"; return 1; }
  /usr/sbin/slurmd -f "$conf" || { loud "slurmd did not start: see $root/log/slurmd.log"; return 1; }
  local i state
  for i in $(seq 1 120); do
    state=$(sinfo -h -p harness -o %T 2>/dev/null | head -n 1)
    case "$state" in
      idle*|mixed*|allocated*) echo "export SLURM_CONF=$conf"; return 0 ;;
      drain*|down*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 ;;
    esac
    sleep 0.5
  done
  loud "the node did not come up (state '${state:-none}'): see $root/log/"
  return 1
}

stop() {
  local d p
  for d in slurmd slurmctld munged; do
    p=$root/run/$d.pid
    if pid_alive "$p"; then
      kill "$(cat "$p")"
      for _ in $(seq 1 50); do pid_alive "$p" || break; sleep 0.1; done
    fi
    rm -f "$p"
  done
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  conf) [ -f "$conf" ] && echo "$conf" ;;
  *) echo "usage: scripts/slurm-cluster.sh install|start|stop|conf" >&2; exit 2 ;;
esac
