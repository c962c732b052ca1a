#!/usr/bin/env python3
"""Golden outputs of the reference implementation for the engine's tiny preset.

Usage: make_goldens.py IN OUT
  IN  what `cargo run -p engine --example golden_inputs -- IN` wrote: tiny weights in
      the diffusers / transformers layout, inputs.safetensors, cases.json, layouts/.
  OUT receives goldens.safetensors (all outputs, f32), layouts.json (tensor names and
      shapes of the released configs as the reference builds them) and log.txt.

Everything runs on the CPU in float32 (no TF32, no reduced-precision kernels), with
diffusers and transformers loading the engine's files through their own loaders; a
missing or unexpected tensor is reported in the log. Each section is independent:
a failure is logged and the others still run.
"""
import json
import os
import sys
import time
import traceback

import numpy as np
import torch

torch.set_grad_enabled(False)
torch.set_default_dtype(torch.float32)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_num_threads(min(16, os.cpu_count() or 1))

from safetensors.torch import load_file, save_file  # noqa: E402

IN, OUT = sys.argv[1], sys.argv[2]
os.makedirs(OUT, exist_ok=True)
LOG = open(os.path.join(OUT, "log.txt"), "w")


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


inp = load_file(os.path.join(IN, "inputs.safetensors"))
cases = json.load(open(os.path.join(IN, "cases.json")))
out = {}
layouts = {}
failed = []


def section(name):
    def wrap(fn):
        t0 = time.time()
        try:
            fn()
            log(f"[ok] {name} ({time.time() - t0:.2f} s)")
        except Exception:
            failed.append(name)
            log(f"[FAILED] {name}\n{traceback.format_exc()}")
        return fn

    return wrap


def report_loading(name, info):
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        v = info.get(k) if isinstance(info, dict) else None
        if v:
            log(f"  {name} {k}: {list(v)[:20]} ({len(v)} in all)")
    log(f"  {name}: loading info clean = {not any(info.get(k) for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys'))}")


def as_f32(m):
    m = m.float().eval()
    assert all(p.dtype == torch.float32 for p in m.parameters())
    return m


try:
    import diffusers
    import transformers

    log("torch", torch.__version__, "diffusers", diffusers.__version__, "transformers", transformers.__version__)
except Exception:
    log(traceback.format_exc())


