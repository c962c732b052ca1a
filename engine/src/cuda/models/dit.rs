//! The LTX-Video transformer (DiT) forward on the device, end to end.
//!
//! Weights stay where staging put them ([`DeviceWeights`], bf16; on an
//! fp8-resident load the block Linears' weights only as e4m3 copies:
//! [`DeviceDit::load_fp8_resident`]); activations
//! live in one preallocated [`Workspace`] sized for (tokens, text length,
//! samples); the residual stream is f32 (bf16 under `residual = bf16`), every
//! GEMM operand bf16 (the blocks' Linears e4m3 on `precision = fp8`) with fp32
//! accumulation. A
//! forward enqueues only kernels and GEMMs on the compute stream: inputs are
//! uploaded before it starts, the output downloaded after it ends, and the
//! timestep embedding is computed on the device (its scalar rides in the kernel
//! arguments, or sits in one device f32 for a forward captured into a CUDA
//! graph: [`Timestep`]), so nothing inside it waits for the host and it can be
//! captured. Its device time comes from CUDA events around it.
//!
//! Semantics follow the reference (diffusers
//! `LTXVideoTransformer3DModel`): names in [`DitDims::tensor_specs`] are the
//! checkpoint's.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;

use crate::cuda::kit::context::{Gpu, Timer};
use crate::cuda::kit::fp8::{Fp8Attn, Fp8Linears, Fp8Rows, LinearRef, Q8};
use crate::cuda::kit::gemm::{Accum, Epilogue, Fp8Scaling, Gemm};
pub use crate::cuda::kit::gemm_tune::AlgoChoice;
use crate::cuda::kit::kernels::{AttnKernel, Kernels, Map, RopeArgs, RowMode, RowOut, NULL};
pub use crate::cuda::kit::kernels::{OperandAmax, ResidualStream};
use crate::cuda::kit::memory::{align_up, download, upload, Arena, DeviceBuffer};
use crate::cuda::kit::sdpa::{Sdpa, Shape as SdpaShape};
use crate::cuda::kit::sdpa_fp8::{self, Fp8Ptrs};
use crate::cuda::kit::DeviceKit;
use crate::cuda::staging::{self, DeviceWeights, StagingOptions, StagingReport};
use crate::cuda::CudaError;
use crate::models::dit::{DitConfig, MASK_BIAS, OUT_NORM_EPS, QK_NORM_EPS, ROPE_COMPRESSION};
use crate::ops::rope::{rope_freqs, ROPE_BASE};
use crate::weights::safetensors::Extent;
use crate::weights::{DType, TensorSpec, WeightError};

mod guidance_batch;
mod text_kv;
pub use guidance_batch::GuidanceBatch;
pub use text_kv::{TextKv, TextKvArm};

/// Latent channels in and out of the DiT.
pub const LATENT_CHANNELS: usize = 128;
/// Width of the sinusoidal timestep embedding.
pub const TIMESTEP_DIM: usize = crate::models::dit::TIMESTEP_CHANNELS;

/// The shape of a DiT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DitDims {
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Text encoder output channels (T5-XXL: 4096).
    pub caption_channels: usize,
}

impl DitDims {
    /// ltxv-2b (LTX-Video 0.9.x): 28 x 32 x 64.
    pub const LTXV_2B: DitDims = DitDims {
        layers: 28,
        heads: 32,
        head_dim: 64,
        caption_channels: 4096,
    };
    /// ltxv-13b (0.9.7/0.9.8): 48 x 32 x 128.
    pub const LTXV_13B: DitDims = DitDims {
        layers: 48,
        heads: 32,
        head_dim: 128,
        caption_channels: 4096,
    };

    /// The dims of a checkpoint config. The device arm supports exactly the
    /// released architecture: 128 latent channels in and out, 1x1x1 patches,
    /// cross-attention width equal to the model width.
    pub fn from_config(cfg: &DitConfig) -> Result<DitDims, CudaError> {
        let d = cfg.num_attention_heads * cfg.attention_head_dim;
        if cfg.in_channels != LATENT_CHANNELS
            || cfg.out_channels != LATENT_CHANNELS
            || cfg.patch_size != 1
            || cfg.patch_size_t != 1
            || cfg.cross_attention_dim != d
            || (cfg.norm_eps - crate::presets::dit_2b().norm_eps).abs() > 1e-12
            || cfg.norm_elementwise_affine
            || !cfg.attention_bias
            || !cfg.attention_out_bias
            || d > 4096
        {
            return Err(CudaError::Invalid(format!(
                "the device DiT needs in/out channels 128, 1x1x1 patches, cross_attention_dim = heads x head_dim, \
                 norm_eps 1e-6 without affine, biased attention projections and heads x head_dim <= 4096 \
                 (the widest row the q/k norm holds in registers); got {cfg:?}"
            )));
        }
        Ok(DitDims {
            layers: cfg.num_layers,
            heads: cfg.num_attention_heads,
            head_dim: cfg.attention_head_dim,
            caption_channels: cfg.caption_channels,
        })
    }

    /// The checkpoint config of these dims: the released architecture (the
    /// ltxv-2b config) with this depth and these widths.
    pub fn config(&self) -> DitConfig {
        let mut c = crate::presets::dit_2b();
        c.num_layers = self.layers;
        c.num_attention_heads = self.heads;
        c.attention_head_dim = self.head_dim;
        c.cross_attention_dim = self.dim();
        c.caption_channels = self.caption_channels;
        c
    }

    /// Model width D = heads x head_dim.
    pub fn dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The same model with `layers` blocks (one block for the block check).
    pub fn with_layers(self, layers: usize) -> DitDims {
        DitDims { layers, ..self }
    }

    /// Every tensor, diffusers names, bf16 (the CPU arm's list for [`DitDims::config`]).
    pub fn tensor_specs(&self) -> Vec<TensorSpec> {
        crate::models::dit::tensor_specs(&self.config())
    }

    /// Every block's Linear weights (not their biases): (checkpoint name,
    /// output channels, input width), block by block, each block's in
    /// [`BLOCK_LINEAR_KEYS`]' order. These are what `precision = fp8` computes
    /// from in e4m3 (the order of [`DeviceDit`]'s e4m3 slots), and what an
    /// fp8-resident load ([`DeviceDit::load_fp8_resident`]) keeps off the
    /// device in bf16. 2 bytes an element each in the checkpoint.
    pub fn block_linear_weights(&self) -> Vec<(String, usize, usize)> {
        let d = self.dim();
        (0..self.layers)
            .flat_map(|b| {
                BLOCK_LINEAR_KEYS.iter().enumerate().map(move |(i, k)| {
                    let (out, inp) = block_linear_shape(i, d);
                    (format!("transformer_blocks.{b}.{k}.weight"), out, inp)
                })
            })
            .collect()
    }

    /// FLOPs of one forward over `n` tokens and `l` text tokens:
    /// (linear layers, self-attention, cross-attention).
    pub fn forward_flops(&self, n: usize, l: usize) -> (f64, f64, f64) {
        let (d, n, l, layers) = (self.dim() as f64, n as f64, l as f64, self.layers as f64);
        let per_block = 28.0 * n * d * d + 4.0 * l * d * d;
        let global = 2.0 * n * d * (2.0 * LATENT_CHANNELS as f64)
            + 2.0 * l * d * (self.caption_channels as f64 + d)
            + 2.0 * d * (TIMESTEP_DIM as f64 + 7.0 * d);
        let lin = layers * per_block + global;
        let self_attn = layers * 4.0 * n * n * d;
        let cross = layers * 4.0 * n * l * d;
        (lin, self_attn, cross)
    }
}

/// A Linear's device weight and bias.
#[derive(Debug, Clone, Copy)]
struct Lin {
    w: CUdeviceptr,
    b: CUdeviceptr,
    out: usize,
    inp: usize,
}

/// An attention's weights (`attn1` or `attn2` of a block; fields named after
/// the checkpoint's keys).
#[derive(Debug, Clone, Copy)]
struct AttentionWeights {
    norm_q: CUdeviceptr,
    norm_k: CUdeviceptr,
    to_q: Lin,
    to_k: Lin,
    to_v: Lin,
    /// `to_out.0`.
    to_out: Lin,
}

/// One block's weights (`transformer_blocks.{i}`).
#[derive(Debug, Clone, Copy)]
struct BlockWeights {
    /// `[6, D]` bf16: shift, scale, gate for attention, then for the feed-forward.
    scale_shift_table: CUdeviceptr,
    attn1: AttentionWeights,
    attn2: AttentionWeights,
    /// `ff.net.0.proj` (D -> 4D, tanh-GELU fused).
    ff_net_0_proj: Lin,
    /// `ff.net.2` (4D -> D).
    ff_net_2: Lin,
}

impl BlockWeights {
    /// The block's ten Linears in [`BlockQ8`]'s order ([`slot`]).
    fn linears(&self) -> [&Lin; BLOCK_LINEARS] {
        [
            &self.attn1.to_q,
            &self.attn1.to_k,
            &self.attn1.to_v,
            &self.attn1.to_out,
            &self.attn2.to_q,
            &self.attn2.to_k,
            &self.attn2.to_v,
            &self.attn2.to_out,
            &self.ff_net_0_proj,
            &self.ff_net_2,
        ]
    }
}

/// Linears of a block: q, k, v and out of each attention, the feed-forward's two.
const BLOCK_LINEARS: usize = 10;

/// The checkpoint keys of a block's Linears (under `transformer_blocks.{i}.`,
/// each with a `.weight` and a `.bias`), in the order of a block's e4m3
/// weights (the forward's slots).
pub const BLOCK_LINEAR_KEYS: [&str; BLOCK_LINEARS] = [
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
];

/// (output channels, input width) of the block Linear in slot `i` of a model
/// of width `d`: the attentions' are `d x d`, the feed-forward's up
/// projection `4d x d` and its down projection `d x 4d`.
fn block_linear_shape(i: usize, d: usize) -> (usize, usize) {
    match i {
        slot::FF_UP => (4 * d, d),
        slot::FF_DOWN => (d, 4 * d),
        _ => (d, d),
    }
}

/// A block's e4m3 weights in [`BlockWeights::linears`]' order.
type BlockQ8 = [Q8; BLOCK_LINEARS];

/// Positions in [`BlockQ8`].
mod slot {
    pub const SELF_Q: usize = 0;
    pub const SELF_K: usize = 1;
    pub const SELF_V: usize = 2;
    pub const SELF_OUT: usize = 3;
    pub const CROSS_Q: usize = 4;
    pub const CROSS_K: usize = 5;
    pub const CROSS_V: usize = 6;
    pub const CROSS_OUT: usize = 7;
    pub const FF_UP: usize = 8;
    pub const FF_DOWN: usize = 9;
}

/// Which number format the blocks' Linears compute in (lever `precision`).
///
/// Which Linears: the ten of each block, which hold all but a fraction of a
/// percent of the forward's GEMM FLOPs. The input and output projections, the
/// timestep MLP and the caption projection stay bf16: GEMMs of one or at most a
/// few hundred rows, or 128 columns, where FP8 saves nothing and costs a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// bf16 operands, f32 accumulation (cuBLASLt).
    Bf16,
    /// e4m3 operands scaled per output channel (quantized once on the device)
    /// and per token (before each GEMM), f32 accumulation, bf16 output
    /// (cuBLASLt's outer-vector scaling; [`crate::fp8`] is the definition).
    ///
    /// Device memory: a render loads the DiT fp8-resident
    /// ([`DeviceDit::load_fp8_resident`]): the block Linears' weights are
    /// resident only as e4m3 codes (one byte an element) and f32 scales (4
    /// bytes a row), never in bf16, so their share of the weights halves (at
    /// 13B, ~24.0 GiB of bf16 become ~12.0 GiB); during the load a bounce buffer
    /// of at most [`FP8_BOUNCE_BOUND`] (or one Linear, if larger) holds the bf16
    /// bytes passing through. The bytes read and copied are unchanged (bf16).
    /// A DiT staged in bf16 and switched to fp8 by [`DeviceDit::set_arms`]
    /// (the checks and benchmarks) keeps both copies.
    Fp8,
}

impl Precision {
    /// The lever arm's name (`bf16`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }
}

/// The `precision = fp8` arm's device state: the blocks' e4m3 weights, and
/// where block inputs (`tokens × ≤ 4 · width`) and the projected text are
/// quantized (allocated with the workspace).
struct Fp8State {
    weights: Fp8Linears,
    acts: Option<(Fp8Rows, Fp8Rows)>,
    /// The FP8 self-attention's operands while `attention-precision = fp8`
    /// (allocated with the workspace).
    attn: Option<Fp8Attn>,
}

/// What a block on the fp8 arm reads: its e4m3 weights, where its Linears'
/// inputs are quantized, the quantized text, and the FP8 attention's operands
/// when the self-attention runs in FP8.
#[derive(Clone, Copy)]
struct BlockFp8<'a> {
    q: BlockQ8,
    acts: &'a Fp8Rows,
    text: &'a Fp8Rows,
    attn: Option<&'a Fp8Attn>,
}

