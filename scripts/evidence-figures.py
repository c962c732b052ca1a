#!/usr/bin/env python3
"""Figures the README, the spec and reports/device-notes.md quote across several
bundles, recomputed from the bundles themselves (no figure in those files should
come from ad-hoc shell).

    scripts/evidence-figures.py cadence STORE (--campaign ID | ID)...
        per bundle and in total: deadlines without a sample (slots the recording
        spans at the expected period, less the samples, as `harness show` counts
        them), the longest interval, the sampler's `gpu_slow` p99 and whether it ran
        off the tick, the p99 of how late ticks fired (tick_lag_ns) and the rows
        holding an energy reading (both from samples.parquet; need pyarrow, e.g.
        target/pyenv/bin/python after `just test`)
    scripts/evidence-figures.py first-cached STORE (--campaign ID | ID)...
        per bundle: the share of the weight files' bytes in the page cache in the
        first sample that read it (needs pyarrow)
    scripts/evidence-figures.py gpm-cost STORE (--all | --campaign ID | ID)...
        what a GPM read costs (issue 33), per GPU over the bundles that sampled
        GPM: bundles and reads (`sampler.tick_cost_parts_us.gpm`: one read per
        window of at least 100 ms, on its own thread), the median of the bundles'
        median reads, of their means and of their p99s, and the worst read

    scripts/evidence-figures.py decode-parts STORE (--campaign ID | ID)...
        per bundle: the `decode.video` phase's wall and, summed over its
        `decode.video.chunk` closes, the device span, cuDNN plan milliseconds,
        host waits and enqueue time; then each chunk's wall, enqueue + wait,
        device span and frames; the close's setup/collect/free/latents
        milliseconds where the engine records them; and load.vae's wall with what
        `vae-prepare = load` made there (plans, their milliseconds, the buffers'
        and the pinned sink's) (needs pyarrow)

STORE is a store directory (`reports/evidence`); an ID is a bundle id or a unique
prefix of one; `--campaign ID` selects every bundle of that campaign (id or prefix);
`--all` every bundle.
"""
import statistics
import json
import math
import os
import sys


def die(msg):
    print(f"evidence-figures: {msg}", file=sys.stderr)
    sys.exit(2)


def bundles(store, args):
    root = os.path.join(store, "bundles")
    try:
        names = sorted(os.listdir(root))
    except OSError as e:
        die(f"{root}: {e.strerror}")
    chosen, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--all":
            chosen += names
            i += 1
            continue
        if a == "--campaign":
            if i + 1 == len(args):
                die("--campaign needs an id")
            camp = args[i + 1]
            found = [n for n in names
                     if manifest(root, n).get("schedule", {}) and
                     str(manifest(root, n)["schedule"].get("campaign", "")).startswith(camp)]
            if not found:
                die(f"no bundle of campaign {camp} under {root}")
            chosen += found
            i += 2
            continue
        found = [n for n in names if n.startswith(a)]
        if len(found) != 1:
            die(f"{a}: {len(found)} bundles under {root} start with it (want exactly 1)")
        chosen += found
        i += 1
    if not chosen:
        die("no bundles named")
    return root, sorted(set(chosen))


_manifests = {}


def manifest(root, name):
    if name not in _manifests:
        path = os.path.join(root, name, "manifest.json")
        try:
            with open(path) as f:
                _manifests[name] = json.load(f)
        except (OSError, ValueError) as e:
            die(f"{path}: {e}")
    return _manifests[name]


def column(root, name, col):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    path = os.path.join(root, name, "samples.parquet")
    return pq.read_table(path, columns=[col]).column(0).to_pylist()


def cadence(root, names):
    total_missed = total_slots = 0
    p99s, maxes, energy_note = [], [], []
    print("bundle        samples  slots  missed  max_interval_ms  gpu_slow_p99_ms  lag_p99_ms  energy_rows")
    for n in names:
        m = manifest(root, n)
        c = m.get("cadence", {})
        e, a, b = c.get("expected_ms"), c.get("first_t_ns"), c.get("last_t_ns")
        if not e or a is None or b is None:
            die(f"{n[:12]}: no cadence span recorded")
        slots = round((b - a) / 1e6 / e) + 1
        missed = max(slots - c["samples"], 0)
        total_missed += missed
        total_slots += slots
        maxes.append(c.get("max_interval_ms") or float("nan"))
        s = m.get("sampler", {})
        g = s.get("tick_cost_parts_us", {}).get("gpu_slow")
        off = "gpu_slow" in s.get("off_tick_parts", [])
        p99 = g["p99_us"] / 1e3 if g else float("nan")
        if g:
            p99s.append(p99)
        lag = column(root, n, "tick_lag_ns")
        lags = sorted(v for v in (lag or []) if v is not None)
        lag_p99 = f"{lags[round(0.99 * (len(lags) - 1))] / 1e6:10.2f}" if lags else "         -"
        energy = column(root, n, "gpu_energy_mj")
        if energy is None:
            rows = "- (no pyarrow)"
        else:
            vals = [v for v in energy if v is not None]
            mono = all(y >= x for x, y in zip(vals, vals[1:]))
            rows = f"{len(vals)} of {len(energy)}{'' if mono else ' NOT monotonic'}"
            energy_note.append(len(vals))
        print(f"{n[:12]}  {c['samples']:7d}  {slots:5d}  {missed:6d}  {maxes[-1]:15.1f}  "
              f"{p99:12.2f}{' off' if off else ' on '}  {lag_p99}  {rows}")
    print(f"total: {total_missed} of {total_slots} deadlines without a sample over {len(names)} bundles")
    if p99s:
        p99s.sort()
        print(f"gpu_slow p99: {p99s[0]:.2f}-{p99s[-1]:.2f} ms (median of bundles {p99s[len(p99s) // 2]:.2f})")
    finite = [x for x in maxes if not math.isnan(x)]
    if finite:
        print(f"longest interval: {max(finite):.1f} ms")


