//! The LTX-Video transformer (DiT) forward on the device, end to end.
//!
//! Weights stay where staging put them ([`DeviceWeights`], bf16); activations
//! live in one preallocated [`Workspace`] sized for (tokens, text length); the
//! residual stream is f32, every GEMM operand bf16 with fp32 accumulation. A
//! forward enqueues only kernels and GEMMs on the compute stream: inputs are
//! uploaded before it starts, the output downloaded after it ends, and the
//! timestep embedding is computed on the device (its scalar rides in the kernel
//! arguments), so nothing inside it waits for the host. Its device time comes
//! from CUDA events around it.
//!
//! Semantics follow `shared/docs/ltx-architecture.md` (diffusers
//! `LTXVideoTransformer3DModel`): names in [`DitDims::tensor_specs`] are the
//! checkpoint's.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;

use super::context::{Gpu, Timer};
use super::gemm::{Epilogue, Gemm};
use super::kernels::{AttnKernel, Kernels, RopeArgs, RowMode, NULL};
use super::memory::{align_up, upload, Arena, DeviceBuffer};
use super::staging::DeviceWeights;
use super::CudaError;
use crate::models::dit::DitConfig;
use crate::weights::{DType, TensorSpec};

/// Latent channels in and out of the DiT.
pub const LATENT_CHANNELS: usize = 128;
/// Width of the sinusoidal timestep embedding.
pub const TIMESTEP_DIM: usize = 256;
/// eps of the blocks' RMS norms and of the output LayerNorm.
pub const NORM_EPS: f32 = 1e-6;
/// eps of the q/k RMS norms.
pub const QK_EPS: f32 = 1e-5;
/// Additive attention bias of a masked text token.
pub const MASK_BIAS: f32 = -10000.0;

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
        {
            return Err(CudaError::Invalid(format!(
                "the device DiT needs in/out channels 128, 1x1x1 patches and cross_attention_dim = heads x head_dim; got {cfg:?}"
            )));
        }
        Ok(DitDims {
            layers: cfg.num_layers,
            heads: cfg.num_attention_heads,
            head_dim: cfg.attention_head_dim,
            caption_channels: cfg.caption_channels,
        })
    }

    /// Model width D = heads x head_dim.
    pub fn dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The same model with `layers` blocks (one block for the block check).
    pub fn with_layers(self, layers: usize) -> DitDims {
        DitDims { layers, ..self }
    }

    /// Every tensor, diffusers names, bf16.
    pub fn tensor_specs(&self) -> Vec<TensorSpec> {
        let d = self.dim();
        let bf = DType::BF16;
        let mut v = Vec::new();
        let lin = |v: &mut Vec<TensorSpec>, name: &str, out: usize, inp: usize| {
            v.push(TensorSpec::new(format!("{name}.weight"), &[out, inp], bf));
            v.push(TensorSpec::new(format!("{name}.bias"), &[out], bf));
        };
        lin(&mut v, "proj_in", d, LATENT_CHANNELS);
        v.push(TensorSpec::new("scale_shift_table", &[2, d], bf));
        lin(
            &mut v,
            "time_embed.emb.timestep_embedder.linear_1",
            d,
            TIMESTEP_DIM,
        );
        lin(&mut v, "time_embed.emb.timestep_embedder.linear_2", d, d);
        lin(&mut v, "time_embed.linear", 6 * d, d);
        lin(
            &mut v,
            "caption_projection.linear_1",
            d,
            self.caption_channels,
        );
        lin(&mut v, "caption_projection.linear_2", d, d);
        for i in 0..self.layers {
            let b = format!("transformer_blocks.{i}");
            v.push(TensorSpec::new(
                format!("{b}.scale_shift_table"),
                &[6, d],
                bf,
            ));
            for a in ["attn1", "attn2"] {
                v.push(TensorSpec::new(format!("{b}.{a}.norm_q.weight"), &[d], bf));
                v.push(TensorSpec::new(format!("{b}.{a}.norm_k.weight"), &[d], bf));
                for p in ["to_q", "to_k", "to_v", "to_out.0"] {
                    lin(&mut v, &format!("{b}.{a}.{p}"), d, d);
                }
            }
            lin(&mut v, &format!("{b}.ff.net.0.proj"), 4 * d, d);
            lin(&mut v, &format!("{b}.ff.net.2"), d, 4 * d);
        }
        lin(&mut v, "proj_out", LATENT_CHANNELS, d);
        v
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

#[derive(Debug, Clone, Copy)]
struct AttnW {
    norm_q: CUdeviceptr,
    norm_k: CUdeviceptr,
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
}

#[derive(Debug, Clone, Copy)]
struct BlockW {
    sst: CUdeviceptr,
    attn1: AttnW,
    attn2: AttnW,
    ff1: Lin,
    ff2: Lin,
}

struct DitW {
    proj_in: Lin,
    sst: CUdeviceptr,
    t1: Lin,
    t2: Lin,
    tlin: Lin,
    cap1: Lin,
    cap2: Lin,
    proj_out: Lin,
    blocks: Vec<BlockW>,
}

fn lin(w: &DeviceWeights, name: &str, out: usize, inp: usize) -> Result<Lin, CudaError> {
    Ok(Lin {
        w: w.get(&format!("{name}.weight"), &[out, inp])?.ptr,
        b: w.get(&format!("{name}.bias"), &[out])?.ptr,
        out,
        inp,
    })
}

fn resolve(w: &DeviceWeights, dims: &DitDims) -> Result<DitW, CudaError> {
    let d = dims.dim();
    let attn = |b: &str, a: &str| -> Result<AttnW, CudaError> {
        Ok(AttnW {
            norm_q: w.get(&format!("{b}.{a}.norm_q.weight"), &[d])?.ptr,
            norm_k: w.get(&format!("{b}.{a}.norm_k.weight"), &[d])?.ptr,
            q: lin(w, &format!("{b}.{a}.to_q"), d, d)?,
            k: lin(w, &format!("{b}.{a}.to_k"), d, d)?,
            v: lin(w, &format!("{b}.{a}.to_v"), d, d)?,
            o: lin(w, &format!("{b}.{a}.to_out.0"), d, d)?,
        })
    };
    let mut blocks = Vec::with_capacity(dims.layers);
    for i in 0..dims.layers {
        let b = format!("transformer_blocks.{i}");
        blocks.push(BlockW {
            sst: w.get(&format!("{b}.scale_shift_table"), &[6, d])?.ptr,
            attn1: attn(&b, "attn1")?,
            attn2: attn(&b, "attn2")?,
            ff1: lin(w, &format!("{b}.ff.net.0.proj"), 4 * d, d)?,
            ff2: lin(w, &format!("{b}.ff.net.2"), d, 4 * d)?,
        });
    }
    Ok(DitW {
        proj_in: lin(w, "proj_in", d, LATENT_CHANNELS)?,
        sst: w.get("scale_shift_table", &[2, d])?.ptr,
        t1: lin(
            w,
            "time_embed.emb.timestep_embedder.linear_1",
            d,
            TIMESTEP_DIM,
        )?,
        t2: lin(w, "time_embed.emb.timestep_embedder.linear_2", d, d)?,
        tlin: lin(w, "time_embed.linear", 6 * d, d)?,
        cap1: lin(w, "caption_projection.linear_1", d, dims.caption_channels)?,
        cap2: lin(w, "caption_projection.linear_2", d, d)?,
        proj_out: lin(w, "proj_out", LATENT_CHANNELS, d)?,
        blocks,
    })
}

/// The RoPE frequency factors for width `dim`: `10000^linspace(0, 1, dim / 6)`
/// times pi / 2, in f32 the way the reference computes them (torch's linspace
/// fills the second half from the end).
pub fn rope_freqs(dim: usize) -> Vec<f32> {
    let n = dim / 6;
    if n == 0 {
        return Vec::new();
    }
    let step = if n > 1 { 1.0f32 / (n - 1) as f32 } else { 0.0 };
    (0..n)
        .map(|i| {
            let t = if n == 1 {
                0.0 // torch.linspace with one step returns its start
            } else if i < n / 2 {
                i as f32 * step
            } else {
                1.0f32 - (n - 1 - i) as f32 * step
            };
            let f = 10000f32.powf(t);
            f * std::f32::consts::PI / 2.0
        })
        .collect()
}

/// Activation buffers of one (tokens, text length).
pub struct Workspace {
    _arena: Arena,
    /// Tokens.
    pub n: usize,
    /// Text tokens.
    pub l: usize,
    /// Input latents, f32 [n, 128] (written by the caller or `forward`).
    pub lat: CUdeviceptr,
    /// Output velocity, f32 [n, 128].
    pub out: CUdeviceptr,
    /// Text encoder states, f32 [l, caption_channels].
    pub text: CUdeviceptr,
    /// Text key bias, f32 [l].
    pub kbias: CUdeviceptr,
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
    /// Bytes a workspace for (n, l) needs on `dims`.
    pub fn bytes_for(dims: &DitDims, n: usize, l: usize) -> usize {
        Self::pieces(dims, n, l).iter().map(|b| align_up(*b)).sum()
    }

    fn pieces(dims: &DitDims, n: usize, l: usize) -> Vec<usize> {
        let d = dims.dim();
        let c = dims.caption_channels;
        let lc = LATENT_CHANNELS;
        vec![
            n * lc * 4,       // lat
            n * lc * 4,       // out
            l * c * 4,        // text
            l * 4,            // kbias
            n * lc * 2,       // lat_bf
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
        self._arena.buffer().fill_bytes(gpu, 0xFF, &gpu.compute)
    }

    /// Allocate a workspace for (n, l).
    pub fn new(gpu: &Gpu, dims: &DitDims, n: usize, l: usize) -> Result<Workspace, CudaError> {
        let sizes = Self::pieces(dims, n, l);
        let mut arena = Arena::new(gpu, Self::bytes_for(dims, n, l), "the DiT workspace")?;
        let mut p = Vec::with_capacity(sizes.len());
        for s in &sizes {
            p.push(arena.take(*s)?);
        }
        Ok(Workspace {
            _arena: arena,
            n,
            l,
            lat: p[0],
            out: p[1],
            text: p[2],
            kbias: p[3],
            lat_bf: p[4],
            x: p[5],
            h: p[6],
            q: p[7],
            k: p[8],
            v: p[9],
            ao: p[10],
            y: p[11],
            ff: p[12],
            text_bf: p[13],
            cap_h: p[14],
            text_p: p[15],
            ck: p[16],
            cv: p[17],
            tsin: p[18],
            t1: p[19],
            t1s: p[20],
            emb: p[21],
            emb_s: p[22],
            temb: p[23],
            out_bf: p[24],
        })
    }
}

/// Geometry of one forward.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Latent grid (frames, height, width); tokens = product, raster order.
    pub grid: (usize, usize, usize),
    /// Frames per second (RoPE's time scale is 8 / fps).
    pub fps: f32,
}

/// The device DiT: resolved weights, kernels, GEMM plans and a workspace.
pub struct DeviceDit {
    gpu: Arc<Gpu>,
    kernels: Arc<Kernels>,
    gemm: Arc<Gemm>,
    dims: DitDims,
    weights: Arc<DeviceWeights>,
    w: DitW,
    freqs: DeviceBuffer,
    ws: Option<Workspace>,
    timer: Timer,
    /// Attention kernel for self- and cross-attention.
    pub attn: AttnKernel,
    /// Use cuBLASLt's fused bias+GELU epilogue (else GEMM + `bias_act` kernel).
    pub fused_gelu: bool,
    /// Fuse each residual add with the next norm / cast (`residual_norm`), else
    /// separate `gated_residual`, `cast` and `ada_norm_mod` passes.
    pub fused_rows: bool,
}

impl DeviceDit {
    /// Bind `weights` (checked against `dims`: every tensor present, bf16, of the
    /// expected shape) and prepare the RoPE table.
    pub fn new(
        gpu: Arc<Gpu>,
        kernels: Arc<Kernels>,
        gemm: Arc<Gemm>,
        dims: DitDims,
        weights: Arc<DeviceWeights>,
    ) -> Result<DeviceDit, CudaError> {
        if dims.dim() % 8 != 0 {
            return Err(CudaError::Invalid(format!(
                "DiT width {} is not a multiple of 8",
                dims.dim()
            )));
        }
        let w = resolve(&weights, &dims)?;
        let f = rope_freqs(dims.dim());
        let freqs = DeviceBuffer::alloc(&gpu, f.len().max(1) * 4, "the RoPE frequency table")?;
        if !f.is_empty() {
            upload(&gpu, freqs.ptr(), &f)?;
        }
        let timer = Timer::new(&gpu)?;
        Ok(DeviceDit {
            attn: AttnKernel::best_for(dims.head_dim),
            fused_gelu: true,
            fused_rows: true,
            gpu,
            kernels,
            gemm,
            dims,
            weights,
            w,
            freqs,
            ws: None,
            timer,
        })
    }

    /// The model's shape.
    pub fn dims(&self) -> &DitDims {
        &self.dims
    }

    /// The staged weights.
    pub fn weights(&self) -> &Arc<DeviceWeights> {
        &self.weights
    }

    /// The workspace for (n, l), allocated (or reallocated) on demand.
    pub fn workspace(&mut self, n: usize, l: usize) -> Result<&Workspace, CudaError> {
        let fits = matches!(&self.ws, Some(w) if w.n == n && w.l == l);
        if !fits {
            self.ws = None;
            self.ws = Some(Workspace::new(&self.gpu, &self.dims, n, l)?);
        }
        self.ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("workspace missing".into()))
    }

    /// Upload the text states (f32 [l, caption_channels]) and mask (l values of
    /// 0/1) into the current workspace.
    pub fn set_text(&mut self, text: &[f32], mask: &[f32]) -> Result<(), CudaError> {
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("set_text before the workspace exists".into()))?;
        if text.len() != ws.l * self.dims.caption_channels || mask.len() != ws.l {
            return Err(CudaError::Invalid(format!(
                "text of {} values and mask of {} for l={} x {} channels",
                text.len(),
                mask.len(),
                ws.l,
                self.dims.caption_channels
            )));
        }
        let bias: Vec<f32> = mask.iter().map(|m| (1.0 - m) * MASK_BIAS).collect();
        upload(&self.gpu, ws.text, text)?;
        upload(&self.gpu, ws.kbias, &bias)
    }

    /// Upload latents (f32 [n, 128]) into the current workspace.
    pub fn set_latents(&mut self, latents: &[f32]) -> Result<(), CudaError> {
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("set_latents before the workspace exists".into()))?;
        if latents.len() != ws.n * LATENT_CHANNELS {
            return Err(CudaError::Invalid(format!(
                "latents of {} values for {} tokens x {LATENT_CHANNELS}",
                latents.len(),
                ws.n
            )));
        }
        upload(&self.gpu, ws.lat, latents)
    }

    /// One forward over the workspace's latents and text (already on the
    /// device), velocity into `workspace.out`. Enqueue only; returns at once. When
    /// `timed`, events bracket it (read them with [`DeviceDit::last_device_ms`]).
    pub fn enqueue_forward(
        &mut self,
        sigma: f32,
        geo: Geometry,
        timed: bool,
    ) -> Result<(), CudaError> {
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("forward before the workspace exists".into()))?;
        let (n, l) = (ws.n, ws.l);
        let tokens = geo.grid.0 * geo.grid.1 * geo.grid.2;
        if tokens != n {
            return Err(CudaError::Invalid(format!(
                "grid {:?} has {tokens} tokens but the workspace holds {n}",
                geo.grid
            )));
        }
        let s = &self.gpu.compute;
        let k = &self.kernels;
        let g = &self.gemm;
        let d = self.dims.dim();
        let lc = LATENT_CHANNELS;
        let w = &self.w;
        let gelu = |x: CUdeviceptr, lw: &Lin, y: CUdeviceptr, m: usize| -> Result<(), CudaError> {
            if self.fused_gelu {
                g.linear(s, x, lw.w, lw.b, y, m, lw.out, lw.inp, Epilogue::BiasGelu)
            } else {
                g.linear(s, x, lw.w, NULL, y, m, lw.out, lw.inp, Epilogue::None)?;
                k.bias_act(s, y, lw.b, lw.out, m * lw.out, true)
            }
        };
        let linb = |x: CUdeviceptr, lw: &Lin, y: CUdeviceptr, m: usize| -> Result<(), CudaError> {
            g.linear(s, x, lw.w, lw.b, y, m, lw.out, lw.inp, Epilogue::Bias)
        };
        if timed {
            self.timer.start(s)?;
        }
        // Input projection into the f32 residual stream.
        k.cast_f32_to_bf16(s, ws.lat, ws.lat_bf, n * lc)?;
        linb(ws.lat_bf, &w.proj_in, ws.h, n)?;
        k.cast_bf16_to_f32(s, ws.h, ws.x, n * d)?;
        // Timestep: sinusoid(sigma * 1000) -> linear_1 -> SiLU -> linear_2 = emb;
        // SiLU(emb) -> linear = temb (6 x D).
        k.timestep_sinusoid(s, ws.tsin, sigma * 1000.0, TIMESTEP_DIM / 2)?;
        linb(ws.tsin, &w.t1, ws.t1, 1)?;
        k.silu(s, ws.t1, ws.t1s, d)?;
        linb(ws.t1s, &w.t2, ws.emb, 1)?;
        k.silu(s, ws.emb, ws.emb_s, d)?;
        linb(ws.emb_s, &w.tlin, ws.temb, 1)?;
        // Caption projection: linear_1 -> tanh-GELU -> linear_2.
        k.cast_f32_to_bf16(s, ws.text, ws.text_bf, l * self.dims.caption_channels)?;
        gelu(ws.text_bf, &w.cap1, ws.cap_h, l)?;
        linb(ws.cap_h, &w.cap2, ws.text_p, l)?;

        let rope = RopeArgs {
            freqs: self.freqs.ptr(),
            nfreq: d / 6,
            grid: geo.grid,
            scale: [8.0 / geo.fps, 32.0, 32.0],
            base: [20.0, 2048.0, 2048.0],
        };
        let hd = self.dims.head_dim;
        let heads = self.dims.heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let row = |p: CUdeviceptr, i: usize| p + (i * d * 2) as u64; // row i of a [6, D] bf16 table
        let nb = w.blocks.len();
        if self.fused_rows && nb > 0 {
            // One fused row pass between sub-blocks: residual add (f32) and the
            // next consumer's bf16 input in the same read of x.
            let b0 = &w.blocks[0];
            k.residual_norm(
                s,
                ws.x,
                NULL,
                (NULL, NULL),
                n,
                d,
                RowMode::Rms,
                (row(b0.sst, 0), row(ws.temb, 0)),
                (row(b0.sst, 1), row(ws.temb, 1)),
                ws.h,
            )?;
        }
        for (bi, b) in w.blocks.iter().enumerate() {
            // Self-attention on the modulated RMS norm.
            if !self.fused_rows {
                k.ada_norm_mod(
                    s,
                    ws.x,
                    ws.h,
                    n,
                    d,
                    NORM_EPS,
                    false,
                    row(b.sst, 0),
                    row(b.sst, 1),
                    row(ws.temb, 0),
                    row(ws.temb, 1),
                )?;
            }
            linb(ws.h, &b.attn1.q, ws.q, n)?;
            linb(ws.h, &b.attn1.k, ws.k, n)?;
            linb(ws.h, &b.attn1.v, ws.v, n)?;
            k.qk_norm_rope(s, ws.q, ws.q, b.attn1.norm_q, n, d, QK_EPS, Some(&rope))?;
            k.qk_norm_rope(s, ws.k, ws.k, b.attn1.norm_k, n, d, QK_EPS, Some(&rope))?;
            k.attention(
                s,
                self.attn,
                heads,
                hd,
                (ws.q, d),
                (ws.k, d),
                (ws.v, d),
                (ws.ao, d),
                n,
                n,
                NULL,
                scale,
            )?;
            linb(ws.ao, &b.attn1.o, ws.y, n)?;
            // Cross-attention to the text: no norm, no modulation, no gate.
            if self.fused_rows {
                k.residual_norm(
                    s,
                    ws.x,
                    ws.y,
                    (row(b.sst, 2), row(ws.temb, 2)),
                    n,
                    d,
                    RowMode::Cast,
                    (NULL, NULL),
                    (NULL, NULL),
                    ws.h,
                )?;
            } else {
                k.gated_residual(s, ws.x, ws.y, row(b.sst, 2), row(ws.temb, 2), d, n * d)?;
                k.cast_f32_to_bf16(s, ws.x, ws.h, n * d)?;
            }
            linb(ws.h, &b.attn2.q, ws.q, n)?;
            linb(ws.text_p, &b.attn2.k, ws.ck, l)?;
            linb(ws.text_p, &b.attn2.v, ws.cv, l)?;
            k.qk_norm_rope(s, ws.q, ws.q, b.attn2.norm_q, n, d, QK_EPS, None)?;
            k.qk_norm_rope(s, ws.ck, ws.ck, b.attn2.norm_k, l, d, QK_EPS, None)?;
            k.attention(
                s,
                self.attn,
                heads,
                hd,
                (ws.q, d),
                (ws.ck, d),
                (ws.cv, d),
                (ws.ao, d),
                n,
                l,
                ws.kbias,
                scale,
            )?;
            linb(ws.ao, &b.attn2.o, ws.y, n)?;
            // Feed-forward on the modulated RMS norm.
            if self.fused_rows {
                k.residual_norm(
                    s,
                    ws.x,
                    ws.y,
                    (NULL, NULL),
                    n,
                    d,
                    RowMode::Rms,
                    (row(b.sst, 3), row(ws.temb, 3)),
                    (row(b.sst, 4), row(ws.temb, 4)),
                    ws.h,
                )?;
            } else {
                k.gated_residual(s, ws.x, ws.y, NULL, NULL, d, n * d)?;
                k.ada_norm_mod(
                    s,
                    ws.x,
                    ws.h,
                    n,
                    d,
                    NORM_EPS,
                    false,
                    row(b.sst, 3),
                    row(b.sst, 4),
                    row(ws.temb, 3),
                    row(ws.temb, 4),
                )?;
            }
            gelu(ws.h, &b.ff1, ws.ff, n)?;
            linb(ws.ff, &b.ff2, ws.y, n)?;
            if self.fused_rows {
                // The gated residual, then the next block's input norm, or the
                // output LayerNorm modulated by scale_shift_table + emb.
                let gate = (row(b.sst, 5), row(ws.temb, 5));
                if bi + 1 < nb {
                    let nx = &w.blocks[bi + 1];
                    k.residual_norm(
                        s,
                        ws.x,
                        ws.y,
                        gate,
                        n,
                        d,
                        RowMode::Rms,
                        (row(nx.sst, 0), row(ws.temb, 0)),
                        (row(nx.sst, 1), row(ws.temb, 1)),
                        ws.h,
                    )?;
                } else {
                    k.residual_norm(
                        s,
                        ws.x,
                        ws.y,
                        gate,
                        n,
                        d,
                        RowMode::LayerNorm,
                        (row(w.sst, 0), ws.emb),
                        (row(w.sst, 1), ws.emb),
                        ws.h,
                    )?;
                }
            } else {
                k.gated_residual(s, ws.x, ws.y, row(b.sst, 5), row(ws.temb, 5), d, n * d)?;
            }
        }
        if !self.fused_rows || nb == 0 {
            // Output: LayerNorm (no affine) modulated by scale_shift_table + emb.
            k.ada_norm_mod(
                s,
                ws.x,
                ws.h,
                n,
                d,
                NORM_EPS,
                true,
                row(w.sst, 0),
                row(w.sst, 1),
                ws.emb,
                ws.emb,
            )?;
        }
        linb(ws.h, &w.proj_out, ws.out_bf, n)?;
        k.cast_bf16_to_f32(s, ws.out_bf, ws.out, n * lc)?;
        if timed {
            self.timer.stop(s)?;
        }
        Ok(())
    }

    /// Device milliseconds of the last timed forward (waits for it to finish).
    pub fn last_device_ms(&self) -> Result<f64, CudaError> {
        self.timer.elapsed_ms()
    }

    /// A whole forward from host data: latents f32 [n, 128], text f32 [l,
    /// caption_channels], mask [l]. Returns the velocity f32 [n, 128] and the
    /// forward's device milliseconds.
    pub fn forward(
        &mut self,
        latents: &[f32],
        sigma: f32,
        text: &[f32],
        mask: &[f32],
        geo: Geometry,
    ) -> Result<(Vec<f32>, f64), CudaError> {
        let n = geo.grid.0 * geo.grid.1 * geo.grid.2;
        let l = mask.len();
        self.workspace(n, l)?;
        self.set_latents(latents)?;
        self.set_text(text, mask)?;
        self.enqueue_forward(sigma, geo, true)?;
        let ms = self.last_device_ms()?;
        let out = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("workspace missing".into()))?
            .out;
        let v = super::memory::download::<f32>(&self.gpu, out, n * LATENT_CHANNELS)?;
        Ok((v, ms))
    }

    /// Device address of the workspace's latents and velocity (for a
    /// device-resident denoise loop).
    pub fn io_ptrs(&self) -> Option<(CUdeviceptr, CUdeviceptr)> {
        self.ws.as_ref().map(|w| (w.lat, w.out))
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
    fn specs_match_the_cpu_arms_layout() {
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
        // ltx-architecture.md: 2B at 6144 tokens: linear 20.2 T, self-attn 8.7 T.
        let (lin, sa, _) = DitDims::LTXV_2B.forward_flops(6144, 128);
        assert!((lin / 1e12 - 20.2).abs() < 0.1, "{lin}");
        assert!((sa / 1e12 - 8.66).abs() < 0.05, "{sa}");
    }

    #[test]
    fn rope_freqs_span_pi_half_to_10000_pi_half() {
        let f = rope_freqs(2048);
        assert_eq!(f.len(), 341);
        assert!((f[0] - std::f32::consts::FRAC_PI_2).abs() < 1e-6);
        assert!((f[340] / (10000.0 * std::f32::consts::FRAC_PI_2) - 1.0).abs() < 1e-6);
        assert!(f.windows(2).all(|w| w[1] > w[0]));
    }

    #[test]
    fn workspace_pieces_are_all_counted() {
        let dims = DitDims::LTXV_2B;
        let b = Workspace::bytes_for(&dims, 6144, 128);
        // Dominated by x (f32) + 6 bf16 [n, D] + ff [n, 4D].
        let min = 6144 * 2048 * (4 + 6 * 2 + 8);
        assert!(b > min && b < min + (64 << 20), "{b}");
    }
}
