#!/usr/bin/env bash
# A real Slurm for the fleet tests (harness/tests/it/slurm.rs): Debian's slurm-wlm
# (22.05) and munge, as a two-node cluster on the loopback interface of this
# machine, every file it writes under target/tools/slurm (no /etc/slurm, no systemd):
#
#   scripts/slurm-cluster.sh install   apt-get install slurm-wlm munge where sbatch,
#                                      slurmctld, slurmd or munged is missing (root
#                                      with apt-get only; apt-get update first when
#                                      the package lists do not know them)
#   scripts/slurm-cluster.sh start     write the configuration, start munged,
#                                      slurmctld and one slurmd per node, wait until
#                                      every node is idle; prints `export
#                                      SLURM_CONF=...`, the one variable the client
#                                      commands need (sbatch, squeue, sacct, scancel
#                                      read it)
#   scripts/slurm-cluster.sh stop      stop the daemons this script started (by
#                                      their pid files, nothing else)
#   scripts/slurm-cluster.sh conf      print the slurm.conf path (exit 1 when absent)
#   scripts/slurm-cluster.sh nodes     print the nodes the running cluster has
#
# Two nodes, `n1` and `n2`, both on 127.0.0.1: Debian's slurm-wlm 22.05.8 runs two
# slurmd on one host, each started as `slurmd -N n1` / `slurmd -N n2`, with its own
# port (HARNESS_SLURMD_PORT, default 6818, and HARNESS_SLURMD2_PORT, default one
# more; slurmctld's is HARNESS_SLURMCTLD_PORT, default 6817: a second cluster on the
# same machine, another checkout's, needs other ports) and its own spool directory,
# pid and log file (`%n` in slurm.conf). The machine's CPUs are split between them
# (at least 1 each), so that the two do not claim more than there is. Two benchmark
# tasks on two nodes of one machine would run side by side, each measured under the
# other's load; the tests that measure submit with `--max-parallel 1` (the array
# throttle `%1`), so that their rounds never overlap whatever the node count, and
# take the cluster one test at a time; the test that shows an array spreading across
# the nodes runs trivial tasks. HARNESS_SLURM_NODES=1 starts one node only; where the
# second slurmd does not start or come up, `start` says so loudly and falls back to
# one node (the tests pass with one; the spreading test says NOT RUN for its
# two-node assertion). The partition is `harness`; every job is exclusive on its node.
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

# The nodes of the configuration written last (one name a line).
nodes_file=$root/run/nodes
ctld_port=${HARNESS_SLURMCTLD_PORT:-6817}
d_port=${HARNESS_SLURMD_PORT:-6818}
d2_port=${HARNESS_SLURMD2_PORT:-$((d_port + 1))}

