#!/bin/bash
# One device call of the lever campaign (issue 10), run on the GPU machine from the
# repository root: `bash scripts/device-campaign.sh CARRY RUNGS LEVERS REPEAT BUDGET_S`.
# Nothing is built there: CARRY (default .devcarry/campaign) holds zstd-compressed,
# stripped dev-profile `harness` and `engine` binaries built here, and a `zstd`.
#
# Steps: the instrument's positive controls (`harness control`: the watchdog fires
# at its floor; utilization.gpu reads high under `engine burn`), then
# `harness campaign` into a store on the machine's disk (never /tmp), stopped with
# SIGTERM before BUDGET_S so the running position seals `interrupted` and the
# campaign stays resumable. LEVERS is a `;`-separated list of campaigns run one
# after the other (e.g. `staging;release-pages`), each with REPEAT rounds.
# Sealed bundles are re-packed into ONE file, $OUT/bundles.tar, every few
# seconds (a bundle directory appears in bundles/ only once sealed; the device
# tool brings back a bounded number of files, so never a directory tree), so a
# call cut at its limit still brings back every sealed run. Full logs under
# $OUT; a short table last.
set -o pipefail
carry=${1:-.devcarry/campaign}
rungs=${2:-1}
levers=${3:-staging,release-pages}
repeat=${4:-3}
budget=${5:-480}
t0=$(date +%s)
work=$PWD/$carry/work
mkdir -p "$work/bin"
for b in harness engine; do
  "$carry/zstd" -q -d -f "$carry/$b.zst" -o "$work/bin/$b" && chmod +x "$work/bin/$b"
done
( cd "$work/bin" && sha256sum harness engine ) | tee "$OUT/sha256.txt"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
export HARNESS_LEASE_ID="device-tool-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)"
store=$work/store
{ nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
  nproc; free -g | head -2; df -hT "$work" | tail -1; echo "lease $HARNESS_LEASE_ID"; } \
  > "$OUT/env.txt" 2>&1
H="$work/bin/harness"

# The positive controls, kept in the store for the runs' gates.
timeout 90 "$H" control --store "$store" --engine "$work/bin/engine" --seconds 6 \
  > "$OUT/control.out" 2> "$OUT/control.err"
echo "control rc=$?" >> "$OUT/control.out"

pack() {
  [ -d "$store/bundles" ] || return 0
  tar -C "$store" -cf "$OUT/bundles.tar.part" bundles && mv -f "$OUT/bundles.tar.part" "$OUT/bundles.tar"
}
( while true; do pack; sleep 5; done ) > /dev/null 2>&1 < /dev/null &
packer=$!

rc=0
IFS=';' read -ra campaigns <<< "$levers"
for lv in "${campaigns[@]}"; do
  left=$(( budget - ($(date +%s) - t0) ))
  [ "$left" -gt 45 ] || { echo "no time left for campaign $lv" >> "$OUT/campaign.out"; break; }
  # SIGTERM at the deadline: the campaign passes it to the running position,
  # which stops its engine and seals `interrupted`; 40 s later, SIGKILL.
  timeout -s TERM -k 40 "$left" "$H" campaign --rungs "$rungs" --levers "$lv" \
    --repeat "$repeat" --order random --seed 1 --store "$store" --engine "$work/bin/engine" \
    -- --cadence-ms 100 >> "$OUT/campaign.out" 2>> "$OUT/campaign.err" < /dev/null
  rc=$?
  echo "campaign $lv rc=$rc" >> "$OUT/campaign.out"
done
kill $packer 2>/dev/null; wait $packer 2>/dev/null
pack

echo "==================== table ===================="
cat "$OUT/sha256.txt"
head -3 "$OUT/env.txt"
tail -4 "$OUT/control.out"
grep -E 'refused|error' "$OUT/control.err" | head -3
echo "last campaign rc=$rc after $(( $(date +%s) - t0 )) s"
grep -E '^campaign|^stopped|^resume|^no time' "$OUT/campaign.out"
grep -c '^campaign: position .*sealed' "$OUT/campaign.err"
grep -E 'campaign: position .*(sealed|start)' "$OUT/campaign.err" | tail -3
tar -tf "$OUT/bundles.tar" | grep -c 'manifest.json$'
ls -la "$OUT/bundles.tar"; sha256sum "$OUT/bundles.tar"
