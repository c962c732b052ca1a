//! `engine encode-text`: a prompt set tokenized and encoded by one arm, with
//! the conditioning code the render runs ([`crate::conditioning`]), written to
//! a safetensors file for `scripts/t5_check.py` to hold against transformers'
//! `T5EncoderModel`.
//!
//! File: for prompt `i`, `ids.{i}` (i32 `[L]`), `mask.{i}` (f32 `[L]`, the
//! tokenizer's), `states.{i}` (f32 `[L, d_model]`, the last hidden state)
//! and, with `--blocks N` on the host arm, `block.{i}.{k}` for the first N
//! blocks (f32 `[L, d_model]`, block `k`'s output before the final norm:
//! transformers' `hidden_states[k + 1]`). Metadata: `prompts` (a JSON array), `arm`
//! (`cpu`|`cuda`), `keys` (`all`|`masked`), `preset`, `engine_version`,
//! `load_s`, `encode_s` (wall seconds) and on the device `device_ms`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use evidence::rung::Device;

use super::TensorFile;
use crate::conditioning::{Encoded, KeyRule};
use crate::cpu::text::encode_host;
use crate::cuda::models::t5::encode_device;
use crate::cuda::models::t5::open_device_t5;
use crate::cuda::staging::{StagingMethod, StagingOptions};
use crate::models::t5::{self, T5Encoder};
use crate::pipeline::BadInput;
use crate::presets::Preset;
use crate::text::tokenizer::PromptTokenizer;
use crate::weights::layout::{Component, Layout};
use crate::weights::safetensors::LoadOptions;
use crate::weights::VarBuilder;

/// What to encode, with what.
#[derive(Debug, Clone)]
pub struct EncodeTextRequest {
    /// A weights directory in the diffusers layout (`tokenizer/`, `text_encoder/`).
    pub weights: PathBuf,
    /// The preset whose text encoder config and token budget apply.
    pub preset: Preset,
    /// The prompts, in order.
    pub prompts: Vec<String>,
    /// The arm: the host's f32 encoder or the device's bf16 one.
    pub device: Device,
    /// Which keys the encoder attends to.
    pub keys: KeyRule,
    /// Keep the outputs of the first this many blocks (host arm only).
    pub blocks: usize,
}

/// The encoded prompts and the time they took.
#[derive(Debug)]
pub struct EncodeTextOutcome {
    /// One per prompt, in order.
    pub encoded: Vec<Encoded>,
    /// Wall seconds to load the encoder (and stage it on the device).
    pub load_s: f64,
    /// Wall seconds to tokenize and encode every prompt.
    pub encode_s: f64,
    /// Device milliseconds of the forwards (device arm).
    pub device_ms: Option<f64>,
}

/// Read a prompt file: a JSON array of strings.
pub fn read_prompts(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        BadInput(format!(
            "{}: cannot read the prompt file: {e}",
            path.display()
        ))
    })?;
    let v: Vec<String> = serde_json::from_str(&text).map_err(|e| {
        BadInput(format!(
            "{}: expected a JSON array of prompt strings: {e}",
            path.display()
        ))
    })?;
    if v.is_empty() {
        return Err(BadInput(format!("{}: the prompt list is empty", path.display())).into());
    }
    Ok(v)
}

/// Tokenize and encode every prompt of `req`.
pub fn encode_text(req: &EncodeTextRequest) -> anyhow::Result<EncodeTextOutcome> {
    if req.blocks > 0 && req.device == Device::Cuda {
        return Err(BadInput("--blocks is for the host arm (--device cpu)".into()).into());
    }
    let p = &req.preset;
    let layout = Layout::resolve(&req.weights).map_err(|e| BadInput(format!("weights: {e}")))?;
    let tok_path = layout.tokenizer_json().ok_or_else(|| {
        BadInput(format!(
            "{}: no tokenizer/tokenizer.json",
            layout.root().display()
        ))
    })?;
    let tok = PromptTokenizer::from_file(&tok_path, p.max_text_tokens, p.t5.vocab_size)
        .map_err(|e| BadInput(e.to_string()))?;
    let cf = layout
        .component(Component::TextEncoder)
        .map_err(|e| BadInput(e.to_string()))?;
    let src = cf
        .open(LoadOptions::default())
        .map_err(|e| BadInput(e.to_string()))?;
    src.validate(&t5::tensor_specs(&p.t5), &|n| n == t5::EMBED_ALIAS)
        .map_err(|e| BadInput(e.to_string()))?;
    let prompts: Vec<&str> = req.prompts.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    match req.device {
        Device::Cpu => {
            let model = T5Encoder::load(&VarBuilder::new(&src), &p.t5)
                .map_err(|e| BadInput(e.to_string()))?;
            drop(src);
            let load_s = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let encoded = encode_host(&model, &tok, &prompts, req.keys, req.blocks)
                .context("encoding on the host")?;
            Ok(EncodeTextOutcome {
                encoded,
                load_s,
                encode_s: t1.elapsed().as_secs_f64(),
                device_ms: None,
            })
        }
        Device::Cuda => {
            let tensors = src.extents().map_err(|e| BadInput(e.to_string()))?;
            drop(src);
            let (mut dev, _) = open_device_t5(
                &tensors,
                &p.t5,
                &StagingOptions::new(StagingMethod::Batched),
            )
            .context("the CUDA arm's text encoder")?;
            let load_s = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let (encoded, ms) = encode_device(&mut dev, &tok, &prompts, req.keys)
                .context("encoding on the device")?;
            Ok(EncodeTextOutcome {
                encoded,
                load_s,
                encode_s: t1.elapsed().as_secs_f64(),
                device_ms: Some(ms),
            })
        }
    }
}

/// Write `out` of `req` to `path` (the layout in the module doc).
pub fn write(req: &EncodeTextRequest, out: &EncodeTextOutcome, path: &Path) -> anyhow::Result<()> {
    let mut f = TensorFile::new();
    for (i, e) in out.encoded.iter().enumerate() {
        let ids: Vec<i32> = e.ids.iter().map(|v| *v as i32).collect();
        f.i32(format!("ids.{i}"), &ids);
        f.f32(format!("mask.{i}"), &[e.mask.len()], &e.mask);
        f.f32(format!("states.{i}"), e.states.shape(), e.states.data());
        for (k, b) in e.blocks.iter().enumerate() {
            f.f32(format!("block.{i}.{k}"), b.shape(), b.data());
        }
    }
    f.meta("prompts", serde_json::to_string(&req.prompts)?);
    f.meta(
        "arm",
        match req.device {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        },
    );
    f.meta("keys", req.keys.name());
    f.meta("preset", req.preset.name);
    f.meta("engine_version", env!("CARGO_PKG_VERSION"));
    f.meta("load_s", format!("{:.3}", out.load_s));
    f.meta("encode_s", format!("{:.3}", out.encode_s));
    if let Some(ms) = out.device_ms {
        f.meta("device_ms", format!("{ms:.3}"));
    }
    f.write(path)?;
    Ok(())
}