@section("t5")
def _t5():
    from transformers import T5EncoderModel
    from transformers.models.t5.modeling_t5 import T5Attention

    m, info = T5EncoderModel.from_pretrained(
        os.path.join(IN, "text_encoder"), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    report_loading("text_encoder", info)
    m = as_f32(m)
    ids = inp["t5_ids"].long()[None]
    mask = inp["t5_mask"].long()[None]
    r = m(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    out["t5_out"] = r.last_hidden_state[0]
    for i, hs in enumerate(r.hidden_states or []):
        out[f"dbg_t5_hidden_{i}"] = hs[0]
    # As diffusers' LTXPipeline calls it: token ids alone, every key live.
    out["t5_out_all_keys"] = m(input_ids=ids).last_hidden_state[0]
    rel = torch.arange(-300, 301)
    out["t5_buckets_bi"] = T5Attention._relative_position_bucket(rel, True, 32, 128).float()
    out["t5_buckets_uni"] = T5Attention._relative_position_bucket(rel, False, 32, 128).float()


@section("transformer")
def _dit():
    from diffusers import LTXVideoTransformer3DModel

    m, info = LTXVideoTransformer3DModel.from_pretrained(os.path.join(IN, "transformer"), output_loading_info=True)
    report_loading("transformer", info)
    m = as_f32(m)
    c = cases["dit"]
    f, h, w = c["grid"]
    sigma = torch.tensor([c["sigma"]], dtype=torch.float32)
    cos, sin = m.rope(inp["dit_latents"][None], f, h, w, (8 / c["fps"], 32, 32), None)
    out["dbg_dit_rope_cos"], out["dbg_dit_rope_sin"] = cos[0], sin[0]
    temb, emb = m.time_embed(sigma * 1000, batch_size=1, hidden_dtype=torch.float32)
    out["dbg_dit_temb"], out["dbg_dit_embedded_timestep"] = temb[0], emb[0]
    out["dbg_dit_caption"] = m.caption_projection(inp["dit_text"][None])[0]
    hooks = [
        b.register_forward_hook(lambda mod, a, o, i=i: out.__setitem__(f"dbg_dit_block_{i}", o[0]))
        for i, b in enumerate(m.transformer_blocks)
    ]
    y = m(
        hidden_states=inp["dit_latents"][None],
        encoder_hidden_states=inp["dit_text"][None],
        timestep=sigma * 1000,
        encoder_attention_mask=inp["dit_mask"][None],
        num_frames=f,
        height=h,
        width=w,
        rope_interpolation_scale=(8 / c["fps"], 32, 32),
        return_dict=False,
    )[0]
    out["dit_out"] = y[0]
    for hk in hooks:
        hk.remove()


@section("vae")
def _vae():
    from diffusers import AutoencoderKLLTXVideo

    m, info = AutoencoderKLLTXVideo.from_pretrained(os.path.join(IN, "vae"), output_loading_info=True)
    report_loading("vae", info)
    m = as_f32(m)
    t = torch.tensor([cases["vae"]["timestep"]], dtype=torch.float32)
    d = m.decoder
    stages = [("conv_in", d.conv_in), ("mid", d.mid_block)] + [(f"up{i}", u) for i, u in enumerate(d.up_blocks)]
    hooks = [mod.register_forward_hook(lambda mod, a, o, n=n: out.__setitem__(f"dbg_vae_{n}", o[0])) for n, mod in stages]
    out["vae_out"] = m.decode(inp["vae_latents"][None], temb=t, return_dict=False)[0][0]
    for hk in hooks:
        hk.remove()


@section("vae090")
def _vae090():
    from diffusers import AutoencoderKLLTXVideo

    m, info = AutoencoderKLLTXVideo.from_pretrained(os.path.join(IN, "vae090"), output_loading_info=True)
    report_loading("vae090", info)
    m = as_f32(m)
    out["vae090_out"] = m.decode(inp["vae090_latents"][None], temb=None, return_dict=False)[0][0]


@section("schedules")
def _sched():
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps

    for steps, tokens in cases["schedules"]:
        s = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(IN, "scheduler"))
        sig = np.linspace(1.0, 1 / steps, steps)
        mu = calculate_shift(
            tokens,
            s.config.get("base_image_seq_len", 256),
            s.config.get("max_image_seq_len", 4096),
            s.config.get("base_shift", 0.5),
            s.config.get("max_shift", 1.15),
        )
        retrieve_timesteps(s, steps, "cpu", None, sigmas=sig, mu=mu)
        out[f"sched_{steps}_{tokens}"] = s.sigmas.float()


@section("pipeline")
def _pipe():
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline, LTXVideoTransformer3DModel

    c = cases["pipe"]
    pipe = LTXPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(IN, "scheduler")),
        vae=as_f32(AutoencoderKLLTXVideo.from_pretrained(os.path.join(IN, "vae"))),
        text_encoder=None,
        tokenizer=None,
        transformer=as_f32(LTXVideoTransformer3DModel.from_pretrained(os.path.join(IN, "transformer"))),
    )
    noise = inp["pipe_noise"][None]  # [1, C, F, H, W] as the reference draws it
    packed = LTXPipeline._pack_latents(noise, 1, 1)
    kw = dict(
        prompt_embeds=inp["pipe_prompt"][None],
        prompt_attention_mask=inp["pipe_prompt_mask"][None],
        negative_prompt_embeds=inp["pipe_negative"][None],
        negative_prompt_attention_mask=inp["pipe_negative_mask"][None],
        width=c["width"],
        height=c["height"],
        num_frames=c["frames"],
        frame_rate=int(c["fps"]),
        num_inference_steps=c["steps"],
        guidance_scale=c["guidance"],
        decode_timestep=c["decode_timestep"],
        decode_noise_scale=0.0,
        return_dict=False,
    )
    def grab(p, i, t, kw_):
        out[f"dbg_pipe_step_{i}"] = kw_["latents"][0].clone()
        return {}

    out["pipe_latents"] = pipe(latents=packed.clone(), output_type="latent", callback_on_step_end=grab, **kw)[0][0]
    out["pipe_video"] = pipe(latents=packed.clone(), output_type="pt", **kw)[0][0]


