//! The lever registry: every switch a run can flip, its arms, its default arm (the
//! best measured state) and its baseline arm (the state the seed measured).
//!
//! A run's arms are resolved once, from the profile (`default` or `baseline`) and
//! then the per-lever overrides (`--lever NAME=ARM` or a rung's `[levers]` table).
//! An unknown lever or arm is an error listing the valid ones, so a typo never falls
//! back silently to a default.

use std::collections::BTreeMap;

use evidence::rung::Profile;
use serde::Serialize;

use crate::weights::safetensors::Widen;

/// Which device arm of the engine a lever acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Applies {
    /// The CPU reference arm (host memory and host threads).
    Cpu,
    /// The device-resident CUDA arm.
    Cuda,
    /// Both arms (e.g. releasing the weight files' page cache after loading).
    Both,
}

/// One lever: an id, its arms, and which arm each profile takes.
#[derive(Debug, Clone, Serialize)]
pub struct LeverDef {
    /// Lever id as written on the command line and in rung files (`widen-f32`).
    pub id: &'static str,
    /// Every accepted arm, in a stable order.
    pub arms: &'static [&'static str],
    /// The arm of the `default` profile (the best measured state).
    pub default: &'static str,
    /// The arm of the `baseline` profile (the old state the seed measured).
    pub baseline: &'static str,
    /// The device arm this lever acts on; on another arm it is recorded but inert.
    pub applies_to: Applies,
    /// What the lever changes, in one sentence.
    pub doc: &'static str,
}

/// Lever id: how weights are widened to `f32` on the host.
pub const WIDEN_F32: &str = "widen-f32";
/// Lever id: whether the source pages of the weight files are released after load.
pub const RELEASE_PAGES: &str = "release-pages";
/// Lever id: the size of the host thread pool.
pub const HOST_THREADS: &str = "host-threads";
/// Lever id: how the CUDA arm stages weights onto the device.
pub const STAGING: &str = "staging";
/// Lever id: whether the CUDA arm's denoise steps replay captured CUDA graphs.
pub const DENOISE_GRAPH: &str = "denoise-graph";
/// Lever id: where the text encoder (the `conditioning` phase) runs.
pub const CONDITIONING: &str = "conditioning";
/// Lever id: where the video VAE decodes on a CUDA render.
pub const VAE: &str = "vae";
/// Lever id: which kernel runs the CUDA arm's DiT self-attention.
pub const ATTENTION: &str = "attention";
/// Lever id: which kernel runs the CUDA arm's DiT cross-attention to the text.
pub const CROSS_ATTENTION: &str = "cross-attention";
/// Lever id: which kernel runs the CUDA arm's DiT q/k RMS norm and RoPE.
pub const QK_NORM: &str = "qk-norm";
/// Lever id: the number format of the CUDA arm's DiT block Linears.
pub const PRECISION: &str = "precision";
/// Lever id: when the CUDA arm's VAE makes its decode's buffers and cuDNN plans.
pub const VAE_PREPARE: &str = "vae-prepare";
/// Lever id: how the CUDA arm's FP8 GEMMs accumulate (inert unless `precision = fp8`).
pub const FP8_ACCUM: &str = "fp8-accum";
/// Lever id: the number format of the CUDA arm's DiT self-attention.
pub const ATTENTION_PRECISION: &str = "attention-precision";
/// Lever id: whether the CUDA arm's DiT projects the text's cross-attention
/// keys and values in every forward or once per text.
pub const TEXT_KV: &str = "text-kv";
/// Lever id: whether the CUDA arm runs a guided step's two forwards one after
/// the other or as one forward over both samples.
pub const GUIDANCE_BATCH: &str = "guidance-batch";
/// Lever id: the number format of the CUDA arm's DiT residual stream.
pub const RESIDUAL: &str = "residual";
/// Lever id: how the CUDA arm's DiT GEMMs choose their cuBLASLt algorithm.
pub const GEMM_ALGO: &str = "gemm-algo";

