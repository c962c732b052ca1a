#!/bin/bash
# One device call (run from the repository root on the GPU machine):
#   bash scripts/device-bench-gpu.sh CARRY STEP...
# CARRY holds zstd-compressed stripped `harness` and `engine` binaries built here and a
# `zstd` (the device has none), optionally `engine-before.zst` (an older engine that
# t5check and oracle measure beside the current one); the diffusers wheels travel in .whl. Nothing is built
# there. The binaries are unpacked into $WORK/bin, the wheels into $WORK/site, and the
# steps are run by scripts/bench-gpu.sh (see there) with a deadline under the device
# tool's 10-minute command limit. Weights and the store live under $WORK on the
# machine's disk (kept while the machine stays warm; the carried dir is not).
# The tool refuses a checkout over 64 MiB: run `scripts/device-tree.sh slim` first
# (the committed bundles leave the working tree) and `scripts/device-tree.sh full` after.
set -o pipefail
carry=${1:?usage: device-bench-gpu.sh CARRY STEP...}
shift
export WORK=${WORK:-$HOME/ltx-bench}
export DEADLINE_S=${DEADLINE_S:-560} PACK_LOGS=1
mkdir -p "$WORK/bin"
Z=$(command -v zstd || echo "$carry/zstd")
chmod +x "$Z" 2>/dev/null
for b in harness engine; do
  "$Z" -q -d -f "$carry/$b.zst" -o "$WORK/bin/$b" && chmod +x "$WORK/bin/$b"
done
# An older engine to measure beside the current one (t5check, oracle), when carried.
if [ -f "$carry/engine-before.zst" ]; then
  mkdir -p "$WORK/before"
  "$Z" -q -d -f "$carry/engine-before.zst" -o "$WORK/before/engine" && chmod +x "$WORK/before/engine"
  export BEFORE_ENGINE=$WORK/before/engine
fi
if [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$WORK/site" .whl/*.whl > "$WORK/pip.log" 2>&1; then
  export REF_SITE=$WORK/site
fi
export HARNESS_LEASE_ID=${HARNESS_LEASE_ID:-"device-tool-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)"}
exec bash scripts/bench-gpu.sh "$WORK/bin" "$@"
