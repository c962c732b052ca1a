//! One render, phase by phase, with the markers of `specs/markers.md`. The
//! text encoder and the VAE run on the host (the CPU reference arm) unless a
//! `device = cuda` render moves them: with `conditioning = device`,
//! `load.text_encoder` stages T5's bf16 weights to the GPU (lever `staging`)
//! and runs a warm-up forward, `conditioning` encodes the prompt(s) there as
//! one batch (`device_ms` from CUDA events) and frees the encoder before
//! `load.dit` (inert with `--prompt-embeds`); with `vae = device` the decoder
//! is staged in `load.vae` and decodes on the device (below). The DiT's
//! denoise loop runs on the arm the request names ([`crate::denoise`]): on the
//! CPU in f32, or device-resident on the GPU (weights staged through the
//! `staging` lever, latents on the device from the first step to the last, one
//! host copy at the end), with `device_ms` from CUDA events on the `dit.forward`
//! ticks and the `load.dit`, `denoise.step` and `denoise` closes, and
//! `peak_device_bytes` on every close from the first device load on (`load.text_encoder`
//! under `conditioning = device`, else `load.dit`).
//!
//! Order (one model resident at a time, so the host peak is the largest model,
//! not the sum): `load.text_encoder` (the T5 weights, or the precomputed prompt
//! embeddings) -> `conditioning` (tokenize and encode the prompt, and the
//! negative prompt when guidance > 1) -> `load.dit` -> `denoise` (one
//! `denoise.step` per step, a `dit.forward` tick per forward, two forwards per step
//! with guidance) -> `load.vae` -> `decode.video` (one `decode.video.chunk` per
//! temporal chunk) -> `artifacts.frames` (video.y4m, first/middle/last PNG, every
//! frame with `--all-frames`), then an `Info` marker with what was written.
//!
//! Levers: `widen-f32 = double` keeps each model's stored bytes beside its f32
//! copies while the model lives; `release-pages = on` drops the weight files'
//! pages as tensors are materialized and the whole files at the end of each load;
//! `host-threads` sizes the rayon pool the render runs in (set by the caller);
//! on the device arm `staging = serial|batched` picks how the transformer
//! reaches the device, `release-pages` drops its file pages once copied,
//! `denoise-graph = on` replays each forward as a captured CUDA graph (the
//! `denoise` close says `graph`, `load.dit`'s `graph_capture_ms`), and `vae = host|device`
//! picks where the VAE decodes on a CUDA render (on the device: staged in
//! `load.vae`, decoded in chunks of [`DEVICE_CHUNK_LATENT_FRAMES`] latent
//! frames, `device_ms`, `peak_device_bytes` and the host split (`enqueue_ms`,
//! `wait_ms`, `plans_built`, `plan_ms`, `plans_searched`) on every `decode.video.chunk`,
//! and the host time outside the chunks' work (`setup_ms`, `collect_ms`, `free_ms`)
//! on the `decode.video` close; with `vae-prepare = load` the decode's buffers and
//! cuDNN plans are made in `load.vae` (its close says `decode_plans`,
//! `decode_plan_ms`, `decode_alloc_ms`, `decode_sink_ms`, `decode_device_bytes`,
//! `decode_pinned_bytes`; the decode's says `prepared`, `prepared_served`,
//! `prepared_missed`, `prepared_complete`); inert on the CPU arm). Every
//! `decode.video` close says `latents_ms`, the host milliseconds preparing the
//! latents (denormalize, decode noise).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context};
use evidence::attrs;
use evidence::marker::{attr, Attrs};
use evidence::rung::{Device, Rung};
use serde_json::Value;

use crate::arms::{ChunkEnd, Decoded, Decoder, TextEncoder};
use crate::conditioning::{ConditioningError, Encoded, PIPELINE_KEYS};
use crate::cpu::decode::HostVae;
use crate::cpu::denoise::CpuDenoiser;
use crate::cpu::text::HostT5;
use crate::cuda::denoise::{open_cuda_denoiser, Dispatch};
use crate::cuda::models::dit::Geometry;
use crate::cuda::models::t5::{open_device_t5, DeviceT5};
use crate::cuda::models::vae::{
    self as cuda_vae, open_device_vae, DecodeOptions, DeviceVae, DEVICE_CHUNK_LATENT_FRAMES,
    RENDER_CONV_PATH,
};
use crate::cuda::staging::{StagingOptions, StagingReport};
use crate::denoise::{Conditioning, Denoiser, TextCond};
use crate::frames::png::write_png;
use crate::frames::y4m::Y4mWriter;
use crate::frames::{frames_from_pixels, Frame};
use crate::levers::{self, LeverSet};
use crate::models::dit;
use crate::models::dit::Transformer;
use crate::models::t5::{self, T5Encoder};
use crate::models::vae::{self, VaeDecoder};
use crate::ops::space::{pack_latents, unpack_latents};
use crate::phase::Recorder;
use crate::presets::Preset;
use crate::rng::{decode_noise, initial_latents};
use crate::schedule;
use crate::tensor::Tensor;
use crate::text::embeds::{load_prompt_embeds, PromptEmbeds};
use crate::text::tokenizer::PromptTokenizer;
use crate::weights::layout::{Component, Layout};
use crate::weights::safetensors::{LoadOptions, SafetensorsSource};
use crate::weights::{TensorSpec, VarBuilder};