/// The blocks' cross-attention K/V GEMMs' input: the projected text in bf16, or
/// its e4m3 codes and row scales on the fp8 arm (`text_q`).
fn text_operand(ws: &Workspace, text_q: Option<&Fp8Rows>) -> LinIn {
    match text_q {
        None => LinIn::Bf16(ws.text_p),
        Some(t) => {
            let (c, sc) = t.operand();
            LinIn::Fp8(c, sc)
        }
    }
}

impl Fp8State {
    /// Block `i`'s e4m3 weights.
    fn block(&self, i: usize) -> Result<BlockQ8, CudaError> {
        self.weights
            .q
            .get(i * BLOCK_LINEARS..(i + 1) * BLOCK_LINEARS)
            .and_then(|q| BlockQ8::try_from(q).ok())
            .ok_or_else(|| CudaError::Invalid(format!("no FP8 weights for block {i}")))
    }
}

/// The transformer's weights, named after the checkpoint's keys.
struct DitWeights {
    proj_in: Lin,
    /// `[2, D]` bf16: shift and scale of the output norm.
    scale_shift_table: CUdeviceptr,
    /// `time_embed.emb.timestep_embedder.linear_1`.
    time_embed_linear_1: Lin,
    /// `time_embed.emb.timestep_embedder.linear_2`.
    time_embed_linear_2: Lin,
    /// `time_embed.linear` (the 6 modulation rows).
    time_embed_linear: Lin,
    caption_projection_linear_1: Lin,
    caption_projection_linear_2: Lin,
    proj_out: Lin,
    blocks: Vec<BlockWeights>,
}

/// The normalisation the last residual add of a step also writes into `ws.h`
/// for whatever reads the stream next.
#[derive(Debug, Clone, Copy)]
struct NextInput {
    mode: RowMode,
    eps: f32,
    shift: (CUdeviceptr, CUdeviceptr),
    scale: (CUdeviceptr, CUdeviceptr),
}

/// Copy `bytes` from `src` to `dst` on the device, in `s`'s order.
fn copy_d2d(
    s: &cudarc::driver::CudaStream,
    src: CUdeviceptr,
    dst: CUdeviceptr,
    bytes: usize,
) -> Result<(), CudaError> {
    use crate::cuda::DriverContext;
    // SAFETY: both ranges lie inside the workspace's arena (the caller's
    // offsets), which outlives the stream's work on it.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, s.cu_stream()) }
        .ctx("copying the input projection into the residual stream")
}

/// Row `i` of a `[rows, d]` bf16 table at `p`.
fn row(d: usize, p: CUdeviceptr, i: usize) -> CUdeviceptr {
    p + (i * d * 2) as u64
}

fn lin(w: &DeviceWeights, name: &str, out: usize, inp: usize) -> Result<Lin, CudaError> {
    Ok(Lin {
        w: w.get(&format!("{name}.weight"), &[out, inp])?.ptr,
        b: w.get(&format!("{name}.bias"), &[out])?.ptr,
        out,
        inp,
    })
}

/// The model's weights in `w`, checked against `dims`. With `bf16_blocks`
/// false the blocks' Linear weights ([`DitDims::block_linear_weights`]) are
/// not looked up (they were never staged: an fp8-resident load) and their
/// addresses are [`NULL`]; their biases still are.
fn resolve(w: &DeviceWeights, dims: &DitDims, bf16_blocks: bool) -> Result<DitWeights, CudaError> {
    let d = dims.dim();
    let norms = |b: &str, a: &str| -> Result<(CUdeviceptr, CUdeviceptr), CudaError> {
        Ok((
            w.get(&format!("{b}.{a}.norm_q.weight"), &[d])?.ptr,
            w.get(&format!("{b}.{a}.norm_k.weight"), &[d])?.ptr,
        ))
    };
    let mut blocks = Vec::with_capacity(dims.layers);
    for i in 0..dims.layers {
        let b = format!("transformer_blocks.{i}");
        let mut lins = [Lin {
            w: NULL,
            b: NULL,
            out: 0,
            inp: 0,
        }; BLOCK_LINEARS];
        for (j, key) in BLOCK_LINEAR_KEYS.iter().enumerate() {
            let (out, inp) = block_linear_shape(j, d);
            let name = format!("{b}.{key}");
            lins[j] = if bf16_blocks {
                lin(w, &name, out, inp)?
            } else {
                Lin {
                    w: NULL,
                    b: w.get(&format!("{name}.bias"), &[out])?.ptr,
                    out,
                    inp,
                }
            };
        }
        let (n1, n2) = (norms(&b, "attn1")?, norms(&b, "attn2")?);
        blocks.push(BlockWeights {
            scale_shift_table: w.get(&format!("{b}.scale_shift_table"), &[6, d])?.ptr,
            attn1: AttentionWeights {
                norm_q: n1.0,
                norm_k: n1.1,
                to_q: lins[slot::SELF_Q],
                to_k: lins[slot::SELF_K],
                to_v: lins[slot::SELF_V],
                to_out: lins[slot::SELF_OUT],
            },
            attn2: AttentionWeights {
                norm_q: n2.0,
                norm_k: n2.1,
                to_q: lins[slot::CROSS_Q],
                to_k: lins[slot::CROSS_K],
                to_v: lins[slot::CROSS_V],
                to_out: lins[slot::CROSS_OUT],
            },
            ff_net_0_proj: lins[slot::FF_UP],
            ff_net_2: lins[slot::FF_DOWN],
        });
    }
    Ok(DitWeights {
        proj_in: lin(w, "proj_in", d, LATENT_CHANNELS)?,
        scale_shift_table: w.get("scale_shift_table", &[2, d])?.ptr,
        time_embed_linear_1: lin(
            w,
            "time_embed.emb.timestep_embedder.linear_1",
            d,
            TIMESTEP_DIM,
        )?,
        time_embed_linear_2: lin(w, "time_embed.emb.timestep_embedder.linear_2", d, d)?,
        time_embed_linear: lin(w, "time_embed.linear", 6 * d, d)?,
        caption_projection_linear_1: lin(
            w,
            "caption_projection.linear_1",
            d,
            dims.caption_channels,
        )?,
        caption_projection_linear_2: lin(w, "caption_projection.linear_2", d, d)?,
        proj_out: lin(w, "proj_out", LATENT_CHANNELS, d)?,
        blocks,
    })
}

/// A flag per tensor of `tensors`: whether it is one of the block Linear
/// weights `want` ((name, output channels, input width), as
/// [`DitDims::block_linear_weights`] lists them). An error names a weight of
/// `want` that `tensors` lacks, or holds in another shape or not in bf16 (the
/// quantize kernel reads bf16).
fn transient_flags(
    tensors: &[Extent],
    want: &[(String, usize, usize)],
) -> Result<Vec<bool>, CudaError> {
    let at: HashMap<&str, usize> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let mut flags = vec![false; tensors.len()];
    for (name, out, inp) in want {
        let expected = vec![*out, *inp];
        let i = *at.get(name.as_str()).ok_or_else(|| {
            CudaError::Weights(WeightError::Missing {
                name: name.clone(),
                file: tensors.first().map(|t| t.file.clone()).unwrap_or_default(),
                expected: expected.clone(),
            })
        })?;
        let t = &tensors[i];
        if t.shape != expected {
            return Err(CudaError::Weights(WeightError::Shape {
                name: name.clone(),
                file: t.file.clone(),
                expected,
                found: t.shape.clone(),
            }));
        }
        if t.dtype != DType::BF16 {
            return Err(CudaError::Weights(WeightError::DType {
                name: name.clone(),
                file: t.file.clone(),
                expected: "BF16 (the e4m3 weights are quantized from bf16)".into(),
                found: t.dtype.safetensors_name().into(),
            }));
        }
        flags[i] = true;
    }
    Ok(flags)
}

/// Activation buffers of one (tokens, text length, samples).
pub struct Workspace {
    arena: Arena,
    /// Tokens of one sample.
    pub n: usize,
    /// Text tokens (the longest text a forward over this workspace may read).
    pub l: usize,
    /// Samples a forward over it may run at once (lever `guidance-batch`):
    /// every per-token buffer holds `batch · n` rows, sample by sample.
    pub batch: usize,
    lat_bf: CUdeviceptr,
    x: CUdeviceptr,
    h: CUdeviceptr,
    q: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    ao: CUdeviceptr,
    y: CUdeviceptr,
    ff: CUdeviceptr,
    text_bf: CUdeviceptr,
    cap_h: CUdeviceptr,
    text_p: CUdeviceptr,
    ck: CUdeviceptr,
    cv: CUdeviceptr,
    tsin: CUdeviceptr,
    t1: CUdeviceptr,
    t1s: CUdeviceptr,
    emb: CUdeviceptr,
    emb_s: CUdeviceptr,
    temb: CUdeviceptr,
    out_bf: CUdeviceptr,
}

impl Workspace {
    /// Bytes a workspace for (n, l) and `batch` samples needs on `dims`.
    pub fn bytes_for(dims: &DitDims, n: usize, l: usize, batch: usize) -> usize {
        Self::pieces(dims, n, l, batch)
            .iter()
            .map(|b| align_up(*b))
            .sum()
    }

    /// The buffers' sizes: the per-token ones for `batch · n` rows (the
    /// latents' bf16 copy for `n`: both samples read the same latents), the
    /// text's and the timestep's once.
    fn pieces(dims: &DitDims, n: usize, l: usize, batch: usize) -> [usize; 21] {
        let d = dims.dim();
        let (lat, n) = (n, n * batch.max(1));
        let c = dims.caption_channels;
        let lc = LATENT_CHANNELS;
        [
            lat * lc * 2,     // lat_bf
            n * d * 4,        // x
            n * d * 2,        // h
            n * d * 2,        // q
            n * d * 2,        // k
            n * d * 2,        // v
            n * d * 2,        // ao
            n * d * 2,        // y
            n * 4 * d * 2,    // ff
            l * c * 2,        // text_bf
            l * d * 2,        // cap_h
            l * d * 2,        // text_p
            l * d * 2,        // ck
            l * d * 2,        // cv
            TIMESTEP_DIM * 2, // tsin
            d * 2,            // t1
            d * 2,            // t1s
            d * 2,            // emb
            d * 2,            // emb_s
            6 * d * 2,        // temb
            n * lc * 2,       // out_bf
        ]
    }

    /// Fill every byte with 0xFF (NaN in f32 and bf16) on the compute stream, so
    /// a check sees any element the forward failed to write.
    pub fn poison(&self, gpu: &Gpu) -> Result<(), CudaError> {
        self.arena.buffer().fill_bytes(gpu, 0xFF, &gpu.compute)
    }

    /// Allocate a workspace for (n, l) and `batch` samples (at least 1).
    pub fn new(
        gpu: &Gpu,
        dims: &DitDims,
        n: usize,
        l: usize,
        batch: usize,
    ) -> Result<Workspace, CudaError> {
        let batch = batch.max(1);
        let sizes = Self::pieces(dims, n, l, batch);
        let bytes = Self::bytes_for(dims, n, l, batch);
        let mut arena = Arena::new(gpu, bytes, "the DiT workspace")?;
        let mut p = [0 as CUdeviceptr; 21];
        for (ptr, size) in p.iter_mut().zip(sizes) {
            *ptr = arena.take(size)?;
        }
        let [lat_bf, x, h, q, k, v, ao, y, ff, text_bf, cap_h, text_p, ck, cv, tsin, t1, t1s, emb, emb_s, temb, out_bf] =
            p;
        Ok(Workspace {
            arena,
            n,
            l,
            batch,
            lat_bf,
            x,
            h,
            q,
            k,
            v,
            ao,
            y,
            ff,
            text_bf,
            cap_h,
            text_p,
            ck,
            cv,
            tsin,
            t1,
            t1s,
            emb,
            emb_s,
            temb,
            out_bf,
        })
    }
}

/// How many leading text tokens a cross-attention must read for `mask` (1.0 a
/// real token, 0.0 padding). Where the mask is a run of real tokens followed
/// only by padding, the padding keys carry a bias of [`MASK_BIAS`] (-10,000):
/// their softmax weight `exp(score - 10,000 - max)` is exactly 0 in f32, so
/// attending to the real tokens alone gives the same output while the caption
/// projection, the k|v GEMMs and the attention read `l` rows instead of the
/// padded length (an empty negative prompt is 1 real token of 128). Any other
/// mask (padding between real tokens, values other than 0 and 1, no real
/// token at all, where every key weighs the same) keeps its full length.
pub fn attended_tokens(mask: &[f32]) -> usize {
    let real = mask.iter().take_while(|m| **m == 1.0).count();
    if real > 0 && mask[real..].iter().all(|m| *m == 0.0) {
        real
    } else {
        mask.len()
    }
}

