#!/bin/bash
# One device call for the T5 encoder's device arm (issue 7 item 1, lever
# `conditioning`), run on the GPU machine from the root of the checkout that
# travels: `bash scripts/device-t5.sh CARRY BUDGET_S` (default .devcarry/t5, 150).
# Nothing is built there: CARRY holds engine.zst (a stripped dev-profile engine
# built from branch t5, zstd) and a `zstd` binary (the machine has none).
# Step: `engine selftest-cuda --only t5 --bench`: the T5 kernels and forwards
# against the host arm (tiny preset; T5-XXL dims with 2 blocks on 128 tokens,
# 20 and 57 real), each forward's mutants (no position bias, no mask) that must
# exceed the tolerance, then the benchmark (T5-XXL 24 blocks: staging, device
# forward, host forward, device vs host). Scratch files on the machine's disk,
# full logs under $OUT, a short table last.
set -o pipefail
carry=$PWD/${1:-.devcarry/t5}
budget=${2:-150}
work=$carry/work
mkdir -p "$work/bin" "$work/scratch"
Z=$(command -v zstd || echo "$carry/zstd")
[ -x "$Z" ] || chmod +x "$Z" 2>/dev/null
{
  "$Z" -q -d -f "$carry/engine.zst" -o "$work/bin/engine" && chmod +x "$work/bin/engine"
  (cd "$work/bin" && sha256sum engine)
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "nproc $(nproc)"; free -g | head -2; df -h "$work" | tail -1
} > "$OUT/env.txt" 2>&1
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
export ENGINE_CACHE_DIR=$work/cache RUST_BACKTRACE=1
t=$(date +%s)
timeout "$budget" "$work/bin/engine" selftest-cuda --only t5 --bench --scratch "$work/scratch" \
  > "$OUT/selftest.out" 2> "$OUT/selftest.err"
rc=$?
rm -rf "$work/scratch"
echo "==================== table ===================="
cat "$OUT/env.txt"
echo "selftest-cuda --only t5 --bench rc=$rc in $(( $(date +%s) - t )) s"
cat "$OUT/selftest.out"
grep -E 'wrote|could not|FAILED|panicked|error' "$OUT/selftest.err" | head -10