/// An error caused by the render's inputs (arguments, rung, weights, prompt
/// files), as opposed to a failure while rendering. Exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// Everything a render needs, validated by the caller.
#[derive(Debug, Clone)]
pub struct RenderRequest {
    /// The rung.
    pub rung: Rung,
    /// The preset the rung names.
    pub preset: Preset,
    /// Weights directory (diffusers) or Lightricks single file.
    pub weights: PathBuf,
    /// Output directory (created if needed).
    pub out: PathBuf,
    /// The lever arms.
    pub levers: LeverSet,
    /// Host pool size the render runs with (for the record).
    pub threads: usize,
    /// The device arm of the DiT (and of T5 under `conditioning = device`, of
    /// the VAE under `vae = device`).
    pub device: Device,
    /// Write every frame as a PNG too.
    pub all_frames: bool,
    /// Precomputed prompt embeddings instead of tokenizer + T5.
    pub prompt_embeds: Option<PathBuf>,
}

/// What a render wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOutcome {
    /// Frames in `video.y4m`.
    pub frames_written: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
}

fn load_options(levers: &LeverSet) -> LoadOptions {
    LoadOptions {
        widen: levers.widen(),
        release_pages: levers.release_pages(),
    }
}

/// The stored bytes a model keeps beside its f32 copies under
/// `widen-f32 = double` (empty under `single`); the file mappings are gone.
pub struct Retained(Vec<Vec<u8>>);

/// Open and validate one component's weights.
fn open_component(
    layout: &Layout,
    c: Component,
    specs: &[TensorSpec],
    allow_extra: &dyn Fn(&str) -> bool,
    opts: LoadOptions,
) -> anyhow::Result<SafetensorsSource> {
    let cf = layout.component(c).map_err(|e| BadInput(e.to_string()))?;
    let src = cf.open(opts).map_err(|e| BadInput(e.to_string()))?;
    src.validate(specs, allow_extra)
        .map_err(|e| BadInput(e.to_string()))?;
    Ok(src)
}

/// After a component's load: release its pages (lever on), and keep its source
/// only when widen-f32 = double asks for the stored bytes to stay.
fn finish_load(src: SafetensorsSource, levers: &LeverSet) -> (Attrs, Retained) {
    if levers.release_pages() {
        src.release_all();
    }
    let st = src.stats();
    let a = attrs! {
        "tensors" => st.tensors,
        "bytes_read" => st.bytes_read,
        "bytes_retained" => st.bytes_retained,
        "bytes_released" => st.bytes_released,
        "files" => src.files().len(),
    };
    (a, Retained(src.into_retained()))
}

fn text_cond(p: PromptEmbeds) -> TextCond {
    TextCond {
        states: p.states,
        mask: p.mask,
    }
}

/// Render `req`, emitting phases through `rec`. Runs on the current rayon pool.
pub fn render(req: &RenderRequest, rec: &Recorder) -> anyhow::Result<RenderOutcome> {
    let p = &req.preset;
    let rung = &req.rung;
    let (gf, gh, gw) = rung.latent_grid();
    let grid = (gf as usize, gh as usize, gw as usize);
    let tokens = grid.0 * grid.1 * grid.2;
    let sigmas = schedule::sigmas(&p.scheduler, rung.steps as usize, tokens)
        .map_err(|e| BadInput(format!("steps: {e}")))?;
    // Arms that cannot run together are the user's input: refused before any load.
    if req.device == Device::Cuda {
        let arms = req.levers.forward_arms();
        if let Some(why) = arms
            .conflict()
            .or_else(|| arms.model_conflict(p.dit.attention_head_dim))
        {
            return Err(BadInput(format!("levers: {why}")).into());
        }
    }
    let (layout, cond, uncond) = condition(req, rec)?;
    let conditioning = Conditioning {
        cond,
        uncond,
        guidance: rung.guidance as f32,
    };
    let latents = load_and_denoise(req, rec, &layout, conditioning, grid, &sigmas)?;
    let decoded = load_and_decode(req, rec, &layout, latents, grid)?;

    // ---- Frames.
    let ph = rec.phase("artifacts.frames", Attrs::new());
    std::fs::create_dir_all(&req.out)
        .with_context(|| format!("{}: cannot create the output directory", req.out.display()))?;
    let frames = match decoded {
        Decoded::Pixels(pixels) => frames_from_pixels(&pixels).context("decoded pixels")?,
        Decoded::Frames(frames) => frames,
    };
    let outcome = write_frames(&frames, &req.out, rung.fps, req.all_frames)?;
    ph.finish(attrs! {"frames" => outcome.frames_written});
    rec.emitter().info(attrs! {
        "frames_written" => outcome.frames_written,
        "video" => "video.y4m",
        "width" => outcome.width,
        "height" => outcome.height,
    });
    Ok(outcome)
}

