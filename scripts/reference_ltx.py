#!/usr/bin/env python3
"""The PyTorch + diffusers reference for the engine's GPU benchmarks (issue 7).

It loads the SAME weights directory the engine renders from (diffusers layout, as
`engine synth-weights` writes it) through diffusers' own loaders, and times:

  vae       AutoencoderKLLTXVideo.decode of random latents at a geometry (bf16,
            timestep-conditioned when the VAE is), CUDA-synchronized wall per decode;
  pipeline  LTXPipeline at a rung's geometry, steps and guidance: the load
            (from_pretrained + .to(device)) and each call (text encoding, denoise,
            decode to float frames), wall-clock; and each call's denoise loop alone,
            by CUDA events recorded before the transformer's first forward and after
            its last (no per-step synchronization), for each arm of --arms in one
            process on the same weights: `eager` (as loaded), `compile`
            (`torch.compile(transformer)`, default mode) and `compile-max`
            (mode max-autotune); a compiled arm's first call (compilation included)
            is its warm-up, reported as `warm_up_ms`, never timed.

Usage:
  reference_ltx.py vae      --weights DIR --width W --height H --frames F [--repeat N]
  reference_ltx.py pipeline --weights DIR --width W --height H --frames F --steps S
                            --guidance G [--seed N] [--prompt P] [--negative P] [--repeat N]
                            [--arms eager,compile,compile-max]
  common: [--device cuda|cpu] [--dtype bf16|f32] [--json OUT]

Prints one line per timed repetition and a JSON summary (also written to --json):
medians in milliseconds (and the untimed-for-the-median first call, `warm_up_ms`, which
a cold process pays), the versions of torch and diffusers, the device name.
Numbers from it are only meaningful beside the engine's, measured in the same call
on the same machine (scripts/device-bench-gpu.sh does that).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["vae", "pipeline"])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--height", type=int, required=True)
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prompt", default="a red fox trotting through fresh snow at sunrise, cinematic")
    ap.add_argument("--negative", default="")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--decode-timestep", type=float, default=0.05)
    ap.add_argument("--decode-noise-scale", type=float, default=0.025)
    ap.add_argument("--arms", default="eager",
                    help="pipeline: comma-separated arms in order (eager, compile, compile-max)")
    ap.add_argument("--json")
    return ap.parse_args()


def sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def timed(a, label, what, call):
    """Run `call` a.repeat + 1 times, CUDA-synchronized wall per call; the first is
    the warm-up (what a cold process pays). Prints one line per call and returns
    (warm-up ms, the timed calls' ms, the last output's shape)."""
    warm_up, times, shape = None, [], None
    for i in range(a.repeat + 1):
        sync(a.device)
        t = time.perf_counter()
        out = call()
        sync(a.device)
        ms = (time.perf_counter() - t) * 1e3
        shape = list(out.shape)
        print(f"{label} {'warm-up' if i == 0 else i}: {ms:.1f} ms, {what} {shape}", flush=True)
        if i == 0:
            warm_up = ms
        else:
            times.append(ms)
        del out
    return warm_up, times, shape


def latent_grid(a, vae_cfg):
    sp = vae_cfg.get("spatial_compression_ratio") or 32
    tp = vae_cfg.get("temporal_compression_ratio") or 8
    if (a.frames - 1) % tp or a.width % sp or a.height % sp:
        sys.exit(
            f"geometry {a.width}x{a.height}x{a.frames}: width and height must be multiples of "
            f"{sp} and frames - 1 a multiple of {tp}"
        )
    return (a.frames - 1) // tp + 1, a.height // sp, a.width // sp


def run_vae(a, dtype):
    from diffusers import AutoencoderKLLTXVideo

    t0 = time.perf_counter()
    vae = AutoencoderKLLTXVideo.from_pretrained(a.weights, subfolder="vae", torch_dtype=dtype)
    vae = vae.to(a.device).eval()
    sync(a.device)
    load_ms = (time.perf_counter() - t0) * 1e3
    f, h, w = latent_grid(a, vae.config)
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    z = torch.randn((1, vae.config.latent_channels, f, h, w), generator=g).to(a.device, dtype)
    temb = None
    if getattr(vae.config, "timestep_conditioning", False):
        temb = torch.tensor([a.decode_timestep], device=a.device, dtype=dtype)
    with torch.no_grad():
        warm_up, times, shape = timed(
            a, "vae decode", "output", lambda: vae.decode(z, temb=temb, return_dict=False)[0]
        )
    peak = torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else None
    return {
        "load_ms": load_ms,
        "warm_up_ms": warm_up,
        "latent_grid": [f, h, w],
        "output_shape": shape,
        "decode_ms": times,
        "decode_ms_median": statistics.median(times),
        "peak_device_bytes": peak,
    }


class DenoiseEvents:
    """CUDA events around a pipeline call's denoise loop: one recorded before the
    transformer's first forward of the call and one after each forward (the last
    one stands), by module hooks that enqueue an event and never synchronize."""

    def __init__(self, module, device):
        self.on = device.startswith("cuda")
        self.reset()
        module.register_forward_pre_hook(self.pre)
        module.register_forward_hook(self.post)

    def reset(self):
        self.start, self.end, self.forwards = None, None, 0

    def pre(self, _module, _args):
        if self.on and self.start is None:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def post(self, _module, _args, _out):
        self.forwards += 1
        if self.on:
            self.end = torch.cuda.Event(enable_timing=True)
            self.end.record()

    def ms(self):
        if not self.on or self.start is None or self.end is None:
            return None
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def run_pipeline(a, dtype):
    from diffusers import LTXPipeline

    t0 = time.perf_counter()
    pipe = LTXPipeline.from_pretrained(a.weights, torch_dtype=dtype).to(a.device)
    sync(a.device)
    load_ms = (time.perf_counter() - t0) * 1e3
    print(f"pipeline load: {load_ms:.1f} ms", flush=True)
    eager = pipe.transformer

    def call():
        g = torch.Generator(device=a.device).manual_seed(a.seed)
        return pipe(
            prompt=a.prompt,
            negative_prompt=a.negative,
            width=a.width,
            height=a.height,
            num_frames=a.frames,
            num_inference_steps=a.steps,
            guidance_scale=a.guidance,
            decode_timestep=a.decode_timestep,
            decode_noise_scale=a.decode_noise_scale,
            generator=g,
            output_type="np",
            return_dict=False,
        )[0]

    arms = {}
    for arm in [x.strip() for x in a.arms.split(",") if x.strip()]:
        if arm == "eager":
            pipe.transformer = eager
        elif arm in ("compile", "compile-max"):
            mode = "max-autotune" if arm == "compile-max" else None
            pipe.transformer = torch.compile(eager, mode=mode)
        else:
            sys.exit(f"--arms: unknown arm '{arm}' (eager, compile, compile-max)")
        ev = DenoiseEvents(pipe.transformer, a.device)
        denoise = []

        def timed_call():
            ev.reset()
            out = call()
            denoise.append(ev.ms())
            return out

        warm_up, times, shape = timed(a, f"pipeline call [{arm}]", "frames", timed_call)
        steady = [d for d in denoise[1:] if d is not None]
        for i, d in enumerate(denoise):
            print(f"denoise [{arm}] {'warm-up' if i == 0 else i}: "
                  f"{'n/a' if d is None else f'{d:.1f} ms'} over {ev.forwards} forwards", flush=True)
        arms[arm] = {
            "warm_up_ms": warm_up,
            "call_ms": times,
            "call_ms_median": statistics.median(times),
            "denoise_warm_up_ms": denoise[0],
            "denoise_ms": steady,
            "denoise_ms_median": statistics.median(steady) if steady else None,
            "forwards_per_call": ev.forwards,
        }
    peak = torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else None
    first = next(iter(arms.values()))
    return {
        "load_ms": load_ms,
        # The first arm's figures at the top level, as before --arms existed.
        "warm_up_ms": first["warm_up_ms"],
        "output_shape": shape,
        "call_ms": first["call_ms"],
        "call_ms_median": first["call_ms_median"],
        "arms": arms,
        "peak_device_bytes": peak,
    }


def main():
    a = parse()
    torch.set_grad_enabled(False)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    import diffusers

    res = run_vae(a, dtype) if a.mode == "vae" else run_pipeline(a, dtype)
    res.update(
        {
            "mode": a.mode,
            "geometry": [a.width, a.height, a.frames],
            "steps": a.steps,
            "guidance": a.guidance,
            "dtype": a.dtype,
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu",
        }
    )
    s = json.dumps(res, indent=1)
    print(s)
    if a.json:
        # Written beside and renamed: a killed run leaves no half-written summary.
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            f.write(s + "\n")
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
