#!/bin/bash
# Device call for the CUDA arm inside `engine render` (issue 6/7), run on the GPU
# machine from the root of the checkout that travels, with the carried folder as
# $1 (default .devcarry/cuda2). Nothing is built there: the folder holds
#   engine.zst        the engine (stripped dev-profile build, zstd)
#   cuda_render.zst   the engine's end-to-end test binary (engine/tests/it, `cargo test
#                     -p engine --test it --no-run`), whose cuda_render:: tests run here
#   mutant.zst        (optional) an engine whose guided Euler step ignores
#                     guidance: the rung-0 comparison must FAIL on it
#   nowarm.zst        (optional) an engine without the first-launch warm-up (run
#                     5's): the rung-0 test must FAIL on it (host time in a
#                     forward's events)
#   rungs/            this branch's rungs/0.toml and rungs/1.toml (the checkout
#                     that travels may be another branch)
#   zstd              (optional) a zstd binary, used when the machine has none
# Steps: selftest-cuda (every kernel and forward against the CPU arm), the
# rung-0 device-vs-CPU test, the same test on the mutant, then rung 1 (ltxv-2b
# synthetic weights, synthesized in the background while the first steps run).
# Full logs under $OUT (8 files at most come back); a short table last.
set -o pipefail
carry=$PWD/${1:-.devcarry/cuda2}
work=$carry/work
mkdir -p "$work/bin"
Z=$(command -v zstd || echo "$carry/zstd")
[ -x "$Z" ] || chmod +x "$Z" 2>/dev/null
{
  echo "zstd: $Z"
  for b in engine cuda_render mutant nowarm; do
    if [ -f "$carry/$b.zst" ]; then
      "$Z" -q -d -f "$carry/$b.zst" -o "$work/bin/$b" && chmod +x "$work/bin/$b"
    fi
  done
  (cd "$work/bin" && sha256sum ./*)
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "nproc $(nproc)"; free -g | head -2
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
export ENGINE_CACHE_DIR=$work/cache RUST_BACKTRACE=1
export ENGINE_BIN=$work/bin/engine ENGINE_REPO=$carry ENGINE_TEST_SCRATCH=$work/scratch
T=$work/bin/cuda_render
R0=cuda_render::rung0_on_the_device_matches_the_cpu_arm_within_the_argued_tolerance
R1=cuda_render::rung1_renders_on_the_device_end_to_end_with_its_markers
# The 2B weights, in the background while the checks run.
( t=$(date +%s); "$ENGINE_BIN" synth-weights --preset ltxv-2b --out "$work/w2b" > "$work/synth.log" 2>&1
  echo "synth ltxv-2b rc=$? in $(( $(date +%s) - t )) s" >> "$work/synth.log" ) &
synth=$!

t=$(date +%s)
timeout 90 "$ENGINE_BIN" selftest-cuda --scratch "$work/selftest" > "$OUT/selftest.out" 2> "$OUT/selftest.err"
st_rc=$?; st_s=$(( $(date +%s) - t ))
st_fail=$(grep -c '^FAIL' "$OUT/selftest.out")
st_ok=$(grep -c '^ok' "$OUT/selftest.out")
echo "selftest rc=$st_rc in $st_s s"; head -1 "$OUT/selftest.out"; grep '^FAIL' "$OUT/selftest.out" | head -20

t=$(date +%s)
timeout 60 "$T" --exact "$R0" --ignored --nocapture --test-threads 1 > "$OUT/rung0.log" 2>&1
r0_rc=$?; r0_s=$(( $(date +%s) - t ))
echo "rung0 test rc=$r0_rc in $r0_s s"; grep -v '^$' "$OUT/rung0.log" | tail -40

mu_rc=-
if [ -x "$work/bin/mutant" ]; then
  t=$(date +%s)
  ENGINE_BIN=$work/bin/mutant timeout 45 "$T" --exact "$R0" --ignored --nocapture --test-threads 1 \
    > "$OUT/mutant.log" 2>&1
  mu_rc=$?; mu_s=$(( $(date +%s) - t ))
  echo "MUTANT (guided Euler ignores guidance) rung0 test rc=$mu_rc in $mu_s s (must be non-zero)"
  grep -E -A1 "rung 0: device vs CPU|panicked" "$OUT/mutant.log" | head -4
fi

nw_rc=-
if [ -x "$work/bin/nowarm" ]; then
  t=$(date +%s)
  { echo "=== NOWARM (no first-launch warm-up)"; ENGINE_BIN=$work/bin/nowarm timeout 45 "$T" --exact "$R0" --ignored \
    --nocapture --test-threads 1; } >> "$OUT/mutant.log" 2>&1
  nw_rc=$?; nw_s=$(( $(date +%s) - t ))
  echo "NOWARM rung0 test rc=$nw_rc in $nw_s s (must be non-zero)"
  sed -n '/=== NOWARM/,$p' "$OUT/mutant.log" | grep -A1 "panicked" | head -2
fi

wait $synth; tail -2 "$work/synth.log"
t=$(date +%s)
ENGINE_TEST_WEIGHTS_2B=$work/w2b timeout "${RUNG1_TIMEOUT:-120}" "$T" --exact "$R1" --ignored --nocapture \
  --test-threads 1 > "$OUT/rung1.log" 2>&1
r1_rc=$?; r1_s=$(( $(date +%s) - t ))
cp "$ENGINE_TEST_SCRATCH/cuda_render/rung1/markers.jsonl" "$OUT/rung1-markers.jsonl" 2>/dev/null
{ echo "--- engine stderr (tail)"; tail -20 "$ENGINE_TEST_SCRATCH/cuda_render/rung1/stderr.txt"; cat "$work/synth.log"; } \
  >> "$OUT/rung1.log" 2>/dev/null
echo "rung1 test rc=$r1_rc in $r1_s s"; grep -v '^$' "$OUT/rung1.log" | tail -45

{
  echo "==================== table ===================="
  echo "binaries:"; grep -E '^[0-9a-f]{64}' "$OUT/env.txt"
  echo "selftest-cuda        rc=$st_rc  ok=$st_ok FAIL=$st_fail  ${st_s}s"
  echo "rung0 cuda vs cpu    rc=$r0_rc  ${r0_s}s  $(grep -E '^rung 0: device vs CPU' "$OUT/rung0.log" | head -1)"
  grep -E '^(GPU-busy|device peak)' "$OUT/rung0.log" | sed 's/^/    rung0 /'
  echo "mutant rung0         rc=$mu_rc (non-zero required)  $(grep -E '^rung 0: device vs CPU' "$OUT/mutant.log" 2>/dev/null | head -1)"
  sed '/=== NOWARM/,$d' "$OUT/mutant.log" 2>/dev/null | grep -A1 "panicked" | head -2 | sed 's/^/    mutant /'
  echo "nowarm rung0         rc=$nw_rc (non-zero required)"
  sed -n '/=== NOWARM/,$p' "$OUT/mutant.log" 2>/dev/null | grep -A1 "panicked" | head -2 | sed 's/^/    nowarm /'
  echo "rung1 (2b 512x320x25) rc=$r1_rc  ${r1_s}s"
  grep -E '^(rung 1|phase |load|conditioning|denoise|decode|artifacts|GPU-busy|device peak)' "$OUT/rung1.log" | sed 's/^/    /'
} | tee "$OUT/table.txt"