/// `load.text_encoder` and `conditioning`: the weights' layout resolved, the
/// prompt (and with guidance the negative prompt) tokenized and encoded by
/// the arm the levers pick, or read from `--prompt-embeds`. Returns the layout
/// (the later loads read it) and the conditioning.
fn condition(
    req: &RenderRequest,
    rec: &Recorder,
) -> anyhow::Result<(Layout, TextCond, Option<TextCond>)> {
    let p = &req.preset;
    let rung = &req.rung;
    let guidance = rung.uses_guidance();
    let opts = load_options(&req.levers);
    let ph = rec.phase("load.text_encoder", Attrs::new());
    let layout = Layout::resolve(&req.weights).map_err(|e| BadInput(format!("weights: {e}")))?;
    enum Text {
        Embeds(TextCond, Option<TextCond>),
        Model(Box<dyn TextEncoder>, Box<PromptTokenizer>),
    }
    let (text, a) = match &req.prompt_embeds {
        Some(file) => {
            let e = load_prompt_embeds(file, p.dit.caption_channels)
                .map_err(|e| BadInput(format!("--prompt-embeds: {e}")))?;
            if guidance && e.negative.is_none() {
                return Err(BadInput(format!(
                    "{}: guidance {} > 1 needs 'negative_embeds' and 'negative_mask' in the \
                     prompt embeddings file",
                    file.display(),
                    rung.guidance
                ))
                .into());
            }
            (
                Text::Embeds(text_cond(e.positive), e.negative.map(text_cond)),
                attrs! {"source" => "prompt-embeds"},
            )
        }
        None => {
            let tok_path = layout.tokenizer_json().ok_or_else(|| {
                BadInput(format!(
                    "{}: no tokenizer/tokenizer.json (or pass --prompt-embeds)",
                    layout.root().display()
                ))
            })?;
            let tok = PromptTokenizer::from_file(&tok_path, p.max_text_tokens, p.t5.vocab_size)
                .map_err(|e| BadInput(e.to_string()))?;
            let specs = t5::tensor_specs(&p.t5);
            let src = open_component(
                &layout,
                Component::TextEncoder,
                &specs,
                &|n| n == t5::EMBED_ALIAS,
                opts,
            )?;
            if req.device == Device::Cuda && req.levers.conditioning_on_device() {
                let prompts = if guidance { 2 } else { 1 };
                let (t5, mut a) = load_cuda_t5(src, req, prompts, rec)?;
                a.insert("source".into(), Value::from("t5"));
                (Text::Model(Box::new(t5), Box::new(tok)), a)
            } else {
                let model = T5Encoder::load(&VarBuilder::new(&src), &p.t5)
                    .map_err(|e| BadInput(e.to_string()))?;
                let (mut a, kept) = finish_load(src, &req.levers);
                a.insert("source".into(), Value::from("t5"));
                a.insert("arm".into(), Value::from("cpu"));
                (
                    Text::Model(Box::new(HostT5::new(model, kept.0)), Box::new(tok)),
                    a,
                )
            }
        }
    };
    ph.finish(a);

    let ph = rec.phase(
        "conditioning",
        attrs! {"prompts" => if guidance { 2 } else { 1 }},
    );
    let mut done = Attrs::new();
    let mut prompts = vec![rung.prompt.as_str()];
    if guidance {
        prompts.push(rung.negative_prompt.as_str());
    }
    let out = match text {
        Text::Embeds(c, u) => (c, if guidance { u } else { None }),
        Text::Model(mut enc, tok) => {
            let (e, ms) = enc
                .encode(&tok, &prompts, PIPELINE_KEYS)
                .map_err(conditioning_error)?;
            let arm = enc.arm();
            // Freed inside `conditioning`, before `load.dit`.
            drop(enc);
            // The device arm names itself here; the host arm's `arm` is on its load.
            if arm != "cpu" {
                done.insert("arm".into(), Value::from(arm));
            }
            done.insert("keys".into(), Value::from(PIPELINE_KEYS.name()));
            if let Some(ms) = ms {
                done.insert(attr::DEVICE_MS.into(), Value::from(ms));
            }
            prompt_and_negative(e, guidance)?
        }
    };
    done.insert("tokens".into(), Value::from(out.0.mask.len()));
    ph.finish(done);
    let (c, u) = out;
    Ok((layout, c, u))
}

