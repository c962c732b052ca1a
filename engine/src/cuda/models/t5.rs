//! The T5 v1.1 text encoder forward on the device (lever `conditioning = device`).
//!
//! The same model as the host arm ([`crate::models::t5::T5Encoder`]): token
//! embedding; per block an RMS norm (T5's: no mean, no bias, a weight), self-
//! attention with the relative-position bias of block 0's table shared by every
//! block and no 1/sqrt(d) scaling, a residual add, an RMS norm, the gated-GELU
//! feed-forward (`gelu_tanh(h wi_0ᵀ) * h wi_1ᵀ`, then `wo`), a residual add; a
//! final RMS norm. Padded keys are ignored; padded rows are computed as the
//! reference computes them.
//!
//! Precision: weights stay bf16 where staging put them; every GEMM has bf16
//! operands with fp32 accumulation (cuBLASLt); norms, softmax and the gated
//! GELU compute in f32 and round their outputs to bf16 once. The residual
//! stream is f32: T5's residual grows large over the blocks (real T5 v1.1
//! checkpoints overflow fp16's 65504 there, which is why fp16 T5 needs
//! clamping), and bf16 has f32's range, so it would not overflow, but with 8
//! mantissa bits a block's update smaller than 2⁻⁹ of the running value would
//! be lost when added; the f32 stream keeps it, as the host arm does. The
//! output is the final norm in f32 `[L, d_model]` per prompt, the host arm's
//! layout, so the DiT arms consume it unchanged.
//!
//! Several prompts of one length run as one batch: the GEMMs see `B * L` rows
//! (the weights are read once for all prompts), attention runs per prompt.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;

use crate::arms::TextEncoder;
use crate::conditioning::{tokenize, ConditioningError, Encoded, KeyRule};
use crate::cuda::kit::context::{Gpu, Timer};
use crate::cuda::kit::gemm::{Epilogue, Gemm};
use crate::cuda::kit::kernels::{Kernels, Params, NULL};
use crate::cuda::kit::memory::{align_up, download, upload, Arena, MemTracker};
use crate::cuda::kit::DeviceKit;
use crate::cuda::staging::{self, DeviceWeights, OpenReport, StagingOptions};
use crate::cuda::CudaError;
use crate::models::t5::{tensor_specs, Keys, T5Config, EMBED_ALIAS};
use crate::ops::t5::relative_position_bucket;
use crate::tensor::Tensor;
use crate::text::tokenizer::PromptTokenizer;
use crate::weights::safetensors::Extent;

/// Head dims the attention kernel is built for (the tiny preset's 16, T5-XXL's 64).
pub const ATTN_HEAD_DIMS: [usize; 2] = [16, 64];
/// Query rows per attention block (4 warps of 4 queries).
const ATTN_QUERIES: usize = 16;
/// Threads per attention block.
const ATTN_THREADS: u32 = 128;
/// Longest prompt the device encoder accepts, tokens (the brief's bound; the
/// kernels themselves only need `2L - 1` buckets).
pub const MAX_TOKENS: usize = 512;

/// Parts of the forward a check may switch off to show that it turns red.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ablation {
    /// Run attention without the relative-position bias.
    pub drop_position_bias: bool,
    /// Run attention with every key live (the padding mask ignored).
    pub drop_mask: bool,
}

/// `x = f32(table[ids])`: ids int32 \[rows\], table bf16 \[vocab, d\], x f32 \[rows, d\].
pub fn embed(
    k: &Kernels,
    s: &CudaStream,
    ids: CUdeviceptr,
    table: CUdeviceptr,
    x: CUdeviceptr,
    rows: usize,
    d: usize,
) -> Result<(), CudaError> {
    let p = Params::default().ptr(ids).ptr(table).ptr(x).int(d);
    k.launch_rows("t5_embed", rows, 0, s, p)
}