/// One prompt's conditioning on the device: the text encoder states (f32 [l,
/// caption_channels]) and the key bias of its mask (f32 \[l\], 0 for a real token,
/// [`MASK_BIAS`] for padding), cut to the tokens a forward attends to
/// ([`attended_tokens`]).
pub struct TextSlot {
    buf: DeviceBuffer,
    /// Text tokens.
    pub l: usize,
    /// Whether a kept token is masked (the mask was not real tokens followed by
    /// padding): the key bias then matters, and the cross-attention runs on the
    /// kernel that adds it.
    pub masked: bool,
    caption: usize,
    /// Its cross-attention keys and values under `text-kv = cached`
    /// ([`DeviceDit::prepare_text`]).
    kv: Option<TextKv>,
}

impl TextSlot {
    /// Device bytes of a slot of `l` tokens.
    pub fn bytes_for(dims: &DitDims, l: usize) -> usize {
        align_up(l * dims.caption_channels * 4) + l * 4
    }

    /// Upload `text` (f32 [l, caption_channels]) and `mask` (l values of 0/1).
    pub fn upload(
        gpu: &Gpu,
        dims: &DitDims,
        text: &[f32],
        mask: &[f32],
    ) -> Result<TextSlot, CudaError> {
        let c = dims.caption_channels;
        if mask.is_empty() || text.len() != mask.len() * c {
            return Err(CudaError::Invalid(format!(
                "text of {} values and a mask of {} do not make [L >= 1, {c}] states",
                text.len(),
                mask.len()
            )));
        }
        let l = attended_tokens(mask);
        let (text, mask) = (&text[..l * c], &mask[..l]);
        let buf = DeviceBuffer::alloc(gpu, Self::bytes_for(dims, l), "the text conditioning")?;
        let masked = mask.iter().any(|m| *m != 1.0);
        let slot = TextSlot {
            buf,
            l,
            masked,
            caption: c,
            kv: None,
        };
        let bias: Vec<f32> = mask.iter().map(|m| (1.0 - m) * MASK_BIAS).collect();
        upload(gpu, slot.text(), text)?;
        upload(gpu, slot.kbias(), &bias)?;
        Ok(slot)
    }

    fn text(&self) -> CUdeviceptr {
        self.buf.ptr()
    }

    fn kbias(&self) -> CUdeviceptr {
        self.buf.ptr() + align_up(self.l * self.caption * 4) as u64
    }
}

/// Where a forward's timestep comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timestep {
    /// The noise level sigma, by value: t = sigma x 1000 rides in the launch's
    /// arguments (the eager loop).
    Sigma(f32),
    /// t = sigma x 1000 as one f32 at this device address, read when the
    /// timestep kernel runs: a captured graph replays the forward unchanged while
    /// each step writes its own t there first (see `backend`).
    At(CUdeviceptr),
}

/// Geometry of one forward.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Latent grid (frames, height, width); tokens = product, raster order.
    pub grid: (usize, usize, usize),
    /// Frames per second (RoPE's time scale is 8 / fps).
    pub fps: f32,
}

/// The bound of the bounce buffer an fp8-resident load stages the block
/// Linears' bf16 weights through, bytes: 1 GiB (two 13B blocks, eight 2B
/// blocks a window). A Linear larger than it alone sets the buffer's size.
pub const FP8_BOUNCE_BOUND: usize = 1 << 30;

/// The device DiT: resolved weights, kernels, GEMM plans and a workspace.
pub struct DeviceDit {
    gpu: Arc<Gpu>,
    kernels: Arc<Kernels>,
    gemm: Arc<Gemm>,
    dims: DitDims,
    weights: Arc<DeviceWeights>,
    w: DitWeights,
    /// Epsilon of the blocks' RMS norms (the config's `norm_eps`).
    norm_eps: f32,
    freqs: DeviceBuffer,
    ws: Option<Workspace>,
    /// The engine's own attention kernel: the self-attention on the `mma` arm
    /// of `attention`, the cross-attention on the `mma` arm of
    /// `cross-attention` and for a text whose kept tokens carry a mask.
    pub attn: AttnKernel,
    /// The kernel arms the forward runs ([`DeviceDit::set_arms`]).
    arms: ForwardArms,
    /// cuDNN's fused attention, loaded while an arm of `arms` runs on it.
    sdpa: Option<Sdpa>,
    /// The e4m3 block weights and activation buffers while `arms.precision`
    /// is fp8.
    fp8: Option<Fp8State>,
    /// Whether the blocks' Linear weights are resident in bf16 (false for an
    /// fp8-resident load: the bf16 arm cannot run, their addresses are NULL).
    bf16_blocks: bool,
    /// How a row step feeds an FP8 GEMM ([`NormQuantize`]).
    norm_quantize: NormQuantize,
    /// Where the FP8 attention's q and k amax come from ([`OperandAmax`]).
    operand_amax: OperandAmax,
}

/// How the fp8 arm's residual + norm steps hand their output to the FP8 GEMM
/// that reads it. Both give the same codes and scales bit for bit (the
/// selftest compares them), so this is no lever: [`NormQuantize::Fused`] is
/// the forward's, [`NormQuantize::Separate`] is kept for that check and for
/// the bench's side-by-side timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormQuantize {
    /// The row step writes bf16 h, then `quantize_rows_e4m3` reads it twice
    /// (its amax, then its codes): 5 more bytes per element moved.
    Separate,
    /// The row step quantizes its own output row (`residual_norm_e4m3`); h is
    /// never written.
    Fused,
}

/// A block Linear's input: bf16 rows, or their e4m3 codes and per-row scales.
#[derive(Debug, Clone, Copy)]
enum LinIn {
    Bf16(CUdeviceptr),
    Fp8(CUdeviceptr, CUdeviceptr),
}

/// Which kernel runs the cross-attention to the text (lever `cross-attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossArm {
    /// The engine's own flash kernel with the text's key bias.
    Mma,
    /// cuDNN's fused SDPA-forward operation over the attended text tokens
    /// (no bias: [`TextSlot::masked`] is false); a text whose kept tokens
    /// carry a mask still runs on the engine's kernel, which adds the bias.
    Cudnn,
}

impl CrossArm {
    /// The lever arm's name (`mma`, `cudnn`).
    pub fn name(self) -> &'static str {
        match self {
            CrossArm::Mma => "mma",
            CrossArm::Cudnn => "cudnn",
        }
    }
}

/// Which kernel runs the blocks' q/k RMS norm and RoPE (lever `qk-norm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNormArm {
    /// One block of 256 threads per row, 4-byte loads
    /// ([`Kernels::qk_norm_rope_pair`]).
    Block,
    /// One warp per row, 16-byte loads ([`Kernels::qk_norm_rope_warp`]).
    Warp,
}

impl QkNormArm {
    /// The lever arm's name (`block`, `warp`).
    pub fn name(self) -> &'static str {
        match self {
            QkNormArm::Block => "block",
            QkNormArm::Warp => "warp",
        }
    }
}

/// The forward's kernel arms: one per lever that picks a kernel of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardArms {
    /// The self-attention (lever `attention`).
    pub attention: AttentionArm,
    /// The cross-attention (lever `cross-attention`).
    pub cross: CrossArm,
    /// The q/k norm (lever `qk-norm`).
    pub qk_norm: QkNormArm,
    /// The number format of the blocks' Linears (lever `precision`).
    pub precision: Precision,
    /// How the FP8 GEMMs accumulate (lever `fp8-accum`; inert on bf16).
    pub fp8_accum: Accum,
    /// The number format of the self-attention (lever `attention-precision`;
    /// fp8 needs `precision = fp8` and `attention = cudnn`).
    pub attn_precision: AttnPrecision,
    /// Where the cross-attention's text keys and values come from (lever
    /// `text-kv`; cached needs [`DeviceDit::prepare_text`] on each text).
    pub text_kv: TextKvArm,
    /// How a guided step runs its two forwards (lever `guidance-batch`;
    /// batched needs `text-kv = cached`).
    pub guidance: GuidanceBatch,
    /// The number format of the residual stream (lever `residual`).
    pub residual: ResidualStream,
    /// How the DiT's cuBLASLt products choose their algorithm (lever
    /// `gemm-algo`).
    pub gemm_algo: AlgoChoice,
}

impl ForwardArms {
    /// Every kernel the engine's own: the arms a machine without cuDNN runs.
    pub const OWN: ForwardArms = ForwardArms {
        attention: AttentionArm::Mma,
        cross: CrossArm::Mma,
        qk_norm: QkNormArm::Block,
        precision: Precision::Bf16,
        fp8_accum: Accum::Exact,
        attn_precision: AttnPrecision::Bf16,
        text_kv: TextKvArm::PerForward,
        guidance: GuidanceBatch::Pair,
        residual: ResidualStream::F32,
        gemm_algo: AlgoChoice::Heuristic,
    };

    /// Whether an arm runs on cuDNN (which must then load).
    pub fn needs_cudnn(&self) -> bool {
        self.attention == AttentionArm::Cudnn
            || self.cross == CrossArm::Cudnn
            || self.attn_precision == AttnPrecision::Fp8
    }

    /// Why these arms cannot run on a model of `head_dim` channels per head,
    /// or None: `attention-precision = fp8` below
    /// [`sdpa_fp8::MIN_HEAD_DIM`].
    pub fn model_conflict(&self, head_dim: usize) -> Option<String> {
        let min = crate::cuda::kit::sdpa_fp8::MIN_HEAD_DIM;
        (self.attn_precision == AttnPrecision::Fp8 && head_dim < min).then(|| {
            format!(
                "attention-precision = fp8 needs a head dim of at least {min} (this model's is \
                 {head_dim}): cuDNN's FP8 attention wrote wrong outputs at head dim 64 with 32 \
                 heads on an H100 (reports/device-notes.md, s36-dev2); use --lever \
                 attention-precision=bf16"
            )
        })
    }

    /// Why these arms cannot run together, if they cannot:
    /// `attention-precision = fp8` writes e4m3 codes the out-projection's FP8
    /// GEMM reads (`precision = fp8`) and runs in cuDNN (`attention = cudnn`);
    /// `guidance-batch = batched` reads every text's keys and values from its
    /// cache (`text-kv = cached`).
    /// Every conflict is named, joined by "; ".
    pub fn conflict(&self) -> Option<String> {
        let mut found = Vec::new();
        if self.guidance == GuidanceBatch::Batched && self.text_kv != TextKvArm::Cached {
            found.push(
                "guidance-batch = batched needs text-kv = cached (the batched forward reads \
                 each prompt's cross-attention keys and values from its cache); add --lever \
                 text-kv=cached"
                    .to_string(),
            );
        }
        if self.attn_precision == AttnPrecision::Fp8 {
            // (missing, why it is needed, the lever that adds it)
            let (why, add): (Vec<&str>, Vec<&str>) = [
                (
                    self.precision != Precision::Fp8,
                    "precision = fp8 (its e4m3 output is the out-projection's FP8 input)",
                    "precision=fp8",
                ),
                (
                    self.attention != AttentionArm::Cudnn,
                    "attention = cudnn (it is cuDNN's FP8 SDPA)",
                    "attention=cudnn",
                ),
            ]
            .into_iter()
            .filter(|m| m.0)
            .map(|m| (m.1, m.2))
            .unzip();
            if !why.is_empty() {
                found.push(format!(
                    "attention-precision = fp8 needs {}; add --lever {}",
                    why.join(" and "),
                    add.join(" --lever ")
                ));
            }
        }
        (!found.is_empty()).then(|| found.join("; "))
    }
}

/// The number format of the self-attention (lever `attention-precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnPrecision {
    /// bf16 q, k, v and output (the `attention` lever's kernels).
    Bf16,
    /// e4m3 q, k and v with one scale each, e4m3 probabilities and output, in
    /// cuDNN's FP8 SDPA ([`crate::fp8::AttentionScales`] defines the scales).
    Fp8,
}

impl AttnPrecision {
    /// The lever arm's name (`bf16`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            AttnPrecision::Bf16 => "bf16",
            AttnPrecision::Fp8 => "fp8",
        }
    }
}

/// Which kernel runs the self-attention (lever `attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionArm {
    /// The engine's own flash kernel (bf16 `mma.sync`, [`AttnKernel`]).
    Mma,
    /// cuDNN's fused SDPA-forward operation ([`Sdpa`]).
    Cudnn,
}

impl AttentionArm {
    /// The lever arm's name (`mma`, `cudnn`).
    pub fn name(self) -> &'static str {
        match self {
            AttentionArm::Mma => "mma",
            AttentionArm::Cudnn => "cudnn",
        }
    }
}

impl DeviceDit {
    /// Bind `weights` (checked against `dims`: every tensor present, bf16, of the
    /// expected shape) and upload the RoPE frequency table. Every arm can run
    /// on it ([`DeviceDit::set_arms`]; `precision = fp8` quantizes a second,
    /// e4m3 copy of the block Linears beside the bf16 one).
    pub fn new(
        gpu: Arc<Gpu>,
        kernels: Arc<Kernels>,
        gemm: Arc<Gemm>,
        dims: DitDims,
        weights: Arc<DeviceWeights>,
    ) -> Result<DeviceDit, CudaError> {
        Self::build(gpu, kernels, gemm, dims, weights, None)
    }