static REGISTRY: &[LeverDef] = &[
    LeverDef {
        id: WIDEN_F32,
        arms: &["double", "single"],
        default: "single",
        baseline: "double",
        applies_to: Applies::Cpu,
        doc: "double keeps the bf16 originals beside the f32 copies for the whole run \
              (the seed's defect); single keeps only the f32 copies",
    },
    LeverDef {
        id: RELEASE_PAGES,
        arms: &["off", "on"],
        default: "on",
        baseline: "off",
        applies_to: Applies::Both,
        doc: "on drops the weight files' pages (MADV_DONTNEED on the mapping, \
              POSIX_FADV_DONTNEED on the file) once a tensor is materialized",
    },
    LeverDef {
        id: HOST_THREADS,
        arms: &["1", "n"],
        default: "n",
        baseline: "1",
        applies_to: Applies::Cpu,
        doc: "the host (rayon) pool size: 1 thread, or n = every core",
    },
    LeverDef {
        id: STAGING,
        arms: &["serial", "batched"],
        default: "batched",
        baseline: "serial",
        applies_to: Applies::Cuda,
        doc: "serial stages each tensor with its own cuMemAlloc, a pageable copy and a \
              synchronize (the seed's pattern); batched reads the file with several threads \
              straight into pinned buffers and overlaps async copies into one device arena",
    },
    // Default `on` from device run graph1 (final latents bit-identical between
    // arms; faster per step at rung 1's grid, about even at rung 2's:
    // reports/device-notes.md and the lever's ranking in reports/levers.md).
    LeverDef {
        id: DENOISE_GRAPH,
        arms: &["off", "on"],
        default: "on",
        baseline: "off",
        applies_to: Applies::Cuda,
        doc: "off launches every kernel and GEMM of each forward from the host every step; \
              on captures each forward once per loop as a CUDA graph and replays it, the \
              step's timestep written into device memory before the replay",
    },
    LeverDef {
        id: CONDITIONING,
        arms: &["host", "device"],
        default: "device",
        baseline: "host",
        applies_to: Applies::Cuda,
        doc: "host runs the T5 text encoder on the CPU arm in f32; device stages its bf16 \
              weights to the GPU in load.text_encoder and runs the forward(s) there, freeing \
              it before load.dit (inert with --prompt-embeds)",
    },
    LeverDef {
        id: VAE,
        arms: &["host", "device"],
        default: "device",
        baseline: "host",
        applies_to: Applies::Cuda,
        doc: "host decodes the video VAE on the CPU reference arm; device stages the VAE to the \
              GPU and decodes there in temporal chunks (bf16 activations, cuDNN convolutions, \
              or the engine's implicit-GEMM kernel where cuDNN does not load), pixels copied \
              back per chunk",
    },
    LeverDef {
        id: ATTENTION,
        arms: &["mma", "cudnn"],
        // Measured on the H200: cudnn's denoise is the shorter at rungs 2 and 3
        // at a fidelity above the lever's floor (reports/levers.md, the
        // `attention` rows; reports/device-notes.md, 2026-12-04), so it is the
        // default; mma stays the baseline (and the arm for a machine without
        // cuDNN 9.13+).
        default: "cudnn",
        baseline: "mma",
        applies_to: Applies::Cuda,
        doc: "mma runs the DiT's self-attention in the engine's own flash kernel (bf16 \
              mma.sync, online softmax in registers); cudnn runs it in cuDNN's fused \
              SDPA-forward operation (cuDNN 9.13+, loaded at run time; an error, not a \
              fallback, where it is missing). The cross-attention to the text is the \
              cross-attention lever's",
    },
    // Not yet measured on a device (UNMEASURED): the default stays the baseline.
    LeverDef {
        id: CROSS_ATTENTION,
        arms: &["mma", "cudnn"],
        default: "mma",
        baseline: "mma",
        applies_to: Applies::Cuda,
        doc: "mma runs the DiT's cross-attention to the text in the engine's own flash kernel, \
              adding the text mask's key bias; cudnn runs it in cuDNN's fused SDPA-forward \
              operation over the attended text tokens without a bias (cuDNN 9.13+, an error \
              where it is missing); a text whose kept tokens carry a mask (not real tokens \
              followed by padding) stays on the engine's kernel on both arms",
    },
    LeverDef {
        id: QK_NORM,
        arms: &["block", "warp"],
        default: "block",
        baseline: "block",
        applies_to: Applies::Cuda,
        doc: "block runs each DiT block's q/k RMS norm (+ RoPE) one 256-thread block per row \
              with 4-byte loads; warp runs it one warp per row with 16-byte loads and the sum \
              of squares as a warp reduction (the same expressions, the sum in another order: \
              a value may differ in its last bit)",
    },
    LeverDef {
        id: PRECISION,
        arms: &["bf16", "fp8"],
        default: "bf16",
        baseline: "bf16",
        applies_to: Applies::Cuda,
        doc: "bf16 runs the DiT blocks' ten Linears as bf16 GEMMs; fp8 quantizes each weight \
              to e4m3 per output channel once on the device and each input per token before \
              its GEMM, and runs cuBLASLt's FP8 GEMM with outer-vector scales and f32 \
              accumulation (compute capability 8.9+ and cuBLAS 12.9+, an error where either \
              is missing); a render on fp8 keeps those weights in e4m3 only (staged through a \
              bounded bounce buffer and quantized as they arrive: about half their bf16 \
              bytes of device memory)",
    },
    // Confirmed at rung 2 (2026-12-07, four pairs): the default is the load arm.
    LeverDef {
        id: VAE_PREPARE,
        arms: &["decode", "load"],
        default: "load",
        baseline: "decode",
        applies_to: Applies::Cuda,
        doc: "decode makes the device decode's buffers, its two pinned RGB8 frame halves and \
              its cuDNN convolution plans at their first use inside decode.video; load makes \
              them in load.vae for the render's latent geometry (the same sizes, plans and \
              kernels: the frames do not change; the decode's memory is held from load.vae on)",
    },
    // Confirmed at rungs 2 and 3 within the fidelity rule (2026-12-07): the default
    // is fast, inert unless a user picks precision = fp8.
    LeverDef {
        id: FP8_ACCUM,
        arms: &["exact", "fast"],
        default: "fast",
        baseline: "exact",
        applies_to: Applies::Cuda,
        doc: "exact lets cuBLASLt promote the FP8 GEMMs' partial sums to f32 at its default \
              cadence; fast sets its FAST_ACCUM, so the tensor cores keep a k-chain's sums in \
              their narrower accumulator (faster, the sums less exact; the e4m3 operands and \
              scales are the same); inert unless precision = fp8 (specs/levers.toml measures \
              it with precision = fp8 in both arms)",
    },
    // Not yet measured on a device (UNMEASURED): the default stays the baseline.
    LeverDef {
        id: ATTENTION_PRECISION,
        arms: &["bf16", "fp8"],
        default: "bf16",
        baseline: "bf16",
        applies_to: Applies::Cuda,
        doc: "bf16 runs the DiT's self-attention in bf16 on the attention lever's kernel; fp8 \
              quantizes q, k and v to e4m3 with one scale per tensor and runs cuDNN's FP8 \
              fused attention (Hopper), whose probabilities are e4m3 too and whose e4m3 output \
              feeds the out-projection's FP8 GEMM directly; needs precision = fp8 and \
              attention = cudnn (an error naming them otherwise); the cross-attention stays \
              bf16",
    },
    LeverDef {
        id: GUIDANCE_BATCH,
        arms: &["pair", "batched"],
        default: "pair",
        baseline: "pair",
        applies_to: Applies::Cuda,
        doc: "pair runs a guided step's two DiT forwards (negative prompt, then prompt) one \
              after the other; batched runs them as one forward over both samples, every \
              Linear one GEMM over both samples' rows (attention, RoPE and the text per \
              sample; the GEMMs' sums may differ in their last bits at the doubled row \
              count); needs text-kv = cached (an error naming it otherwise); twice the \
              forward's per-token workspace; inert without guidance",
    },
    LeverDef {
        id: RESIDUAL,
        arms: &["f32", "bf16"],
        default: "f32",
        baseline: "f32",
        applies_to: Applies::Cuda,
        doc: "f32 holds the DiT's residual stream in f32 (each residual add exact to f32); \
              bf16 holds it in bf16, as a bf16 model does (each add taken in f32 and rounded \
              once to bf16, the norms reading the rounded row): the row passes move 8 bytes \
              an element instead of 12",
    },
    LeverDef {
        id: GEMM_ALGO,
        arms: &["heuristic", "tuned"],
        default: "heuristic",
        baseline: "heuristic",
        applies_to: Applies::Cuda,
        doc: "heuristic runs each of the DiT's cuBLASLt products (bf16, or FP8 on precision = \
              fp8) with the first algorithm \
              cuBLASLt's heuristic answers; tuned times the heuristic's first 8 answers on the \
              product's own operands the first time a shape is planned (in load.dit's warm-up) \
              and keeps the fastest where it beats the first by 2%, storing the choice per card \
              and cuBLASLt version in the engine's cache directory (gemm-algos/), so later runs \
              on the machine reuse it (another algorithm may sum in another order: the outputs \
              may differ in their last bits)",
    },
    LeverDef {
        id: TEXT_KV,
        arms: &["per-forward", "cached"],
        default: "per-forward",
        baseline: "per-forward",
        applies_to: Applies::Cuda,
        doc: "per-forward projects the text to every DiT block's cross-attention keys (then \
              RMS-normed) and values inside each forward; cached computes them once per \
              prompt when the loop is readied and every forward reads them (the same values \
              bit for bit; layers x 2 x text tokens x width bf16 more device memory per \
              prompt)",
    },
];

