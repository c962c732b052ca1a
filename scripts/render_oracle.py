#!/usr/bin/env python3
"""Whole renders against diffusers' LTXPipeline on identical weights, prompt and noise (issue 18).

For each config (geometry, steps, guidance) it writes a rung, asks the engine for
that rung's noise streams (`engine noise`: initial latents and decode noise, as
the reference draws them), renders with diffusers in f32 (TF32 off) and in bf16
from exactly those numbers (the latents passed as `latents=`, the decode noise
handed to the pipeline's own draw), captures diffusers' f32 prompt embeddings,
and renders with the engine:

  (a)  own conditioning, device arm        `engine render` (the default levers)
  (a') own conditioning, `conditioning=host` (f32 T5 on the host)
  (b)  given diffusers' f32 embeddings      `--prompt-embeds`
  (c)  diffusers bf16 (the reference's own bf16 pipeline)
  (f)  own conditioning, device arm, `precision=fp8`        } with --variants f,bf:
  (bf) diffusers' f32 embeddings, `precision=fp8`           } measured, not judged

Every render's frames (8-bit RGB, every frame: the engine's PNGs, diffusers'
float frames quantized as the engine quantizes, round(255 * clamp(x))) are
compared with diffusers f32 as PSNR over all frames and channels.

Pass (specs/fidelity.md): (a') >= 45 dB; (a) no further from diffusers f32 than
(c) is. Engines labelled `before...` are measured but not judged, and so are the
fp8 renders (f) and (bf): the fp8 arm is judged by its campaign's fidelity rule
(specs/levers.toml), these say how far it is from diffusers f32.

Usage:
  render_oracle.py --weights DIR --engine [LABEL=]BIN [...] --out DIR
                   [--configs WxHxF:STEPS:GUIDANCE,...] [--preset ltxv-2b]
                   [--device cuda] [--engine-device cuda] [--seed 42] [--prompt P]
                   [--variants a,ah,b[,f,bf]]
Prints a table and `render-oracle: PASS|FAIL` last; exit 0 only on PASS.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ltx_files import max_tokens_of, read_safetensors, write_safetensors  # noqa: E402

DEFAULT_CONFIGS = "512x320x25:4:1,512x320x25:4:3,384x256x17:4:1,384x256x17:4:3"
PROMPT = "a red fox trotting through fresh snow at sunrise, cinematic"


def psnr(a, b):
    d = a.astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(d * d))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def to_u8(x):
    """The engine's quantization of a [0, 1] value (frames/mod.rs `to_u8`)."""
    return np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)


def read_frames(d, n):
    from PIL import Image

    out = []
    for i in range(n):
        p = os.path.join(d, f"frame_{i:05}.png")
        out.append(np.asarray(Image.open(p).convert("RGB")))
    return np.stack(out)


def parse_configs(s):
    out = []
    for c in s.split(","):
        geo, steps, g = c.split(":")
        w, h, f = (int(x) for x in geo.split("x"))
        out.append({"width": w, "height": h, "frames": f, "steps": int(steps), "guidance": float(g),
                    "name": f"{w}x{h}x{f}-s{steps}-g{g}"})
    return out


class Diffusers:
    """One LTXPipeline per dtype, loaded once, called per config."""

    def __init__(self, weights, device, dtype_name):
        import torch
        from diffusers import LTXPipeline

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_grad_enabled(False)
        self.torch = torch
        self.dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        t0 = time.time()
        self.pipe = LTXPipeline.from_pretrained(weights, torch_dtype=self.dtype).to(device)
        self.pipe.set_progress_bar_config(disable=True)
        self.load_s = time.time() - t0
        self.device = device

    def render(self, cfg, noise, prompt, negative, fps, decode_timestep, decode_noise_scale, max_tokens):
        import diffusers.pipelines.ltx.pipeline_ltx as pl

        torch = self.torch
        lat = torch.from_numpy(noise["latents"].copy()).to(self.device)
        dn = torch.from_numpy(noise["decode_noise"].copy()).to(self.device)
        drawn = []

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            # The pipeline's only draw when latents are given: the decode noise.
            assert tuple(shape) == tuple(dn.shape), (shape, dn.shape)
            drawn.append(tuple(shape))
            return dn.to(device=device, dtype=dtype)

        captured = {}
        enc = self.pipe.encode_prompt

        def encode_prompt(*a, **k):
            r = enc(*a, **k)
            captured["r"] = r
            return r

        saved = pl.randn_tensor
        pl.randn_tensor = randn
        self.pipe.encode_prompt = encode_prompt
        try:
            t0 = time.time()
            video = self.pipe(
                prompt=prompt, negative_prompt=negative, width=cfg["width"], height=cfg["height"],
                num_frames=cfg["frames"], frame_rate=fps, num_inference_steps=cfg["steps"],
                guidance_scale=cfg["guidance"], latents=self.pipe._pack_latents(lat, 1, 1),
                decode_timestep=decode_timestep, decode_noise_scale=decode_noise_scale,
                max_sequence_length=max_tokens, output_type="np", return_dict=False)[0][0]
            wall = time.time() - t0
        finally:
            pl.randn_tensor = saved
            del self.pipe.encode_prompt
        if decode_noise_scale and not drawn:
            raise RuntimeError("diffusers never drew the decode noise: the oracle would compare different noise")
        pe, pm, ne, nm = captured["r"]
        emb = (pe[0].float().cpu().numpy(), pm[0].float().cpu().numpy(),
               None if ne is None else ne[0].float().cpu().numpy(),
               None if nm is None else nm[0].float().cpu().numpy())
        return to_u8(np.asarray(video)), emb, wall


