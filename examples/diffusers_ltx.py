#!/usr/bin/env python3
"""diffusers' LTXPipeline as an engine the harness can wrap: it renders a rung and
speaks the marker protocol (specs/markers.md), so `harness run --exec` measures
the reference exactly as it measures `engine render`, into a bundle `harness diff`
can hold beside the engine's.

    harness run --rung rungs/2.toml --weights DIR --store S \\
        --exec -- python3 examples/diffusers_ltx.py --rung rungs/2.toml --weights DIR

Options: --rung FILE (geometry, steps, guidance, seed, prompt, negative prompt,
fps), --weights DIR (a diffusers directory; `engine synth-weights` writes one),
--out DIR (default $HARNESS_FRAMES_DIR), --dtype bf16|f32 (default bf16),
--device cuda|cpu (default cuda when torch sees one), --decode-timestep and
--decode-noise-scale (default 0.05 and 0.025, the 0.9.5+ VAE's), --engine-noise BIN (take
the initial latents and the decode noise from `BIN noise --rung FILE`, the
engine's own streams, so the frames are comparable with the engine's; default:
torch's generator seeded with the rung's seed, as a user of LTXPipeline gets).

Phases: load.runtime (the interpreter's imports of torch, diffusers and
transformers: the reference's start-up cost), load.text_encoder, load.dit,
load.vae (each component from_pretrained and
moved to the device), then one LTXPipeline call, marked from its own hooks:
conditioning (encode_prompt), denoise (one denoise.step per scheduler step, one
dit.forward tick per transformer call with its device time from CUDA events; with
guidance diffusers batches the two prompts into one forward of batch 2), and
decode.video (latent unpacking, decode noise, VAE decode, post-processing); then
artifacts.frames (video.y4m C444 and the first, middle and last PNGs, as the
engine writes them). Closes carry peak_device_bytes (torch's allocator) and
peak_host_bytes (VmHWM, reset per phase through /proc/self/clear_refs where the
kernel allows).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import tomllib


class Markers:
    """The marker channel (HARNESS_MARKER_FD) and the human lines on stderr."""

    def __init__(self):
        fd = os.environ.get("HARNESS_MARKER_FD")
        self.ch = None
        if fd is not None:
            os.set_inheritable(int(fd), False)
            self.ch = os.fdopen(int(fd), "w", buffering=1)
        self.open_t = {}

    def ev(self, kind, **kw):
        line = json.dumps({"ev": kind, "t_ns": time.monotonic_ns(), **kw})
        if self.ch is not None:
            try:
                self.ch.write(line + "\n")
            except OSError as e:  # the harness died: say so once, keep rendering
                print(f"diffusers_ltx: marker channel lost: {e}", file=sys.stderr)
                self.ch = None

    def open(self, name, attrs=None):
        self.open_t[name] = time.monotonic()
        reset_peaks()
        self.ev("open", name=name, **({"attrs": attrs} if attrs else {}))
        print(f"+{name}", file=sys.stderr, flush=True)

    def close(self, name, attrs=None):
        a = dict(attrs or {})
        a.update(peaks())
        self.ev("close", name=name, attrs=a)
        dt = time.monotonic() - self.open_t.pop(name, time.monotonic())
        print(f"-{name} {dt:.3f}s", file=sys.stderr, flush=True)

    def tick(self, name, attrs):
        self.ev("tick", name=name, attrs=attrs)
        print(f"~{name} {attrs.get('step')}/{attrs.get('steps')} #{attrs.get('forward')}", file=sys.stderr,
              flush=True)


_torch = None


def reset_peaks():
    if _torch is not None and _torch.cuda.is_available():
        _torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peaks():
    out = {}
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                out["peak_host_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    if _torch is not None and _torch.cuda.is_available():
        out["peak_device_bytes"] = int(_torch.cuda.max_memory_allocated())
    return out


def write_frames(frames, out, fps):
    """frames: uint8 [F, H, W, 3]. video.y4m (C444, BT.601 full range, the
    engine's conversion) and first/middle/last PNGs."""
    import numpy as np
    from PIL import Image

    f, h, w, _ = frames.shape
    rgb = frames.astype(np.float64)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]

    def q(x):
        return np.clip(np.floor(x + 0.5), 0, 255).astype(np.uint8)

    y = q(0.299 * r + 0.587 * g + 0.114 * b)
    cb = q(128.0 - 0.168736 * r - 0.331264 * g + 0.5 * b)
    cr = q(128.0 + 0.5 * r - 0.418688 * g - 0.081312 * b)
    tmp = os.path.join(out, "video.y4m.part")
    with open(tmp, "wb") as v:
        v.write(f"YUV4MPEG2 W{w} H{h} F{int(fps)}:1 Ip A1:1 C444 XCOLORRANGE=FULL\n".encode())
        for i in range(f):
            v.write(b"FRAME\n")
            v.write(y[i].tobytes())
            v.write(cb[i].tobytes())
            v.write(cr[i].tobytes())
        v.flush()
        os.fsync(v.fileno())
    os.replace(tmp, os.path.join(out, "video.y4m"))
    for name, i in (("first", 0), ("middle", (f - 1) // 2), ("last", f - 1)):
        Image.fromarray(frames[i]).save(os.path.join(out, f"{name}.png"))
    return w, h


def main():
    global _torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rung", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--out", default=os.environ.get("HARNESS_FRAMES_DIR"))
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--device")
    ap.add_argument("--engine-noise", help="an engine binary whose `noise` command gives the streams")
    ap.add_argument("--decode-timestep", type=float, default=0.05)
    ap.add_argument("--decode-noise-scale", type=float, default=0.025)
    ap.add_argument("--offload", action="store_true",
                    help="move the text encoder to the host once the prompts are encoded and the "
                         "transformer once the last step is done, so that f32 13B fits an 80 GB card "
                         "(the numbers are unchanged: each model is moved after its last use)")
    a = ap.parse_args()
    if not a.out:
        sys.exit("diffusers_ltx: no output directory (--out or HARNESS_FRAMES_DIR)")
    try:
        rung = tomllib.load(open(a.rung, "rb"))
        width, height, frames_n = int(rung["width"]), int(rung["height"]), int(rung["frames"])
        steps, guidance, seed = int(rung["steps"]), float(rung.get("guidance", 1.0)), int(rung.get("seed", 0))
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as e:
        sys.exit(f"diffusers_ltx: {a.rung}: {e}")
    prompt = rung.get("prompt", "")
    negative = rung.get("negative_prompt", "")
    fps = float(rung.get("fps", 25.0))
    os.makedirs(a.out, exist_ok=True)

    m = Markers()
    # The interpreter's imports are the reference's start-up cost, so they are a
    # phase of their own inside the marked span (the versions come after them).
    m.ev("hello", protocol=1, engine="diffusers-ltx", version="0",
         attrs={"dtype": a.dtype, "rung": a.rung, "weights": a.weights,
                "noise": "engine" if a.engine_noise else "torch",
                "offload": "on" if a.offload else "off"})
    m.open("load.runtime")
    import torch

    _torch = torch
    import diffusers
    from diffusers import (AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline,
                           LTXVideoTransformer3DModel)
    import diffusers.pipelines.ltx.pipeline_ltx as pl
    from transformers import T5EncoderModel, T5TokenizerFast
    import transformers

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    torch.set_grad_enabled(False)
    m.close("load.runtime")
    m.ev("info", attrs={"diffusers": diffusers.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__, "device": device})

    w = a.weights
    m.open("load.text_encoder")
    tok = T5TokenizerFast.from_pretrained(w, subfolder="tokenizer")
    te = T5EncoderModel.from_pretrained(w, subfolder="text_encoder", dtype=dtype).to(device)
    m.close("load.text_encoder")
    m.open("load.dit")
    tr = LTXVideoTransformer3DModel.from_pretrained(w, subfolder="transformer", torch_dtype=dtype).to(device)
    m.close("load.dit")
    m.open("load.vae")
    vae = AutoencoderKLLTXVideo.from_pretrained(w, subfolder="vae", torch_dtype=dtype).to(device)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(w, subfolder="scheduler")
    pipe = LTXPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    m.close("load.vae")

    # The token budget the weights' tokenizer declares (128 for the released models).
    max_tokens = int(json.load(open(os.path.join(w, "tokenizer", "tokenizer_config.json")))
                     .get("model_max_length", 128))
    latents, gen = None, torch.Generator(device).manual_seed(seed)
    if a.engine_noise:
        noise_file = os.path.join(a.out, ".noise.safetensors")
        subprocess.run([a.engine_noise, "noise", "--rung", a.rung, "--out", noise_file], check=True)
        from safetensors.numpy import load_file

        n = load_file(noise_file)
        os.remove(noise_file)
        latents = pipe._pack_latents(torch.from_numpy(n["latents"]).to(device), 1, 1)
        dn = torch.from_numpy(n["decode_noise"]).to(device)

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            # With latents given, the pipeline's only draw is the decode noise.
            return dn.to(device=device, dtype=dtype)

        pl.randn_tensor = randn

    # Hooks: conditioning around encode_prompt; a step per scheduler step and a
    # tick per transformer call inside denoise; decode.video after the last step.
    state = {"forward": 0, "step": 1, "events": [], "last": None}
    use_events = device.startswith("cuda")
    enc = pipe.encode_prompt

    def offload(phase, model):
        # `--offload`: a model moved to the host after its last use (the numbers
        # are unchanged), the copy marked as its own phase.
        m.open(phase)
        model.to("cpu")
        torch.cuda.empty_cache()
        m.close(phase)

    def encode_prompt(*args, **kw):
        m.open("conditioning", {"prompts": 2 if guidance > 1 else 1})
        r = enc(*args, **kw)
        m.close("conditioning", {"tokens": int(r[1].shape[-1])})
        if a.offload and use_events:
            # The embeddings are computed: the encoder's weights leave the card,
            # in a phase of their own so that no timed phase holds the copy.
            offload("offload.text_encoder", te)
        m.open("denoise", {"steps": steps, "forwards_per_step": 1})
        m.open("denoise.step", {"step": 1, "steps": steps})
        return r

    pipe.encode_prompt = encode_prompt
    fwd = tr.forward

    def forward(*args, **kw):
        if use_events:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            out = fwd(*args, **kw)
            e1.record()
            state["events"].append((e0, e1))
        else:
            t0 = time.perf_counter()
            out = fwd(*args, **kw)
            state["events"].append(time.perf_counter() - t0)
        return out

    tr.forward = forward

    def step_end(p, i, t, kw):
        if use_events:
            torch.cuda.synchronize()
        ms_total = 0.0
        for ev in state["events"]:
            ms = ev[0].elapsed_time(ev[1]) if use_events else ev * 1e3
            ms_total += ms
            state["forward"] += 1
            now = time.monotonic()
            attrs = {"step": i + 1, "steps": steps, "forward": state["forward"], "device_ms": ms}
            if state["last"] is not None:
                attrs["last_s"] = now - state["last"]
            state["last"] = now
            m.tick("dit.forward", attrs)
        state["events"] = []
        m.close("denoise.step", {"device_ms": ms_total})
        if i + 1 < steps:
            m.open("denoise.step", {"step": i + 2, "steps": steps})
        else:
            m.close("denoise", {"forwards": state["forward"], "graph": False})
            if a.offload and use_events:
                # The last forward is done: the decode needs the card's memory.
                offload("offload.transformer", tr)
            m.open("decode.video")
            m.open("decode.video.chunk", {"chunk": 0})
        return {}

    try:
        video = pipe(prompt=prompt, negative_prompt=negative, width=width, height=height,
                     num_frames=frames_n, frame_rate=int(fps), num_inference_steps=steps,
                     guidance_scale=guidance, generator=gen, latents=latents,
                     decode_timestep=a.decode_timestep, decode_noise_scale=a.decode_noise_scale,
                     max_sequence_length=max_tokens, output_type="np",
                     callback_on_step_end=step_end, return_dict=False)[0][0]
    except Exception:
        for name in reversed(list(m.open_t)):
            m.close(name, {"aborted": True})
        raise
    if use_events:
        torch.cuda.synchronize()
    m.close("decode.video.chunk")
    m.close("decode.video")
    import numpy as np

    m.open("artifacts.frames")
    frames = np.round(np.clip(video, 0.0, 1.0) * 255.0).astype(np.uint8)
    wd, ht = write_frames(frames, a.out, fps)
    m.close("artifacts.frames", {"frames": int(frames.shape[0])})
    m.ev("info", attrs={"frames_written": int(frames.shape[0]), "video": "video.y4m", "width": wd, "height": ht})
    print(f"diffusers_ltx: wrote {frames.shape[0]} frames of {wd}x{ht} into {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