/// `load.dit` and `denoise`: the transformer loaded on the render's arm, the
/// initial latents drawn inside step 1, one `denoise.step` per sigma with a
/// `dit.forward` tick per forward. Returns the final latents `[tokens, C]`.
fn load_and_denoise(
    req: &RenderRequest,
    rec: &Recorder,
    layout: &Layout,
    conditioning: Conditioning,
    grid: (usize, usize, usize),
    sigmas: &[f32],
) -> anyhow::Result<Tensor> {
    let p = &req.preset;
    let rung = &req.rung;
    let opts = load_options(&req.levers);
    let latent_ch = p.dit.in_channels;
    let fps = rung.fps as f32;
    let steps = rung.steps as usize;
    let tokens = grid.0 * grid.1 * grid.2;
    let ph = rec.phase("load.dit", Attrs::new());
    let specs = dit::tensor_specs(&p.dit);
    let src = open_component(layout, Component::Transformer, &specs, &|_| false, opts)?;
    let (mut den, a, kept) = match req.device {
        Device::Cpu => load_cpu_dit(src, req, conditioning, grid, fps)?,
        Device::Cuda => load_cuda_dit(src, req, conditioning, grid, fps, rec)?,
    };
    ph.finish(a);
    // 1 a step where a guided step's pair runs as one batched forward.
    let forwards_per_step = den.forwards_per_step();

    let den_ph = rec.phase(
        "denoise",
        attrs! {"steps" => steps, "tokens" => tokens, "forwards_per_step" => forwards_per_step, "arm" => den.arm()},
    );
    let mut forward = 0usize;
    let mut forwards_ms = 0.0f64;
    let mut last_tick: Option<Instant> = None;
    for k in 0..steps {
        let ph = rec.phase("denoise.step", attrs! {"step" => k + 1, "steps" => steps});
        if k == 0 {
            // Drawn inside step 1 (so no unmarked gap precedes it).
            let lat = Tensor::new(
                &[tokens, latent_ch],
                pack_latents(
                    initial_latents(rung.seed, latent_ch, grid).data(),
                    latent_ch,
                ),
            )
            .map_err(|e| anyhow!("latents: {e}"))?;
            den.begin(lat)?;
            den.enqueue(0, sigmas[0], sigmas[1])?;
        }
        // The next step is queued before this one is waited for: the
        // device arm then always has work queued while the host reports.
        if k + 1 < steps {
            den.enqueue(k + 1, sigmas[k + 1], sigmas[k + 2])?;
        }
        let mut tick = |device_ms: Option<f64>| {
            forward += 1;
            let now = Instant::now();
            let mut a = attrs! {"step" => k + 1, "steps" => steps, "forward" => forward};
            if let Some(prev) = last_tick {
                a.insert("last_s".into(), Value::from((now - prev).as_secs_f64()));
            }
            if let Some(ms) = device_ms {
                a.insert(attr::DEVICE_MS.into(), Value::from(ms));
                forwards_ms += ms;
            }
            last_tick = Some(now);
            rec.tick("dit.forward", a);
        };
        let step_ms = den.wait(k, &mut tick)?;
        let mut a = attrs! {"sigma" => sigmas[k], "sigma_next" => sigmas[k + 1]};
        if let Some(ms) = step_ms {
            a.insert(attr::DEVICE_MS.into(), Value::from(ms));
        }
        ph.finish(a);
    }
    let (lat, loop_ms) = den.finish()?;
    let capture_ms = den.graph_capture_ms();
    // Freeing the model (and on a device the context) is the phase's work
    // too (no unmarked gap after it).
    drop(den);
    drop(kept);
    let mut a = attrs! {"forwards" => forward, "graph" => capture_ms.is_some()};
    if let Some(ms) = loop_ms {
        a.insert(attr::DEVICE_MS.into(), Value::from(ms));
        a.insert("forwards_device_ms".into(), Value::from(forwards_ms));
    }
    den_ph.finish(a);
    Ok(lat)
}

/// `load.vae` and `decode.video`: the decoder loaded on the arm the `vae`
/// lever picks and the latents decoded in temporal chunks.
fn load_and_decode(
    req: &RenderRequest,
    rec: &Recorder,
    layout: &Layout,
    latents: Tensor,
    grid: (usize, usize, usize),
) -> anyhow::Result<Decoded> {
    let p = &req.preset;
    let opts = load_options(&req.levers);
    let ph = rec.phase("load.vae", Attrs::new());
    let specs = vae::decoder_read_specs(&p.vae);
    let src = open_component(
        layout,
        Component::Vae,
        &specs,
        &|n| n.starts_with("encoder."),
        opts,
    )?;
    let dec: Box<dyn Decoder> = if req.device == Device::Cuda && req.levers.vae_on_device() {
        let (mut dv, mut a) = load_cuda_vae(src, req, rec)?;
        a.insert(
            "vae_prepare".into(),
            Value::from(req.levers.arm(levers::VAE_PREPARE)),
        );
        if req.levers.vae_prepare_at_load() {
            let r = dv
                .prepare(
                    grid,
                    decode_timestep(p),
                    &DecodeOptions::render(DEVICE_CHUNK_LATENT_FRAMES),
                )
                .context("the CUDA arm's VAE: preparing the decode (`--lever vae-prepare=decode` makes it inside decode.video)")?;
            a.insert("decode_plans".into(), Value::from(r.plans));
            a.insert("decode_plan_ms".into(), Value::from(r.plan_ms));
            a.insert("decode_alloc_ms".into(), Value::from(r.alloc_ms));
            a.insert("decode_sink_ms".into(), Value::from(r.sink_ms));
            a.insert("decode_device_bytes".into(), Value::from(r.device_bytes));
            a.insert("decode_pinned_bytes".into(), Value::from(r.pinned_bytes));
        }
        ph.finish(a);
        Box::new(dv)
    } else {
        let model = VaeDecoder::load(&VarBuilder::new(&src), &p.vae)
            .map_err(|e| BadInput(e.to_string()))?;
        let (mut a, kept) = finish_load(src, &req.levers);
        a.insert("arm".into(), Value::from("cpu"));
        ph.finish(a);
        Box::new(HostVae::new(model, kept.0))
    };
    decode_video(dec, latents, req, grid, rec)
}

/// The CPU arm's DiT: the transformer widened to f32 on the host, and the
/// stored bytes `widen-f32 = double` keeps beside it while it lives.
fn load_cpu_dit(
    src: SafetensorsSource,
    req: &RenderRequest,
    cond: Conditioning,
    grid: (usize, usize, usize),
    fps: f32,
) -> anyhow::Result<(Box<dyn Denoiser>, Attrs, Option<Retained>)> {
    let model = Transformer::load(&VarBuilder::new(&src), &req.preset.dit)
        .map_err(|e| BadInput(e.to_string()))?;
    let (mut a, kept) = finish_load(src, &req.levers);
    a.insert("arm".into(), Value::from("cpu"));
    Ok((
        Box::new(CpuDenoiser::new(model, cond, grid, fps)),
        a,
        Some(kept),
    ))
}