def first_cached(root, names):
    print("bundle        first_cached_share")
    for n in names:
        m = manifest(root, n)
        total = sum(f["bytes"] for f in m.get("weights", {}).get("files", []))
        vals = column(root, n, "weights_cached_bytes")
        if vals is None:
            die("first-cached needs pyarrow (target/pyenv/bin/python after `just test`)")
        first = next((v for v in vals if v is not None), None)
        share = "-" if first is None or total == 0 else f"{100.0 * first / total:.1f}%"
        print(f"{n[:12]}  {share}")


def gpm_cost(root, names):
    by_gpu = {}
    for n in names:
        m = manifest(root, n)
        g = ((m.get("sampler") or {}).get("tick_cost_parts_us") or {}).get("gpm")
        if g and g.get("ticks"):
            by_gpu.setdefault((m.get("gpu") or {}).get("name") or "?", []).append(g)
    if not by_gpu:
        print("no bundle records GPM reads")
        return
    med = statistics.median
    for gpu, gs in sorted(by_gpu.items()):
        print(f"{gpu}: {len(gs)} bundle(s), {sum(g['ticks'] for g in gs)} reads; "
              f"median read {med([g['median_us'] for g in gs]) / 1e3:.2f} ms, "
              f"median of means {med([g['mean_us'] for g in gs]) / 1e3:.2f} ms, "
              f"median p99 {med([g['p99_us'] for g in gs]) / 1e3:.1f} ms, "
              f"worst {max(g['max_us'] for g in gs) / 1e3:.1f} ms")


def decode_parts(root, names):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        die("decode-parts needs pyarrow (target/pyenv/bin/python after `just test`)")
    print("bundle        decode.video_s  device_ms  plan_ms  wait_ms  enqueue_ms  chunks")
    for n in names:
        d = os.path.join(root, n)
        closes = [(r["name"], json.loads(r["attrs_json"] or "{}"))
                  for r in pq.read_table(os.path.join(d, "markers.parquet")).to_pylist()
                  if r["ev"] == "close" and r["name"] in ("decode.video", "decode.video.chunk", "load.vae")]
        load = [a for name, a in closes if name == "load.vae"]
        chunks = [a for name, a in closes if name == "decode.video.chunk"]
        whole = [a for name, a in closes if name == "decode.video"]
        walls = [r for r in pq.read_table(os.path.join(d, "phases.parquet")).to_pylist()
                 if r["name"] in ("decode.video", "decode.video.chunk", "load.vae")]
        phase = [r["duration_s"] for r in walls if r["name"] == "decode.video"]
        if not whole or not phase or not chunks:
            die(f"{n[:12]}: no device decode.video with chunks recorded")
        if any(k not in a for a in chunks for k in ("device_ms", "plan_ms", "wait_ms", "enqueue_ms")):
            die(f"{n[:12]}: a decode.video.chunk close lacks the device split (CPU arm?)")
        tot = lambda k: sum(a[k] for a in chunks)
        print(f"{n[:12]}  {phase[0]:14.3f}  {whole[0].get('device_ms', float('nan')):9.1f}  "
              f"{tot('plan_ms'):7.1f}  {tot('wait_ms'):7.1f}  {tot('enqueue_ms'):10.1f}  {len(chunks)}")
        chunk_walls = [r["duration_s"] for r in walls if r["name"] == "decode.video.chunk"]
        for i, (a, w) in enumerate(zip(chunks, chunk_walls)):
            print(f"    chunk {i}: wall {w * 1e3:.1f} ms, enqueue+wait "
                  f"{a['enqueue_ms'] + a['wait_ms']:.1f} ms, device {a['device_ms']:.1f} ms, "
                  f"frames {a.get('frames', '-')}")
        extra = [f"{k} {whole[0][k]:.1f} ms" for k in ("setup_ms", "collect_ms", "free_ms", "latents_ms")
                 if k in whole[0]]
        if extra:
            print("    " + ", ".join(extra))
        # vae-prepare: what load.vae made ahead for the decode (absent on the decode arm).
        if load:
            la = load[0]
            lw = [r["duration_s"] for r in walls if r["name"] == "load.vae"]
            made = [f"{k} {la[k]:.1f} ms" for k in ("decode_plan_ms", "decode_alloc_ms", "decode_sink_ms")
                    if k in la]
            print(f"    load.vae {lw[0]:.3f} s, vae_prepare {la.get('vae_prepare', '-')}"
                  + (f", {la.get('decode_plans', '-')} plans; " + ", ".join(made) if made else ""))


COMMANDS = {"cadence": cadence, "first-cached": first_cached, "gpm-cost": gpm_cost,
            "decode-parts": decode_parts}


def main(argv):
    if len(argv) < 3 or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    root, names = bundles(argv[1], argv[2:])
    COMMANDS[argv[0]](root, names)


if __name__ == "__main__":
    main(sys.argv[1:])
