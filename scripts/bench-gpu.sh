#!/bin/bash
# The GPU benchmarks and full renders, as a list of steps run in order on one machine
# so that every figure is side by side (issue 7's `just bench-gpu`, and the device
# calls that produce the committed evidence):
#
#   scripts/bench-gpu.sh BIN_DIR STEP...
#
# BIN_DIR holds `engine` and `harness` (target/debug here: the dev profile is
# optimized). Steps:
#   selftest[:SECTION[:bench]]
#                         engine selftest-cuda --bench: every device check against the
#                         CPU arm, then the staging/forward/denoise/graph/T5/VAE benches;
#                         with SECTION (dit, t5, vae, graph, attention: the attention kernels alone, in
#                         under a minute; gemm: the gemm-algo lever's checks alone; staging: the staging
#                         variants' checks, with :bench the staging sweep) that section's
#                         checks alone,
#                         and with `:bench` after it that section's benchmarks too
#   synth:PRESET          synthesize the preset's weights (in the background, beside
#                         other synth steps only: every step that measures waits for
#                         every synth still running, since a run that starts with more
#                         than half the cores busy is excluded as contended), unless
#                         already there
#   run:RUNG:PROFILE[:K=V,K=V[:CACHE]]
#                         harness run of rungs/RUNG.toml with that profile and lever
#                         overrides; the bundle is sealed into $WORK/store; CACHE =
#                         as-is (default), cold or warm (--weights-cache)
#   before:RUNG:PROFILE[:K=V,K=V[:CACHE]]
#                         the same with the carried older engine (engine-before.zst):
#                         list before/run steps alternately for an A/B in one sitting;
#                         the table labels its bundles `engine-before`
#   ref:RUNG              the PyTorch + diffusers reference at the rung's geometry, steps
#                         and guidance (scripts/reference_ltx.py vae, then pipeline with
#                         the arms REF_ARMS, default eager,compile: eager and
#                         torch.compile'd transformer, REF_REPEAT timed calls each after a
#                         warm-up, the denoise loop timed by CUDA events), with
#                         the weights read into the page cache first (compare it with a
#                         run whose CACHE is warm: the default profile's release-pages
#                         leaves the weights cold for whoever comes next)
#   campaign:RUNGS:LEVERS:REPEAT[:CACHE]
#                         harness campaign (order random, seed 1) into $WORK/store;
#                         CACHE = as-is (default), cold or warm (--weights-cache)
#   t5check:PRESET        the text encoder against transformers' T5EncoderModel at full
#                         scale (scripts/t5_check.py: f32, bf16 and f64 side by side, the
#                         host and device arms, every prompt of the set); records the
#                         reference into $OUT/t5-reference-PRESET.safetensors
#   oracle:PRESET         whole renders against diffusers' LTXPipeline from the engine's
#                         own noise (scripts/render_oracle.py: two geometries, with and
#                         without guidance; own conditioning on both arms, diffusers'
#                         embeddings, diffusers bf16 against f32; ORACLE_ARGS=
#                         "--variants a,ah,b,f,bf" adds the fp8 arm's renders, measured
#                         not judged)
#   exec:RUNG[:DTYPE]     diffusers' LTXPipeline (examples/diffusers_ltx.py) under
#                         `harness run --exec` at the rung, from the engine's noise (with
#                         DTYPE, bf16 or f32: `--dtype DTYPE` and `--lever precision=DTYPE`,
#                         the bundles rank pairs into the measured fidelity floor), then
#                         `harness diff` of the last run:RUNG bundle and this one
#                         (DIFFUSERS_ARGS: extra arguments, e.g. `--device cpu`, or
#                         `--offload` for exec:3:f32 on an 80 GB card: f32 13B + T5 + decode)
#   table                 the summary: engine phases of every rung-2/3 bundle beside
#                         the reference's walls, with the ratios
#
# Environment: WORK (weights, store, scratch; default $HOME/ltx-bench, never /tmp),
# OUT (logs and bundles.tar.partNN; default $WORK/out), DEADLINE_S (seconds this script may
# take in all; each step's timeout is cut to what is left, default 86400),
# PACK_LOGS (1: logs into one logs.tgz at the end), PYTHON (default python3), REF_SITE (extra PYTHONPATH for diffusers, optional),
# BEFORE_ENGINE (an older engine binary: t5check and oracle measure it beside the current one, unjudged),
# T5CHECK_ARGS and ORACLE_ARGS (extra arguments of the two scripts, e.g. `--device cpu --arms cpu`
# and `--device cpu --engine-device cpu --configs 64x64x9:3:3` to try them on a machine without a GPU).
set -o pipefail
bin=$(cd "${1:?usage: bench-gpu.sh BIN_DIR STEP...}" && pwd)
shift
t0=$(date +%s)
WORK=${WORK:-$HOME/ltx-bench}
OUT=${OUT:-$WORK/out}
DEADLINE_S=${DEADLINE_S:-86400}
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$OUT"
store=$WORK/store
E=$bin/engine
H=$bin/harness
export ENGINE_CACHE_DIR=$WORK/cache
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
cudnn=$("$PY" -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)
[ -n "$cudnn" ] && export LD_LIBRARY_PATH=$cudnn/lib:$LD_LIBRARY_PATH
( cd "$bin" && sha256sum engine harness ) > "$OUT/sha256.txt"
[ -n "${BEFORE_ENGINE:-}" ] && sha256sum "$BEFORE_ENGINE" | sed "s|  .*|  engine-before|" >> "$OUT/sha256.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
  echo "cores $(nproc)"; free -g | head -2; df -hT "$WORK" | tail -1
  echo "lease ${HARNESS_LEASE_ID:-none}"; } > "$OUT/env.txt" 2>&1