/// Levers whose default has not yet been decided from device evidence: it stays
/// the baseline until a complete campaign ranks the treatment (every other
/// lever's default is its best measured arm, never its baseline). A new lever
/// whose treatment has never run on a device belongs here. `precision` stays by
/// decision, not for want of evidence: its fp8 arm is confirmed faster at rungs 2
/// and 3 (2026-12-06, `reports/levers.md`) and holds 11.9 GiB less at 13B, and
/// with its own conditioning it is as far from diffusers f32 as the bf16 arm is
/// (20.27-20.29 against 20.43 dB at rung 2, 21.50-21.53 against 21.47 at rung 3,
/// read off the committed bundles: `specs/fidelity.md`). But its frames sit 36-37
/// dB from the bf16 arm's, and issue 31 holds the default render given diffusers'
/// embeddings at the 48-51 dB from diffusers f32 it has on bf16, which fp8 would
/// take to about 36. fp8 stays the arm a user picks with `--lever
/// precision=fp8`. `cross-attention` and `qk-norm` stay because the
/// evidence keeps their baselines: both treatments were refuted at rung 2
/// (2026-12-06, three pairs each, against a 1% minimum: cudnn -0.3% [-0.6%, 0.1%],
/// warp -0.1% [-0.2%, 0.0%]), so their best arms are the baselines.
/// `vae-prepare` left on 2026-12-07: four pairs at rung 2 (campaign 96f158c465f6)
/// confirmed its `load` arm (38.8% [30.4%, 47.9%] of decode.video against a 25%
/// minimum, frames identical). `fp8-accum` left the same day: confirmed at rung 2
/// (3fc06ac6b29a, 5.9% [5.2%, 6.9%] of an fp8 denoise, 44.2 dB from the exact
/// arm's frames) and at rung 3 (ef8387a527f1, 11.2% [11.0%, 11.6%], 44.7 dB); its
/// `fast` arm acts only under `precision = fp8`, which a user picks.
/// `attention-precision` stays: refuted at rung 2 (70fb5068f340, 1.2% [0.4%,
/// 1.8%] against 5%, on a head-dim-64 kernel since found wrong and now refused:
/// `ForwardArms::model_conflict`) and confirmed at rung 3 (4343a54f503c, 7.1%
/// [6.9%, 7.2%], 39.7 dB from the bf16 attention's frames, 2026-12-07); its fp8
/// arm needs `precision = fp8`, which a user picks. `text-kv` (session 35) stays
/// for want of evidence: 1.0% [0.9%, 1.1%] at rung 2 (c4b3c324ebcc, frames
/// identical) straddles its 1% minimum. `guidance-batch` and `gemm-algo` stay
/// because the evidence keeps their baselines: refuted at rung 2 (2026-12-07,
/// three pairs each, against a 2% minimum: batched 1.3% [1.2%, 1.5%] with the
/// frames identical, campaign 2678b81b95a5; tuned 0.5% [0.3%, 0.6%], 48.3 dB,
/// 645a2d8c46d0). `residual` stays for want of evidence: 2.1% [1.9%, 2.4%] at
/// rung 2 (2678b81b95a5, 46.8 dB from the f32 stream's frames) straddles its 2%
/// minimum.
pub const UNMEASURED: &[&str] = &[
    CROSS_ATTENTION,
    QK_NORM,
    PRECISION,
    ATTENTION_PRECISION,
    TEXT_KV,
    GUIDANCE_BATCH,
    RESIDUAL,
    GEMM_ALGO,
];