    /// Bind `weights`, which hold every tensor but the block Linears' weights
    /// ([`DitDims::block_linear_weights`]), and `fp8`, their e4m3 copies in
    /// that order; the DiT runs `precision = fp8` from the start and cannot
    /// run bf16 (there is nothing to run it on: [`DeviceDit::set_arms`]
    /// refuses). Checked: `fp8` holds one Linear per block weight, of its shape.
    pub fn with_fp8_weights(
        gpu: Arc<Gpu>,
        kernels: Arc<Kernels>,
        gemm: Arc<Gemm>,
        dims: DitDims,
        weights: Arc<DeviceWeights>,
        fp8: Fp8Linears,
    ) -> Result<DeviceDit, CudaError> {
        let want = dims.block_linear_weights();
        if fp8.len() != want.len() {
            return Err(CudaError::Invalid(format!(
                "{} e4m3 Linears for a DiT of {} block Linears",
                fp8.len(),
                want.len()
            )));
        }
        if let Some((i, (name, out, inp))) = want
            .iter()
            .enumerate()
            .find(|(i, (_, out, inp))| fp8.shape(*i) != Some((*out, *inp)))
        {
            return Err(CudaError::Invalid(format!(
                "e4m3 Linear {i} is {:?}, '{name}' is [{out}, {inp}]",
                fp8.shape(i)
            )));
        }
        Self::build(gpu, kernels, gemm, dims, weights, Some(fp8))
    }

    fn build(
        gpu: Arc<Gpu>,
        kernels: Arc<Kernels>,
        gemm: Arc<Gemm>,
        dims: DitDims,
        weights: Arc<DeviceWeights>,
        fp8: Option<Fp8Linears>,
    ) -> Result<DeviceDit, CudaError> {
        if dims.dim() % 8 != 0 {
            return Err(CudaError::Invalid(format!(
                "DiT width {} is not a multiple of 8",
                dims.dim()
            )));
        }
        let bf16_blocks = fp8.is_none();
        let w = resolve(&weights, &dims, bf16_blocks)?;
        let f = rope_freqs(dims.dim());
        let freqs = DeviceBuffer::alloc(&gpu, Self::rope_bytes(&dims), "the RoPE frequency table")?;
        if !f.is_empty() {
            upload(&gpu, freqs.ptr(), &f)?;
        }
        let precision = match fp8 {
            Some(_) => Precision::Fp8,
            None => Precision::Bf16,
        };
        Ok(DeviceDit {
            attn: AttnKernel::best_for(dims.head_dim),
            gpu,
            kernels,
            gemm,
            dims,
            weights,
            w,
            norm_eps: dims.config().norm_eps as f32,
            freqs,
            ws: None,
            arms: ForwardArms {
                precision,
                ..ForwardArms::OWN
            },
            sdpa: None,
            fp8: fp8.map(|weights| Fp8State {
                attn: None,
                weights,
                acts: None,
            }),
            bf16_blocks,
            norm_quantize: NormQuantize::Fused,
            operand_amax: OperandAmax::Folded,
        })
    }

    /// Stage the DiT of `dims` from `tensors` (the validated checkpoint's
    /// extents) in bf16 with `opts` ([`crate::cuda::staging::stage`]) and bind
    /// it ([`DeviceDit::new`]): every arm can run on it.
    pub fn load_bf16(
        kit: &DeviceKit,
        dims: DitDims,
        tensors: &[Extent],
        opts: &StagingOptions,
    ) -> Result<(DeviceDit, StagingReport), CudaError> {
        let (w, report) = staging::stage(&kit.gpu, tensors, opts)?;
        let dit = DeviceDit::new(
            kit.gpu.clone(),
            kit.kernels.clone(),
            kit.gemm.clone(),
            dims,
            Arc::new(w),
        )?;
        Ok((dit, report))
    }

    /// Stage the DiT of `dims` from `tensors` (the validated checkpoint's
    /// extents) fp8-resident, for `precision = fp8`: every tensor but the
    /// block Linears' weights goes into the resident arena as
    /// [`crate::cuda::staging::stage`] puts it; the block Linears' bf16 weights
    /// go window by window through one bounce buffer of at most `bound` bytes
    /// (or one Linear, if larger: [`crate::cuda::staging::stage_split`]), each
    /// window quantized there by the same kernel the bf16-staged path runs
    /// ([`Fp8Linears::quantize_one`]; the e4m3 codes and scales are bit for
    /// bit that path's) before the next refills it. The bytes read and copied
    /// are unchanged (bf16, all of them in the report); what stays resident
    /// for those weights halves. Refuses, before reading anything, a device
    /// without FP8 and a checkpoint that lacks a block weight or holds one of
    /// another shape or type.
    pub fn load_fp8_resident(
        kit: &DeviceKit,
        dims: DitDims,
        tensors: &[Extent],
        opts: &StagingOptions,
        bound: usize,
    ) -> Result<(DeviceDit, StagingReport), CudaError> {
        let want = dims.block_linear_weights();
        let shapes: Vec<(usize, usize)> = want.iter().map(|(_, o, i)| (*o, *i)).collect();
        let transient = transient_flags(tensors, &want)?;
        let slot_of: HashMap<&str, usize> = want
            .iter()
            .enumerate()
            .map(|(i, (n, _, _))| (n.as_str(), i))
            .collect();
        let q = Fp8Linears::alloc(&kit.gpu, &shapes)?;
        let mut done = vec![false; want.len()];
        let mut quantize = |view: &DeviceWeights| -> Result<(), CudaError> {
            for name in view.names() {
                let i = *slot_of.get(name).ok_or_else(|| {
                    CudaError::Invalid(format!("'{name}' passed through but is no block Linear"))
                })?;
                let (out, inp) = shapes[i];
                let t = view.get(name, &[out, inp])?;
                q.quantize_one(&kit.gpu, &kit.kernels, i, t.ptr)?;
                done[i] = true;
            }
            // The bounce is refilled next: the quantize passes must be done.
            kit.gpu.sync_compute()
        };
        let (resident, report) =
            staging::stage_split(&kit.gpu, tensors, opts, &transient, bound, &mut quantize)?;
        if let Some(i) = done.iter().position(|d| !d) {
            return Err(CudaError::Invalid(format!(
                "'{}' was never quantized",
                want[i].0
            )));
        }
        let dit = Self::with_fp8_weights(
            kit.gpu.clone(),
            kit.kernels.clone(),
            kit.gemm.clone(),
            dims,
            Arc::new(resident),
            q,
        )?;
        Ok((dit, report))
    }

    /// Run the forward on `arms`. An arm on cuDNN loads it and checks its
    /// version here (an error names what is missing; nothing falls back
    /// silently, so a run's levers say what ran); with no arm on cuDNN it is
    /// released.
    ///
    /// On a DiT staged in bf16 ([`DeviceDit::new`]), `precision = fp8`
    /// quantizes every block Linear's weight on the device here (once) into
    /// e4m3 copies kept beside the bf16 weights, and the activation buffers
    /// come with the workspace; `bf16` frees both. On an fp8-resident DiT
    /// ([`DeviceDit::load_fp8_resident`]) the e4m3 weights are already there
    /// and `bf16` is refused with [`CudaError::Invalid`] (its bf16 block
    /// weights were never staged), changing nothing.
    pub fn set_arms(&mut self, arms: ForwardArms) -> Result<(), CudaError> {
        if let Some(why) = arms.conflict() {
            return Err(CudaError::Invalid(why));
        }
        if arms.attn_precision == AttnPrecision::Fp8
            && self.gpu.capability < sdpa_fp8::MIN_CAPABILITY
        {
            return Err(CudaError::NotAvailable(format!(
                "attention-precision = fp8 runs cuDNN's FP8 attention, which needs compute \
                 capability {}.{} (Hopper); this GPU ({}) has {}.{}",
                sdpa_fp8::MIN_CAPABILITY.0,
                sdpa_fp8::MIN_CAPABILITY.1,
                self.gpu.name,
                self.gpu.capability.0,
                self.gpu.capability.1
            )));
        }
        if let Some(why) = arms.model_conflict(self.dims.head_dim) {
            return Err(CudaError::NotAvailable(why));
        }
        if arms.precision == Precision::Bf16 && !self.bf16_blocks {
            return Err(CudaError::Invalid(
                "precision = bf16 on a DiT loaded for precision = fp8: its bf16 block Linear \
                 weights were not staged (only their e4m3 copies are resident); load it again \
                 with precision = bf16"
                    .into(),
            ));
        }
        if !arms.needs_cudnn() {
            self.sdpa = None;
        } else if self.sdpa.is_none() {
            self.sdpa = Some(Sdpa::open(&self.gpu)?);
        }
        match arms.precision {
            Precision::Bf16 => self.fp8 = None,
            Precision::Fp8 if self.fp8.is_none() => {
                if !self.bf16_blocks {
                    return Err(CudaError::Invalid(
                        "precision = fp8 without e4m3 or bf16 block weights".into(),
                    ));
                }
                let weights =
                    Fp8Linears::quantize(&self.gpu, &self.kernels, &self.block_linears())?;
                let mut st = Fp8State {
                    weights,
                    acts: None,
                    attn: None,
                };
                if let Some((rows, l)) = self.ws.as_ref().map(|w| (w.n * w.batch, w.l)) {
                    st.acts = Some(self.fp8_acts(rows, l)?);
                }
                self.fp8 = Some(st);
            }
            Precision::Fp8 => {}
        }
        self.hold_fp8_attn(arms.attn_precision)?;
        // The products planned from here on (each choice keeps its own plans).
        self.gemm.set_choice(arms.gemm_algo);
        self.arms = arms;
        Ok(())
    }

    /// Hold the FP8 attention's operands exactly while `want` is fp8, the fp8
    /// arm's state exists and a workspace gives their token count (allocated
    /// or freed here; [`DeviceDit::set_arms`] and [`DeviceDit::workspace`]
    /// both end with it).
    fn hold_fp8_attn(&mut self, want: AttnPrecision) -> Result<(), CudaError> {
        let rows = match want {
            AttnPrecision::Fp8 => self.ws.as_ref().map(|w| w.n),
            AttnPrecision::Bf16 => None,
        };
        let width = self.dims.dim();
        if let Some(st) = self.fp8.as_mut() {
            match (rows, &st.attn) {
                (Some(n), Some(a)) if a.rows == n => {}
                (Some(n), _) => {
                    st.attn = None;
                    st.attn = Some(Fp8Attn::new(&self.gpu, n, width)?);
                }
                (None, _) => st.attn = None,
            }
        }
        Ok(())
    }

    /// Whether the blocks' Linear weights are resident in bf16 (false after
    /// [`DeviceDit::load_fp8_resident`]).
    pub fn has_bf16_blocks(&self) -> bool {
        self.bf16_blocks
    }

    /// How the fp8 arm's row steps feed their FP8 GEMMs from now on (for the
    /// selftest's bit-exact comparison and the bench's timing; a load starts
    /// [`NormQuantize::Fused`]). Inert under `precision = bf16`.
    pub fn set_norm_quantize(&mut self, how: NormQuantize) {
        self.norm_quantize = how;
    }

    /// Where the FP8 attention's q and k amax come from from now on (for the
    /// selftest's bit-exact comparison and the bench's timing; a load starts
    /// [`OperandAmax::Folded`]). Inert unless `attention-precision = fp8`.
    pub fn set_operand_amax(&mut self, how: OperandAmax) {
        self.operand_amax = how;
    }

    /// The residual + norm row step over the forward's `n` rows (tokens times
    /// samples; see
    /// [`Kernels::residual_norm`]), its output handed on as the input of the
    /// Linear that reads it: bf16 in `ws.h` when `acts` is None; else that
    /// Linear's FP8 operand in `acts`, quantized by the step itself or by a
    /// pass over `ws.h` after it, as [`DeviceDit::set_norm_quantize`] says.
    fn row_step(
        &self,
        ws: &Workspace,
        n: usize,
        (y, gate): (CUdeviceptr, (CUdeviceptr, CUdeviceptr)),
        next: &NextInput,
        acts: Option<&Fp8Rows>,
    ) -> Result<LinIn, CudaError> {
        let (s, k) = (&self.gpu.compute, &self.kernels);
        let d = self.dims.dim();
        let step = |out: RowOut| {
            k.residual_norm(
                s,
                (ws.x, self.arms.residual),
                y,
                gate,
                n,
                d,
                next.mode,
                next.eps,
                next.shift,
                next.scale,
                out,
            )
        };
        match (acts, self.norm_quantize) {
            (None, _) => {
                step(RowOut::Bf16(ws.h))?;
                Ok(LinIn::Bf16(ws.h))
            }
            (Some(a), NormQuantize::Fused) => {
                let (codes, scales) = a.destination(n, d)?;
                step(RowOut::E4m3 { codes, scales })?;
                Ok(LinIn::Fp8(codes, scales))
            }
            (Some(a), NormQuantize::Separate) => {
                step(RowOut::Bf16(ws.h))?;
                let (codes, scales) = a.quantize(&self.gpu, k, ws.h, n, d)?;
                Ok(LinIn::Fp8(codes, scales))
            }
        }
    }