log=$OUT/steps.txt

left() { echo $(( DEADLINE_S - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
# The device tool brings back at most 8 files of $OUT, 16 MiB each and 64 MiB in all (a
# 86 MB tar was refused on 2026-12-01; on 2026-12-06 a 84 MiB pack lost its last two
# parts, 7.5 rung-2 bundles). pack() therefore packs WHOLE bundles not yet brought back
# ($store/brought.txt; a warm machine keeps the store of earlier calls) until PACK_MIB
# (default 56) is reached, splits the tar into 14 MiB parts `bundles.tar.partNN` (rejoin
# with `cat bundles.tar.part* | tar -x`), and names every bundle it had to leave behind in
# $OUT/left-behind.txt and on stdout: a call on the still-warm machine with no steps (or
# the `pack` step) brings them next. A rung-2 bundle of synthesized weights is ~3.5 MiB
# (three 1.2 MB noise PNGs): about 16 of them fit one call.
mkdir -p "$store/bundles"
touch "$store/brought.txt"
brought_before=$(cat "$store/brought.txt")   # what earlier calls brought back
pack() { # re-run after each step: it rewrites this call's parts from scratch
  local budget=$(( ${PACK_MIB:-56} * 1024 * 1024 )) used=0 b sz take=() left=()
  rm -f "$OUT"/bundles.tar.part* "$OUT/left-behind.txt"
  for b in $(ls -tr "$store/bundles"); do
    grep -qx "$b" <<< "$brought_before" && continue
    sz=$(du -sb "$store/bundles/$b" | cut -f1)
    if [ $(( used + sz )) -le "$budget" ]; then take+=("bundles/$b"); used=$(( used + sz ))
    else left+=("$b"); fi
  done
  [ ${#take[@]} -gt 0 ] && tar -C "$store" -cf - "${take[@]}" | split -b 14M -d - "$OUT/bundles.tar.part"
  { [ -n "$brought_before" ] && echo "$brought_before"
    [ ${#take[@]} -gt 0 ] && printf '%s\n' "${take[@]#bundles/}"; } > "$store/brought.txt"
  if [ ${#left[@]} -gt 0 ]; then
    printf '%s\n' "${left[@]}" > "$OUT/left-behind.txt"
    echo "PACK: ${#left[@]} bundle(s) over the ${PACK_MIB:-56} MiB pack LEFT BEHIND on the machine" \
      "(call again at once, with the step 'pack', to bring them): ${left[*]}"
  fi
}
note() { echo "$(( $(date +%s) - t0 ))s $*" | tee -a "$log"; }
declare -A synth_pid last_bundle
weights_of() { echo "$WORK/weights-$1"; }
preset_of() { sed -n 's/^preset *= *"\(.*\)"/\1/p' "rungs/$1.toml" 2>/dev/null; }
need() { # wait for a preset's weights
  local p=$1 w; w=$(weights_of "$1")
  if [ -n "${synth_pid[$p]}" ]; then wait "${synth_pid[$p]}"; note "synth $p rc=$?"; unset "synth_pid[$p]"; fi
  [ -f "$w/model_index.json" ] || { note "weights $p missing: synthesizing now";
    "$E" synth-weights --preset "$p" --out "$w" >> "$OUT/synth-$p.log" 2>&1; note "synth $p rc=$?"; }
}
settle() { # before a step that measures: no synth runs beside it
  local p
  for p in "${!synth_pid[@]}"; do
    note "waiting for synth $p before $1 (nothing is measured beside a synth)"
    wait "${synth_pid[$p]}"; note "synth $p rc=$?"; unset "synth_pid[$p]"
  done
}
geometry() { "$PY" - "rungs/$1.toml" <<'EOF'
import sys, tomllib
r = tomllib.load(open(sys.argv[1], "rb"))
print(r["width"], r["height"], r["frames"], r["steps"], r["guidance"], r["seed"])
EOF
}

for step in "$@"; do
  [ "$(left)" -le 10 ] && { note "deadline: skipping $step and the rest"; break; }
  IFS=: read -r kind a b c d <<< "$step"
  case $kind in synth|table|pack) ;; *) settle "$step" ;; esac
  case $kind in
    selftest)
      if [ -n "$b" ] && [ "$b" != bench ]; then
        note "selftest $a: unknown option '$b' (want selftest:SECTION or selftest:SECTION:bench)"
      elif [ -n "$a" ]; then
        timeout "$(cap 280)" "$E" selftest-cuda --only "$a" ${b:+--bench} --scratch "$WORK/selftest" \
          > "$OUT/selftest-$a.log" 2>&1
        note "selftest $a rc=$?; $(grep -E 'passed, .* failed' "$OUT/selftest-$a.log" | tail -1)"
      else
        timeout "$(cap 280)" "$E" selftest-cuda --bench --scratch "$WORK/selftest" \
          > "$OUT/selftest.log" 2>&1
        note "selftest rc=$?"
      fi ;;
    synth)
      w=$(weights_of "$a")
      if [ ! -f "$w/model_index.json" ]; then
        ( "$E" synth-weights --preset "$a" --out "$w" > "$OUT/synth-$a.log" 2>&1 ) &
        synth_pid[$a]=$!
        note "synth $a started"
      fi ;;
    run|before)
      # `before:` is `run:` with the carried older engine (BEFORE_ENGINE): the two
      # binaries measured in one sitting, alternated as the steps are listed.
      eng=$E
      if [ "$kind" = before ]; then
        [ -n "${BEFORE_ENGINE:-}" ] || { note "before:$a: no engine-before.zst carried"; continue; }
        eng=$BEFORE_ENGINE
      fi
      p=$(preset_of "$a"); need "$p"
      flags=(--profile "$b")
      [ -n "$c" ] && for kv in ${c//,/ }; do flags+=(--lever "$kv"); done
      name="$kind-$a-$b${c:+-${c//[=,]/_}}"
      s=$(date +%s.%N)
      [ -n "$d" ] && { flags+=(--weights-cache "$d"); name+="-$d"; }
      timeout -s TERM -k 20 "$(cap 480)" "$H" run --rung "rungs/$a.toml" "${flags[@]}" \
        --store "$store" --engine "$eng" --weights "$(weights_of "$p")" --cadence-ms 100 \
        > "$OUT/$name.out" 2> "$OUT/$name.err" < /dev/null
      rc=$?
      note "$name rc=$rc wall $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $s}") s"
      [ "$kind" = run ] && last_bundle[$a]=$(sed -n 's/^path: //p' "$OUT/$name.out" | tail -1)
      pack ;;
    exec)
      # diffusers' LTXPipeline (examples/diffusers_ltx.py) under `harness run --exec`
      # at rung A, from the engine's noise streams, then `harness diff` against the
      # engine's bundle of the last run:A step: the ratios come from the two bundles.
      case ${b:-} in ""|bf16|f32) ;; *) note "exec $a: unknown dtype '$b' (want bf16 or f32)"; continue ;; esac
      p=$(preset_of "$a"); need "$p"; w=$(weights_of "$p")
      export PYTHONPATH=${REF_SITE:+$REF_SITE:}${PYTHONPATH:-} PYTHONUNBUFFERED=1
      name="exec-$a-diffusers${b:+-$b}"
      timeout -s TERM -k 20 "$(cap 480)" "$H" run --rung "rungs/$a.toml" --store "$store" \
        --weights "$w" --cadence-ms 100 ${b:+--lever "precision=$b"} --exec -- "$PY" examples/diffusers_ltx.py \
        --rung "rungs/$a.toml" --weights "$w" --engine-noise "$E" ${b:+--dtype "$b"} ${DIFFUSERS_ARGS:-} \
        > "$OUT/$name.out" 2> "$OUT/$name.err" < /dev/null
      note "$name rc=$?"
      ref=$(sed -n 's/^path: //p' "$OUT/$name.out" | tail -1)
      if [ -n "$ref" ] && [ -n "${last_bundle[$a]:-}" ]; then
        "$H" diff "${last_bundle[$a]}" "$ref" --store "$store" > "$OUT/diff-$a.md" 2>&1
        note "harness diff engine diffusers at rung $a rc=$? ($OUT/diff-$a.md)"
      else
        note "no diff at rung $a: run:$a first (engine bundle: ${last_bundle[$a]:-none}; diffusers: ${ref:-none})"
      fi
      pack ;;
    ref)
      p=$(preset_of "$a"); need "$p"
      read -r W Hh F S G SEED <<< "$(geometry "$a")"
      geo=(--weights "$(weights_of "$p")" --width "$W" --height "$Hh" --frames "$F" --seed "$SEED")
      export PYTHONPATH=${REF_SITE:+$REF_SITE:}${PYTHONPATH:-} PYTHONUNBUFFERED=1
      find "$(weights_of "$p")" -type f -exec cat {} + > /dev/null
      note "ref $a weights read into the page cache"
      timeout "$(cap 120)" "$PY" scripts/reference_ltx.py vae "${geo[@]}" --repeat 5 \
        --json "$OUT/ref-$a-vae.json" > "$OUT/ref-$a-vae.log" 2>&1
      note "ref $a vae rc=$?"
      timeout "$(cap ${REF_PIPELINE_S:-420})" "$PY" scripts/reference_ltx.py pipeline "${geo[@]}" --steps "$S" \
        --guidance "$G" --repeat "${REF_REPEAT:-2}" --arms "${REF_ARMS:-eager,compile}" \
        --json "$OUT/ref-$a-pipeline.json" \
        > "$OUT/ref-$a-pipeline.log" 2>&1
      note "ref $a pipeline rc=$?" ;;
    campaign)
      p=$(preset_of "${a%%,*}")
      # One --weights serves every run of the campaign: rungs of different presets
      # (2 is ltxv-2b, 3 is ltxv-13b) need one campaign step each.
      bad=""
      for r in ${a//,/ }; do
        q=$(preset_of "$r")
        if [ -z "$q" ]; then bad="rungs/$r.toml names no preset (missing file?)"; break; fi
        [ "$q" = "$p" ] || bad="its rungs use different presets ($p, $q); give one campaign step per preset"
      done
      [ -z "$bad" ] || { note "campaign $a $b: $bad"; continue; }
      need "$p"
      # --budget-s: stop before a run expected to outlast the deadline (it would be
      # killed and sealed interrupted, its time lost); 30 s are kept for packing.
      budget=$(( $(left) - 30 ))
      [ "$budget" -gt 0 ] || { note "campaign $a $b: no time left"; continue; }
      timeout -s TERM -k 30 "$(cap 3600)" "$H" campaign --rungs "$a" --levers "$b" \
        --repeat "$c" --weights-cache "${d:-as-is}" --engine "$E" --store "$store" --budget-s "$budget" \
        -- --weights "$(weights_of "$p")" \
        --cadence-ms 100 --quiet-wait-s 60 > "$OUT/campaign-$a-${b//,/+}.out" 2> "$OUT/campaign-$a-${b//,/+}.err" < /dev/null
      rc=$?
      # rc 1 is also a clean stop (the budget, an interrupted run): say which.
      note "campaign $a $b x$c cache ${d:-as-is} rc=$rc; $(grep -E '^(campaign [0-9a-f]+:|stopped:)' \
        "$OUT/campaign-$a-${b//,/+}.out" | tr '\n' ' ')"
      pack ;;
    t5check)
      need "$a"
      export PYTHONPATH=${REF_SITE:+$REF_SITE:}${PYTHONPATH:-} PYTHONUNBUFFERED=1
      eng=(--engine "engine=$E"); [ -n "${BEFORE_ENGINE:-}" ] && eng+=(--engine "before=$BEFORE_ENGINE")
      rm -rf "$WORK/t5check-$a"
      # Live against transformers where it is installed; else against the reference
      # recorded on these weights (engine/tests/goldens/t5_xxl_reference.safetensors,
      # the T5-XXL of ltxv-2b and ltxv-13b), which needs numpy alone.
      ref=(--record "$OUT/t5-reference-$a.safetensors" --masked cuda)
      recorded=engine/tests/goldens/t5_xxl_reference.safetensors
      if ! "$PY" -c 'import transformers, torch' 2>/dev/null && [ "$a" != tiny ] && [ -f "$recorded" ]; then
        ref=(--recorded "$recorded")
      fi
      timeout "$(cap 300)" "$PY" scripts/t5_check.py --weights "$(weights_of "$a")" --preset "$a" "${eng[@]}" \
        --out "$WORK/t5check-$a" "${ref[@]}" ${T5CHECK_ARGS:-} > "$OUT/t5check-$a.log" 2>&1
      rc=$?
      cp "$WORK/t5check-$a"/*.json "$WORK/t5check-$a"/*.log "$OUT/" 2>/dev/null
      note "t5check $a rc=$rc; $(grep -E '^t5-check' "$OUT/t5check-$a.log" | tr '\n' ' ')" ;;
    oracle)
      need "$a"
      export PYTHONPATH=${REF_SITE:+$REF_SITE:}${PYTHONPATH:-} PYTHONUNBUFFERED=1
      eng=(--engine "engine=$E"); [ -n "${BEFORE_ENGINE:-}" ] && eng+=(--engine "before=$BEFORE_ENGINE")
      rm -rf "$WORK/oracle-$a"
      timeout "$(cap 400)" "$PY" scripts/render_oracle.py --weights "$(weights_of "$a")" --preset "$a" \
        "${eng[@]}" --out "$WORK/oracle-$a" ${ORACLE_ARGS:-} > "$OUT/oracle-$a.log" 2>&1
      rc=$?
      cp "$WORK/oracle-$a"/*.json "$OUT/" 2>/dev/null
      mkdir -p "$OUT/oracle-$a-logs" && cp "$WORK/oracle-$a"/*.log "$OUT/oracle-$a-logs/" 2>/dev/null
      note "oracle $a rc=$rc; $(grep -E '^render-oracle' "$OUT/oracle-$a.log" | tr '\n' ' ')" ;;
    table) ;;
    pack) ;; # nothing to run: the final pack brings what an earlier call left behind
    *) note "unknown step $step"; exit 2 ;;
  esac
done
pack

echo "==================== table ===================="
cat "$OUT/sha256.txt"; head -1 "$OUT/env.txt"
cat "$log"
[ -f "$OUT/selftest.log" ] && grep -E 'passed, .* failed|FAIL|median|ms ' "$OUT/selftest.log" | tail -30
for f in "$OUT"/diff-*.md; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f") (engine, then diffusers under harness run --exec)"
  head -40 "$f"
done
for f in "$OUT"/t5check-*.log "$OUT"/oracle-*.log; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f")"
  sed -n '/^prompt  real/,$p;/^config  /,$p' "$f" | grep -v '^$' | head -80
done
"$PY" - "$H" "$store" "$OUT" <<'EOF'
import json, subprocess, sys, glob, os
h, store, out = sys.argv[1:4]
try:
    ls = json.loads(subprocess.run([h, "ls", "--store", store, "--json"], capture_output=True, text=True).stdout or "[]")
except Exception as e:
    ls = []; print("ls failed:", e)
before_sha = next((l.split()[0] for l in open(os.path.join(out, "sha256.txt")) if l.rstrip().endswith("engine-before")), None)
keep = ("load.text_encoder", "conditioning", "load.dit", "denoise", "load.vae", "decode.video", "artifacts.frames")
rows = {}
den = {}
for b in ls:
    d = json.loads(subprocess.run([h, "show", "--store", store, "--json", b["id"]], capture_output=True, text=True).stdout)
    ph = {p["name"]: p["duration_s"] for p in d["phases"] if p["depth"] == 0}
    prof = d["manifest"].get("profile")
    over = ",".join(f"{k}={v}" for k, v in sorted((b.get("levers") or {}).items()))
    if before_sha and d["manifest"].get("engine", {}).get("sha256") == before_sha:
        over = "engine-before" + ("," + over if over else "")  # never pooled with the current engine
    wall = b.get("run_wall_s") or 0
    print(f"{b['id'][:12]} rung {b['rung']} {prof}{'+' + over if over else ''} complete={b['complete']} exit={b['exit']} "
          f"run wall {wall:.2f} s engine wall {b.get('wall_s') or 0:.2f} s | " +
          " ".join(f"{k} {ph[k]:.2f}" for k in keep if k in ph))
    if prof == "default" and not over:
        rows.setdefault(b["rung"], []).append((wall, b.get("wall_s") or 0, ph))
    if prof == "default" and b.get("complete") and "denoise" in ph:
        den.setdefault(b["rung"], {}).setdefault(over or "default", []).append(ph["denoise"])
for f in sorted(glob.glob(os.path.join(out, "ref-*-*.json"))):
    r = json.load(open(f))
    rung = os.path.basename(f).split("-")[1]
    if r["mode"] == "vae":
        print(f"ref rung {rung} vae decode median {r['decode_ms_median']:.1f} ms (n={len(r['decode_ms'])}), torch {r['torch']} diffusers {r['diffusers']}")
        # The engine's decode against it, same card, same call (its decode.video
        # also brings the frames to the host; the reference's does not).
        for wall, ewall, ph in rows.get(rung, []):
            if "decode.video" in ph:
                d = ph["decode.video"] * 1e3
                print(f"  engine default: decode.video {d:.1f} ms / ref vae decode {r['decode_ms_median']:.1f} ms = {d / r['decode_ms_median']:.3f}x (frames to host included)")
    else:
        call = r["call_ms_median"] / 1e3; load = r["load_ms"] / 1e3
        cold = r.get("warm_up_ms", 0) / 1e3
        print(f"ref rung {rung} pipeline load {load:.2f} s, first call {cold:.2f} s, call median {call:.2f} s")
        for wall, ewall, ph in rows.get(rung, []):
            noload = sum(v for k, v in ph.items() if not k.startswith("load."))
            print(f"  engine default: engine wall {ewall:.2f} s / ref load+first call {load+cold:.2f} s = {ewall/(load+cold):.3f}x (both cold, neither counts interpreter or harness start); "
                  f"run wall {wall:.2f} s / ref load+first call = {wall/(load+cold):.3f}x (harness gates and sealing included); "
                  f"run wall / ref load+warm call {load+call:.2f} s = {wall/(load+call):.3f}x; "
                  f"non-load phases {noload:.2f} s / ref warm call {call:.2f} s = {noload/call:.3f}x (target <= 0.75)")
        # The denoise loop alone, engine against each reference arm (CUDA events around
        # the reference's loop, no per-step sync; the engine's `denoise` phase wall).
        for arm, ra in (r.get("arms") or {}).items():
            if ra.get("denoise_ms_median") is None:
                print(f"ref rung {rung} [{arm}] denoise not timed (forwards per call {ra.get('forwards_per_call')})")
                continue
            rd = ra["denoise_ms_median"] / 1e3
            print(f"ref rung {rung} [{arm}] denoise median {rd:.3f} s (n={len(ra['denoise_ms'])}, "
                  f"{ra['forwards_per_call']} forwards a call; warm-up call {ra['warm_up_ms']/1e3:.1f} s)")
            for label, ds in sorted(den.get(rung, {}).items()):
                m = sorted(ds)[len(ds) // 2]
                print(f"  engine {label}: denoise median {m:.3f} s (n={len(ds)}) / ref {arm} {rd:.3f} s = {m/rd:.3f}x")
EOF
echo "took $(( $(date +%s) - t0 )) s"
[ -s "$OUT/left-behind.txt" ] && echo "PACK: $(wc -l < "$OUT/left-behind.txt") bundle(s) LEFT BEHIND; call 'pack' at once: $(tr '\n' ' ' < "$OUT/left-behind.txt")"
# PACK_LOGS=1 (the device call sets it): every log into one logs.tgz, so that the
# bundle parts and the logs fit the device tool's 8 files.
if [ "${PACK_LOGS:-0}" = 1 ]; then
  ( cd "$OUT" && ls | grep -v -e '^bundles.tar.part' -e '^logs.tgz$' -e '^t5-reference-' > .list &&
    tar -czf logs.tgz -T .list && xargs rm -rf < .list && rm -f .list )
fi