/// The CUDA arm's DiT: the validated checkpoint's tensors staged onto the
/// device (lever `staging`, `release-pages`), the conditioning uploaded, the
/// device's allocator attached to the recorder.
fn load_cuda_dit(
    src: SafetensorsSource,
    req: &RenderRequest,
    cond: Conditioning,
    grid: (usize, usize, usize),
    fps: f32,
    rec: &Recorder,
) -> anyhow::Result<(Box<dyn Denoiser>, Attrs, Option<Retained>)> {
    let tensors = src.extents().map_err(|e| BadInput(e.to_string()))?;
    drop(src);
    let opts = req.levers.staging();
    let dispatch = Dispatch::from_graph_lever(req.levers.denoise_graph());
    let arms = req.levers.forward_arms();
    let geo = Geometry { grid, fps };
    let (den, r) = open_cuda_denoiser(&tensors, &req.preset.dit, &opts, &cond, geo, dispatch, arms)
        .with_context(|| {
            format!(
                "the CUDA arm's transformer (attention={}, cross-attention={}, qk-norm={}, \
             precision={}, fp8-accum={}, attention-precision={}, text-kv={}, guidance-batch={}, residual={}, gemm-algo={}; `--lever attention=mma --lever \
             cross-attention=mma --lever attention-precision=bf16` runs the engine's own kernels \
             without cuDNN, `--lever precision=bf16 --lever attention-precision=bf16` without FP8)",
                arms.attention.name(),
                arms.cross.name(),
                arms.qk_norm.name(),
                arms.precision.name(),
                arms.fp8_accum.name(),
                arms.attn_precision.name(),
                arms.text_kv.name(),
                arms.guidance.name(),
                arms.residual.name(),
                arms.gemm_algo.name()
            )
        })?;
    rec.attach_device(den.mem());
    let mut a = staging_attrs(
        &opts,
        &r.staging,
        tensors.len(),
        (r.device_open_s, r.opened),
    );
    a.insert("dispatch".into(), Value::from(dispatch.name()));
    a.insert("attention".into(), Value::from(arms.attention.name()));
    a.insert("cross_attention".into(), Value::from(arms.cross.name()));
    a.insert("qk_norm".into(), Value::from(arms.qk_norm.name()));
    a.insert("precision".into(), Value::from(arms.precision.name()));
    a.insert(
        "attention_precision".into(),
        Value::from(arms.attn_precision.name()),
    );
    a.insert("text_kv".into(), Value::from(arms.text_kv.name()));
    // The arm; whether it acts (a guided render) shows in the denoise phase's
    // `forwards_per_step` (1 where the pair runs batched).
    a.insert("guidance_batch".into(), Value::from(arms.guidance.name()));
    a.insert("residual".into(), Value::from(arms.residual.name()));
    a.insert("gemm_algo".into(), Value::from(arms.gemm_algo.name()));
    if arms.gemm_algo == crate::cuda::models::dit::AlgoChoice::Tuned {
        insert_tune_report(&mut a, &den.gemm_tune_report());
    }
    // Only where FP8 GEMMs run: on bf16 the lever is inert.
    if arms.precision == crate::cuda::models::dit::Precision::Fp8 {
        a.insert("fp8_accum".into(), Value::from(arms.fp8_accum.name()));
        // Shapes cuBLASLt ran exact although fast was asked for (planned in
        // the warm-up forwards above): "MxNxK" each. (s32-dev1's rung-2 fast
        // renders on an H100 ran before this fallback existed and completed, so
        // none of the 2B shapes at 6144 tokens was refused there.)
        let refused: Vec<Value> = den
            .fp8_fast_refused()
            .iter()
            .map(|(m, n, k)| Value::from(format!("{m}x{n}x{k}")))
            .collect();
        if arms.fp8_accum == crate::cuda::kit::gemm::Accum::Fast {
            a.insert("fp8_fast_refused".into(), Value::Array(refused));
        }
    }
    if let Some(v) = den.cudnn_version() {
        a.insert("cudnn_version".into(), Value::from(v));
    }
    // The loop was readied inside this load (warm-up forwards, graph capture).
    if let Some(ms) = den.warm_up_ms() {
        a.insert("warm_up_ms".into(), Value::from(ms));
    }
    if let Some(ms) = den.graph_capture_ms() {
        a.insert("graph_capture_ms".into(), Value::from(ms));
    }
    settle_staging(&mut a);
    Ok((Box::new(den), a, None))
}

/// What `gemm-algo = tuned` did in `load.dit` (its warm-up planned every
/// product of the forward): `gemm_tuned` (shapes timed on the card this run),
/// `gemm_from_cache` (read from the machine's cache), `gemm_not_first` (kept
/// another algorithm than the heuristic's first), `gemm_tune_ms` (host ms spent
/// timing), `gemm_cache_rejected` (cache lines or stored algorithms refused,
/// then tuned again), `gemm_untimed_in_capture`, `gemm_algos_sha256` (equal in
/// two runs exactly when they ran the same algorithms), `gemm_changed` ("key:
/// #index (gain)" per shape not on the first), `gemm_cache_file` and, where the
/// cache could not be written, `gemm_cache_error`.
fn insert_tune_report(a: &mut Attrs, r: &crate::cuda::kit::gemm_tune::TuneReport) {
    a.insert("gemm_tuned".into(), Value::from(r.tuned));
    a.insert("gemm_from_cache".into(), Value::from(r.from_cache));
    a.insert("gemm_not_first".into(), Value::from(r.not_first));
    a.insert("gemm_tune_ms".into(), Value::from(r.tune_ms));
    a.insert("gemm_cache_rejected".into(), Value::from(r.cache_rejected));
    a.insert(
        "gemm_untimed_in_capture".into(),
        Value::from(r.untimed_in_capture),
    );
    a.insert("gemm_algos_sha256".into(), Value::from(r.digest()));
    let changed: Vec<Value> = r.changed().into_iter().map(Value::from).collect();
    a.insert("gemm_changed".into(), Value::Array(changed));
    if let Some(p) = &r.cache_file {
        a.insert(
            "gemm_cache_file".into(),
            Value::from(p.display().to_string()),
        );
    }
    if let Some(e) = &r.cache_error {
        a.insert("gemm_cache_error".into(), Value::from(e.clone()));
    }
}

