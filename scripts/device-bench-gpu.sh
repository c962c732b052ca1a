#!/bin/bash
# One device call for issue 7's full renders and benchmarks, run on the GPU machine from
# the repository root: `bash scripts/device-bench-gpu.sh CARRY RUNG [SELFTEST]`.
# Nothing is built there. CARRY (default .devcarry/bench) holds zstd-compressed stripped
# dev-profile `harness` and `engine` binaries built here and a `zstd`; the diffusers
# wheels travel in .whl (see scripts/reference_ltx.py).
#
# Steps, all in this one call so every figure is side by side on one machine:
#  1. `engine selftest-cuda --bench` (every device check against the CPU arm, then the
#     benchmarks: staging, forward, denoise graph on/off, T5, VAE decode) when SELFTEST=1;
#  2. synthetic weights of the rung's preset (`engine synth-weights`), on the machine's
#     disk, never /tmp;
#  3. `harness run` of rungs/RUNG.toml with --profile default, then --profile baseline
#     (bundles sealed into a store on that disk; the harness pixel-checks the frames);
#  4. the PyTorch + diffusers reference on the same weights: the VAE decode at the
#     rung's geometry, and the LTXPipeline at the rung's geometry, steps and guidance;
#  5. the bundles packed into ONE file, $OUT/bundles.tar; full logs under $OUT; a short
#     table last.
set -o pipefail
carry=${1:-.devcarry/bench}
rung=${2:-2}
selftest=${3:-1}
t0=$(date +%s)
work=$PWD/$carry/work
mkdir -p "$work/bin"
Z=$(command -v zstd || echo "$carry/zstd")
chmod +x "$Z" 2>/dev/null
for b in harness engine; do
  "$Z" -q -d -f "$carry/$b.zst" -o "$work/bin/$b" && chmod +x "$work/bin/$b"
done
( cd "$work/bin" && sha256sum harness engine ) | tee "$OUT/sha256.txt"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
cudnn=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)
[ -n "$cudnn" ] && export LD_LIBRARY_PATH=$cudnn/lib:$LD_LIBRARY_PATH
export ENGINE_CACHE_DIR=$work/cache
export HARNESS_LEASE_ID="device-tool-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)"
E=$work/bin/engine
H=$work/bin/harness
store=$work/store
{ nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
  nproc; free -g | head -2; df -hT "$work" | tail -1; echo "lease $HARNESS_LEASE_ID"; } \
  > "$OUT/env.txt" 2>&1

preset=$(sed -n 's/^preset *= *"\(.*\)"/\1/p' "rungs/$rung.toml")
weights=$work/weights-$preset
if [ ! -f "$weights/model_index.json" ]; then
  ( "$E" synth-weights --preset "$preset" --out "$weights" > "$OUT/synth.log" 2>&1 ) &
  synth=$!
fi

if [ "$selftest" = 1 ]; then
  timeout 300 "$E" selftest-cuda --bench --scratch "$work/selftest" > "$OUT/selftest.log" 2>&1
  echo "selftest rc=$?" >> "$OUT/selftest.log"
fi
[ -n "$synth" ] && wait "$synth"

for profile in default baseline; do
  timeout -s TERM -k 30 420 "$H" run --rung "rungs/$rung.toml" --profile "$profile" \
    --store "$store" --engine "$E" --weights "$weights" --cadence-ms 100 \
    > "$OUT/run-$profile.out" 2> "$OUT/run-$profile.err" < /dev/null
  echo "run $profile rc=$?" >> "$OUT/runs.txt"
  [ -d "$store/bundles" ] && tar -C "$store" -cf "$OUT/bundles.tar" bundles
done

# The reference (PyTorch + diffusers), on the same weights and geometry.
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$work/site" .whl/*.whl > "$OUT/ref.log" 2>&1; then
  export PYTHONPATH=$work/site PYTHONUNBUFFERED=1
  read -r W Hh F S G <<< "$(python3 - "rungs/$rung.toml" <<'EOF'
import sys, tomllib
r = tomllib.load(open(sys.argv[1], "rb"))
print(r["width"], r["height"], r["frames"], r["steps"], r["guidance"])
EOF
)"
  geo=(--weights "$weights" --width "$W" --height "$Hh" --frames "$F")
  timeout 150 python3 scripts/reference_ltx.py vae "${geo[@]}" --repeat 5 \
    --json "$OUT/ref-vae.json" >> "$OUT/ref.log" 2>&1
  echo "ref vae rc=$?" >> "$OUT/ref.log"
  timeout 300 python3 scripts/reference_ltx.py pipeline "${geo[@]}" --steps "$S" \
    --guidance "$G" --repeat 1 --json "$OUT/ref-pipeline.json" >> "$OUT/ref.log" 2>&1
  echo "ref pipeline rc=$?" >> "$OUT/ref.log"
fi
[ -d "$store/bundles" ] && tar -C "$store" -cf "$OUT/bundles.tar" bundles

echo "==================== table ===================="
cat "$OUT/sha256.txt"
head -1 "$OUT/env.txt"
if [ "$selftest" = 1 ]; then
  grep -E '^== selftest|passed, .* failed|FAIL' "$OUT/selftest.log" | head -12
  grep -iE 'vae|t5|graph|decode' "$OUT/selftest.log" | grep -vE '^\s*$' | tail -16
fi
cat "$OUT/runs.txt"
for profile in default baseline; do
  echo "-- $profile"; tail -22 "$OUT/run-$profile.out"
done
grep -E 'rc=|median|_ms"' "$OUT/ref.log" | head -12
echo "call took $(( $(date +%s) - t0 )) s"