/// Every lever the engine knows, in a stable order.
pub fn registry() -> &'static [LeverDef] {
    REGISTRY
}

/// The lever `id`, if known.
pub fn lever(id: &str) -> Option<&'static LeverDef> {
    REGISTRY.iter().find(|l| l.id == id)
}

/// A lever selection could not be honoured.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LeverError {
    /// No lever has this id.
    #[error("unknown lever '{name}'; valid levers: {valid}")]
    UnknownLever {
        /// The id given.
        name: String,
        /// Every valid id, comma separated.
        valid: String,
    },
    /// The lever has no such arm.
    #[error("lever '{lever}' has no arm '{arm}'; valid arms: {valid}")]
    UnknownArm {
        /// The lever id.
        lever: String,
        /// The arm given.
        arm: String,
        /// Every valid arm, separated by '|'.
        valid: String,
    },
    /// A `NAME=ARM` argument without `=`.
    #[error("lever setting '{0}' is not NAME=ARM")]
    Syntax(String),
}

/// Parse a `NAME=ARM` command-line setting (not yet validated against the registry).
pub fn parse_setting(s: &str) -> Result<(String, String), LeverError> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
            Ok((k.trim().to_string(), v.trim().to_string()))
        }
        _ => Err(LeverError::Syntax(s.to_string())),
    }
}

/// The arm of every lever for one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct LeverSet {
    arms: BTreeMap<String, String>,
}

impl LeverSet {
    /// Every lever in the arm of `profile`, then `overrides` applied in order.
    pub fn resolve<'a>(
        profile: Profile,
        overrides: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<LeverSet, LeverError> {
        let mut arms: BTreeMap<String, String> = REGISTRY
            .iter()
            .map(|l| {
                let arm = match profile {
                    Profile::Default => l.default,
                    Profile::Baseline => l.baseline,
                };
                (l.id.to_string(), arm.to_string())
            })
            .collect();
        for (name, arm) in overrides {
            let def = lever(name).ok_or_else(|| LeverError::UnknownLever {
                name: name.to_string(),
                valid: REGISTRY.iter().map(|l| l.id).collect::<Vec<_>>().join(", "),
            })?;
            if !def.arms.contains(&arm) {
                return Err(LeverError::UnknownArm {
                    lever: name.to_string(),
                    arm: arm.to_string(),
                    valid: def.arms.join("|"),
                });
            }
            arms.insert(name.to_string(), arm.to_string());
        }
        Ok(LeverSet { arms })
    }

    /// The arm of lever `id` (every registered lever has one).
    pub fn arm(&self, id: &str) -> &str {
        self.arms.get(id).map(String::as_str).unwrap_or("")
    }

    /// Every lever and its arm, by id.
    pub fn arms(&self) -> &BTreeMap<String, String> {
        &self.arms
    }

    /// The `widen-f32` arm.
    pub fn widen(&self) -> Widen {
        if self.arm(WIDEN_F32) == "double" {
            Widen::Double
        } else {
            Widen::Single
        }
    }

    /// Whether `release-pages` is on.
    pub fn release_pages(&self) -> bool {
        self.arm(RELEASE_PAGES) == "on"
    }

    /// The CUDA arm's staging options from `staging` and `release-pages`.
    pub fn staging(&self) -> crate::cuda::staging::StagingOptions {
        use crate::cuda::staging::{StagingMethod, StagingOptions};
        let method = if self.arm(STAGING) == "serial" {
            StagingMethod::Serial
        } else {
            StagingMethod::Batched
        };
        let mut o = StagingOptions::new(method);
        o.release_pages = self.release_pages();
        o
    }

    /// Whether `denoise-graph` is on (the CUDA arm replays captured forwards).
    pub fn denoise_graph(&self) -> bool {
        self.arm(DENOISE_GRAPH) == "on"
    }

    /// Whether `conditioning = device`: the text encoder runs on the device
    /// (on a `device = cuda` render; elsewhere the arm is recorded but inert).
    pub fn conditioning_on_device(&self) -> bool {
        self.arm(CONDITIONING) == "device"
    }

    /// Whether the `vae` lever asks for the device decode (inert off the CUDA arm).
    pub fn vae_on_device(&self) -> bool {
        self.arm(VAE) == "device"
    }

    /// Whether `vae-prepare = load`: the device decode's buffers and cuDNN plans
    /// are made in `load.vae` (inert unless the VAE decodes on the device).
    pub fn vae_prepare_at_load(&self) -> bool {
        self.arm(VAE_PREPARE) == "load"
    }

    /// The `attention` arm: which kernel runs the DiT's self-attention.
    pub fn attention(&self) -> crate::cuda::models::dit::AttentionArm {
        use crate::cuda::models::dit::AttentionArm;
        if self.arm(ATTENTION) == "mma" {
            AttentionArm::Mma
        } else {
            AttentionArm::Cudnn
        }
    }