/// What every device load's close says of its staging: the arm, the levers that
/// shaped it (`staging`, `release_pages`), the bytes, tensors, files, copies and
/// allocations it made, its wall (`staging_s`, s) and rate (`staging_gbps`, GB/s),
/// its device time (`device_ms`) and the device's open time (`device_open_s`, s)
/// with its parts (`device_open_context_s`, `device_open_kernels_s`,
/// `device_open_gemm_s`, s; `kernel_modules_compiled`: modules NVRTC compiled
/// because the disk cache lacked them), so a slow open names its cause; and
/// where the staging's own wall went beside its reads and copies
/// (`staging_pin_s`: seconds pinning host memory, thread-seconds for the
/// registered reader; `staging_teardown_s`: wall after the last copy spent
/// undoing the host side).
fn staging_attrs(
    opts: &StagingOptions,
    st: &StagingReport,
    tensors: usize,
    (device_open_s, opened): (f64, crate::cuda::kit::OpenTimes),
) -> Attrs {
    attrs! {
        "arm" => "cuda",
        "staging" => opts.method.name(),
        "release_pages" => opts.release_pages,
        attr::BYTES_STAGED => st.bytes,
        "tensors" => tensors,
        "files" => st.files,
        "copies" => st.copies,
        "allocations" => st.allocations,
        "staging_s" => st.seconds,
        "staging_gbps" => st.gbps(),
        "staging_pin_s" => st.pin_s,
        "staging_teardown_s" => st.teardown_s,
        attr::DEVICE_MS => st.device_ms,
        "device_open_s" => device_open_s,
        "device_open_context_s" => opened.context_s,
        "device_open_kernels_s" => opened.kernels_s,
        "device_open_gemm_s" => opened.gemm_s,
        "kernel_modules_compiled" => opened.modules_compiled,
    }
}

/// Wait for the staging teardowns still running on their own threads
/// ([`crate::cuda::staging::Teardown::Background`]) before a device load's
/// phase closes, so the load's promises (`release-pages`) hold at its close;
/// with any, the close says their own wall (`staging_background_teardown_s`, s)
/// and how long the load waited for them at its end (`staging_settle_wait_s`, s).
fn settle_staging(a: &mut Attrs) {
    insert_settled(a, crate::cuda::staging::settle_teardowns());
}

/// The close attributes of [`settle_staging`] from what it waited for (own
/// wall, wait; s): none when no teardown ran in the background.
fn insert_settled(a: &mut Attrs, (own, waited): (f64, f64)) {
    if own > 0.0 {
        a.insert("staging_background_teardown_s".into(), Value::from(own));
        a.insert("staging_settle_wait_s".into(), Value::from(waited));
    }
}

/// `conditioning = device`: the validated T5 checkpoint's tensors staged onto
/// the device (lever `staging`, `release-pages`), the device's allocator
/// attached to the recorder, and one warm-up forward over placeholder tokens
/// for `prompts` prompts, so the workspace and the first launches' one-time
/// host work fall in this load, not in `conditioning`'s forwards.
fn load_cuda_t5(
    src: SafetensorsSource,
    req: &RenderRequest,
    prompts: usize,
    rec: &Recorder,
) -> anyhow::Result<(DeviceT5, Attrs)> {
    let tensors = src.extents().map_err(|e| BadInput(e.to_string()))?;
    drop(src);
    let opts = req.levers.staging();
    let (mut t5, r) =
        open_device_t5(&tensors, &req.preset.t5, &opts).context("the CUDA arm's text encoder")?;
    rec.attach_device(t5.mem());
    let warm_ms = t5
        .warm_up(prompts, req.preset.max_text_tokens)
        .context("the CUDA arm's text encoder: warm-up forward")?;
    let staged = t5.weights().names().count();
    let mut a = staging_attrs(&opts, &r.staging, staged, (r.device_open_s, r.opened));
    a.insert("warm_up_device_ms".into(), Value::from(warm_ms));
    settle_staging(&mut a);
    Ok((t5, a))
}

/// The encoded prompt and (with guidance) negative prompt, in the order
/// `condition` encoded them, as what the denoise loop conditions on.
fn prompt_and_negative(
    encoded: Vec<Encoded>,
    guidance: bool,
) -> anyhow::Result<(TextCond, Option<TextCond>)> {
    let mut e = encoded.into_iter().map(Encoded::into_cond);
    let c = e
        .next()
        .ok_or_else(|| anyhow!("the text encoder returned no states"))?;
    let u = if guidance { e.next() } else { None };
    Ok((c, u))
}

/// A tokenizer error is the user's input; an encoder failure is the engine's.
fn conditioning_error(e: ConditioningError) -> anyhow::Error {
    match e {
        ConditioningError::Tokenize(t) => BadInput(t.to_string()).into(),
        other => anyhow::Error::new(other),
    }
}