# Write slurm.conf for the nodes named in "$@" (n1, or n1 n2).
write_conf() {
  local host cpus mem per
  host=$(hostname -s)
  # The machine's figures as slurmd sees them (CPUs, memory); memory a little under
  # what it reports, so that no node is ever drained for it.
  local node
  node=$(/usr/sbin/slurmd -C 2>/dev/null | head -n 1) || true
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  [ -n "$cpus" ] || cpus=$(nproc)
  [ -n "$mem" ] || mem=1024
  # Split between the nodes: each claims its share of the CPUs (at least 1) and
  # of the memory.
  per=$((cpus / $#))
  [ "$per" -ge 1 ] || per=1
  mem=$((mem * 9 / 10 / $#))
  mkdir -p "$root/etc" "$root/state/ctld" "$root/log" "$root/run" "$root/munge"
  local n port
  for n in "$@"; do mkdir -p "$root/state/d-$n"; done
  chmod 700 "$root/munge"
  {
    cat <<EOF
# Written by scripts/slurm-cluster.sh: a test cluster of $# node(s) ($*) on loopback.
ClusterName=harness-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$root/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$root/state/ctld
SlurmdSpoolDir=$root/state/d-%n
SlurmctldPidFile=$root/run/slurmctld.pid
SlurmdPidFile=$root/run/slurmd-%n.pid
SlurmctldLogFile=$root/log/slurmctld.log
SlurmdLogFile=$root/log/slurmd-%n.log
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
EOF
    for n in "$@"; do
      port=$d_port
      [ "$n" = n2 ] && port=$d2_port
      echo "NodeName=$n NodeAddr=127.0.0.1 NodeHostname=$host Port=$port CPUs=$per RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=harness Nodes=$(IFS=,; echo "$*") Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE"
  } >"$conf"
  printf '%s\n' "$@" >"$nodes_file"
}

# The nodes of the running cluster's configuration.
conf_nodes() { cat "$nodes_file" 2>/dev/null; }

# Whether every node named in "$@" is up (idle or busy); a drained or down one is
# resumed.
nodes_up() {
  local n state ok=0
  for n in "$@"; do
    state=$(sinfo -h -n "$n" -o %T 2>/dev/null | head -n 1)
    case "$state" in
      idle*|mixed*|allocated*|completing*) ;;
      drain*|down*) scontrol update nodename="$n" state=resume >/dev/null 2>&1; ok=1 ;;
      *) ok=1 ;;
    esac
  done
  return $ok
}

# Start slurmctld and one slurmd per node named in "$@", and wait (up to 60 s)
# until every node is up; 1, saying why, when not.
start_nodes() {
  write_conf "$@"
  /usr/sbin/slurmctld -f "$conf" || { loud "slurmctld did not start: see $root/log/slurmctld.log"; return 1; }
  local n
  for n in "$@"; do
    /usr/sbin/slurmd -f "$conf" -N "$n" \
      || { echo "scripts/slurm-cluster.sh: slurmd -N $n did not start: see $root/log/slurmd-$n.log" >&2; return 1; }
  done
  for _ in $(seq 1 120); do
    nodes_up "$@" && return 0
    sleep 0.5
  done
  echo "scripts/slurm-cluster.sh: not every node came up: $(sinfo -h -N -o '%N %T' 2>/dev/null | tr '\n' ' ')(see $root/log/)" >&2
  return 1
}

start() {
  have || { loud "Slurm is not installed: run scripts/slurm-cluster.sh install"; return 1; }
  export SLURM_CONF=$conf
  local n running=1
  if pid_alive "$root/run/munged.pid" && pid_alive "$root/run/slurmctld.pid" && [ -n "$(conf_nodes)" ]; then
    for n in $(conf_nodes); do pid_alive "$root/run/slurmd-$n.pid" || running=0; done
    if [ "$running" = 1 ] && scontrol ping >/dev/null 2>&1; then
      echo "export SLURM_CONF=$conf"
      return 0
    fi
  fi
  stop >/dev/null 2>&1
  mkdir -p "$root/munge" "$root/run" "$root/log"
  chmod 700 "$root/munge"
  # munge: a key of our own, a socket of our own (slurm.conf's AuthInfo names it).
  if [ ! -s "$root/munge/munge.key" ]; then
    dd if=/dev/urandom of="$root/munge/munge.key" bs=1 count=1024 status=none
  fi
  chmod 400 "$root/munge/munge.key"
  /usr/sbin/munged --force --key-file="$root/munge/munge.key" --socket="$root/munge/munge.socket" \
    --pid-file="$root/run/munged.pid" --log-file="$root/log/munged.log" \
    --seed-file="$root/munge/munged.seed" || { loud "munged did not start: see $root/log/munged.log"; return 1; }
  if [ "${HARNESS_SLURM_NODES:-2}" = 1 ]; then
    echo "scripts/slurm-cluster.sh: one node only (HARNESS_SLURM_NODES=1)" >&2
  elif start_nodes n1 n2; then
    echo "export SLURM_CONF=$conf"
    return 0
  else
    {
      echo
      echo "*** scripts/slurm-cluster.sh: two slurmd did not both come up on this host: falling back to ONE node ***"
      echo "*** the test that shows an array spreading across the nodes will say NOT RUN for that ***"
      echo
    } >&2
    stop_daemons slurmd-n1 slurmd-n2 slurmctld
  fi
  if start_nodes n1; then
    echo "export SLURM_CONF=$conf"
    return 0
  fi
  loud "the cluster did not come up: see $root/log/"
  return 1
}

# Stop the daemons named in "$@" (their pid files under run/), each by its pid.
stop_daemons() {
  local d p
  for d in "$@"; do
    p=$root/run/$d.pid
    if pid_alive "$p"; then
      kill "$(cat "$p")"
      for _ in $(seq 1 50); do pid_alive "$p" || break; sleep 0.1; done
    fi
    rm -f "$p"
  done
}

stop() {
  # slurmd.pid: the one node of a cluster started by this script before it had two.
  stop_daemons slurmd-n1 slurmd-n2 slurmd slurmctld munged
  rm -f "$nodes_file"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  conf) [ -f "$conf" ] && echo "$conf" ;;
  nodes) conf_nodes ;;
  *) echo "usage: scripts/slurm-cluster.sh install|start|stop|conf|nodes" >&2; exit 2 ;;
esac