    /// The forward's kernel arms: `attention`, `cross-attention`, `qk-norm`,
    /// `precision`, `fp8-accum`, `attention-precision`, `text-kv`,
    /// `guidance-batch` and `residual`.
    pub fn forward_arms(&self) -> crate::cuda::models::dit::ForwardArms {
        use crate::cuda::kit::gemm::Accum;
        use crate::cuda::models::dit::Precision;
        use crate::cuda::models::dit::{
            AlgoChoice, AttnPrecision, CrossArm, ForwardArms, GuidanceBatch, QkNormArm,
            ResidualStream, TextKvArm,
        };
        ForwardArms {
            attention: self.attention(),
            cross: if self.arm(CROSS_ATTENTION) == "cudnn" {
                CrossArm::Cudnn
            } else {
                CrossArm::Mma
            },
            qk_norm: if self.arm(QK_NORM) == "warp" {
                QkNormArm::Warp
            } else {
                QkNormArm::Block
            },
            precision: if self.arm(PRECISION) == "fp8" {
                Precision::Fp8
            } else {
                Precision::Bf16
            },
            fp8_accum: if self.arm(FP8_ACCUM) == "fast" {
                Accum::Fast
            } else {
                Accum::Exact
            },
            attn_precision: if self.arm(ATTENTION_PRECISION) == "fp8" {
                AttnPrecision::Fp8
            } else {
                AttnPrecision::Bf16
            },
            text_kv: if self.arm(TEXT_KV) == "cached" {
                TextKvArm::Cached
            } else {
                TextKvArm::PerForward
            },
            guidance: if self.arm(GUIDANCE_BATCH) == "batched" {
                GuidanceBatch::Batched
            } else {
                GuidanceBatch::Pair
            },
            residual: if self.arm(RESIDUAL) == "bf16" {
                ResidualStream::Bf16
            } else {
                ResidualStream::F32
            },
            gemm_algo: if self.arm(GEMM_ALGO) == "tuned" {
                AlgoChoice::Tuned
            } else {
                AlgoChoice::Heuristic
            },
        }
    }

    /// The host pool size the `host-threads` arm asks for, given `cores` available.
    pub fn host_threads(&self, cores: usize) -> usize {
        if self.arm(HOST_THREADS) == "1" {
            1
        } else {
            cores.max(1)
        }
    }
}