/// Per row of `x` (f32 [rows, d]): `x += y` when `y` (bf16) is given, then
/// `n = rms_norm(x) * w` (w bf16 \[d\]) written as bf16 to `h` and/or as f32 to
/// `out` (either may be [`NULL`]; `out` must not alias `x`).
#[allow(clippy::too_many_arguments)]
pub fn add_rms(
    k: &Kernels,
    s: &CudaStream,
    x: CUdeviceptr,
    y: CUdeviceptr,
    w: CUdeviceptr,
    rows: usize,
    d: usize,
    eps: f32,
    h: CUdeviceptr,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    if d * 4 > 48 * 1024 {
        return Err(CudaError::Invalid(format!(
            "t5_add_rms: width {d} exceeds the 12288 a row in shared memory allows"
        )));
    }
    let p = Params::default()
        .ptr(x)
        .ptr(y)
        .ptr(w)
        .int(d)
        .f32(eps)
        .ptr(h)
        .ptr(out);
    k.launch_rows("t5_add_rms", rows, (d * 4) as u32, s, p)
}

/// `g = bf16(gelu_tanh(a) * b)` over n bf16 elements (`g` may be `a`).
pub fn gated_gelu(
    k: &Kernels,
    s: &CudaStream,
    a: CUdeviceptr,
    b: CUdeviceptr,
    g: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let p = Params::default().ptr(a).ptr(b).ptr(g).n(n);
    k.launch_ew("t5_gated_gelu", n, s, p)
}

/// Where one attention call reads and writes: bf16 [batch * l, ld] matrices,
/// prompt `b` at rows `b * l..`, head `h` at columns `h * hd..`.
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs {
    /// Queries.
    pub q: CUdeviceptr,
    /// Keys.
    pub k: CUdeviceptr,
    /// Values.
    pub v: CUdeviceptr,
    /// Output.
    pub o: CUdeviceptr,
    /// Leading dimension of all four, elements (heads * hd or more).
    pub ld: usize,
    /// Prompts.
    pub batch: usize,
    /// Tokens per prompt.
    pub l: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head (one of [`ATTN_HEAD_DIMS`]).
    pub hd: usize,
    /// bf16 [buckets, heads], or [`NULL`] for no position bias.
    pub table: CUdeviceptr,
    /// int32 [2l - 1]: the bucket of relative position `j - i` at `j - i + l - 1`.
    pub bucket: CUdeviceptr,
    /// f32 [batch, l] (> 0.5: a real key), or [`NULL`] for no mask.
    pub mask: CUdeviceptr,
}

/// T5 self-attention (see `t5_attn` in `kernels/t5.cu`): no scaling, the
/// position bias gathered from the table by bucket, padded keys ignored.
pub fn attention(k: &Kernels, s: &CudaStream, a: &AttnArgs) -> Result<(), CudaError> {
    if !ATTN_HEAD_DIMS.contains(&a.hd) {
        return Err(CudaError::Invalid(format!(
            "T5 attention head dim {}: the kernel is built for {ATTN_HEAD_DIMS:?}",
            a.hd
        )));
    }
    if a.l == 0 || a.batch == 0 || a.ld < a.heads * a.hd {
        return Err(CudaError::Invalid(format!(
            "T5 attention over {} prompts of {} tokens with ld {} < {} heads x {}",
            a.batch, a.l, a.ld, a.heads, a.hd
        )));
    }
    if a.table != NULL && a.bucket == NULL {
        return Err(CudaError::Invalid(
            "T5 attention: a position-bias table without buckets".into(),
        ));
    }
    let p = Params::default()
        .ptr(a.q)
        .ptr(a.k)
        .ptr(a.v)
        .ptr(a.o)
        .int(a.l)
        .int(a.ld)
        .int(a.heads)
        .ptr(a.table)
        .ptr(a.bucket)
        .ptr(a.mask);
    let grid = (
        a.l.div_ceil(ATTN_QUERIES) as u32,
        a.heads as u32,
        a.batch as u32,
    );
    k.launch(&format!("t5_attn_hd{}", a.hd), grid, ATTN_THREADS, 0, s, p)
}