@section("render")
def _render():
    """A whole text-to-video render from the prompt with diffusers' own loaders on the
    directory `engine synth-weights --preset tiny` writes, from the engine's noise."""
    import diffusers.pipelines.ltx.pipeline_ltx as pl
    from diffusers import LTXPipeline

    c = cases["render"]
    pipe = LTXPipeline.from_pretrained(os.path.join(IN, "render_weights"), torch_dtype=torch.float32)
    for part in (pipe.text_encoder, pipe.transformer, pipe.vae):
        as_f32(part)
    noise = inp["render_decode_noise"]
    drawn = []

    def randn(shape, generator=None, device=None, dtype=None, layout=None):
        # With latents given, the pipeline's only draw is the decode noise.
        assert tuple(shape) == tuple(noise.shape), (shape, noise.shape)
        drawn.append(tuple(shape))
        return noise.to(dtype=dtype)

    captured = {}
    enc = pipe.encode_prompt

    def encode_prompt(*a, **k):
        captured["r"] = enc(*a, **k)
        return captured["r"]

    pipe.encode_prompt = encode_prompt
    pl.randn_tensor = randn
    steps = []

    def grab(p, i, t, kw_):
        steps.append(kw_["latents"][0].clone())
        return {}

    video = pipe(
        prompt=c["prompt"],
        negative_prompt=c["negative"],
        width=c["width"],
        height=c["height"],
        num_frames=c["frames"],
        frame_rate=int(c["fps"]),
        num_inference_steps=c["steps"],
        guidance_scale=c["guidance"],
        latents=LTXPipeline._pack_latents(inp["render_latents"], 1, 1),
        decode_timestep=c["decode_timestep"],
        decode_noise_scale=c["decode_noise_scale"],
        max_sequence_length=c["max_tokens"],
        callback_on_step_end=grab,
        output_type="np",
        return_dict=False,
    )[0][0]
    assert drawn, "the decode noise was never drawn"
    pe, pm, ne, nm = captured["r"]
    out["render_prompt_embeds"] = pe[0]
    out["render_prompt_mask"] = pm[0].float()
    out["render_negative_embeds"] = ne[0]
    out["render_negative_mask"] = nm[0].float()
    out["render_latents_final"] = steps[-1]
    out["render_frames"] = torch.from_numpy(np.ascontiguousarray(video))
    log(f"  render: weights {c['weights_digest']}, frames {list(video.shape)}, real tokens "
        f"{int(pm.sum())} / {int(nm.sum())}")


@section("layouts")
def _layouts():
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    def load(n):
        return json.load(open(os.path.join(IN, "layouts", n + ".json")))

    builders = {
        "dit_2b": lambda: LTXVideoTransformer3DModel.from_config(load("dit_2b")),
        "dit_13b": lambda: LTXVideoTransformer3DModel.from_config(load("dit_13b")),
        "vae_095": lambda: AutoencoderKLLTXVideo.from_config(load("vae_095")),
        "vae_090": lambda: AutoencoderKLLTXVideo.from_config(load("vae_090")),
        "t5_xxl": lambda: T5EncoderModel(T5Config(**load("t5_xxl"))),
    }
    for name, build in builders.items():
        with torch.device("meta"):
            m = build()
        sd = m.state_dict()
        layouts[name] = {k: list(v.shape) for k, v in sd.items()}
        params = sum(p.numel() for p in m.parameters())
        log(f"  {name}: {len(sd)} state-dict tensors, {params} parameters")


json.dump(layouts, open(os.path.join(OUT, "layouts.json"), "w"), indent=0, sort_keys=True)
# Clone: some outputs share storage (T5's last hidden state is also in hidden_states).
save_file(
    {k: v.detach().float().clone().contiguous() for k, v in out.items()},
    os.path.join(OUT, "goldens.safetensors"),
    metadata={"render_weights_digest": cases["render"]["weights_digest"]},
)
log("outputs:", {k: list(v.shape) for k, v in out.items()})
log("failed sections:", failed)
