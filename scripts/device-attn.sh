#!/bin/bash
# One device call for the attention kernels, run on the GPU machine from the root
# of the checkout that travels: `bash scripts/device-attn.sh CARRY BUDGET_S`
# (default .devcarry/attn, 150). CARRY holds engine.zst (a stripped dev-profile
# engine, zstd) and a `zstd` binary. Step: engine selftest-cuda --only dit --bench
# (attention checks incl. 6144x6144 hd64/hd128 vs attn_ref, DiT forwards vs the
# host arm, forward benches with flash2, the flash_mt layouts and cuDNN's fused
# attention (the `attention` lever's arms) side by side, and each arm's forward by
# operation class measured in place; cuDNN from the venv).
# Full log under $OUT, a short table last.
set -o pipefail
carry=$PWD/${1:-.devcarry/attn}
budget=${2:-150}
work=$HOME/attnwork
mkdir -p "$work/bin" "$HOME/st"
chmod +x "$carry/zstd" 2>/dev/null
{
  "$carry/zstd" -q -d -f "$carry/engine.zst" -o "$work/bin/engine" && chmod +x "$work/bin/engine"
  (cd "$work/bin" && sha256sum engine)
  nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
} > "$OUT/env.txt" 2>&1
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
# cuDNN (the attention lever's cudnn arm) lives in the Python venv's nvidia.cudnn.
cudnn=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)
[ -n "$cudnn" ] && export LD_LIBRARY_PATH=$cudnn/lib:$LD_LIBRARY_PATH
echo "cudnn: ${cudnn:-not found} $(ls $cudnn/lib 2>/dev/null | tr '\n' ' ')" >> "$OUT/env.txt"
export ENGINE_CACHE_DIR=$work/cache RUST_BACKTRACE=1
t=$(date +%s)
timeout "$budget" "$work/bin/engine" selftest-cuda --only dit --bench --scratch "$HOME/st" 2>&1 | tee "$OUT/selftest.log" > /dev/null
rc=$?
echo "==================== table ===================="
cat "$OUT/env.txt"
echo "selftest-cuda --only dit --bench rc=$rc in $(( $(date +%s) - t )) s"
grep -E "FAIL|panicked|error" "$OUT/selftest.log" | grep -v "0 failed" | head -15
grep -E "^== selftest|passed, .* failed" "$OUT/selftest.log" | tail -2
grep -E "attention .*(6144|flash-w)" "$OUT/selftest.log" | sort -u | head -40
grep -E "forward .*(attn=|vs the CPU)" "$OUT/selftest.log" | sort -u | head -20
grep -E "^forward " "$OUT/selftest.log" | sort -u
grep -E "cudnn" "$OUT/selftest.log" | sort -u | head -30
# The forward by operation class, in place (an event after each op).
grep -E "in place" "$OUT/selftest.log" | head -64