/// The bucket of every relative position `j - i` of an `l`-token prompt, at
/// index `j - i + l - 1` (what the attention kernel gathers the bias with).
pub fn buckets(cfg: &T5Config, l: usize) -> Vec<i32> {
    (0..(2 * l).saturating_sub(1))
        .map(|i| {
            relative_position_bucket(
                i as i64 - (l as i64 - 1),
                true,
                cfg.relative_attention_num_buckets,
                cfg.relative_attention_max_distance,
            ) as i32
        })
        .collect()
}

/// The tensors of a T5 checkpoint the device encoder stages: those of
/// [`tensor_specs`], and the embedding under [`EMBED_ALIAS`] only where
/// `shared.weight` is absent (a tied copy is not staged twice).
pub fn select_extents(tensors: &[Extent], cfg: &T5Config) -> Vec<Extent> {
    let names: HashSet<String> = tensor_specs(cfg).into_iter().map(|s| s.name).collect();
    let has_shared = tensors.iter().any(|t| t.name == "shared.weight");
    tensors
        .iter()
        .filter(|t| names.contains(&t.name) || (!has_shared && t.name == EMBED_ALIAS))
        .cloned()
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct BlockW {
    ln_attn: CUdeviceptr,
    q: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    o: CUdeviceptr,
    ln_ff: CUdeviceptr,
    wi_0: CUdeviceptr,
    wi_1: CUdeviceptr,
    wo: CUdeviceptr,
}

struct T5W {
    embed: CUdeviceptr,
    rel: CUdeviceptr,
    blocks: Vec<BlockW>,
    final_norm: CUdeviceptr,
}

fn resolve(w: &DeviceWeights, cfg: &T5Config) -> Result<T5W, CudaError> {
    let (d, inner, ff) = (cfg.d_model, cfg.inner_dim(), cfg.d_ff);
    let embed_name = if w.names().any(|n| n == "shared.weight") {
        "shared.weight"
    } else {
        EMBED_ALIAS
    };
    let embed = w.get(embed_name, &[cfg.vocab_size, d])?.ptr;
    let mut blocks = Vec::with_capacity(cfg.num_layers);
    let mut rel = NULL;
    for i in 0..cfg.num_layers {
        let b = format!("encoder.block.{i}.layer");
        let g = |n: &str, shape: &[usize]| -> Result<CUdeviceptr, CudaError> {
            Ok(w.get(&format!("{b}.{n}.weight"), shape)?.ptr)
        };
        if i == 0 {
            rel = g(
                "0.SelfAttention.relative_attention_bias",
                &[cfg.relative_attention_num_buckets, cfg.num_heads],
            )?;
        }
        blocks.push(BlockW {
            ln_attn: g("0.layer_norm", &[d])?,
            q: g("0.SelfAttention.q", &[inner, d])?,
            k: g("0.SelfAttention.k", &[inner, d])?,
            v: g("0.SelfAttention.v", &[inner, d])?,
            o: g("0.SelfAttention.o", &[d, inner])?,
            ln_ff: g("1.layer_norm", &[d])?,
            wi_0: g("1.DenseReluDense.wi_0", &[ff, d])?,
            wi_1: g("1.DenseReluDense.wi_1", &[ff, d])?,
            wo: g("1.DenseReluDense.wo", &[d, ff])?,
        });
    }
    Ok(T5W {
        embed,
        rel,
        blocks,
        final_norm: w.get("encoder.final_layer_norm.weight", &[d])?.ptr,
    })
}

/// Activation buffers of one (prompts, tokens).
pub struct Workspace {
    arena: Arena,
    /// Prompts.
    pub batch: usize,
    /// Tokens per prompt.
    pub l: usize,
    x: CUdeviceptr,
    h: CUdeviceptr,
    q: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    ao: CUdeviceptr,
    y: CUdeviceptr,
    a: CUdeviceptr,
    b: CUdeviceptr,
    ids: CUdeviceptr,
    mask: CUdeviceptr,
    bucket: CUdeviceptr,
    out: CUdeviceptr,
}

impl Workspace {
    fn pieces(cfg: &T5Config, batch: usize, l: usize) -> [usize; 13] {
        let rows = batch * l;
        let (d, inner, ff) = (cfg.d_model, cfg.inner_dim(), cfg.d_ff);
        [
            rows * d * 4,                  // x: the residual stream
            rows * d * 2,                  // h: normed input of a GEMM
            rows * inner * 2,              // q
            rows * inner * 2,              // k
            rows * inner * 2,              // v
            rows * inner * 2,              // ao: attention output
            rows * d * 2,                  // y: a sub-block's output
            rows * ff * 2,                 // a: wi_0, then the gated product
            rows * ff * 2,                 // b: wi_1
            rows * 4,                      // ids
            rows * 4,                      // mask
            (2 * l).saturating_sub(1) * 4, // bucket
            rows * d * 4,                  // out: the final norm, f32
        ]
    }

    /// Device bytes of a workspace for `batch` prompts of `l` tokens.
    pub fn bytes_for(cfg: &T5Config, batch: usize, l: usize) -> usize {
        Self::pieces(cfg, batch, l)
            .iter()
            .map(|b| align_up(*b))
            .sum()
    }

    /// Allocate a workspace for `batch` prompts of `l` tokens.
    pub fn new(gpu: &Gpu, cfg: &T5Config, batch: usize, l: usize) -> Result<Workspace, CudaError> {
        let sizes = Self::pieces(cfg, batch, l);
        let mut arena = Arena::new(
            gpu,
            Self::bytes_for(cfg, batch, l),
            "the T5 encoder's workspace",
        )?;
        let mut p = [0 as CUdeviceptr; 13];
        for (ptr, size) in p.iter_mut().zip(sizes) {
            *ptr = arena.take(size)?;
        }
        let [x, h, q, k, v, ao, y, a, b, ids, mask, bucket, out] = p;
        Ok(Workspace {
            arena,
            batch,
            l,
            x,
            h,
            q,
            k,
            v,
            ao,
            y,
            a,
            b,
            ids,
            mask,
            bucket,
            out,
        })
    }
}

/// The T5 encoder on the device: resolved weights, kernels, GEMMs, a workspace.
pub struct DeviceT5 {
    ws: Option<Workspace>,
    w: T5W,
    weights: DeviceWeights,
    cfg: T5Config,
    /// What the forward leaves out (only checks set this).
    pub ablation: Ablation,
    gemm: Arc<Gemm>,
    kernels: Arc<Kernels>,
    gpu: Arc<Gpu>,
}

/// Open GPU 0, stage the encoder's tensors (the extents of the validated
/// checkpoint, possibly over several shards: [`select_extents`] picks what is
/// staged) with `staging` and bind them.
pub fn open_device_t5(
    tensors: &[Extent],
    cfg: &T5Config,
    staging: &StagingOptions,
) -> Result<(DeviceT5, OpenReport), CudaError> {
    let t0 = Instant::now();
    let kit = DeviceKit::open()?;
    let device_open_s = t0.elapsed().as_secs_f64();
    let keep = select_extents(tensors, cfg);
    let (w, report) = staging::stage(&kit.gpu, &keep, staging)?;
    let t5 = DeviceT5::new(&kit, cfg, w)?;
    Ok((
        t5,
        OpenReport {
            device_open_s,
            opened: kit.opened,
            staging: report,
        },
    ))
}

impl DeviceT5 {
    /// Bind `weights` (every tensor present, bf16, of the expected shape) on
    /// the kit's device.
    pub fn new(
        kit: &DeviceKit,
        cfg: &T5Config,
        weights: DeviceWeights,
    ) -> Result<DeviceT5, CudaError> {
        cfg.validate()
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        if !ATTN_HEAD_DIMS.contains(&cfg.d_kv) {
            return Err(CudaError::Invalid(format!(
                "the device T5 has attention for head dims {ATTN_HEAD_DIMS:?}, not d_kv = {}",
                cfg.d_kv
            )));
        }
        if cfg.d_model % 8 != 0 || cfg.inner_dim() % 8 != 0 || cfg.d_ff % 8 != 0 {
            return Err(CudaError::Invalid(format!(
                "the device T5 needs widths that are multiples of 8 (d_model {}, heads x d_kv {}, d_ff {})",
                cfg.d_model,
                cfg.inner_dim(),
                cfg.d_ff
            )));
        }
        let w = resolve(&weights, cfg)?;
        Ok(DeviceT5 {
            ws: None,
            w,
            weights,
            cfg: cfg.clone(),
            ablation: Ablation::default(),
            gemm: kit.gemm.clone(),
            kernels: kit.kernels.clone(),
            gpu: kit.gpu.clone(),
        })
    }

    /// The device allocator's tracker (for `peak_device_bytes`).
    pub fn mem(&self) -> Arc<MemTracker> {
        self.gpu.mem.clone()
    }

    /// The staged weights.
    pub fn weights(&self) -> &DeviceWeights {
        &self.weights
    }

    /// The GPU the encoder lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn workspace(&mut self, batch: usize, l: usize) -> Result<&Workspace, CudaError> {
        let fits = matches!(&self.ws, Some(w) if w.batch == batch && w.l == l);
        if !fits {
            self.ws = None;
            self.ws = Some(Workspace::new(&self.gpu, &self.cfg, batch, l)?);
        }
        self.ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("T5 workspace missing".into()))
    }

    /// One forward over placeholder prompts (`batch` of `l` tokens of id 1,
    /// all real): allocates the workspace and does the one-time host work of
    /// the first launches (cuBLASLt algorithm choice, lazy kernel loading)
    /// outside the forwards that events time. Returns its device milliseconds.
    pub fn warm_up(&mut self, batch: usize, l: usize) -> Result<f64, CudaError> {
        let ids = vec![1u32.min(self.cfg.vocab_size as u32 - 1); l];
        let prompts: Vec<(&[u32], Keys)> = (0..batch.max(1))
            .map(|_| (ids.as_slice(), Keys::All))
            .collect();
        Ok(self.encode(&prompts, false)?.1)
    }

    /// Check one prompt as the host arm does: ids inside the vocabulary, and
    /// with a mask one value per token and at least one real token.
    fn check_prompt(&self, i: usize, ids: &[u32], keys: Keys<'_>) -> Result<(), CudaError> {
        let bad = |m: String| Err(CudaError::Invalid(format!("T5 prompt {i}: {m}")));
        if ids.is_empty() || ids.len() > MAX_TOKENS {
            return bad(format!("{} tokens (1..={MAX_TOKENS} accepted)", ids.len()));
        }
        if let Keys::Masked(mask) = keys {
            if mask.len() != ids.len() {
                return bad(format!(
                    "{} mask values for {} tokens",
                    mask.len(),
                    ids.len()
                ));
            }
            if mask.iter().all(|m| *m <= 0.5) {
                return bad("the mask masks every token".into());
            }
        }
        if let Some((j, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= self.cfg.vocab_size)
        {
            return bad(format!(
                "token {j} has id {id}, past the vocabulary of {}",
                self.cfg.vocab_size
            ));
        }
        Ok(())
    }

    /// Encode `prompts` (token ids, one length for all, and the keys each
    /// attends to) as one batch: the final hidden states f32 `[L, d_model]`
    /// of each, and the forward's
    /// device milliseconds (CUDA events around it; the uploads before and the
    /// download after are outside). With `poison` the workspace and output are
    /// NaN bytes first, so an element the forward fails to write shows.
    pub fn encode(
        &mut self,
        prompts: &[(&[u32], Keys<'_>)],
        poison: bool,
    ) -> Result<(Vec<Tensor>, f64), CudaError> {
        let Some((first, _)) = prompts.first() else {
            return Err(CudaError::Invalid("T5: no prompt to encode".into()));
        };
        let l = first.len();
        for (i, (ids, keys)) in prompts.iter().enumerate() {
            self.check_prompt(i, ids, *keys)?;
            if ids.len() != l {
                return Err(CudaError::Invalid(format!(
                    "T5 prompt {i} has {} tokens, prompt 0 has {l}: one batch needs one length",
                    ids.len()
                )));
            }
        }
        let batch = prompts.len();
        let ids: Vec<i32> = prompts
            .iter()
            .flat_map(|(ids, _)| ids.iter().map(|v| *v as i32))
            .collect();
        // Every key live is a mask of ones (the kernel then adds no bias).
        let mask: Vec<f32> = prompts
            .iter()
            .flat_map(|(ids, keys)| match keys {
                Keys::All => vec![1.0; ids.len()],
                Keys::Masked(m) => m.to_vec(),
            })
            .collect();
        let bucket = buckets(&self.cfg, l);
        let gpu = self.gpu.clone();
        let ws = self.workspace(batch, l)?;
        if poison {
            ws.arena.buffer().fill_bytes(&gpu, 0xFF, &gpu.compute)?;
        }
        let (p_ids, p_mask, p_bucket, p_out) = (ws.ids, ws.mask, ws.bucket, ws.out);
        upload(&gpu, p_ids, &ids)?;
        upload(&gpu, p_mask, &mask)?;
        upload(&gpu, p_bucket, &bucket)?;
        let timer = Timer::new(&gpu)?;
        timer.start(&gpu.compute)?;
        self.enqueue_forward()?;
        timer.stop(&gpu.compute)?;
        let ms = timer.elapsed_ms()?;
        let d = self.cfg.d_model;
        let y = download::<f32>(&gpu, p_out, batch * l * d)?;
        let out = y
            .chunks(l * d)
            .map(|c| {
                Tensor::new(&[l, d], c.to_vec())
                    .map_err(|e| CudaError::Invalid(format!("T5 output: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((out, ms))
    }

    /// Enqueue one forward over the inputs already in the workspace (ids, mask,
    /// buckets) on the compute stream; the output lands in the workspace's `out`.
    pub fn enqueue_forward(&self) -> Result<(), CudaError> {
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("T5 forward before its workspace".into()))?;
        let (k, g, s) = (&*self.kernels, &*self.gemm, &self.gpu.compute);
        let cfg = &self.cfg;
        let (d, inner, ff) = (cfg.d_model, cfg.inner_dim(), cfg.d_ff);
        let (batch, l) = (ws.batch, ws.l);
        let rows = batch * l;
        let eps = cfg.layer_norm_epsilon as f32;
        let lin = |x: CUdeviceptr, w: CUdeviceptr, y: CUdeviceptr, n: usize, kk: usize| {
            g.linear(s, x, w, NULL, y, rows, n, kk, Epilogue::None)
        };
        let attn = AttnArgs {
            q: ws.q,
            k: ws.k,
            v: ws.v,
            o: ws.ao,
            ld: inner,
            batch,
            l,
            heads: cfg.num_heads,
            hd: cfg.d_kv,
            table: if self.ablation.drop_position_bias {
                NULL
            } else {
                self.w.rel
            },
            bucket: ws.bucket,
            mask: if self.ablation.drop_mask {
                NULL
            } else {
                ws.mask
            },
        };
        embed(k, s, ws.ids, self.w.embed, ws.x, rows, d)?;
        let blocks = &self.w.blocks;
        match blocks.first() {
            Some(b0) => add_rms(k, s, ws.x, NULL, b0.ln_attn, rows, d, eps, ws.h, NULL)?,
            None => add_rms(
                k,
                s,
                ws.x,
                NULL,
                self.w.final_norm,
                rows,
                d,
                eps,
                NULL,
                ws.out,
            )?,
        }
        for (i, b) in blocks.iter().enumerate() {
            lin(ws.h, b.q, ws.q, inner, d)?;
            lin(ws.h, b.k, ws.k, inner, d)?;
            lin(ws.h, b.v, ws.v, inner, d)?;
            attention(k, s, &attn)?;
            lin(ws.ao, b.o, ws.y, d, inner)?;
            add_rms(k, s, ws.x, ws.y, b.ln_ff, rows, d, eps, ws.h, NULL)?;
            lin(ws.h, b.wi_0, ws.a, ff, d)?;
            lin(ws.h, b.wi_1, ws.b, ff, d)?;
            gated_gelu(k, s, ws.a, ws.b, ws.a, rows * ff)?;
            lin(ws.a, b.wo, ws.y, d, ff)?;
            // The residual add fused with the next block's input norm, or the
            // final norm into the f32 output.
            match blocks.get(i + 1) {
                Some(nx) => add_rms(k, s, ws.x, ws.y, nx.ln_attn, rows, d, eps, ws.h, NULL)?,
                None => add_rms(
                    k,
                    s,
                    ws.x,
                    ws.y,
                    self.w.final_norm,
                    rows,
                    d,
                    eps,
                    NULL,
                    ws.out,
                )?,
            }
        }
        Ok(())
    }
}

/// Device bytes the encoder holds besides its staged weights once loaded: the
/// cuBLASLt workspace.
pub fn loaded_bytes() -> u64 {
    crate::cuda::kit::gemm::WORKSPACE_BYTES as u64
}

/// Device bytes a forward adds over `prompts` prompts of `l` tokens: its workspace.
pub fn run_bytes(cfg: &T5Config, prompts: usize, l: usize) -> u64 {
    Workspace::bytes_for(cfg, prompts, l) as u64
}

/// Encode `prompts` on the device with `rule`, as one batch (every prompt has
/// the tokenizer's fixed length). Returns them and the forward's device
/// milliseconds.
pub fn encode_device(
    t5: &mut DeviceT5,
    tok: &PromptTokenizer,
    prompts: &[&str],
    rule: KeyRule,
) -> Result<(Vec<Encoded>, f64), ConditioningError> {
    let toks = tokenize(tok, prompts)?;
    let mut out = Vec::with_capacity(toks.len());
    let mut ms = 0.0;
    // One batch per length (the tokenizer pads to one length, so one batch).
    let mut lengths: Vec<usize> = toks.iter().map(|t| t.ids.len()).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let mut states: Vec<Option<Tensor>> = vec![None; toks.len()];
    for l in lengths {
        let members: Vec<usize> = (0..toks.len())
            .filter(|i| toks[*i].ids.len() == l)
            .collect();
        let batch: Vec<(&[u32], Keys)> = members
            .iter()
            .map(|i| (toks[*i].ids.as_slice(), rule.keys(&toks[*i].mask)))
            .collect();
        let (ys, t) = t5
            .encode(&batch, false)
            .map_err(|e| ConditioningError::Device(e.into()))?;
        ms += t;
        for (i, y) in members.into_iter().zip(ys) {
            states[i] = Some(y);
        }
    }
    for (t, s) in toks.into_iter().zip(states) {
        let states = s.ok_or_else(|| {
            ConditioningError::Device(
                CudaError::Invalid(
                    "the device text encoder returned fewer states than prompts".into(),
                )
                .into(),
            )
        })?;
        out.push(Encoded {
            ids: t.ids,
            mask: t.mask,
            states,
            blocks: Vec::new(),
        });
    }
    Ok((out, ms))
}

impl TextEncoder for DeviceT5 {
    fn arm(&self) -> &'static str {
        "cuda"
    }

    fn encode(
        &mut self,
        tok: &PromptTokenizer,
        prompts: &[&str],
        rule: KeyRule,
    ) -> Result<(Vec<Encoded>, Option<f64>), ConditioningError> {
        let (e, ms) = encode_device(self, tok, prompts, rule)?;
        Ok((e, Some(ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::{t5_tiny, t5_xxl};
    use crate::weights::DType;

    fn extent(name: &str) -> Extent {
        Extent {
            name: name.into(),
            file: "f".into(),
            dtype: DType::BF16,
            shape: vec![1],
            offset: 0,
            bytes: 2,
        }
    }

    #[test]
    fn buckets_index_relative_positions_from_minus_l_plus_one() {
        let cfg = t5_xxl();
        let b = buckets(&cfg, 128);
        assert_eq!(b.len(), 255);
        // rel = 0 at index 127: bucket 0; rel = -1 -> 1; rel = +1 -> 17; the
        // extremes clamp to the last bucket of each half.
        assert_eq!((b[127], b[126], b[128]), (0, 1, 17));
        assert_eq!((b[0], b[254]), (15, 31));
        // The kernel's gather equals the host arm's [heads, L, L] bias.
        let heads = 3;
        let table: Vec<f32> = (0..32 * heads).map(|i| i as f32 * 0.5 - 7.0).collect();
        let l = 40;
        let b = buckets(&cfg, l);
        let pos = crate::ops::t5::position_bias(&table, heads, l, l, 32, 128);
        for h in 0..heads {
            for i in 0..l {
                for j in 0..l {
                    let g = table[b[j + l - 1 - i] as usize * heads + h];
                    assert_eq!(g, pos[(h * l + i) * l + j]);
                }
            }
        }
        assert_eq!(buckets(&cfg, 1), vec![0]);
    }

    #[test]
    fn staged_tensors_are_the_specs_and_the_alias_only_when_needed() {
        let cfg = t5_tiny();
        let specs = tensor_specs(&cfg);
        let mut all: Vec<Extent> = specs.iter().map(|s| extent(&s.name)).collect();
        all.push(extent(EMBED_ALIAS));
        all.push(extent("decoder.block.0.layer.0.layer_norm.weight"));
        let kept = select_extents(&all, &cfg);
        assert_eq!(kept.len(), specs.len());
        assert!(kept.iter().all(|e| e.name != EMBED_ALIAS));
        // Without shared.weight the alias is staged instead.
        let no_shared: Vec<Extent> = all
            .into_iter()
            .filter(|e| e.name != "shared.weight")
            .collect();
        let kept = select_extents(&no_shared, &cfg);
        assert_eq!(kept.len(), specs.len());
        assert!(kept.iter().any(|e| e.name == EMBED_ALIAS));
    }

    #[test]
    fn workspace_and_projection_bytes() {
        let cfg = t5_xxl();
        let one = run_bytes(&cfg, 1, 128);
        let two = run_bytes(&cfg, 2, 128);
        // x + out f32, h + y bf16 over d; q, k, v, ao over inner; a, b over d_ff.
        let per_row = (4 + 4 + 2 + 2) * 4096 + 4 * 2 * 4096 + 2 * 2 * 10240;
        assert!(one >= 128 * per_row as u64 && one < 128 * per_row as u64 + 13 * 256 + 2048);
        assert!(two - one >= 128 * per_row as u64);
        assert_eq!(loaded_bytes(), 32 << 20);
    }

    #[test]
    fn the_device_encoder_without_cuda_is_a_clean_error() {
        let r = std::panic::catch_unwind(|| {
            open_device_t5(
                &[],
                &t5_tiny(),
                &StagingOptions::new(staging::StagingMethod::Batched),
            )
            .map(|_| ())
        })
        .expect("must not panic");
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            let e = r.expect_err("no CUDA: must fail");
            assert!(e.to_string().starts_with("no CUDA here"), "{e}");
        }
    }

    #[test]
    fn the_kernel_module_declares_every_launched_entry_point() {
        let names = crate::cuda::kit::kernels::kernel_names(crate::cuda::kit::nvrtc::T5_CU);
        let mut want: Vec<String> = ["t5_embed", "t5_add_rms", "t5_gated_gelu"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        want.extend(ATTN_HEAD_DIMS.iter().map(|hd| format!("t5_attn_hd{hd}")));
        let (mut a, mut b) = (names.clone(), want);
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }
}