/// `engine levers --json`: every lever keyed by id with its arms, default and
/// baseline arm, the device arm it applies to, and its one-line description.
pub fn registry_json() -> serde_json::Value {
    let map: BTreeMap<&str, &LeverDef> = REGISTRY.iter().map(|l| (l.id, l)).collect();
    serde_json::json!({ "levers": map })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_pick_default_and_baseline_arms() {
        let d = LeverSet::resolve(Profile::Default, []).unwrap();
        assert_eq!(d.widen(), Widen::Single);
        assert!(d.release_pages());
        assert_eq!(d.host_threads(8), 8);
        let b = LeverSet::resolve(Profile::Baseline, []).unwrap();
        assert_eq!(b.widen(), Widen::Double);
        assert!(!b.release_pages());
        assert_eq!(b.host_threads(8), 1);
    }

    #[test]
    fn staging_lever_maps_to_the_cuda_staging_options() {
        use crate::cuda::staging::StagingMethod;
        let d = LeverSet::resolve(Profile::Default, []).unwrap().staging();
        assert_eq!((d.method, d.release_pages), (StagingMethod::Batched, true));
        let b = LeverSet::resolve(Profile::Baseline, []).unwrap().staging();
        assert_eq!((b.method, b.release_pages), (StagingMethod::Serial, false));
        let o = LeverSet::resolve(Profile::Default, [("staging", "serial")])
            .unwrap()
            .staging();
        assert_eq!(o.method, StagingMethod::Serial);
        assert_eq!(registry_json()["levers"]["staging"]["applies_to"], "cuda");
        assert_eq!(
            registry_json()["levers"]["release-pages"]["applies_to"],
            "both"
        );
    }

    #[test]
    fn the_vae_lever_matches_the_spec_and_defaults_to_the_device() {
        let d = LeverSet::resolve(Profile::Default, []).unwrap();
        assert!(d.vae_on_device());
        let b = LeverSet::resolve(Profile::Baseline, []).unwrap();
        assert!(!b.vae_on_device());
        let h = LeverSet::resolve(Profile::Default, [("vae", "host")]).unwrap();
        assert!(!h.vae_on_device());
        let j = registry_json();
        assert_eq!(j["levers"]["vae"]["applies_to"], "cuda");
        assert_eq!(j["levers"]["vae"]["baseline"], "host");
        assert_eq!(j["levers"]["vae"]["arms"][1], "device");
        // specs/levers.toml's entry names the same arms.
        let entry = spec_entry("vae");
        assert!(entry.contains("arms = [\"host\", \"device\"]"), "{entry}");
        assert!(entry.contains("baseline = \"host\""), "{entry}");
    }

    #[test]
    fn overrides_win_over_the_profile() {
        let s = LeverSet::resolve(
            Profile::Baseline,
            [("widen-f32", "single"), ("release-pages", "on")],
        )
        .unwrap();
        assert_eq!(s.widen(), Widen::Single);
        assert!(s.release_pages());
        assert_eq!(s.arm(HOST_THREADS), "1");
    }

    #[test]
    fn unknown_lever_or_arm_lists_the_valid_ones() {
        let e = LeverSet::resolve(Profile::Default, [("widen", "single")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'widen'") && e.contains("widen-f32, release-pages, host-threads"),
            "{e}"
        );
        let e = LeverSet::resolve(Profile::Default, [("widen-f32", "triple")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'triple'") && e.contains("double|single"), "{e}");
        assert_eq!(
            parse_setting("a=b").unwrap(),
            ("a".to_string(), "b".to_string())
        );
        assert!(parse_setting("ab").is_err());
        assert!(parse_setting("=b").is_err());
    }

    /// The `[[lever]]` entry of `id` in specs/levers.toml, up to its hypothesis.
    fn spec_entry(id: &str) -> &'static str {
        let spec = include_str!("../../specs/levers.toml");
        let at = spec
            .find(&format!("id = \"{id}\""))
            .unwrap_or_else(|| panic!("lever {id} in specs/levers.toml"));
        let end = spec[at..]
            .find("[lever.hypothesis]")
            .unwrap_or_else(|| panic!("lever {id}: no [lever.hypothesis]"));
        &spec[at..at + end]
    }

    #[test]
    fn registry_is_consistent_and_serialises() {
        for l in registry() {
            assert!(l.arms.contains(&l.default), "{}", l.id);
            assert!(l.arms.contains(&l.baseline), "{}", l.id);
            if UNMEASURED.contains(&l.id) {
                assert_eq!(
                    l.default, l.baseline,
                    "{}: unmeasured keeps the baseline",
                    l.id
                );
            } else {
                assert_ne!(l.default, l.baseline, "{}", l.id);
            }
        }
        let j = registry_json();
        assert_eq!(j["levers"]["widen-f32"]["default"], "single");
        assert_eq!(j["levers"]["release-pages"]["baseline"], "off");
        assert_eq!(j["levers"]["host-threads"]["arms"][1], "n");
        assert_eq!(j["levers"]["host-threads"]["applies_to"], "cpu");
    }

    #[test]
    fn attention_lever_matches_the_spec_entry_and_maps_to_the_arm() {
        use crate::cuda::models::dit::AttentionArm;
        let l = lever(ATTENTION).unwrap();
        assert_eq!(l.arms, ["mma", "cudnn"]);
        assert_eq!(l.applies_to, Applies::Cuda);
        let d = LeverSet::resolve(Profile::Default, []).unwrap();
        assert_eq!(d.attention(), AttentionArm::Cudnn);
        assert_eq!(d.attention().name(), "cudnn");
        let b = LeverSet::resolve(Profile::Baseline, []).unwrap();
        assert_eq!(b.attention(), AttentionArm::Mma);
        let m = LeverSet::resolve(Profile::Default, [("attention", "mma")]).unwrap();
        assert_eq!(m.attention(), AttentionArm::Mma);
        assert_eq!(m.attention().name(), "mma");
        let entry = spec_entry("attention");
        assert!(entry.contains("arms = [\"mma\", \"cudnn\"]"), "{entry}");
        assert!(entry.contains("baseline = \"mma\""), "{entry}");
        assert!(entry.contains("treatment = \"cudnn\""), "{entry}");
        assert!(entry.contains("numerics = \"changing\""), "{entry}");
    }

    /// Red on: a new lever's arm not reaching `forward_arms` (e.g. the
    /// `cudnn` or `fast` test inverted), a default that is not the baseline while the
    /// lever is unmeasured, or a spec entry whose arms disagree.
    #[test]
    fn unmeasured_forward_levers_map_to_their_arms_and_match_the_spec() {
        use crate::cuda::kit::gemm::Accum;
        use crate::cuda::models::dit::Precision;
        use crate::cuda::models::dit::{
            AlgoChoice, AttentionArm, AttnPrecision, CrossArm, ForwardArms, GuidanceBatch,
            QkNormArm, ResidualStream, TextKvArm,
        };
        for (id, arms) in [
            (CROSS_ATTENTION, ["mma", "cudnn"]),
            (QK_NORM, ["block", "warp"]),
            (PRECISION, ["bf16", "fp8"]),
            (ATTENTION_PRECISION, ["bf16", "fp8"]),
            (TEXT_KV, ["per-forward", "cached"]),
            (GUIDANCE_BATCH, ["pair", "batched"]),
            (RESIDUAL, ["f32", "bf16"]),
            (GEMM_ALGO, ["heuristic", "tuned"]),
        ] {
            let l = lever(id).unwrap();
            assert_eq!(l.arms, arms, "{id}");
            assert_eq!((l.default, l.baseline), (arms[0], arms[0]), "{id}");
            assert!(UNMEASURED.contains(&id), "{id}");
            assert_eq!(l.applies_to, Applies::Cuda);
            let entry = spec_entry(id);
            let want = format!("arms = [\"{}\", \"{}\"]", arms[0], arms[1]);
            assert!(entry.contains(&want), "{entry}");
            assert!(
                entry.contains(&format!("treatment = \"{}\"", arms[1])),
                "{entry}"
            );
        }
        let d = LeverSet::resolve(Profile::Default, []).unwrap();
        assert_eq!(
            d.forward_arms(),
            ForwardArms {
                attention: AttentionArm::Cudnn,
                cross: CrossArm::Mma,
                qk_norm: QkNormArm::Block,
                precision: Precision::Bf16,
                fp8_accum: Accum::Fast,
                attn_precision: AttnPrecision::Bf16,
                text_kv: TextKvArm::PerForward,
                guidance: GuidanceBatch::Pair,
                residual: ResidualStream::F32,
                gemm_algo: AlgoChoice::Heuristic,
            }
        );
        // fp8-accum is decided (fast), not unmeasured; its baseline stays exact.
        let l = lever(FP8_ACCUM).unwrap();
        assert_eq!(
            (l.arms, l.baseline, l.default),
            (&["exact", "fast"][..], "exact", "fast")
        );
        assert!(!UNMEASURED.contains(&FP8_ACCUM));
        assert!(spec_entry(FP8_ACCUM).contains("treatment = \"fast\""));
        let b = LeverSet::resolve(Profile::Baseline, []).unwrap();
        assert_eq!(b.forward_arms().fp8_accum, Accum::Exact);
        let t = LeverSet::resolve(
            Profile::Baseline,
            [
                ("cross-attention", "cudnn"),
                ("qk-norm", "warp"),
                ("precision", "fp8"),
                ("fp8-accum", "fast"),
            ],
        )
        .unwrap();
        let a = t.forward_arms();
        assert_eq!(
            (a.attention, a.cross, a.qk_norm, a.precision, a.fp8_accum),
            (
                AttentionArm::Mma,
                CrossArm::Cudnn,
                QkNormArm::Warp,
                Precision::Fp8,
                Accum::Fast
            )
        );
        assert_eq!(a.fp8_accum.name(), "fast");
        assert!(a.needs_cudnn());
        assert!(!ForwardArms::OWN.needs_cudnn());
        // fp8-accum acts only under precision = fp8: its campaign must set it.
        assert!(
            spec_entry(FP8_ACCUM).contains("with = { precision = \"fp8\" }"),
            "{}",
            spec_entry(FP8_ACCUM)
        );
        assert_eq!((a.cross.name(), a.qk_norm.name()), ("cudnn", "warp"));
    }

    #[test]
    fn vae_prepare_lever_matches_the_spec_and_maps_to_the_load_arm() {
        let l = lever(VAE_PREPARE).unwrap();
        assert_eq!(l.arms, ["decode", "load"]);
        assert_eq!((l.baseline, l.default), ("decode", "load"));
        assert!(!UNMEASURED.contains(&VAE_PREPARE));
        assert_eq!(l.applies_to, Applies::Cuda);
        assert!(LeverSet::resolve(Profile::Default, [])
            .unwrap()
            .vae_prepare_at_load());
        assert!(!LeverSet::resolve(Profile::Baseline, [])
            .unwrap()
            .vae_prepare_at_load());
        assert!(
            LeverSet::resolve(Profile::Baseline, [("vae-prepare", "load")])
                .unwrap()
                .vae_prepare_at_load()
        );
        let entry = spec_entry("vae-prepare");
        assert!(entry.contains("arms = [\"decode\", \"load\"]"), "{entry}");
        assert!(entry.contains("treatment = \"load\""), "{entry}");
        assert!(entry.contains("numerics = \"preserving\""), "{entry}");
    }

    /// Red on: `batched` not reaching `forward_arms` (the test inverted), the
    /// conflict with `text-kv = per-forward` gone or not naming the lever that
    /// mends it, the conflicts no longer all named at once, or the spec's
    /// entry dropping the cached text keys its campaign needs or calling the
    /// arm numerics-preserving (its GEMMs see twice the rows).
    #[test]
    fn guidance_batch_lever_needs_the_text_cache() {
        use crate::cuda::models::dit::GuidanceBatch;
        let arms = |levers: &[(&'static str, &'static str)]| {
            LeverSet::resolve(Profile::Default, levers.iter().copied())
                .unwrap()
                .forward_arms()
        };
        let alone = arms(&[("guidance-batch", "batched")]);
        assert_eq!(alone.guidance, GuidanceBatch::Batched);
        assert_eq!(alone.guidance.name(), "batched");
        let why = alone.conflict().expect("batched without the text cache");
        assert!(
            why.contains("guidance-batch = batched needs text-kv = cached"),
            "{why}"
        );
        assert!(why.contains("--lever text-kv=cached"), "{why}");
        let ok = arms(&[("guidance-batch", "batched"), ("text-kv", "cached")]);
        assert_eq!(ok.conflict(), None);
        assert_eq!(arms(&[]).guidance, GuidanceBatch::Pair);
        assert_eq!(arms(&[("guidance-batch", "pair")]).conflict(), None);
        // Two conflicts at once: both are named.
        let both = arms(&[
            ("guidance-batch", "batched"),
            ("attention-precision", "fp8"),
        ]);
        let why = both.conflict().expect("two conflicts");
        assert!(
            why.contains("text-kv=cached") && why.contains("precision=fp8"),
            "{why}"
        );
        let entry = spec_entry(GUIDANCE_BATCH);
        assert!(entry.contains("numerics = \"changing\""), "{entry}");
        assert!(entry.contains("text-kv = \"cached\""), "{entry}");
    }

    /// Red on: `bf16` not reaching `forward_arms` (the test inverted), the
    /// spec's entry calling the arm numerics-preserving or judging it without
    /// the measured floor, or an arm conflict where there is none.
    #[test]
    fn residual_lever_maps_to_the_bf16_stream() {
        use crate::cuda::models::dit::ResidualStream;
        let on = |arm: &'static str| {
            LeverSet::resolve(Profile::Default, [("residual", arm)])
                .unwrap()
                .forward_arms()
        };
        assert_eq!(on("bf16").residual, ResidualStream::Bf16);
        assert_eq!(on("f32").residual, ResidualStream::F32);
        assert_eq!(on("bf16").residual.name(), "bf16");
        assert_eq!(
            (on("bf16").residual.bytes(), on("f32").residual.bytes()),
            (2, 4)
        );
        assert_eq!(on("bf16").conflict(), None);
        let entry = spec_entry(RESIDUAL);
        assert!(entry.contains("numerics = \"changing\""), "{entry}");
        assert!(entry.contains("floor_margin_db"), "{entry}");
    }

    /// Red on: `tuned` not reaching `forward_arms` (the test inverted), or the
    /// spec's entry calling the arm numerics-preserving or judging it without
    /// the measured floor.
    #[test]
    fn gemm_algo_lever_maps_to_the_tuned_choice() {
        use crate::cuda::models::dit::AlgoChoice;
        let on = |arm: &'static str| {
            LeverSet::resolve(Profile::Default, [("gemm-algo", arm)])
                .unwrap()
                .forward_arms()
        };
        assert_eq!(on("tuned").gemm_algo, AlgoChoice::Tuned);
        assert_eq!(on("heuristic").gemm_algo, AlgoChoice::Heuristic);
        assert_eq!(on("tuned").gemm_algo.name(), "tuned");
        assert_eq!(on("tuned").conflict(), None);
        let entry = spec_entry(GEMM_ALGO);
        assert!(entry.contains("numerics = \"changing\""), "{entry}");
        assert!(entry.contains("floor_margin_db"), "{entry}");
    }

    /// Red on: `cached` not reaching `forward_arms` (the test inverted), the
    /// spec's entry calling it numerics-changing, or its campaign dropping the
    /// fp8 Linears it is measured on.
    #[test]
    fn text_kv_lever_maps_to_the_cached_arm() {
        use crate::cuda::models::dit::TextKvArm;
        let on = |arm: &'static str| {
            LeverSet::resolve(Profile::Default, [("text-kv", arm)])
                .unwrap()
                .forward_arms()
        };
        assert_eq!(on("cached").text_kv, TextKvArm::Cached);
        assert_eq!(on("per-forward").text_kv, TextKvArm::PerForward);
        assert_eq!(on("cached").text_kv.name(), "cached");
        // Either arm runs with either precision and attention.
        assert_eq!(on("cached").conflict(), None);
        assert_eq!(on("cached").needs_cudnn(), on("per-forward").needs_cudnn());
        let entry = spec_entry(TEXT_KV);
        assert!(entry.contains("numerics = \"preserving\""), "{entry}");
        assert!(entry.contains("with = { precision = \"fp8\" }"), "{entry}");
    }

    /// Red on: the fp8 arm not reaching `forward_arms`, the conflict check
    /// passing an fp8 attention without its FP8 GEMMs or without cuDNN, or the
    /// spec's `with` dropping either lever its campaign needs.
    #[test]
    fn attention_precision_needs_fp8_gemms_and_cudnn() {
        use crate::cuda::models::dit::AttnPrecision;
        let ok = LeverSet::resolve(
            Profile::Default,
            [("precision", "fp8"), ("attention-precision", "fp8")],
        )
        .unwrap()
        .forward_arms();
        assert_eq!(ok.attn_precision, AttnPrecision::Fp8);
        assert_eq!(ok.attn_precision.name(), "fp8");
        assert!(ok.needs_cudnn());
        assert_eq!(ok.conflict(), None);
        // Refused below head dim 128 (the 2B model's 64: cuDNN's FP8 attention
        // was wrong there, s36-dev2); the 13B model's 128 runs it; bf16 runs
        // on both. Red when the bound moves or the refusal goes.
        let why = ok.model_conflict(64).expect("fp8 attention at head dim 64");
        assert!(why.contains("head dim of at least 128"), "{why}");
        assert!(why.contains("--lever attention-precision=bf16"), "{why}");
        assert_eq!(ok.model_conflict(128), None);
        let d = LeverSet::resolve(Profile::Default, []).unwrap();
        assert_eq!(d.forward_arms().model_conflict(64), None);
        let bf16 = LeverSet::resolve(Profile::Default, [("attention-precision", "fp8")])
            .unwrap()
            .forward_arms();
        let why = bf16.conflict().expect("fp8 attention on bf16 GEMMs");
        assert!(why.contains("needs precision = fp8"), "{why}");
        assert!(why.contains("--lever precision=fp8"), "{why}");
        assert!(!why.contains("attention=cudnn"), "{why}");
        let mma = LeverSet::resolve(
            Profile::Baseline,
            [("precision", "fp8"), ("attention-precision", "fp8")],
        )
        .unwrap()
        .forward_arms();
        let why = mma.conflict().expect("fp8 attention on the mma arm");
        assert!(why.contains("attention = cudnn"), "{why}");
        assert!(why.contains("--lever attention=cudnn"), "{why}");
        assert!(!why.contains("precision=fp8"), "{why}");
        // The bf16 arm conflicts with nothing.
        let d = LeverSet::resolve(Profile::Default, []).unwrap();
        assert_eq!(d.forward_arms().conflict(), None);
        let entry = spec_entry(ATTENTION_PRECISION);
        assert!(
            entry.contains("with = { precision = \"fp8\", attention = \"cudnn\" }"),
            "{entry}"
        );
        assert!(entry.contains("numerics = \"changing\""), "{entry}");
    }

    #[test]
    fn conditioning_lever_matches_the_spec_entry() {
        let l = lever(CONDITIONING).unwrap();
        assert_eq!(l.arms, ["host", "device"]);
        assert_eq!((l.baseline, l.default), ("host", "device"));
        assert_eq!(l.applies_to, Applies::Cuda);
        assert!(LeverSet::resolve(Profile::Default, [])
            .unwrap()
            .conditioning_on_device());
        assert!(!LeverSet::resolve(Profile::Baseline, [])
            .unwrap()
            .conditioning_on_device());
        assert!(
            !LeverSet::resolve(Profile::Default, [("conditioning", "host")])
                .unwrap()
                .conditioning_on_device()
        );
        // specs/levers.toml's entry names the same arms and roles.
        let entry = spec_entry("conditioning");
        assert!(entry.contains("arms = [\"host\", \"device\"]"), "{entry}");
        assert!(entry.contains("baseline = \"host\""), "{entry}");
        assert!(entry.contains("treatment = \"device\""), "{entry}");
        assert!(entry.contains("applies_to = [\"cuda\"]"), "{entry}");
    }
}
