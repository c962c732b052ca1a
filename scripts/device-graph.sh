#!/bin/bash
# Device call for the denoise-graph lever (issue 7, items 3-4), run on the GPU
# machine from the root of the checkout that travels, with the carried folder as
# $1 (default .devcarry/graph). Nothing is built there: the folder holds
#   engine.zst   the engine (stripped dev-profile build of branch graph, zstd)
#   zstd         a zstd binary (the machine has none)
#   rungs/0.toml this branch's rung 0 (the checkout that travels may differ)
# Steps:
#   1. selftest-cuda --only graph --bench: graph-replayed vs eager loops
#      (tolerance 0, determinism control, mutant) and the loop benchmark off vs
#      on at rung 2's grid (6144 tokens, guided) and rung 1's (640, unguided);
#   2. rung 0 rendered through the pipeline on the device with denoise-graph off
#      and on: identical video.y4m required, the denoise close's graph attrs;
#   3. the whole selftest-cuda (checks only): nothing else regressed.
# Full logs under $OUT (8 files at most come back); a short table last.
set -o pipefail
carry=$PWD/${1:-.devcarry/graph}
work=/tmp/graph-work
mkdir -p "$work/bin"
Z=$(command -v zstd || echo "$carry/zstd")
[ -x "$Z" ] || chmod +x "$Z" 2>/dev/null
{
  echo "date $(date -u +%FT%TZ)"
  "$Z" -q -d -f "$carry/engine.zst" -o "$work/bin/engine" && chmod +x "$work/bin/engine"
  (cd "$work/bin" && sha256sum ./engine)
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "nproc $(nproc)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
export ENGINE_CACHE_DIR=$work/cache RUST_BACKTRACE=1
E=$work/bin/engine

# 1. The lever's checks and benchmark.
t=$(date +%s)
timeout "${GRAPH_TIMEOUT:-150}" "$E" selftest-cuda --only graph --bench --scratch "$work/st" \
  > "$OUT/graph.out" 2> "$OUT/graph.err"
g_rc=$?; g_s=$(( $(date +%s) - t ))
echo "graph selftest+bench rc=$g_rc in $g_s s"; cat "$OUT/graph.out"

# 2. Rung 0 through the pipeline, off then on.
"$E" synth-weights --preset tiny --out "$work/wtiny" > "$OUT/r0.log" 2>&1
for arm in off on; do
  t=$(date +%s)
  HARNESS_MARKER_FD=3 timeout 60 "$E" render --rung "$carry/rungs/0.toml" --device cuda \
    --weights "$work/wtiny" --out "$work/r0-$arm" --lever "denoise-graph=$arm" \
    3> "$work/r0-$arm.jsonl" 2> "$work/r0-$arm.err"
  rc=$?
  { echo "=== rung0 denoise-graph=$arm rc=$rc in $(( $(date +%s) - t )) s"; tail -5 "$work/r0-$arm.err"; } >> "$OUT/r0.log"
  eval "r0_${arm}_rc=$rc"
done
{ for arm in off on; do echo "=== $arm"; cat "$work/r0-$arm.jsonl"; done; } > "$OUT/r0-markers.jsonl"
h_off=$(sha256sum < "$work/r0-off/video.y4m" 2>/dev/null | cut -c1-16)
h_on=$(sha256sum < "$work/r0-on/video.y4m" 2>/dev/null | cut -c1-16)
den_off=$(grep '"close"' "$work/r0-off.jsonl" | grep '"name":"denoise"' | head -1)
den_on=$(grep '"close"' "$work/r0-on.jsonl" | grep '"name":"denoise"' | head -1)

# 3. Every other check.
t=$(date +%s)
timeout "${FULL_TIMEOUT:-90}" "$E" selftest-cuda --scratch "$work/full" > "$OUT/selftest.out" 2> "$OUT/selftest.err"
f_rc=$?; f_s=$(( $(date +%s) - t ))

{
  echo "==================== table ===================="
  grep -E '^[0-9a-f]{64}' "$OUT/env.txt"
  echo "graph selftest+bench  rc=$g_rc ${g_s}s  ok=$(grep -c '^ok' "$OUT/graph.out") FAIL=$(grep -c '^FAIL' "$OUT/graph.out")"
  grep -E '^(ok|FAIL) ' "$OUT/graph.out" | sed 's/^/    /'
  grep -E '^(denoise-graph|  )' "$OUT/graph.out" | sed 's/^/    /'
  echo "rung0 off rc=$r0_off_rc on rc=$r0_on_rc; video.y4m off $h_off on $h_on $([ -n "$h_off" ] && [ "$h_off" = "$h_on" ] && echo IDENTICAL || echo DIFFER)"
  echo "    off: $den_off"
  echo "    on : $den_on"
  echo "full selftest rc=$f_rc ${f_s}s  ok=$(grep -c '^ok' "$OUT/selftest.out") FAIL=$(grep -c '^FAIL' "$OUT/selftest.out")"
  grep '^FAIL' "$OUT/selftest.out" | head -10 | sed 's/^/    /'
} | tee "$OUT/table.txt"
