#!/bin/bash
# The sampler's fixed cadence with large weight files (README, "Fixed cadence with
# large weights"): each HARNESS binary in turn, ROUNDS times interleaved, runs the
# test engine sleeping 6 s under `harness run --cadence-ms 100 --weights DIR`, with
# SIZE_GIB GiB of sparse weight files read once into the page cache first. Per run
# it prints the deadlines that got no sample (slots the recording spans at 100 ms,
# less the samples), the p99 interval, the tick's own p99 work and the median
# page-cache pass (`sampler.tick_cost_parts_us.pagecache`).
#
#   scripts/cadence-weights.sh target/debug/harness [OLDER_HARNESS ...]
#
# Files go under target/cadence-weights (sparse: they take no disk, only page cache);
# the store is target/cadence-weights/store (not evidence: these runs measure the
# instrument, and the engine is the test engine). Needs target/debug/test-engine
# (`cargo build --bins`) and python3 with pyarrow (target/pyenv, `scripts/pyenv.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/cadence-weights.sh HARNESS [HARNESS ...]" >&2; exit 2; }
SIZE_GIB=${SIZE_GIB:-16}
ROUNDS=${ROUNDS:-2}
PY=${PY:-target/pyenv/bin/python}
ENGINE=target/debug/test-engine
dir=$PWD/target/cadence-weights
mkdir -p "$dir/w" "$dir/store"
n=$(( (SIZE_GIB + 3) / 4 ))
for i in $(seq 0 $((n - 1))); do truncate -s 4G "$dir/w/model-$(printf %05d "$i").safetensors"; done
cat "$dir"/w/*.safetensors > /dev/null
for round in $(seq 1 "$ROUNDS"); do
  for h in "$@"; do
    "$h" run --store "$dir/store" --weights "$dir/w" --cadence-ms 100 --exec -- "$ENGINE" \
      --hello --open work --sleep-ms 6000 --close work > "$dir/last.out" 2> "$dir/last.err" || true
    b=$(sed -n 's/^path: //p' "$dir/last.out")
    [ -n "$b" ] || { echo "no bundle from $h; see $dir/last.err" >&2; exit 1; }
    "$PY" - "$b" "$h" "$round" <<'EOF'
import json, sys
import pyarrow.parquet as pq
b, h, r = sys.argv[1:]
m = json.load(open(f"{b}/manifest.json"))
t = sorted(pq.read_table(f"{b}/samples.parquet").column("t_ns").to_pylist())
slots = round((t[-1] - t[0]) / 1e8) + 1
iv = sorted(y - x for x, y in zip(t, t[1:]))
p99 = iv[min(len(iv) - 1, max(0, -(-99 * len(iv) // 100) - 1))] / 1e6
s = m["sampler"]
pc = s.get("tick_cost_parts_us", {}).get("pagecache", {})
print(f"round {r} {h}: {slots - len(t)} of {slots} deadlines without a sample; "
      f"p99 interval {p99:.1f} ms; tick work p99 {s['tick_cost_us']['p99_us'] / 1e3:.1f} ms; "
      f"page-cache pass median {pc.get('median_us', float('nan')) / 1e3:.0f} ms")
EOF
  done
done