def run_engine(a, binary, rung, out_dir, extra):
    # release-pages=off keeps the weights in the page cache between the renders
    # (it changes no number the engine computes).
    cmd = [binary, "render", "--rung", rung, "--weights", a.weights, "--out", out_dir, "--all-frames",
           "--device", a.engine_device, "--lever", "release-pages=off"] + extra
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    open(out_dir + ".log", "w").write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    return r.returncode, time.time() - t0, r.stderr.strip().splitlines()[-1:] if r.returncode else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--engine", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--preset", default="ltxv-2b")
    ap.add_argument("--device", default="cuda", help="diffusers' device")
    ap.add_argument("--engine-device", default="cuda", help="the engine's arm for the DiT and VAE")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--negative", default="")
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--max-tokens", type=int, help="token budget (default: the tokenizer's model_max_length)")
    ap.add_argument("--decode-timestep", type=float, default=0.05)
    ap.add_argument("--decode-noise-scale", type=float, default=0.025)
    ap.add_argument("--before-configs", type=int, default=2,
                    help="render the `before` engines at the first N configs only")
    ap.add_argument("--before-variants", default="a",
                    help="which renders of the `before` engines: a (device conditioning), ah (host), b")
    ap.add_argument("--variants", default="a,ah,b",
                    help="which renders of the judged engines: a, ah and b (judged when listed), "
                         "f and bf (precision=fp8 with own conditioning / diffusers' embeddings, "
                         "measured only)")
    a = ap.parse_args()
    a.max_tokens = a.max_tokens or max_tokens_of(a.weights)
    os.makedirs(a.out, exist_ok=True)
    configs = parse_configs(a.configs)
    engines = [(s.split("=", 1) if "=" in s else ("engine", s)) for s in a.engine]

    # Noise and rungs first (cheap), then each reference dtype once over every config.
    for c in configs:
        c["rung"] = os.path.join(a.out, c["name"] + ".toml")
        with open(c["rung"], "w") as f:
            f.write(f'preset = "{a.preset}"\nwidth = {c["width"]}\nheight = {c["height"]}\n'
                    f'frames = {c["frames"]}\nsteps = {c["steps"]}\nguidance = {c["guidance"]}\n'
                    f'seed = {a.seed}\nfps = {a.fps}\ndevice = "{a.engine_device}"\n'
                    f'prompt = {json.dumps(a.prompt)}\nnegative_prompt = {json.dumps(a.negative)}\n')
        nf = os.path.join(a.out, c["name"] + "-noise.safetensors")
        subprocess.run([engines[-1][1], "noise", "--rung", c["rung"], "--out", nf], check=True)
        c["noise"] = read_safetensors(nf)[0]
    ref = {}
    for dt in ("f32", "bf16"):
        d = Diffusers(a.weights, a.device, dt)
        print(f"diffusers {dt}: loaded in {d.load_s:.1f} s", flush=True)
        for c in configs:
            frames, emb, wall = d.render(c, c["noise"], a.prompt, a.negative, a.fps, a.decode_timestep,
                                         a.decode_noise_scale, a.max_tokens)
            ref[(dt, c["name"])] = frames
            if dt == "f32":
                c["embeds"] = os.path.join(a.out, c["name"] + "-embeds.safetensors")
                pe, pm, ne, nm = emb
                t = {"embeds": pe, "mask": pm}
                if c["guidance"] > 1:
                    t.update(negative_embeds=ne, negative_mask=nm)
                write_safetensors(c["embeds"], {k: np.asarray(v, dtype=np.float32) for k, v in t.items()})
            print(f"  {dt} {c['name']}: {frames.shape} in {wall:.1f} s", flush=True)
        del d
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:
            pass

    rows, verdicts = [], []
    print("\nconfig               | render                                            | PSNR vs diffusers f32 | note",
          flush=True)

    def add(name, what, p, note):
        rows.append((name, what, p, note))
        print(f"{name:<20} | {what:<49} | {p:>8.2f} dB           | {note}", flush=True)

    fp8 = ["--lever", "precision=fp8"]
    variants = {"a": ("(a) own conditioning, device arm", lambda c: []),
                "ah": ("(a') own conditioning, conditioning=host", lambda c: ["--lever", "conditioning=host"]),
                "b": ("(b) diffusers' embeddings", lambda c: ["--prompt-embeds", c["embeds"]]),
                "f": ("(f) own conditioning, precision=fp8", lambda c: fp8),
                "bf": ("(bf) diffusers' embeddings, precision=fp8",
                       lambda c: ["--prompt-embeds", c["embeds"]] + fp8)}
    judged_variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in judged_variants + a.before_variants.split(",") if v and v not in variants]
    if unknown:
        sys.exit(f"render_oracle.py: --variants/--before-variants: unknown {unknown}; "
                 f"expected some of {sorted(variants)}")
    # The judged engines over every config first, then the `before` engines
    # (first --before-configs configs, --before-variants): a deadline cuts
    # the unjudged part.
    jobs = []
    for c in configs:
        jobs.append((c, None, None, None))
        for label, binary in engines:
            if not label.startswith("before"):
                jobs += [(c, label, binary, v) for v in judged_variants]
    for label, binary in engines:
        if label.startswith("before"):
            jobs += [(c, label, binary, v) for c in configs[:a.before_configs]
                     for v in a.before_variants.split(",")]
    for c, label, binary, v in jobs:
        base = ref[("f32", c["name"])]
        if label is None:
            add(c["name"], "(c) diffusers bf16", psnr(ref[("bf16", c["name"])], base), "")
            continue
        what, extra = variants[v][0], variants[v][1](c)
        out_dir = os.path.join(a.out, f"{c['name']}-{label}-{v}")
        rc, wall, err = run_engine(a, binary, c["rung"], out_dir, extra)
        if rc != 0:
            add(c["name"], f"{label} {what}", float("nan"), f"exit {rc}: {err}")
            continue
        add(c["name"], f"{label} {what}", psnr(read_frames(out_dir, base.shape[0]), base), f"{wall:.1f} s")
        json.dump({"rows": rows}, open(os.path.join(a.out, "render_oracle.json"), "w"), indent=1, default=str)
    # Verdicts per config for every judged engine.
    failed = False
    for c in configs:
        cr = {w: p for (name, w, p, _) in rows if name == c["name"]}
        floor = cr["(c) diffusers bf16"]
        for label, _ in engines:
            if label.startswith("before"):
                continue
            if not ("a" in judged_variants and "ah" in judged_variants):
                continue  # the verdict needs both; --variants left one out
            host = cr.get(f"{label} (a') own conditioning, conditioning=host", float("nan"))
            dev = cr.get(f"{label} (a) own conditioning, device arm", float("nan"))
            ok_h, ok_d = host >= 45.0, dev >= floor
            verdicts.append((c["name"], label, ok_h, ok_d, host, dev, floor))
            failed = failed or not (ok_h and ok_d)
    json.dump({"rows": rows, "configs": [{k: v for k, v in c.items() if k != "noise"} for c in configs]},
              open(os.path.join(a.out, "render_oracle.json"), "w"), indent=1, default=str)
    print()
    for name, label, ok_h, ok_d, host, dev, floor in verdicts:
        print(f"render-oracle {name} {label}: (a') host {host:.2f} dB {'>=' if ok_h else '<'} 45 "
              f"{'PASS' if ok_h else 'FAIL'}; (a) device {dev:.2f} dB {'>=' if ok_d else '<'} (c) {floor:.2f} "
              f"{'PASS' if ok_d else 'FAIL'}")
    if not verdicts:
        print("render-oracle: NOT JUDGED (--variants leaves out a or ah)")
        sys.exit(0)
    print(f"render-oracle: {'FAIL' if failed else 'PASS'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