/// The timestep the VAE decodes at: the preset's decode timestep where the
/// decoder is timestep-conditioned, else 0.
fn decode_timestep(p: &Preset) -> f32 {
    if p.vae.timestep_conditioning {
        p.vae_scaling.decode_timestep
    } else {
        0.0
    }
}

/// Tokens `[N, C]` in (f, h, w) order to channel-first latents `[C, f, h, w]`,
/// denormalised, with the decode noise mixed in where the decoder is
/// timestep-conditioned; returns them and the decode timestep.
fn prepare_latents(
    latents: Tensor,
    mean: &[f32],
    std: &[f32],
    req: &RenderRequest,
    grid: (usize, usize, usize),
) -> anyhow::Result<(Tensor, f32)> {
    let p = &req.preset;
    let lc = p.vae.latent_channels;
    let mut z = unpack_latents(latents.data(), lc);
    drop(latents);
    schedule::denormalize_latents(&mut z, mean, std, p.vae_scaling.scaling_factor)
        .map_err(|e| anyhow!("denormalize: {e}"))?;
    if p.vae.timestep_conditioning {
        let noise = decode_noise(req.rung.seed, lc, grid);
        schedule::mix_decode_noise(&mut z, noise.data(), p.vae_scaling.decode_noise_scale)
            .map_err(|e| anyhow!("decode noise: {e}"))?;
    }
    let timestep = decode_timestep(p);
    let z = Tensor::new(&[lc, grid.0, grid.1, grid.2], z).map_err(|e| anyhow!("latents: {e}"))?;
    Ok((z, timestep))
}

/// `decode.video` on the arm `dec` runs: one `decode.video.chunk` per
/// temporal chunk (each closed as the decoder reports its end, with the
/// chunk's `device_ms` and frames where the arm counts them); chunk 0 also
/// covers preparing the latents, the last one freeing the decoder.
fn decode_video(
    dec: Box<dyn Decoder>,
    latents: Tensor,
    req: &RenderRequest,
    grid: (usize, usize, usize),
    rec: &Recorder,
) -> anyhow::Result<Decoded> {
    let chunk = dec.chunk_latent_frames();
    let chunks = grid.0.div_ceil(chunk);
    let mut open = attrs! {"chunk_latent_frames" => chunk, "chunks" => chunks, "arm" => dec.arm()};
    open.extend(dec.open_attrs());
    let ph = rec.phase("decode.video", open);
    let mut open_chunk = Some(rec.phase("decode.video.chunk", attrs! {"chunk" => 0}));
    let (mean, std) = dec.latent_stats();
    let preparing = Instant::now();
    let (z, timestep) = prepare_latents(latents, mean, std, req, grid)?;
    let latents_ms = preparing.elapsed().as_secs_f64() * 1e3;
    let mut last: Option<ChunkEnd> = None;
    let mut on_chunk = |end: ChunkEnd| {
        if end.index + 1 < end.chunks {
            if let Some(c) = open_chunk.take() {
                c.finish(end.attrs());
            }
            open_chunk = Some(rec.phase("decode.video.chunk", attrs! {"chunk" => end.index + 1}));
        } else {
            last = Some(end);
        }
    };
    let (out, mut a) = dec.decode_clip(z, timestep, &mut on_chunk)?;
    if let Some(c) = open_chunk.take() {
        c.finish(last.map(|e| e.attrs()).unwrap_or_default());
    }
    a.insert("latents_ms".into(), serde_json::Value::from(latents_ms));
    ph.finish(a);
    Ok(out)
}

/// The CUDA arm's VAE: the decoder's tensors (and the latent statistics) of
/// the validated checkpoint staged onto the device (lever `staging`,
/// `release-pages`), the convolution weights reordered there, the device's
/// allocator attached to the recorder.
fn load_cuda_vae(
    src: SafetensorsSource,
    req: &RenderRequest,
    rec: &Recorder,
) -> anyhow::Result<(DeviceVae, Attrs)> {
    let tensors: Vec<_> = src
        .extents()
        .map_err(|e| BadInput(e.to_string()))?
        .into_iter()
        .filter(|e| {
            e.name.starts_with("decoder.") || e.name == "latents_mean" || e.name == "latents_std"
        })
        .collect();
    drop(src);
    let opts = req.levers.staging();
    let (dv, r) = open_device_vae(&tensors, &req.preset.vae, &opts, RENDER_CONV_PATH)
        .context("the CUDA arm's VAE")?;
    rec.attach_device(cuda_vae::mem(&dv));
    let mut a = staging_attrs(
        &opts,
        &r.staging,
        tensors.len(),
        (r.device_open_s, r.opened),
    );
    a.insert("prepare_s".into(), Value::from(r.prepare_s));
    a.insert("conv".into(), Value::from(dv.path.name()));
    if let Some(e) = &dv.cudnn_error {
        // cuDNN did not load: the engine's own kernel runs instead.
        a.insert("conv_fallback".into(), Value::from(e.as_str()));
    }
    settle_staging(&mut a);
    Ok((dv, a))
}