    /// The blocks' e4m3 weights while `precision = fp8` (in
    /// [`DitDims::block_linear_weights`]' order).
    pub fn fp8_linears(&self) -> Option<&Fp8Linears> {
        self.fp8.as_ref().map(|st| &st.weights)
    }

    /// Every block's Linears, block by block in [`BlockWeights::linears`]' order.
    fn block_linears(&self) -> Vec<LinearRef> {
        self.w
            .blocks
            .iter()
            .flat_map(|b| b.linears())
            .map(|l| LinearRef {
                w: l.w,
                out: l.out,
                inp: l.inp,
            })
            .collect()
    }

    /// The FP8 arm's buffers for `n` rows (tokens times samples) and `l` text
    /// tokens: block inputs (up to the feed-forward's `4 · width`) and the
    /// projected text.
    fn fp8_acts(&self, n: usize, l: usize) -> Result<(Fp8Rows, Fp8Rows), CudaError> {
        let d = self.dims.dim();
        Ok((
            Fp8Rows::new(&self.gpu, n, 4 * d, "the FP8 block inputs")?,
            Fp8Rows::new(&self.gpu, l, d, "the FP8 text")?,
        ))
    }

    /// Device bytes the `precision = fp8` arm adds, on a DiT staged in bf16,
    /// for a forward of `n` tokens and `l` text tokens: the e4m3 block weights
    /// and the activation buffers.
    pub fn fp8_bytes(&self, n: usize, l: usize) -> usize {
        Self::fp8_bytes_for(&self.dims, n, l)
    }

    /// [`DeviceDit::fp8_bytes`] of a model of `dims`, before it is loaded:
    /// [`DeviceDit::fp8_weight_bytes_for`] + [`DeviceDit::fp8_act_bytes_for`].
    pub fn fp8_bytes_for(dims: &DitDims, n: usize, l: usize) -> usize {
        Self::fp8_weight_bytes_for(dims) + Self::fp8_act_bytes_for(dims, n, l)
    }

    /// Device bytes of the blocks' e4m3 weights of a model of `dims`: codes
    /// (one byte an element) and f32 scales (one a row), each aligned.
    pub fn fp8_weight_bytes_for(dims: &DitDims) -> usize {
        let d = dims.dim();
        let block: Vec<LinearRef> = (0..BLOCK_LINEARS)
            .map(|i| block_linear_shape(i, d))
            .map(|(out, inp)| LinearRef { w: 0, out, inp })
            .collect();
        dims.layers * Fp8Linears::bytes_for(&block)
    }

    /// Device bytes of the `precision = fp8` arm's activation buffers for `n`
    /// rows (tokens times the forward's samples, lever `guidance-batch`) and
    /// `l` text tokens: block inputs up to `4 · width` wide and the
    /// projected text, codes and scales (allocated with the workspace).
    pub fn fp8_act_bytes_for(dims: &DitDims, n: usize, l: usize) -> usize {
        let d = dims.dim();
        Fp8Rows::bytes_for(n, 4 * d) + Fp8Rows::bytes_for(l, d)
    }

    /// Device bytes `attention-precision = fp8` adds for `n` tokens (allocated
    /// with the workspace): e4m3 q, k and v and the scale slots
    /// ([`Fp8Attn::bytes_for`]); its output shares the block inputs' buffer.
    pub fn fp8_attn_bytes_for(dims: &DitDims, n: usize) -> usize {
        Fp8Attn::bytes_for(n, dims.dim())
    }

    /// Device bytes of the bounce buffer [`DeviceDit::load_fp8_resident`]
    /// holds during the load of a model of `dims` under [`FP8_BOUNCE_BOUND`]
    /// (freed before it returns): [`crate::cuda::staging::bounce_capacity`] of
    /// the block Linears' bf16 weights.
    pub fn fp8_bounce_bytes_for(dims: &DitDims) -> usize {
        staging::bounce_capacity(
            dims.block_linear_weights()
                .iter()
                .map(|(_, out, inp)| out * inp * 2),
            FP8_BOUNCE_BOUND,
        )
    }

    /// Run the self-attention on `arm`, the other arms unchanged
    /// ([`DeviceDit::set_arms`]).
    pub fn set_attention(&mut self, arm: AttentionArm) -> Result<(), CudaError> {
        self.set_arms(ForwardArms {
            attention: arm,
            ..self.arms
        })
    }

    /// The arms the forward runs.
    pub fn arms(&self) -> ForwardArms {
        self.arms
    }

    /// The loaded cuDNN's version on the `cudnn` arm.
    pub fn cudnn_version(&self) -> Option<usize> {
        self.sdpa.as_ref().map(|s| s.version)
    }

    /// The (m, n, k) of the FP8 GEMMs planned so far that asked for
    /// `fp8-accum = fast` and run exact: cuBLASLt had no fast algorithm at that
    /// shape ([`Gemm::fast_refused`]).
    pub fn fp8_fast_refused(&self) -> Vec<(usize, usize, usize)> {
        self.gemm.fast_refused(Fp8Scaling::Row)
    }

    /// Device bytes of the RoPE frequency table of `dims`.
    pub fn rope_bytes(dims: &DitDims) -> usize {
        (dims.dim() / 6).max(1) * 4
    }

    /// The model's shape.
    pub fn dims(&self) -> &DitDims {
        &self.dims
    }

    /// The staged weights (after [`DeviceDit::load_fp8_resident`], every
    /// tensor but the block Linears' weights).
    pub fn weights(&self) -> &Arc<DeviceWeights> {
        &self.weights
    }

    /// The GPU the model lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The loaded kernels.
    pub fn kernels(&self) -> &Arc<Kernels> {
        &self.kernels
    }

    /// The cuBLASLt handle and its plan cache.
    pub fn gemm(&self) -> &Arc<Gemm> {
        &self.gemm
    }

    /// The workspace for (n, l) and one sample, allocated (or reallocated) on
    /// demand ([`DeviceDit::workspace_for`]).
    pub fn workspace(&mut self, n: usize, l: usize) -> Result<&Workspace, CudaError> {
        self.workspace_for(n, l, 1)
    }

