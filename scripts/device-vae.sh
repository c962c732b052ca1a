#!/bin/bash
# Device call for the device VAE decoder (lever `vae`, issue 7 item 2), run on
# the GPU machine from the root of the checkout that travels, with the carried
# folder as $1 (default .devcarry/vae). Nothing is built there: the folder holds
#   engine.zst      the engine (stripped dev-profile build, zstd)
#   zstd            a zstd binary (the machine has none)
#   device-vae.sh   this script
# Steps:
#   1. `engine selftest-cuda --only vae --bench`: every VAE primitive against
#      the host primitive, the tiny and the ltxv-2b decoders against the CPU
#      arm (every conv path: the engine's implicit GEMM, its wide tile, cuDNN),
#      chunked == one piece, the plan's decode bytes; then the benchmark
#      (768x512x121, both conv paths, chunk sizes, convolutions alone).
#   2. The same checks with ENGINE_SELFTEST_MUTATE=skip-modulation: the decoder
#      checks must go red (rc != 0).
#   3. Unless RENDERS=0 or step 1 failed: rung 1 (ltxv-2b 512x320x25, synthetic
#      weights synthesized in the background meanwhile) rendered with
#      --lever vae=device and --lever vae=host; frames compared (PSNR, max and
#      mean absolute 8-bit difference over the y4m planes), load.vae /
#      decode.video phases summarised from the markers.
# cuDNN 9 for CUDA 13 is found inside the machine's Python venv (nvidia.cudnn).
# Full logs under $OUT (8 files at most come back); a short table last.
set -o pipefail
carry=$PWD/${1:-.devcarry/vae}
work=$carry/work
mkdir -p "$work/bin"
Z=$(command -v zstd || echo "$carry/zstd")
[ -x "$Z" ] || chmod +x "$Z" 2>/dev/null
CUDNN_LIB=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)/lib
{
  echo "zstd: $Z"
  "$Z" -q -d -f "$carry/engine.zst" -o "$work/bin/engine" && chmod +x "$work/bin/engine"
  (cd "$work/bin" && sha256sum ./*)
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "nproc $(nproc)"; free -g | head -2
  echo "cuDNN lib dir: $CUDNN_LIB"; ls "$CUDNN_LIB" 2>&1 | head -20
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:$CUDNN_LIB:$LD_LIBRARY_PATH
export ENGINE_CACHE_DIR=$work/cache RUST_BACKTRACE=1
E=$work/bin/engine

if [ "${RENDERS:-1}" = 1 ]; then
  ( t=$(date +%s); "$E" synth-weights --preset ltxv-2b --out "$work/w2b" > "$work/synth.log" 2>&1
    echo "synth ltxv-2b rc=$? in $(( $(date +%s) - t )) s" >> "$work/synth.log" ) &
  synth=$!
fi

t=$(date +%s)
timeout "${ST_TIMEOUT:-240}" "$E" selftest-cuda --only vae --bench --scratch "$work/selftest" \
  > "$OUT/selftest.out" 2> "$OUT/selftest.err"
st_rc=$?; st_s=$(( $(date +%s) - t ))
echo "selftest rc=$st_rc in $st_s s"; head -1 "$OUT/selftest.out"; grep '^FAIL' "$OUT/selftest.out" | head -30
tail -5 "$OUT/selftest.err"

t=$(date +%s)
ENGINE_SELFTEST_MUTATE=skip-modulation timeout "${MU_TIMEOUT:-120}" "$E" selftest-cuda --only vae \
  --scratch "$work/selftest" > "$OUT/mutant.out" 2>&1
mu_rc=$?; mu_s=$(( $(date +%s) - t ))
echo "MUTANT (skip-modulation) selftest rc=$mu_rc in $mu_s s (must be non-zero)"

r_dev=-; r_host=-
: > "$OUT/renders.log"
if [ "${RENDERS:-1}" = 1 ] && [ "$st_rc" = 0 ]; then
  wait $synth; cat "$work/synth.log" | tail -2 | tee -a "$OUT/renders.log"
  for arm in device host; do
    d=$work/render-$arm; rm -rf "$d"; mkdir -p "$d"
    t=$(date +%s)
    HARNESS_MARKER_FD=3 timeout "${RENDER_TIMEOUT:-240}" "$E" render --rung rungs/1.toml --weights "$work/w2b" \
      --out "$d" --lever vae=$arm 3> "$d/markers.jsonl" > "$d/stdout.txt" 2> "$d/stderr.txt"
    rc=$?; s=$(( $(date +%s) - t ))
    echo "render vae=$arm rc=$rc in $s s" | tee -a "$OUT/renders.log"
    tail -5 "$d/stderr.txt" >> "$OUT/renders.log"
    [ "$arm" = device ] && r_dev=$rc || r_host=$rc
  done
  cp "$work/render-device/markers.jsonl" "$OUT/render-device-markers.jsonl" 2>/dev/null
  cp "$work/render-host/markers.jsonl" "$OUT/render-host-markers.jsonl" 2>/dev/null
  python3 - "$work/render-device" "$work/render-host" >> "$OUT/renders.log" 2>&1 <<'EOF'
import json, math, sys
def y4m(path):
    # The engine writes C444 (three full planes per frame); FRAME headers
    # are skipped by length, never by searching the pixel bytes.
    b = open(path, "rb").read()
    head, rest = b.split(b"\n", 1)
    f = dict((t[0], t[1:]) for t in head.decode().split()[1:])
    assert f.get("C", "420").startswith("444"), "not C444: %r" % head
    w, h = int(f["W"]), int(f["H"])
    n = 3 * w * h
    frames = []
    while rest:
        assert rest[:6] == b"FRAME\n", "bad frame header"
        frames.append(rest[6:6 + n]); rest = rest[6 + n:]
    return w, h, frames
def phases(path):
    opens, out = {}, []
    for line in open(path):
        m = json.loads(line)
        if m.get("ev") == "open":
            opens.setdefault(m["name"], []).append(m["t_ns"])
        elif m.get("ev") == "close" and (m["name"].startswith("decode") or m["name"] in ("load.vae", "load.dit", "denoise")):
            t0 = opens[m["name"]].pop()
            a = m.get("attrs", {})
            out.append("  %-20s wall %9.1f ms  device_ms %-10s peak_dev %-12s peak_host %s %s" % (
                m["name"], (m["t_ns"] - t0) / 1e6, a.get("device_ms", "-"), a.get("peak_device_bytes", "-"),
                a.get("peak_host_bytes", "-"), {k: v for k, v in a.items() if k in ("chunk", "frames", "conv", "arm", "chunks")}))
    return out
dev, host = sys.argv[1], sys.argv[2]
for name, d in (("device", dev), ("host", host)):
    print("phases, vae=%s:" % name)
    print("\n".join(phases(d + "/markers.jsonl")))
try:
    wa, ha, fa = y4m(dev + "/video.y4m"); wb, hb, fb = y4m(host + "/video.y4m")
    assert (wa, ha, len(fa)) == (wb, hb, len(fb)), "geometry differs"
    se = cnt = 0; mx = 0; sad = 0; worst = (0, 0.0)
    for i, (x, y) in enumerate(zip(fa, fb)):
        fs = 0; fm = 0
        for p, q in zip(x, y):
            d = p - q
            if d < 0: d = -d
            fs += d * d; sad += d
            if d > fm: fm = d
        se += fs; cnt += len(x); mx = max(mx, fm)
        mean_f = sum(abs(p - q) for p, q in zip(x, y)) / len(x)
        if mean_f > worst[1]: worst = (i, mean_f)
    mse = se / cnt
    psnr = float("inf") if mse == 0 else 10 * math.log10(255 * 255 / mse)
    print("frames vae=device vs vae=host: %d frames %dx%d, PSNR %.2f dB, max abs %d, mean abs %.4f, worst frame %d mean %.3f"
          % (len(fa), wa, ha, psnr, mx, sad / cnt, worst[0], worst[1]))
except Exception as e:
    print("frame comparison failed: %r" % (e,))
EOF
fi

{
  echo "==================== table ===================="
  echo "binary:"; grep -E '^[0-9a-f]{64}' "$OUT/env.txt"
  echo "selftest-cuda --only vae --bench  rc=$st_rc  ok=$(grep -c '^ok' "$OUT/selftest.out") FAIL=$(grep -c '^FAIL' "$OUT/selftest.out")  ${st_s}s"
  grep -E '^(ok|FAIL) +vae decode' "$OUT/selftest.out" | sed 's/^/    /'
  grep -E '^vae ' "$OUT/selftest.out" | sed 's/^/    /'
  echo "mutant skip-modulation  rc=$mu_rc (non-zero required)  FAIL=$(grep -c '^FAIL' "$OUT/mutant.out")"
  grep -E '^FAIL' "$OUT/mutant.out" | head -6 | sed 's/^/    /'
  echo "renders: vae=device rc=$r_dev  vae=host rc=$r_host"
  grep -E '^(frames|  decode.video |  load.vae|render)' "$OUT/renders.log" | sed 's/^/    /'
} | tee "$OUT/table.txt"