/// Write `video.y4m`, `first.png`, `middle.png` (frame `(F-1)/2`), `last.png`, and
/// with `all` every `frame_NNNNN.png`, into `out`.
pub fn write_frames(
    frames: &[Frame],
    out: &Path,
    fps: f64,
    all: bool,
) -> anyhow::Result<RenderOutcome> {
    let first = frames
        .first()
        .ok_or_else(|| anyhow!("the decoder produced no frames"))?;
    use rayon::prelude::*;
    let (w, h) = (first.width, first.height);
    let last = frames.len() - 1;
    let mut pngs: Vec<(String, &Frame)> = [
        ("first.png", 0),
        ("middle.png", last / 2),
        ("last.png", last),
    ]
    .into_iter()
    .map(|(name, i)| (name.to_string(), &frames[i]))
    .collect();
    if all {
        pngs.extend(
            frames
                .iter()
                .enumerate()
                .map(|(i, f)| (format!("frame_{i:05}.png"), f)),
        );
    }
    // The video and the pictures are independent files: written side by side.
    let (video, pictures) = rayon::join(
        || -> anyhow::Result<usize> {
            let mut y4m = Y4mWriter::create(&out.join("video.y4m"), w, h, fps)?;
            y4m.write_frames(frames)?;
            Ok(y4m.finish()?)
        },
        || -> anyhow::Result<()> {
            pngs.par_iter()
                .try_for_each(|(name, f)| write_png(&out.join(name), f))?;
            Ok(())
        },
    );
    let n = video?;
    pictures?;
    Ok(RenderOutcome {
        frames_written: n,
        width: w,
        height: h,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kit::OpenTimes;
    use crate::cuda::staging::StagingMethod;

    /// Red on: a part of the device's open left out of a load's close, or
    /// carried under another part's name.
    #[test]
    fn a_device_load_names_where_its_open_went() {
        let st = StagingReport {
            method: StagingMethod::Batched,
            bytes: 9_000_000_000,
            seconds: 0.3,
            device_ms: 290.0,
            files: 2,
            copies: 360,
            allocations: 1,
            windows: 1,
            bounce_bytes: 0,
            pin_s: 0.21,
            teardown_s: 0.04,
        };
        let opened = OpenTimes {
            context_s: 0.31,
            kernels_s: 0.12,
            gemm_s: 0.05,
            modules_compiled: 2,
        };
        let opts = StagingOptions::new(StagingMethod::Batched);
        let a = staging_attrs(&opts, &st, 219, (0.48, opened));
        let f = |k: &str| a.get(k).and_then(Value::as_f64);
        assert_eq!(f("device_open_s"), Some(0.48));
        assert_eq!(f("device_open_context_s"), Some(0.31));
        assert_eq!(f("device_open_kernels_s"), Some(0.12));
        assert_eq!(f("device_open_gemm_s"), Some(0.05));
        assert_eq!(f("kernel_modules_compiled"), Some(2.0));
        assert_eq!(f("staging_gbps"), Some(30.0));
        assert_eq!(f("staging_pin_s"), Some(0.21));
        assert_eq!(f("staging_teardown_s"), Some(0.04));
    }

    /// Red on: a background teardown's wall or wait left out of the close, the
    /// two swapped, or attributes written where nothing ran in the background.
    #[test]
    fn a_load_says_what_its_background_teardown_cost() {
        let mut a = Attrs::new();
        insert_settled(&mut a, (0.0, 0.0));
        assert!(a.is_empty(), "{a:?}");
        insert_settled(&mut a, (0.08, 0.01));
        let f = |k: &str| a.get(k).and_then(Value::as_f64);
        assert_eq!(f("staging_background_teardown_s"), Some(0.08));
        assert_eq!(f("staging_settle_wait_s"), Some(0.01));
    }

    /// Red on: a count of the tuned choice carried under another's name, the
    /// digest or the changed shapes left out, or a cache error not said.
    #[test]
    fn a_tuned_load_says_what_its_gemm_choice_did() {
        use crate::cuda::kit::gemm_tune::TuneReport;
        let mut r = TuneReport {
            tuned: 3,
            from_cache: 2,
            not_first: 1,
            tune_ms: 41.5,
            cache_rejected: 4,
            untimed_in_capture: 5,
            cache_file: Some("/c/gemm-algos/x.tsv".into()),
            cache_error: Some("disk full".into()),
            ..TuneReport::default()
        };
        r.choices
            .insert("m1 n2 k3 Bias Bf16".into(), (2, [7; 8], Some(0.1)));
        r.choices
            .insert("m4 n5 k6 Bias Bf16".into(), (0, [8; 8], None));
        let mut a = Attrs::new();
        insert_tune_report(&mut a, &r);
        let f = |k: &str| a.get(k).and_then(Value::as_f64);
        assert_eq!(f("gemm_tuned"), Some(3.0));
        assert_eq!(f("gemm_from_cache"), Some(2.0));
        assert_eq!(f("gemm_not_first"), Some(1.0));
        assert_eq!(f("gemm_tune_ms"), Some(41.5));
        assert_eq!(f("gemm_cache_rejected"), Some(4.0));
        assert_eq!(f("gemm_untimed_in_capture"), Some(5.0));
        assert_eq!(
            a.get("gemm_algos_sha256").and_then(Value::as_str),
            Some(r.digest().as_str())
        );
        assert_eq!(
            a.get("gemm_changed"),
            Some(&Value::Array(vec![Value::from(
                "m1 n2 k3 Bias Bf16: #2 (-10.0%)"
            )]))
        );
        assert_eq!(
            a.get("gemm_cache_error").and_then(Value::as_str),
            Some("disk full")
        );
        assert!(a.contains_key("gemm_cache_file"));
    }
}