    /// The workspace for (n, l) and at least `batch` samples (lever
    /// `guidance-batch`), allocated (or reallocated) on demand; one of more
    /// samples than asked is kept (a forward of fewer samples uses its first
    /// rows).
    pub fn workspace_for(
        &mut self,
        n: usize,
        l: usize,
        batch: usize,
    ) -> Result<&Workspace, CudaError> {
        let batch = batch.max(1);
        let fits = matches!(&self.ws, Some(w) if w.n == n && w.l == l && w.batch >= batch);
        if !fits {
            self.ws = None;
            if let Some(st) = self.fp8.as_mut() {
                st.acts = None;
            }
            self.ws = Some(Workspace::new(&self.gpu, &self.dims, n, l, batch)?);
        }
        if self.fp8.as_ref().is_some_and(|st| st.acts.is_none()) {
            let rows = self.ws.as_ref().map_or(n, |w| w.n * w.batch);
            let acts = self.fp8_acts(rows, l)?;
            if let Some(st) = self.fp8.as_mut() {
                st.acts = Some(acts);
            }
        }
        self.hold_fp8_attn(self.arms.attn_precision)?;
        self.ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("workspace missing".into()))
    }

    /// Enqueue one forward on the compute stream and return at once: `lat` (f32
    /// [n, 128] on the device) at noise level `sigma`, cross-attending to `text`,
    /// velocity into `out` (f32 [n, 128] on the device). Needs a workspace of n
    /// tokens and at least `text.l` text tokens ([`DeviceDit::workspace`]).
    pub fn enqueue_forward(
        &self,
        lat: CUdeviceptr,
        sigma: f32,
        geo: Geometry,
        text: &TextSlot,
        out: CUdeviceptr,
    ) -> Result<(), CudaError> {
        self.enqueue_at(lat, Timestep::Sigma(sigma), geo, text, out)
    }

    /// [`DeviceDit::enqueue_forward`] with the timestep from `ts`
    /// ([`Timestep::At`] for a forward captured into a graph).
    pub fn enqueue_at(
        &self,
        lat: CUdeviceptr,
        ts: Timestep,
        geo: Geometry,
        text: &TextSlot,
        out: CUdeviceptr,
    ) -> Result<(), CudaError> {
        self.enqueue_blocks(lat, ts, geo, &[text], out, self.w.blocks.len(), None)
    }

    /// One forward over several samples at once (lever `guidance-batch`):
    /// each sample reads the same latents `lat` (f32 [n, 128]) at the same
    /// timestep `ts` and cross-attends to its own text, `texts[j]`, whose keys
    /// and values come from its cache (`text-kv = cached`,
    /// [`DeviceDit::prepare_text`]); sample j's velocity goes to `out + j · n ·
    /// 128 · 4` (f32 [n, 128] each, one after the other). Needs a workspace of
    /// n tokens, at least `texts.len()` samples and the longest text
    /// ([`DeviceDit::workspace_for`]). With one text it is
    /// [`DeviceDit::enqueue_at`].
    pub fn enqueue_batch_at(
        &self,
        lat: CUdeviceptr,
        ts: Timestep,
        geo: Geometry,
        texts: &[&TextSlot],
        out: CUdeviceptr,
    ) -> Result<(), CudaError> {
        self.enqueue_blocks(lat, ts, geo, texts, out, self.w.blocks.len(), None)
    }

    /// [`DeviceDit::enqueue_forward`] with `probe(class)` called after each
    /// operation of the forward, in stream order, with the operation's class
    /// (e.g. `"gemm q|k|v"`, `"self-attention"`, `"residual+norm"`; see
    /// `enqueue_block`): a profiler records an event there and attributes the
    /// device time since the previous one to that class. The launches are the
    /// forward's own, unchanged.
    pub fn enqueue_profiled(
        &self,
        lat: CUdeviceptr,
        sigma: f32,
        geo: Geometry,
        text: &TextSlot,
        out: CUdeviceptr,
        probe: &dyn Fn(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let ts = Timestep::Sigma(sigma);
        self.enqueue_blocks(lat, ts, geo, &[text], out, self.w.blocks.len(), Some(probe))
    }

    /// Enqueue a forward through the first block only (as a one-block model:
    /// that block ends in the output norm), writing `out`. It launches every
    /// kernel and every GEMM shape of a whole forward over the same geometry and
    /// text, so the one-time host work of a first launch (cuBLASLt algorithm
    /// choice and kernel loading, NVRTC functions' lazy loading: tens of
    /// milliseconds, run 5 in `reports/device-notes.md`) is done here, outside
    /// the forwards that events time,
    /// at 1/layers of a forward's device time. `out` is garbage afterwards.
    /// `ts` picks the timestep kernel the later forwards use (by value or
    /// [`Timestep::At`]), so that one is loaded here too. Over `texts.len()`
    /// samples ([`DeviceDit::enqueue_batch_at`]; one text: a batch-1 forward),
    /// whose GEMMs plan for that many rows.
    pub fn enqueue_warm_up(
        &self,
        lat: CUdeviceptr,
        ts: Timestep,
        geo: Geometry,
        texts: &[&TextSlot],
        out: CUdeviceptr,
    ) -> Result<(), CudaError> {
        self.enqueue_blocks(lat, ts, geo, texts, out, self.w.blocks.len().min(1), None)
    }

    /// [`DeviceDit::enqueue_forward`] through the first `blocks` blocks only,
    /// over `texts.len()` samples ([`DeviceDit::enqueue_batch_at`]): the input
    /// projection, the time embedding and (one sample, `text-kv =
    /// per-forward`) the caption projection, the first block's input norm,
    /// each block ([`DeviceDit::enqueue_block`]), the output projection;
    /// `probe` as in [`DeviceDit::enqueue_profiled`].
    #[allow(clippy::too_many_arguments)]
    fn enqueue_blocks(
        &self,
        lat: CUdeviceptr,
        ts: Timestep,
        geo: Geometry,
        texts: &[&TextSlot],
        out: CUdeviceptr,
        blocks: usize,
        probe: Option<&dyn Fn(&'static str) -> Result<(), CudaError>>,
    ) -> Result<(), CudaError> {
        let mark = |class: &'static str| probe.map_or(Ok(()), |p| p(class));
        let blocks = &self.w.blocks[..blocks.min(self.w.blocks.len())];
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("forward before the workspace exists".into()))?;
        let (n, batch) = (ws.n, texts.len());
        let tokens = geo.grid.0 * geo.grid.1 * geo.grid.2;
        if batch == 0 || batch > ws.batch {
            return Err(CudaError::Invalid(format!(
                "a forward over {batch} samples on a workspace of {}",
                ws.batch
            )));
        }
        for text in texts {
            let l = text.l;
            if tokens != n || l > ws.l || text.caption != self.dims.caption_channels {
                return Err(CudaError::Invalid(format!(
                    "a forward over grid {:?} ({tokens} tokens) and {l} text tokens of {} \
                     channels does not fit the workspace of {n} tokens and {} text tokens of {}",
                    geo.grid, text.caption, ws.l, self.dims.caption_channels
                )));
            }
        }
        let rows = n * batch;
        let s = &self.gpu.compute;
        let k = &self.kernels;
        let d = self.dims.dim();
        let lc = LATENT_CHANNELS;
        let w = &self.w;
        let lin = |x: CUdeviceptr, lw: &Lin, y: CUdeviceptr, m: usize, ep: Epilogue| {
            self.gemm.linear(s, x, lw.w, lw.b, y, m, lw.out, lw.inp, ep)
        };
        // Input projection into the residual stream (f32, or bf16 under
        // `residual = bf16`: the projection's own bf16 values either way):
        // once, as every sample reads the same latents, each sample's rows a
        // copy of it.
        k.map(s, Map::F32ToBf16, lat, ws.lat_bf, n * lc)?;
        lin(ws.lat_bf, &w.proj_in, ws.h, n, Epilogue::Bias)?;
        let xb = self.arms.residual.bytes();
        for j in 0..batch {
            let xj = ws.x + (j * n * d * xb) as u64;
            match self.arms.residual {
                ResidualStream::F32 => k.map(s, Map::Bf16ToF32, ws.h, xj, n * d)?,
                ResidualStream::Bf16 => copy_d2d(s, ws.h, xj, n * d * 2)?,
            }
        }
        // Timestep: sinusoid(sigma * 1000) -> linear_1 -> SiLU -> linear_2 = emb;
        // SiLU(emb) -> linear = temb (6 x D), the same for every sample.
        match ts {
            Timestep::Sigma(sigma) => {
                k.timestep_sinusoid(s, ws.tsin, sigma * 1000.0, TIMESTEP_DIM / 2)?
            }
            Timestep::At(t) => k.timestep_sinusoid_at(s, ws.tsin, t, TIMESTEP_DIM / 2)?,
        }
        lin(ws.tsin, &w.time_embed_linear_1, ws.t1, 1, Epilogue::Bias)?;
        k.map(s, Map::SiluBf16, ws.t1, ws.t1s, d)?;
        lin(ws.t1s, &w.time_embed_linear_2, ws.emb, 1, Epilogue::Bias)?;
        k.map(s, Map::SiluBf16, ws.emb, ws.emb_s, d)?;
        lin(ws.emb_s, &w.time_embed_linear, ws.temb, 1, Epilogue::Bias)?;
        // The text's keys and values come from its cache (`text-kv = cached`),
        // or (one sample only) every block projects them from the projected
        // text.
        let caches = texts
            .iter()
            .map(|t| self.text_kv(t, blocks.len()))
            .collect::<Result<Vec<_>, _>>()?;
        let fp8 = match caches.as_slice() {
            [None] => self.project_text(ws, texts[0])?,
            c if c.iter().all(Option::is_some) => self.fp8_parts()?,
            _ => {
                return Err(CudaError::Invalid(format!(
                    "a forward over {batch} samples reads every text's keys and values from \
                     its cache: guidance-batch = batched needs text-kv = cached"
                )))
            }
        };
        let rope = RopeArgs {
            freqs: self.freqs.ptr(),
            nfreq: d / 6,
            grid: geo.grid,
            scale: [
                (ROPE_COMPRESSION.0 as f64 / geo.fps as f64) as f32,
                ROPE_COMPRESSION.1 as f32,
                ROPE_COMPRESSION.1 as f32,
            ],
            base: [ROPE_BASE.0, ROPE_BASE.1, ROPE_BASE.2],
        };
        // The output LayerNorm, modulated by the model's scale_shift_table + emb:
        // what the last block (or, with none, the input) normalises for.
        let output_norm = NextInput {
            mode: RowMode::LayerNorm,
            eps: OUT_NORM_EPS,
            shift: (row(d, w.scale_shift_table, 0), ws.emb),
            scale: (row(d, w.scale_shift_table, 1), ws.emb),
        };
        // Each residual add is fused with the next consumer's bf16 input
        // (`residual_norm`): one pass over the f32 stream between sub-blocks.
        // So the first block's input norm runs here, and each block ends with
        // the next one's.
        let first = match blocks.first() {
            Some(b0) => self.block_input(b0, ws),
            None => output_norm,
        };
        // The first block's Linears read it as their arm does (FP8 under
        // precision = fp8); the output projection reads bf16.
        let first_acts = match (blocks.is_empty(), fp8) {
            (false, Some((_, acts, _))) => Some(acts),
            _ => None,
        };
        let mut h = self.row_step(ws, rows, (NULL, (NULL, NULL)), &first, first_acts)?;
        mark("input, time and caption embeddings")?;
        for (bi, b) in blocks.iter().enumerate() {
            let next = match blocks.get(bi + 1) {
                Some(nx) => self.block_input(nx, ws),
                None => output_norm,
            };
            let q8 = match fp8 {
                Some((st, acts, text_q)) => Some(BlockFp8 {
                    q: st.block(bi)?,
                    acts,
                    text: text_q,
                    attn: match self.arms.attn_precision {
                        AttnPrecision::Fp8 => Some(st.attn.as_ref().ok_or_else(|| {
                            CudaError::Invalid(
                                "attention-precision = fp8 without its buffers".into(),
                            )
                        })?),
                        AttnPrecision::Bf16 => None,
                    },
                }),
                None => None,
            };
            let last = bi + 1 == blocks.len();
            let cross = (texts, &caches[..], bi);
            h = self.enqueue_block(b, q8, ws, h, cross, &rope, (next, last), probe)?;
        }
        // The output norm wrote bf16 (the projection out is a bf16 Linear).
        let LinIn::Bf16(h) = h else {
            return Err(CudaError::Invalid(
                "the output norm handed on an FP8 operand".into(),
            ));
        };
        lin(h, &w.proj_out, ws.out_bf, rows, Epilogue::Bias)?;
        k.map(s, Map::Bf16ToF32, ws.out_bf, out, rows * lc)?;
        mark("output projection")
    }

    /// The caption projection of `text` into `ws.text_p` (linear_1 ->
    /// tanh-GELU -> linear_2) on the compute stream and, on the fp8 arm, its
    /// quantization once for every block's cross-attention keys and values;
    /// returns the fp8 arm's parts ([`DeviceDit::fp8_parts`]).
    #[allow(clippy::type_complexity)]
    fn project_text(
        &self,
        ws: &Workspace,
        text: &TextSlot,
    ) -> Result<Option<(&Fp8State, &Fp8Rows, &Fp8Rows)>, CudaError> {
        let (s, k, w, l) = (&self.gpu.compute, &self.kernels, &self.w, text.l);
        let lin = |x: CUdeviceptr, lw: &Lin, y: CUdeviceptr, ep: Epilogue| {
            self.gemm.linear(s, x, lw.w, lw.b, y, l, lw.out, lw.inp, ep)
        };
        let c = self.dims.caption_channels;
        k.map(s, Map::F32ToBf16, text.text(), ws.text_bf, l * c)?;
        lin(
            ws.text_bf,
            &w.caption_projection_linear_1,
            ws.cap_h,
            Epilogue::BiasGelu,
        )?;
        lin(
            ws.cap_h,
            &w.caption_projection_linear_2,
            ws.text_p,
            Epilogue::Bias,
        )?;
        let fp8 = self.fp8_parts()?;
        if let Some((_, _, text_q)) = fp8 {
            text_q.quantize(&self.gpu, k, ws.text_p, l, self.dims.dim())?;
        }
        Ok(fp8)
    }

    /// The q/k RMS norm (+ RoPE, + amax) of `q` and `kk` (pointer, weight,
    /// rows each) on the compute stream with the `qk-norm` arm's kernel: the one
    /// dispatch the forward and the text K/V cache share, so a cached key row is
    /// the per-forward one bit for bit.
    pub(super) fn qk_norm(
        &self,
        q: (CUdeviceptr, CUdeviceptr, usize),
        kk: (CUdeviceptr, CUdeviceptr, usize),
        rope: Option<&RopeArgs>,
        amax: Option<CUdeviceptr>,
    ) -> Result<(), CudaError> {
        let (s, k, d) = (&self.gpu.compute, &self.kernels, self.dims.dim());
        match self.arms.qk_norm {
            QkNormArm::Block => k.qk_norm_rope_pair(s, q, kk, d, QK_NORM_EPS, rope, amax),
            QkNormArm::Warp => k.qk_norm_rope_warp(s, q, kk, d, QK_NORM_EPS, rope, amax),
        }
    }

    /// The fp8 arm's state, its block inputs' buffer and the projected text's
    /// (None on bf16).
    #[allow(clippy::type_complexity)]
    fn fp8_parts(&self) -> Result<Option<(&Fp8State, &Fp8Rows, &Fp8Rows)>, CudaError> {
        match self.arms.precision {
            Precision::Bf16 => Ok(None),
            Precision::Fp8 => {
                let st = self.fp8.as_ref().ok_or_else(|| {
                    CudaError::Invalid("precision = fp8 without its e4m3 weights".into())
                })?;
                let (acts, text_q) = st.acts.as_ref().ok_or_else(|| {
                    CudaError::Invalid("precision = fp8 without its buffers".into())
                })?;
                Ok(Some((st, acts, text_q)))
            }
        }
    }

    /// The modulated RMS norm a block reads its input through (rows 0 and 1
    /// of its `scale_shift_table` + temb).
    fn block_input(&self, b: &BlockWeights, ws: &Workspace) -> NextInput {
        let d = self.dims.dim();
        NextInput {
            mode: RowMode::Rms,
            eps: self.norm_eps,
            shift: (row(d, b.scale_shift_table, 0), row(d, ws.temb, 0)),
            scale: (row(d, b.scale_shift_table, 1), row(d, ws.temb, 1)),
        }
    }

    /// One transformer block on the compute stream over `texts.len()`
    /// samples of `ws.n` tokens each (their rows one after the other in every
    /// per-token buffer): `h` is the block's modulated input norm as its
    /// Linears read it (written by the step before: bf16 in `ws.h`, or their
    /// FP8 operand); the block adds its self-attention (gated, each sample
    /// attending to its own tokens), cross-attention to each sample's text
    /// (`texts[j]`: its keys and values read from block `bi`'s slot of
    /// `caches[j]`, or projected here from `ws.text_p` for a lone sample) and feed-forward (gated) to the
    /// residual stream `ws.x` (f32, or bf16 under `residual = bf16`), and
    /// returns the input of whatever comes `next` (the next block's norm or,
    /// with `last`, the output norm, whose reader is bf16) as that reader
    /// reads it. Each Linear runs once over every
    /// sample's rows. `probe(class)` after each operation (see
    /// [`DeviceDit::enqueue_profiled`]).
    #[allow(clippy::too_many_arguments)]
    fn enqueue_block(
        &self,
        b: &BlockWeights,
        fp8: Option<BlockFp8<'_>>,
        ws: &Workspace,
        h: LinIn,
        (texts, caches, bi): (&[&TextSlot], &[Option<&TextKv>], usize),
        rope: &RopeArgs,
        (next, last): (NextInput, bool),
        probe: Option<&dyn Fn(&'static str) -> Result<(), CudaError>>,
    ) -> Result<LinIn, CudaError> {
        let mark = |class: &'static str| probe.map_or(Ok(()), |p| p(class));
        let (s, k) = (&self.gpu.compute, &self.kernels);
        let (n, d) = (ws.n, self.dims.dim());
        let rows = n * texts.len();
        let (heads, hd) = (self.dims.heads, self.dims.head_dim);
        // Sample j's rows of a bf16 [rows, d] buffer.
        let at = |p: CUdeviceptr, j: usize| p + (j * n * d * 2) as u64;
        // A block Linear's input as its arm reads it: bf16 as it is, or (fp8)
        // quantized per token into the FP8 buffers (`cols` wide).
        let input = |x: CUdeviceptr, rows: usize, cols: usize| -> Result<LinIn, CudaError> {
            match fp8 {
                None => Ok(LinIn::Bf16(x)),
                Some(f) => {
                    let (c, sc) = f.acts.quantize(&self.gpu, k, x, rows, cols)?;
                    Ok(LinIn::Fp8(c, sc))
                }
            }
        };
        let text_in = text_operand(ws, fp8.map(|f| f.text));
        let lin = |x: LinIn, lw: &Lin, q: Option<Q8>, y: CUdeviceptr, m: usize, ep: Epilogue| {
            self.block_linear(x, lw, q, y, m, ep)
        };
        let q8 = |i: usize| fp8.map(|f| f.q[i]);
        // The engine's attention of sample j's queries to nk key rows (with a
        // key bias, or NULL).
        let attend = |j: usize, kv: (CUdeviceptr, CUdeviceptr), nk: usize, kbias: CUdeviceptr| {
            k.attention(
                s,
                self.attn,
                heads,
                hd,
                (at(ws.q, j), d),
                (kv.0, d),
                (kv.1, d),
                (at(ws.ao, j), d),
                n,
                nk,
                kbias,
                1.0 / (hd as f32).sqrt(),
            )
        };
        let table = |i: usize| (row(d, b.scale_shift_table, i), row(d, ws.temb, i));
        // The FP8 operands' buffer of this block's row steps (fp8 arm).
        let acts = fp8.map(|f| f.acts);
        // Self-attention on the modulated RMS norm (`h`).
        let a1 = &b.attn1;
        lin(h, &a1.to_q, q8(slot::SELF_Q), ws.q, rows, Epilogue::Bias)?;
        lin(h, &a1.to_k, q8(slot::SELF_K), ws.k, rows, Epilogue::Bias)?;
        lin(h, &a1.to_v, q8(slot::SELF_V), ws.v, rows, Epilogue::Bias)?;
        mark("gemm q|k|v")?;
        let qk_norm = |q, kk, rope, amax| self.qk_norm(q, kk, rope, amax);
        // cuDNN's fused attention of sample j's queries over nk key rows (no
        // bias), when loaded.
        let fused = |j: usize, kv: (CUdeviceptr, CUdeviceptr), nk: usize| {
            let sdpa = self
                .sdpa
                .as_ref()
                .ok_or_else(|| CudaError::Invalid("an arm on cuDNN without cuDNN loaded".into()))?;
            let shape = SdpaShape {
                heads,
                hd,
                nq: n,
                nk,
                ld: [d; 4],
                scale_bits: (1.0 / (hd as f32).sqrt()).to_bits(),
            };
            sdpa.enqueue(&self.gpu, &shape, at(ws.q, j), kv.0, kv.1, at(ws.ao, j))
        };
        // The FP8 self-attention (`attention-precision = fp8`): q, k and v
        // quantized per tensor, cuDNN's FP8 SDPA writing e4m3 codes straight
        // into the out-projection's input buffer, whose row scales the
        // quantize pass wrote (1 / scale_o each): no quantize pass of its own.
        // With [`OperandAmax::Folded`] the q/k norm raises q's and k's amax as
        // it writes them (the slots zeroed first), so the operand pass reads
        // only v for its amax. Sample by sample: each has its own scales, and
        // the operands' buffers are reused in stream order.
        let fp8_attn = fp8.and_then(|f| f.attn.map(|a| (a, f.acts)));
        let folded = fp8_attn.is_some() && self.operand_amax == OperandAmax::Folded;
        let mut ao = None;
        for j in 0..texts.len() {
            let slots = match fp8_attn {
                Some((a, _)) if folded => {
                    a.zero_amax(&self.gpu, k)?;
                    Some(a.slots())
                }
                _ => None,
            };
            // RoPE's positions are a token's index in one sample's grid.
            qk_norm(
                (at(ws.q, j), a1.norm_q, n),
                (at(ws.k, j), a1.norm_k, n),
                Some(rope),
                slots,
            )?;
            mark("q/k norm + rope")?;
            ao = Some(match fp8_attn {
                Some((a, acts)) => {
                    let how = if folded {
                        OperandAmax::Folded
                    } else {
                        OperandAmax::Separate
                    };
                    let qkv = [at(ws.q, j), at(ws.k, j), at(ws.v, j)];
                    a.quantize(&self.gpu, k, qkv, n, (acts, j * n), how)?;
                    mark("fp8 attention operands")?;
                    let sdpa = self.sdpa.as_ref().ok_or_else(|| {
                        CudaError::Invalid("attention-precision = fp8 without cuDNN loaded".into())
                    })?;
                    let (codes, scales) = acts.operand();
                    let shape = SdpaShape::self_attention(heads, hd, n);
                    let ptrs = Fp8Ptrs {
                        qkv: a.codes(),
                        o: codes + (j * n * d) as u64,
                        slots: a.slots(),
                    };
                    sdpa.enqueue_fp8(&self.gpu, &shape, ptrs)?;
                    mark("self-attention")?;
                    LinIn::Fp8(codes, scales)
                }
                None => {
                    let kv = (at(ws.k, j), at(ws.v, j));
                    match self.arms.attention {
                        AttentionArm::Cudnn => fused(j, kv, n)?,
                        AttentionArm::Mma => attend(j, kv, n, NULL)?,
                    }
                    mark("self-attention")?;
                    LinIn::Bf16(ws.ao)
                }
            });
        }
        // The bf16 attention's output, as the out-projection reads it.
        let ao = match ao {
            Some(LinIn::Bf16(_)) => input(ws.ao, rows, d)?,
            Some(fp8_out) => fp8_out,
            None => return Err(CudaError::Invalid("a block over no samples".into())),
        };
        lin(
            ao,
            &a1.to_out,
            q8(slot::SELF_OUT),
            ws.y,
            rows,
            Epilogue::Bias,
        )?;
        mark("gemm out")?;
        // Gated residual; cross-attention reads x unnormalised and unmodulated.
        let cast = NextInput {
            mode: RowMode::Cast,
            eps: self.norm_eps,
            shift: (NULL, NULL),
            scale: (NULL, NULL),
        };
        let h = self.row_step(ws, rows, (ws.y, table(2)), &cast, acts)?;
        mark("residual + norm")?;
        let a2 = &b.attn2;
        lin(h, &a2.to_q, q8(slot::CROSS_Q), ws.q, rows, Epilogue::Bias)?;
        mark("gemm q (cross)")?;
        for (j, (t, cache)) in texts.iter().zip(caches).enumerate() {
            // The text's keys (normed) and values: projected here, or read
            // from the text's cache (`text-kv = cached`), whose keys are
            // normed already.
            let (ck, cv, key_rows) = match cache.map(|c| c.block(bi)).transpose()? {
                None => {
                    let (tk, tv) = (q8(slot::CROSS_K), q8(slot::CROSS_V));
                    lin(text_in, &a2.to_k, tk, ws.ck, t.l, Epilogue::Bias)?;
                    lin(text_in, &a2.to_v, tv, ws.cv, t.l, Epilogue::Bias)?;
                    mark("gemm k|v (text)")?;
                    (ws.ck, ws.cv, t.l)
                }
                Some((ck, cv)) => (ck, cv, 0),
            };
            qk_norm(
                (at(ws.q, j), a2.norm_q, n),
                (ck, a2.norm_k, key_rows),
                None,
                None,
            )?;
            mark("q/k norm (cross)")?;
            // The mma arm adds the key bias even where it is all zero, as
            // before the lever existed (its frames stay bit for bit what they
            // were).
            match (self.arms.cross, t.masked) {
                (CrossArm::Cudnn, false) => fused(j, (ck, cv), t.l)?,
                (CrossArm::Cudnn, true) | (CrossArm::Mma, _) => {
                    attend(j, (ck, cv), t.l, t.kbias())?
                }
            }
            mark("cross-attention")?;
        }
        let ao = input(ws.ao, rows, d)?;
        lin(
            ao,
            &a2.to_out,
            q8(slot::CROSS_OUT),
            ws.y,
            rows,
            Epilogue::Bias,
        )?;
        mark("gemm out")?;
        // Plain residual, then the feed-forward's modulated RMS norm.
        let ff_norm = NextInput {
            mode: RowMode::Rms,
            eps: self.norm_eps,
            shift: table(3),
            scale: table(4),
        };
        let h = self.row_step(ws, rows, (ws.y, (NULL, NULL)), &ff_norm, acts)?;
        mark("residual + norm")?;
        let up = q8(slot::FF_UP);
        lin(h, &b.ff_net_0_proj, up, ws.ff, rows, Epilogue::BiasGelu)?;
        mark("gemm ff up + gelu")?;
        let f = input(ws.ff, rows, 4 * d)?;
        lin(
            f,
            &b.ff_net_2,
            q8(slot::FF_DOWN),
            ws.y,
            rows,
            Epilogue::Bias,
        )?;
        mark("gemm ff down")?;
        // The gated residual, then what comes next reads its input.
        let acts = if last { None } else { acts };
        let h = self.row_step(ws, rows, (ws.y, table(5)), &next, acts)?;
        mark("residual + norm")?;
        Ok(h)
    }

    /// One block Linear on the arm its input says: the bf16 GEMM, or the FP8
    /// GEMM against the weight's e4m3 copy `q` (then a GELU epilogue cuBLASLt
    /// could not fuse runs as its own pass).
    fn block_linear(
        &self,
        x: LinIn,
        lw: &Lin,
        q: Option<Q8>,
        y: CUdeviceptr,
        m: usize,
        ep: Epilogue,
    ) -> Result<(), CudaError> {
        let s = &self.gpu.compute;
        match (x, q) {
            (LinIn::Bf16(_), _) if lw.w == NULL => Err(CudaError::Invalid(
                "a bf16 block Linear whose bf16 weight was not staged (an fp8-resident DiT)".into(),
            )),
            (LinIn::Bf16(x), _) => self.gemm.linear(s, x, lw.w, lw.b, y, m, lw.out, lw.inp, ep),
            (LinIn::Fp8(codes, scales), Some(q)) => {
                let w = (q.codes, q.scales);
                let fused = self.gemm.linear_fp8(
                    s,
                    (codes, scales),
                    w,
                    lw.b,
                    y,
                    (m, lw.out, lw.inp),
                    ep,
                    self.arms.fp8_accum,
                )?;
                if !fused && ep == Epilogue::BiasGelu {
                    self.kernels.map(s, Map::GeluTanhBf16, y, y, m * lw.out)?;
                }
                Ok(())
            }
            (LinIn::Fp8(..), None) => Err(CudaError::Invalid(
                "an FP8 input to a Linear without an FP8 weight".into(),
            )),
        }
    }

    /// A whole forward from host data (for checks): latents f32 [n, 128], text
    /// f32 \[l, caption_channels\], mask \[l\]. With `poison` every workspace and
    /// output byte is NaN first. Returns the velocity f32 [n, 128] and the
    /// forward's device milliseconds (CUDA events around it).
    pub fn forward(
        &mut self,
        latents: &[f32],
        sigma: f32,
        text: &[f32],
        mask: &[f32],
        geo: Geometry,
        poison: bool,
    ) -> Result<(Vec<f32>, f64), CudaError> {
        let (mut v, ms) = self.forward_batch(latents, sigma, &[(text, mask)], geo, poison)?;
        Ok((v.swap_remove(0), ms))
    }

    /// [`DeviceDit::forward`] over one sample per text (`texts`: each a text
    /// f32 \[l, caption_channels\] and its mask \[l\]) in one forward
    /// ([`DeviceDit::enqueue_batch_at`]; two or more need `text-kv = cached`):
    /// every sample reads the same latents. With `poison` every workspace and
    /// output byte is NaN first. Returns each sample's velocity f32 [n, 128]
    /// and the forward's device milliseconds.
    pub fn forward_batch(
        &mut self,
        latents: &[f32],
        sigma: f32,
        texts: &[(&[f32], &[f32])],
        geo: Geometry,
        poison: bool,
    ) -> Result<(Vec<Vec<f32>>, f64), CudaError> {
        let n = geo.grid.0 * geo.grid.1 * geo.grid.2;
        if latents.len() != n * LATENT_CHANNELS {
            return Err(CudaError::Invalid(format!(
                "latents of {} values for grid {:?} ({n} tokens x {LATENT_CHANNELS})",
                latents.len(),
                geo.grid
            )));
        }
        let mut slots = texts
            .iter()
            .map(|(text, mask)| TextSlot::upload(&self.gpu, &self.dims, text, mask))
            .collect::<Result<Vec<_>, _>>()?;
        let l = texts.iter().map(|(_, m)| m.len()).max().unwrap_or(0);
        let (gpu, b) = (self.gpu.clone(), texts.len());
        let ws = self.workspace_for(n, l, b)?;
        let bytes = (1 + b) * n * LATENT_CHANNELS * 4;
        let io = DeviceBuffer::alloc(&gpu, bytes, "forward latents")?;
        if poison {
            ws.poison(&gpu)?;
            io.fill_bytes(&self.gpu, 0xFF, &self.gpu.compute)?;
        }
        // Their keys and values under `text-kv = cached` (each cache is
        // poisoned before it is written).
        for slot in &mut slots {
            self.prepare_text(slot)?;
        }
        let (lat, out) = (io.ptr(), io.ptr() + (n * LATENT_CHANNELS * 4) as u64);
        upload(&self.gpu, lat, latents)?;
        let refs: Vec<&TextSlot> = slots.iter().collect();
        let timer = Timer::new(&self.gpu)?;
        timer.start(&self.gpu.compute)?;
        self.enqueue_batch_at(lat, Timestep::Sigma(sigma), geo, &refs, out)?;
        timer.stop(&self.gpu.compute)?;
        let ms = timer.elapsed_ms()?;
        let v = download::<f32>(&self.gpu, out, b * n * LATENT_CHANNELS)?;
        let per = n * LATENT_CHANNELS;
        Ok((v.chunks(per).map(<[f32]>::to_vec).collect(), ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::spec::param_count;

    #[test]
    fn specs_count_the_published_parameters() {
        assert_eq!(param_count(&DitDims::LTXV_2B.tensor_specs()), 1_923_385_472);
        assert_eq!(
            param_count(&DitDims::LTXV_13B.tensor_specs()),
            13_042_569_344
        );
    }

    #[test]
    fn dims_reproduce_every_presets_layout() {
        for name in crate::presets::preset_names() {
            let p = crate::presets::preset(name).unwrap();
            let dims = DitDims::from_config(&p.dit).unwrap();
            let mut mine = dims.tensor_specs();
            let mut theirs = crate::models::dit::tensor_specs(&p.dit);
            mine.sort_by(|a, b| a.name.cmp(&b.name));
            theirs.sort_by(|a, b| a.name.cmp(&b.name));
            assert_eq!(mine, theirs, "{name}");
        }
        assert_eq!(
            DitDims::from_config(&crate::presets::dit_2b()).unwrap(),
            DitDims::LTXV_2B
        );
        assert_eq!(
            DitDims::from_config(&crate::presets::dit_13b()).unwrap(),
            DitDims::LTXV_13B
        );
    }

    #[test]
    fn flops_match_the_architecture_note() {
        // The hand count of reports/device-notes.md ("The two numbers"): 2B at
        // 6144 tokens: linear 20.2 T, self-attn 8.66 T.
        let (lin, sa, _) = DitDims::LTXV_2B.forward_flops(6144, 128);
        assert!((lin / 1e12 - 20.2).abs() < 0.1, "{lin}");
        assert!((sa / 1e12 - 8.66).abs() < 0.05, "{sa}");
    }

    #[test]
    fn config_round_trips_and_unsupported_configs_are_refused() {
        for d in [DitDims::LTXV_2B, DitDims::LTXV_13B.with_layers(1)] {
            assert_eq!(DitDims::from_config(&d.config()).unwrap(), d);
        }
        let mut c = crate::presets::dit_2b();
        c.norm_eps = 1e-5;
        let e = DitDims::from_config(&c).unwrap_err().to_string();
        assert!(e.contains("norm_eps"), "{e}");
        let mut c = crate::presets::dit_2b();
        c.patch_size = 2;
        assert!(DitDims::from_config(&c).is_err());
    }

    /// Red on: a Linear left out of the count, or the e4m3 copy counted at two
    /// bytes an element (the 13B model's copy is half its 26 GB of bf16 blocks).
    #[test]
    fn fp8_bytes_count_every_block_linear_at_a_byte_an_element() {
        let d13 = DitDims::LTXV_13B;
        let per_block = 16 * d13.dim() * d13.dim();
        let got = DeviceDit::fp8_bytes_for(&d13, 0, 0);
        let codes = d13.layers * per_block;
        let scales = d13.layers * (8 * d13.dim() + 4 * d13.dim() + d13.dim()) * 4;
        assert!(got >= codes + scales, "{got} < {}", codes + scales);
        assert!(got <= codes + scales + d13.layers * 10 * 2 * 256, "{got}");
        let blocks_bf16: usize = d13
            .tensor_specs()
            .iter()
            .filter(|t| t.name.starts_with("transformer_blocks.") && t.shape.len() == 2)
            .filter(|t| t.name.contains(".to_") || t.name.contains(".ff."))
            .map(|t| t.nbytes())
            .sum();
        assert_eq!(2 * codes, blocks_bf16);
        let n = 6144;
        let l = 128;
        assert_eq!(
            DeviceDit::fp8_bytes_for(&d13, n, l) - got,
            crate::cuda::kit::memory::align_up(n * 4 * d13.dim())
                + crate::cuda::kit::memory::align_up(n * 4)
                + crate::cuda::kit::memory::align_up(l * d13.dim())
                + crate::cuda::kit::memory::align_up(l * 4)
        );
    }

    /// An odd model: 5 heads of 48 (width 240), 3 blocks.
    fn odd() -> DitDims {
        DitDims {
            layers: 3,
            heads: 5,
            head_dim: 48,
            caption_channels: 96,
        }
    }

    /// Red on: a bias, a norm or a table listed as a block weight, a Linear
    /// left out, the feed-forward's shapes swapped, keys out of slot order.
    #[test]
    fn block_linear_weights_are_the_blocks_ten_linears_in_slot_order() {
        let dims = odd();
        let w = dims.block_linear_weights();
        assert_eq!(w.len(), 30);
        let first: Vec<(&str, usize, usize)> = w[..10]
            .iter()
            .map(|(n, o, i)| (n.as_str(), *o, *i))
            .collect();
        assert_eq!(
            first,
            [
                ("transformer_blocks.0.attn1.to_q.weight", 240, 240),
                ("transformer_blocks.0.attn1.to_k.weight", 240, 240),
                ("transformer_blocks.0.attn1.to_v.weight", 240, 240),
                ("transformer_blocks.0.attn1.to_out.0.weight", 240, 240),
                ("transformer_blocks.0.attn2.to_q.weight", 240, 240),
                ("transformer_blocks.0.attn2.to_k.weight", 240, 240),
                ("transformer_blocks.0.attn2.to_v.weight", 240, 240),
                ("transformer_blocks.0.attn2.to_out.0.weight", 240, 240),
                ("transformer_blocks.0.ff.net.0.proj.weight", 960, 240),
                ("transformer_blocks.0.ff.net.2.weight", 240, 960),
            ]
        );
        assert_eq!(w[29].0, "transformer_blocks.2.ff.net.2.weight");
        assert_eq!(w[20].0, "transformer_blocks.2.attn1.to_q.weight");
        // The slots the forward reads each Linear's e4m3 copy from.
        for (i, key) in [
            (slot::SELF_Q, "attn1.to_q"),
            (slot::SELF_K, "attn1.to_k"),
            (slot::SELF_V, "attn1.to_v"),
            (slot::SELF_OUT, "attn1.to_out.0"),
            (slot::CROSS_Q, "attn2.to_q"),
            (slot::CROSS_K, "attn2.to_k"),
            (slot::CROSS_V, "attn2.to_v"),
            (slot::CROSS_OUT, "attn2.to_out.0"),
            (slot::FF_UP, "ff.net.0.proj"),
            (slot::FF_DOWN, "ff.net.2"),
        ] {
            assert_eq!(BLOCK_LINEAR_KEYS[i], key);
        }
        // Exactly the checkpoint's 2-D block Linear weights, at their shapes.
        let specs = dims.tensor_specs();
        let mut theirs: Vec<(String, Vec<usize>)> = specs
            .iter()
            .filter(|t| t.name.starts_with("transformer_blocks.") && t.shape.len() == 2)
            .filter(|t| !t.name.ends_with("scale_shift_table"))
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        let mut mine: Vec<(String, Vec<usize>)> = w
            .iter()
            .map(|(n, o, i)| (n.clone(), vec![*o, *i]))
            .collect();
        theirs.sort();
        mine.sort();
        assert_eq!(mine, theirs);
        let bytes: usize = w.iter().map(|(_, o, i)| o * i * 2).sum();
        assert_eq!(bytes, 3 * 16 * 240 * 240 * 2);
    }

    fn extents(specs: &[TensorSpec]) -> Vec<Extent> {
        let mut off = 0u64;
        specs
            .iter()
            .map(|t| {
                let e = Extent {
                    name: t.name.clone(),
                    file: std::path::PathBuf::from("odd.safetensors"),
                    dtype: DType::BF16,
                    shape: t.shape.clone(),
                    offset: off,
                    bytes: t.nbytes(),
                };
                off += t.nbytes() as u64;
                e
            })
            .collect()
    }

    /// Red on: a block weight not flagged (it would stay resident in bf16), a
    /// bias flagged, a missing, misshapen or non-bf16 weight let through.
    #[test]
    fn transient_flags_mark_exactly_the_block_weights_and_refuse_bad_ones() {
        let dims = odd();
        let want = dims.block_linear_weights();
        let ext = extents(&dims.tensor_specs());
        let flags = transient_flags(&ext, &want).unwrap();
        let flagged: Vec<&str> = ext
            .iter()
            .zip(&flags)
            .filter(|(_, f)| **f)
            .map(|(e, _)| e.name.as_str())
            .collect();
        assert_eq!(flagged.len(), 30);
        let mut names: Vec<&str> = want.iter().map(|(n, _, _)| n.as_str()).collect();
        names.sort();
        let mut got = flagged.clone();
        got.sort();
        assert_eq!(got, names);
        let moved: usize = ext
            .iter()
            .zip(&flags)
            .filter(|(_, f)| **f)
            .map(|(e, _)| e.bytes)
            .sum();
        let all: usize = ext.iter().map(|e| e.bytes).sum();
        assert_eq!(moved, 3 * 16 * 240 * 240 * 2);
        assert!(all - moved > 0 && flagged.iter().all(|n| n.ends_with(".weight")));
        let name = "transformer_blocks.1.ff.net.0.proj.weight";
        let at = ext.iter().position(|e| e.name == name).unwrap();
        let mut gone = ext.clone();
        gone.remove(at);
        let e = transient_flags(&gone, &want).unwrap_err().to_string();
        assert!(e.contains(name), "{e}");
        let mut bent = ext.clone();
        bent[at].shape = vec![240, 960];
        let e = transient_flags(&bent, &want).unwrap_err();
        assert!(
            matches!(e, CudaError::Weights(WeightError::Shape { .. })),
            "{e}"
        );
        let mut f32s = ext.clone();
        f32s[at].dtype = DType::F32;
        let e = transient_flags(&f32s, &want).unwrap_err();
        assert!(
            matches!(e, CudaError::Weights(WeightError::DType { .. })),
            "{e}"
        );
    }

    /// Red on: the bounce sized to all the block weights (24 GiB at 13B) or
    /// below one Linear.
    #[test]
    fn the_fp8_bounce_is_bounded_by_a_gib_or_the_whole_model() {
        assert_eq!(DeviceDit::fp8_bounce_bytes_for(&DitDims::LTXV_13B), 1 << 30);
        assert_eq!(DeviceDit::fp8_bounce_bytes_for(&DitDims::LTXV_2B), 1 << 30);
        // Smaller than the bound: all of it (aligned), 3 x 16 x 240² x 2.
        assert_eq!(
            DeviceDit::fp8_bounce_bytes_for(&odd()),
            3 * 16 * 240 * 240 * 2
        );
        // One 13B block's Linears are 512 MiB: two blocks a window.
        let block: usize = DitDims::LTXV_13B.block_linear_weights()[..10]
            .iter()
            .map(|(_, o, i)| o * i * 2)
            .sum();
        assert_eq!(block, 512 << 20);
        // Codes are multiples of 256 here; the scales are not: nine rows of
        // 240 (960 bytes, aligned to 1024) and the up projection's 960 rows
        // (3840 bytes, already aligned).
        assert_eq!(
            DeviceDit::fp8_weight_bytes_for(&odd()),
            3 * (16 * 240 * 240 + 9 * 1024 + 3840)
        );
    }

    #[test]
    fn workspace_pieces_are_all_counted() {
        let dims = DitDims::LTXV_2B;
        let b = Workspace::bytes_for(&dims, 6144, 128, 1);
        // Dominated by x (f32) + 6 bf16 [n, D] + ff [n, 4D].
        let min = 6144 * 2048 * (4 + 6 * 2 + 8);
        assert!(b > min && b < min + (64 << 20), "{b}");
        // Two samples (lever `guidance-batch`): every per-token buffer but the
        // latents' bf16 copy twice (both samples read the same latents); the
        // text's and the timestep's once (red on: a piece left at one sample,
        // or the latents' copy or the text doubled).
        let b2 = Workspace::bytes_for(&dims, 6144, 128, 2);
        let per_token = 2048 * (4 + 6 * 2 + 8) + 128 * 2;
        assert_eq!(b2 - b, 6144 * per_token);
        assert_eq!(Workspace::bytes_for(&dims, 6144, 128, 0), b);
    }

    #[test]
    fn cross_attention_reads_only_the_real_prefix_of_a_padded_mask() {
        let m = |ones: usize, zeros: usize| {
            let mut v = vec![1.0f32; ones];
            v.resize(ones + zeros, 0.0);
            v
        };
        assert_eq!(attended_tokens(&m(20, 108)), 20);
        assert_eq!(attended_tokens(&m(1, 127)), 1);
        assert_eq!(attended_tokens(&m(128, 0)), 128);
        // No real token: every key weighs the same, so none may be dropped.
        assert_eq!(attended_tokens(&m(0, 128)), 128);
        // Padding between real tokens, or a value other than 0 and 1: kept whole.
        let mut holes = m(20, 108);
        holes[40] = 1.0;
        assert_eq!(attended_tokens(&holes), 128);
        let mut soft = m(20, 108);
        soft[5] = 0.5;
        assert_eq!(attended_tokens(&soft), 128);
        let mut soft_pad = m(20, 108);
        soft_pad[90] = 1e-3;
        assert_eq!(attended_tokens(&soft_pad), 128);
    }
}
