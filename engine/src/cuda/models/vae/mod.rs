//! The video VAE decoder on the device (lever `vae = device`).
//!
//! The decoder's weights are staged from the VAE checkpoint (bf16, one arena)
//! and each 3x3x3 convolution weight is reordered once, in place, to
//! `[co][27][ci]` (what the implicit-GEMM kernel and cuDNN's NHWC filter
//! layout both read). A decode streams the latent clip through the decoder in
//! temporal chunks ([`stream`]): buffers are sized for the chunk, each
//! convolution keeps the two frames its kernel still needs, and pixels come
//! back to the host as the last layer emits them, so device memory grows with
//! the chunk, not the clip, and any chunking gives the same pixels.
//!
//! Activations are bf16 (halving the traffic of the ~0.8 GB-per-tensor last
//! stage at 768x512x121), every reduction and every elementwise step is f32 in
//! registers; the residual stream stays bf16 because each resnet renormalises
//! its input (per-voxel RMS), so a rounding of 2^-9 per add does not grow
//! through the stack (the check's tolerance argues the bound). The last layer
//! writes f32 pixels to a staging buffer, a kernel converts them there to the
//! render's RGB8 frames (bit-exact with [`crate::frames::to_u8`]), and the
//! render downloads only those (a quarter of the f32 bytes), through two
//! pinned host halves copied on the compute stream, with no host wait between
//! conversions; the f32 pixels can still be downloaded ([`Download`]) for the
//! checks.
//!
//! - [`ops`]: the primitives ([`ops::VaeOps`]) and the weight walk.
//! - [`stream`]: the chunked stream over any backend.
//! - [`host`]: the primitives on the host (the reference; testable without a GPU).
//! - [`device`]: the primitives on the device (kernels, cuBLASLt, the conv path).
//! - [`cudnn`]: the cuDNN convolution path.
//! - [`rgb8`]: the RGB8 conversion's layout, defects and host model.
//! - [`shapes`]: the convolutions a decode asks for, counted without a GPU.
//! - [`pool`]: a decode's buffers allocated ahead of it ([`DeviceVae::prepare`]).
//! - `check` / `bench`: the selftest section and the benchmark.

pub mod cudnn;
pub mod device;
pub mod host;
pub mod ops;
pub mod pool;
pub mod rgb8;
pub mod shapes;
pub mod stream;

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::result as dres;

use crate::cuda::kit::bf16::widen;
use crate::cuda::kit::memory::{download, DeviceBuffer};
use crate::cuda::kit::DeviceKit;
use crate::cuda::staging::{self, DeviceWeights, StagingOptions, StagingReport};
use crate::cuda::{CudaError, DriverContext};
use anyhow::Context;
use evidence::attrs;
use evidence::marker::{attr, Attrs};

use crate::arms::{ChunkEnd, ChunkHost, Decoded, Decoder};
use crate::frames::Frame;
use crate::models::vae::{decoder_tensor_specs, VaeConfig};
use crate::tensor::Tensor;
use crate::weights::safetensors::Extent;
use device::{ConvPath, DecodePool, DeviceOps, PoolReport};
use ops::{DecoderW, Mutation, VaeOps};
use stream::{latent_frames, output_geometry, Stream};

/// Latent frames per device chunk in the render: 4 stays within a few percent
/// of decoding in one piece at under a third of its decode buffers (the chunk
/// sweep of the VAE's device run 2 in `reports/device-notes.md`).
pub const DEVICE_CHUNK_LATENT_FRAMES: usize = 4;

/// The conv path the render uses: cuDNN (about three times the engine's
/// mma.sync kernel on the decoder's 3x3x3 shapes in the VAE's device run 1,
/// `reports/device-notes.md`), falling back to the engine's kernel where cuDNN
/// does not load.
pub const RENDER_CONV_PATH: ConvPath = ConvPath::Cudnn;

/// Device bytes the plan allows for cuDNN's workspace (an estimate, above what
/// cuDNN asked for in the VAE's device runs: `reports/device-notes.md`).
pub const CUDNN_WORKSPACE_ALLOWANCE: u64 = 32 << 20;

/// Host bytes the plan allows for cuDNN's libraries while it decodes (an
/// estimate: rung 1's decode.video peaked 15 MB above the projection without it).
pub const CUDNN_HOST_ALLOWANCE: u64 = 64 << 20;

/// What a decode copies to the host as the frames come (the device converts
/// the pixels to RGB8 whichever it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Download {
    /// Nothing (the benchmark keeps the pixels on the device).
    None,
    /// The f32 clip `[3, F, H, W]` (the checks, the benchmark's comparison).
    F32,
    /// The RGB8 frames (the render).
    Rgb8,
    /// Both (the checks compare them).
    Both,
}

impl Download {
    /// Whether the f32 clip is copied.
    pub fn f32(self) -> bool {
        matches!(self, Download::F32 | Download::Both)
    }

    /// Whether the RGB8 frames are copied.
    pub fn rgb8(self) -> bool {
        matches!(self, Download::Rgb8 | Download::Both)
    }
}

/// How one decode runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Latent frames per chunk (>= 1).
    pub chunk: usize,
    /// What is copied to the host.
    pub download: Download,
    /// Fill every activation buffer with NaN first (checks).
    pub poison: bool,
    /// A deliberate defect (checks that must be able to fail).
    pub mutation: Mutation,
}

impl DecodeOptions {
    /// The render's options: chunks of `chunk`, RGB8 frames downloaded.
    pub fn render(chunk: usize) -> DecodeOptions {
        DecodeOptions {
            chunk,
            download: Download::Rgb8,
            poison: false,
            mutation: Mutation::None,
        }
    }
}

/// One chunk of a decode, reported as it completes.
#[derive(Debug, Clone, Copy)]
pub struct ChunkReport {
    /// Chunk index.
    pub index: usize,
    /// Chunks of the decode.
    pub chunks: usize,
    /// Device milliseconds (CUDA events on the compute stream, host waits excluded).
    pub device_ms: f64,
    /// Pixel frames the chunk completed.
    pub frames: usize,
    /// Host milliseconds of the chunk not spent waiting for the device: its
    /// convolution plans, launches and the frame copies to the host.
    pub enqueue_ms: f64,
    /// Host milliseconds blocked waiting for the device (the waits before frame
    /// copies inside the chunk and at its end).
    pub wait_ms: f64,
    /// cuDNN convolution plans the chunk built (first use of a shape), and the
    /// host milliseconds they took (part of `enqueue_ms`).
    pub plans: (usize, f64),
    /// How many of those plans ran cuDNN's algorithm heuristic (the rest reused the
    /// algorithm of the same convolution at another frame count).
    pub searched: usize,
}

/// What a decode returned.
#[derive(Debug)]
pub struct DecodeOutcome {
    /// Pixels `[3, F, H, W]` (when downloading f32).
    pub pixels: Option<Tensor>,
    /// The RGB8 frames (when downloading RGB8).
    pub frames: Option<Vec<Frame>>,
    /// Device milliseconds of the whole decode (sum of the chunks).
    pub device_ms: f64,
    /// Device bytes of the decode's buffers (activations, embeddings, pixel staging).
    pub workspace_bytes: u64,
    /// Host milliseconds before the first chunk's work: binding the weights,
    /// allocating the stream's buffers and the pixel sink (device and pinned),
    /// poisoning them when asked.
    pub setup_ms: f64,
    /// Host milliseconds after the last chunk: the frames' last copies waited
    /// for and moved into frames, the f32 clip wrapped.
    pub collect_ms: f64,
    /// How the decode used the buffers [`DeviceVae::prepare`] made for it;
    /// `None` when none were made for this latent shape and these options.
    pub prepared: Option<PoolReport>,
}

/// What [`DeviceVae::prepare`] did, for the `load.vae` close.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrepareReport {
    /// cuDNN plans built now (0 off the cuDNN path, or where built before).
    pub plans: usize,
    /// Host milliseconds building them.
    pub plan_ms: f64,
    /// Host milliseconds allocating the decode's buffers and pixel sink
    /// (binding the time embeddings included).
    pub alloc_ms: f64,
    /// Of `alloc_ms`, the pixel sink alone: its device staging and the two
    /// pinned RGB8 halves (page-locking them is most of it).
    pub sink_ms: f64,
    /// Device bytes now held for the decode (buffers and pixel staging).
    pub device_bytes: u64,
    /// Pinned host bytes now held for it (the two RGB8 halves).
    pub pinned_bytes: u64,
}

/// What [`DeviceVae::set_up`] made: the backend, the bound weights, the
/// stream, the first stream buffer's id (what poisoning starts from) and the
/// host milliseconds the pixel sink took.
struct SetUp<'a> {
    ops: DeviceOps<'a>,
    w: DecoderW<DeviceOps<'a>>,
    st: Stream,
    stream_from: usize,
    sink_ms: f64,
}

/// The decode a [`DecodePool`] was made for: latent (frames, height, width),
/// chunk and download. The mutation and poisoning do not change a buffer's size.
type PoolKey = ((usize, usize, usize), usize, Download);

/// The decoder resident on the device.
pub struct DeviceVae {
    kit: DeviceKit,
    cfg: VaeConfig,
    weights: DeviceWeights,
    cudnn: Option<cudnn::CudnnConv>,
    /// Why cuDNN is not loaded, if it was asked for and is not.
    pub cudnn_error: Option<String>,
    /// The convolution path decodes use.
    pub path: ConvPath,
    latents_mean: Vec<f32>,
    latents_std: Vec<f32>,
    /// Buffers made ahead by [`DeviceVae::prepare`], for the decode they fit.
    prepared: Option<(PoolKey, DecodePool)>,
}

/// Names of the decoder's 3x3x3 convolution weights and their shapes.
fn conv3_weights(cfg: &VaeConfig) -> Vec<(String, Vec<usize>)> {
    decoder_tensor_specs(cfg)
        .into_iter()
        .filter(|s| s.shape.len() == 5 && s.shape[2] == 3)
        .map(|s| (s.name, s.shape))
        .collect()
}

/// Device bytes of the transient buffer the weight reordering uses (the
/// largest 3x3x3 convolution weight).
pub fn reorder_bytes(cfg: &VaeConfig) -> u64 {
    conv3_weights(cfg)
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64 * 2)
        .max()
        .unwrap_or(0)
}

/// Elements of the time-embedding buffers a decode allocates (sinusoid and
/// three vectors per embedder).
fn temb_elems(cfg: &VaeConfig) -> usize {
    if !cfg.timestep_conditioning {
        return 0;
    }
    let (first, _, plan) = cfg.decoder_plan();
    let last = plan.last().map(|b| b.out_channels).unwrap_or(first);
    let dims = std::iter::once(4 * first)
        .chain(plan.iter().map(|b| 4 * b.in_channels))
        .chain(std::iter::once(2 * last));
    dims.map(|d| ops::SINUSOID + 3 * d).sum()
}

/// Device bytes one decode of `latent` latent voxels in chunks of `chunk`
/// allocates: every stream buffer, the time embeddings, the pixel staging
/// (f32 and RGB8).
pub fn decode_bytes(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
    chunk: usize,
) -> Result<u64, CudaError> {
    let elems: usize = stream::buffer_elems(cfg, latent, chunk)?.iter().sum();
    let (oc, _, h, w) = output_geometry(cfg, latent);
    let st = Stream::new(cfg, latent, chunk, Mutation::None, &mut |_, _| Ok(0))?;
    let cap = st.pixel_frames_cap();
    let rgb8 = device::rgb8_staging_bytes(cap, (oc, 0, h, w));
    Ok(((elems + temb_elems(cfg)) * 2 + cap * oc * h * w * 4 + rgb8) as u64)
}

/// Pinned host bytes a decode of `latent` in chunks of `chunk` holds for its
/// RGB8 frames: two halves of the stream's pixel cap each (none unless the
/// clip has three colours).
pub fn pinned_bytes(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
    chunk: usize,
) -> Result<u64, CudaError> {
    let (oc, _, h, w) = output_geometry(cfg, latent);
    let st = Stream::new(cfg, latent, chunk, Mutation::None, &mut |_, _| Ok(0))?;
    Ok(2 * device::rgb8_staging_bytes(st.pixel_frames_cap(), (oc, 0, h, w)) as u64)
}

impl DeviceVae {
    /// Binds staged `weights` of a decoder of `cfg` on `kit`'s GPU: checks every
    /// decoder tensor, reorders the convolution weights in place, reads the
    /// latent statistics; with `path = Cudnn` loads cuDNN, falling back to
    /// [`ConvPath::Igemm`] (reason in [`DeviceVae::cudnn_error`]) when it cannot.
    pub fn new(
        kit: DeviceKit,
        cfg: &VaeConfig,
        weights: DeviceWeights,
        path: ConvPath,
    ) -> Result<DeviceVae, CudaError> {
        cfg.validate()
            .map_err(|e| CudaError::Invalid(format!("VAE config: {e}")))?;
        for s in decoder_tensor_specs(cfg) {
            weights.get(&s.name, &s.shape)?;
        }
        let c = cfg.latent_channels;
        let stat = |name: &str| -> Result<Vec<f32>, CudaError> {
            let t = weights.get(name, &[c])?;
            Ok(widen(&download::<u16>(&kit.gpu, t.ptr, c)?))
        };
        let (latents_mean, latents_std) = (stat("latents_mean")?, stat("latents_std")?);
        // Reorder [co][ci][27] -> [co][27][ci] through one transient buffer.
        let convs = conv3_weights(cfg);
        let tmp = DeviceBuffer::alloc(
            &kit.gpu,
            reorder_bytes(cfg) as usize,
            "reordering the VAE weights",
        )?;
        let s = &kit.gpu.compute;
        for (name, shape) in &convs {
            let t = weights.get(name, shape)?;
            kit.gpu.bind()?;
            // SAFETY: `tmp` holds the largest weight; `t` is this tensor's range.
            unsafe { dres::memcpy_dtod_async(tmp.ptr(), t.ptr, t.bytes, s.cu_stream()) }
                .ctx("copying a VAE weight aside")?;
            let n = t.bytes / 2;
            let p = crate::cuda::kit::kernels::Params::default()
                .ptr(tmp.ptr())
                .ptr(t.ptr)
                .int(shape[0])
                .int(shape[1])
                .int(27);
            let blocks = n.div_ceil(256).clamp(1, kit.gpu.sms.max(1) as usize * 16);
            kit.kernels
                .launch("vae_permute", (blocks as u32, 1, 1), 256, 0, s, p)?;
        }
        kit.gpu.sync_compute()?;
        drop(tmp);
        let mut v = DeviceVae {
            kit,
            cfg: cfg.clone(),
            weights,
            cudnn: None,
            cudnn_error: None,
            path: ConvPath::Igemm,
            latents_mean,
            latents_std,
            prepared: None,
        };
        v.set_path(path);
        Ok(v)
    }

    /// Switches the convolution path; asking for cuDNN loads it, and a cuDNN
    /// that cannot load leaves the path at [`ConvPath::Igemm`] with the reason
    /// in [`DeviceVae::cudnn_error`]. Returns the path in effect.
    pub fn set_path(&mut self, path: ConvPath) -> ConvPath {
        if path == ConvPath::Cudnn && self.cudnn.is_none() {
            match cudnn::CudnnConv::open(&self.kit.gpu) {
                Ok(c) => self.cudnn = Some(c),
                Err(e) => self.cudnn_error = Some(e.to_string()),
            }
        }
        self.path = if path == ConvPath::Cudnn && self.cudnn.is_none() {
            ConvPath::Igemm
        } else {
            path
        };
        self.path
    }

    /// Drops the cuDNN handle and its plans and, on the cuDNN path, opens a
    /// fresh one (the checks: plans counted from zero). Returns whether a
    /// fresh handle is open.
    pub fn reopen_cudnn(&mut self) -> bool {
        let path = self.path;
        self.cudnn = None;
        self.set_path(path) == ConvPath::Cudnn && self.cudnn.is_some()
    }

    /// cuDNN convolution plans this decoder's cuDNN path has built, and the
    /// algorithm-heuristic calls among them, since it opened; `None` without cuDNN.
    pub fn cudnn_plans(&self) -> Option<(usize, usize)> {
        self.cudnn
            .as_ref()
            .map(|c| (c.plans_built().0, c.plans_searched()))
    }

    /// The loaded cuDNN's version and the algorithms it chose, if loaded.
    pub fn cudnn_report(&self) -> Option<(usize, Vec<String>)> {
        self.cudnn.as_ref().map(|c| {
            (
                c.version,
                c.algorithms()
                    .into_iter()
                    .map(|(s, a, ws)| format!("{s:?}: {a} ws={ws}"))
                    .collect(),
            )
        })
    }

    /// The decoder's config.
    pub fn config(&self) -> &VaeConfig {
        &self.cfg
    }

    /// The GPU, kernels and cuBLASLt handle.
    pub fn kit(&self) -> &DeviceKit {
        &self.kit
    }

    /// Per-channel latent mean (`latents_mean`).
    pub fn latents_mean(&self) -> &[f32] {
        &self.latents_mean
    }

    /// Per-channel latent standard deviation (`latents_std`).
    pub fn latents_std(&self) -> &[f32] {
        &self.latents_std
    }

    /// The latent `(frames, height, width)` of `shape` `[C, F', H', W']`, or
    /// why a decode of it (in chunks of `chunk` at `timestep`) cannot run.
    fn latent_of(
        &self,
        shape: &[usize],
        chunk: usize,
        timestep: f32,
    ) -> Result<(usize, usize, usize), CudaError> {
        let c = self.cfg.latent_channels;
        if shape.len() != 4 || shape[0] != c || shape[1..].contains(&0) {
            return Err(CudaError::Invalid(format!(
                "VAE latents of shape {shape:?}: expected [{c}, F' >= 1, H' >= 1, W' >= 1]"
            )));
        }
        if chunk == 0 || !timestep.is_finite() {
            return Err(CudaError::Invalid(format!(
                "VAE decode in chunks of {chunk} at timestep {timestep}: the chunk must be >= 1 and the \
                 timestep finite"
            )));
        }
        Ok((shape[1], shape[2], shape[3]))
    }

    /// A decode's setup, the one sequence both [`DeviceVae::prepare`] and
    /// [`DeviceVae::decode`] run, so that a pool is made by exactly the
    /// requests that will take from it: the backend (given `pool`, if any), the
    /// weights bound at `timestep` (time embeddings), the stream's buffers and
    /// the pixel sink.
    fn set_up(
        &mut self,
        latent: (usize, usize, usize),
        timestep: f32,
        opts: &DecodeOptions,
        pool: Option<DecodePool>,
    ) -> Result<SetUp<'_>, CudaError> {
        let geom = output_geometry(&self.cfg, latent);
        let kit = &self.kit;
        let mut ops = DeviceOps::new(
            &kit.gpu,
            &kit.kernels,
            &kit.gemm,
            &self.weights,
            self.path,
            self.cudnn.as_mut(),
        )?;
        if let Some(p) = pool {
            ops.use_pool(p);
        }
        let w = DecoderW::bind(&mut ops, &self.cfg, timestep)?;
        let stream_from = ops.buffers();
        let st = Stream::new(
            &self.cfg,
            latent,
            opts.chunk,
            opts.mutation,
            &mut |n, what| ops.alloc(n, what),
        )?;
        let t = Instant::now();
        ops.pixel_sink(st.pixel_frames_cap(), geom, opts.download, opts.mutation)?;
        Ok(SetUp {
            ops,
            w,
            st,
            stream_from,
            sink_ms: t.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Makes ahead what a decode of `latent` (frames, height, width) with
    /// `opts` would make at its first use (lever `vae-prepare = load`): on the
    /// cuDNN path every convolution plan it needs, in its order
    /// ([`shapes::conv3_shapes`]), and the workspace for them; the stream's
    /// buffers, the time embeddings' and the pixel sink (device staging, the two
    /// pinned RGB8 halves), kept for that decode. A later [`DeviceVae::decode`]
    /// of the same latent shape and options takes them and allocates nothing;
    /// any other decode frees them first. Holds their memory until then.
    pub fn prepare(
        &mut self,
        latent: (usize, usize, usize),
        timestep: f32,
        opts: &DecodeOptions,
    ) -> Result<PrepareReport, CudaError> {
        let c = self.cfg.latent_channels;
        let latent = self.latent_of(&[c, latent.0, latent.1, latent.2], opts.chunk, timestep)?;
        // An earlier preparation goes first: never two sets at once.
        self.prepared = None;
        let t0 = Instant::now();
        let mut plans = 0;
        if self.path == ConvPath::Cudnn {
            if let Some(dnn) = self.cudnn.as_mut() {
                let order = shapes::conv3_shapes(&self.cfg, latent, opts.chunk)?;
                plans = dnn.prepare(&self.kit.gpu, order.into_iter().flatten())?;
            }
        }
        let plan_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let set = self.set_up(latent, timestep, opts, None)?;
        let sink_ms = set.sink_ms;
        let pool = set.ops.into_pool();
        // The time embeddings' launches are done inside the load's time.
        self.kit.gpu.sync_compute()?;
        let report = PrepareReport {
            plans,
            plan_ms,
            alloc_ms: t1.elapsed().as_secs_f64() * 1e3,
            sink_ms,
            device_bytes: pool.device_bytes(),
            pinned_bytes: pool.pinned_bytes(),
        };
        self.prepared = Some(((latent, opts.chunk, opts.download), pool));
        Ok(report)
    }

    /// Decodes `latents [C, F', H', W']` (denormalised, decode noise mixed in)
    /// at `timestep`, in chunks, calling `on_chunk` as each completes. With
    /// buffers prepared for this latent shape and these options
    /// ([`DeviceVae::prepare`]) it takes them; else it frees any prepared ones
    /// and allocates its own.
    pub fn decode(
        &mut self,
        latents: &Tensor,
        timestep: f32,
        opts: &DecodeOptions,
        on_chunk: &mut dyn FnMut(&ChunkReport),
    ) -> Result<DecodeOutcome, CudaError> {
        let entered = Instant::now();
        let c = self.cfg.latent_channels;
        let latent = self.latent_of(latents.shape(), opts.chunk, timestep)?;
        // Prepared buffers of another decode are freed before this one allocates.
        let pool = match self.prepared.take() {
            Some((key, pool)) if key == (latent, opts.chunk, opts.download) => Some(pool),
            _ => None,
        };
        let geom = output_geometry(&self.cfg, latent);
        let SetUp {
            mut ops,
            w,
            mut st,
            stream_from,
            ..
        } = self.set_up(latent, timestep, opts, pool)?;
        let workspace_bytes = ops.held_bytes();
        let prepared = ops.pool_report();
        if opts.poison {
            ops.poison_from(stream_from)?;
        }
        // Timing starts after the allocations (host work the GPU would wait on).
        let setup_ms = entered.elapsed().as_secs_f64() * 1e3;
        ops.begin()?;
        let chunks = st.chunks();
        let hw = latent.1 * latent.2;
        let mut total_ms = 0.0;
        for k in 0..chunks {
            let t0 = k * opts.chunk;
            let n = opts.chunk.min(latent.0 - t0);
            let data = latent_frames(latents.data(), c, latent.0, hw, t0, n);
            if k > 0 {
                ops.begin()?;
            }
            let plans0 = ops.plans_built();
            let searched0 = ops.plans_searched();
            let _ = ops.take_wait_ms();
            let q0 = Instant::now();
            let frames = st.push_chunk(&mut ops, &w, n, &data)?;
            ops.end()?;
            let wall_ms = q0.elapsed().as_secs_f64() * 1e3;
            // Waits inside the push (frames copied to the host as they come)
            // and the chunk's own end.
            let wait_ms = ops.take_wait_ms();
            let plans1 = ops.plans_built();
            let ms = ops.take_ms();
            total_ms += ms;
            on_chunk(&ChunkReport {
                index: k,
                chunks,
                device_ms: ms,
                frames,
                enqueue_ms: (wall_ms - wait_ms).max(0.0),
                wait_ms,
                plans: (plans1.0 - plans0.0, (plans1.1 - plans0.1) * 1e3),
                searched: ops.plans_searched() - searched0,
            });
        }
        if st.emitted() != geom.1 {
            return Err(CudaError::Invalid(format!(
                "the VAE stream emitted {} of {} frames",
                st.emitted(),
                geom.1
            )));
        }
        let collecting = Instant::now();
        let frames = ops.take_frames()?;
        let pixels = match ops.take_pixels() {
            Some(v) => Some(
                Tensor::new(&[geom.0, geom.1, geom.2, geom.3], v)
                    .map_err(|e| CudaError::Invalid(format!("VAE pixels: {e}")))?,
            ),
            None => None,
        };
        Ok(DecodeOutcome {
            pixels,
            frames,
            device_ms: total_ms,
            workspace_bytes,
            setup_ms,
            collect_ms: collecting.elapsed().as_secs_f64() * 1e3,
            prepared,
        })
    }
}

/// What opening the device VAE did (for the `load.vae` close).
#[derive(Debug, Clone)]
pub struct VaeOpenReport {
    /// Seconds to open the GPU, load the kernels and create the GEMM handle.
    pub device_open_s: f64,
    /// Those seconds part by part.
    pub opened: crate::cuda::kit::OpenTimes,
    /// The staging run.
    pub staging: StagingReport,
    /// Seconds to check and reorder the weights.
    pub prepare_s: f64,
}

/// Opens GPU 0, stages the VAE's tensors (`tensors`: the extents of the
/// validated checkpoint's decoder and latent statistics) and binds them.
pub fn open_device_vae(
    tensors: &[Extent],
    cfg: &VaeConfig,
    staging: &StagingOptions,
    path: ConvPath,
) -> Result<(DeviceVae, VaeOpenReport), CudaError> {
    let t0 = Instant::now();
    let kit = DeviceKit::open()?;
    let device_open_s = t0.elapsed().as_secs_f64();
    let opened = kit.opened;
    let (w, report) = staging::stage(&kit.gpu, tensors, staging)?;
    let t1 = Instant::now();
    let vae = DeviceVae::new(kit, cfg, w, path)?;
    Ok((
        vae,
        VaeOpenReport {
            device_open_s,
            opened,
            staging: report,
            prepare_s: t1.elapsed().as_secs_f64(),
        },
    ))
}

/// The device allocator's tracker of a device VAE (for `peak_device_bytes`).
pub fn mem(v: &DeviceVae) -> Arc<crate::cuda::kit::memory::MemTracker> {
    v.kit.gpu.mem.clone()
}

/// The CUDA arm's decoder behind [`Decoder`]: chunks of
/// [`DEVICE_CHUNK_LATENT_FRAMES`] latent frames ([`DecodeOptions::render`]),
/// RGB8 frames copied back per chunk, each chunk's device milliseconds from
/// CUDA events.
impl Decoder for DeviceVae {
    fn arm(&self) -> &'static str {
        "cuda"
    }

    fn latent_stats(&self) -> (&[f32], &[f32]) {
        (self.latents_mean(), self.latents_std())
    }

    fn chunk_latent_frames(&self) -> usize {
        DEVICE_CHUNK_LATENT_FRAMES
    }

    fn open_attrs(&self) -> Attrs {
        attrs! {"conv" => self.path.name()}
    }

    fn decode_clip(
        mut self: Box<Self>,
        z: Tensor,
        timestep: f32,
        on_chunk: &mut dyn FnMut(ChunkEnd),
    ) -> anyhow::Result<(Decoded, Attrs)> {
        let opts = DecodeOptions::render(DEVICE_CHUNK_LATENT_FRAMES);
        let mut report = |r: &ChunkReport| {
            on_chunk(ChunkEnd {
                index: r.index,
                chunks: r.chunks,
                device_ms: Some(r.device_ms),
                frames: Some(r.frames),
                host: Some(ChunkHost {
                    enqueue_ms: r.enqueue_ms,
                    wait_ms: r.wait_ms,
                    plans_built: r.plans.0,
                    plan_ms: r.plans.1,
                    plans_searched: r.searched,
                }),
            })
        };
        let out = DeviceVae::decode(&mut self, &z, timestep, &opts, &mut report)
            .context("VAE decode on the device")?;
        // Freeing the decoder and its device memory is the last chunk's work.
        let freeing = Instant::now();
        drop(self);
        drop(z);
        let free_ms = freeing.elapsed().as_secs_f64() * 1e3;
        let frames = out
            .frames
            .ok_or_else(|| anyhow::anyhow!("the device VAE returned no frames"))?;
        let mut a = attrs! {
            "frames" => frames.len(),
            attr::DEVICE_MS => out.device_ms,
            "workspace_bytes" => out.workspace_bytes,
            "setup_ms" => out.setup_ms,
            "collect_ms" => out.collect_ms,
            "free_ms" => free_ms,
            "prepared" => out.prepared.is_some(),
        };
        if let Some(p) = out.prepared {
            // A preparation this decode could not use wholly says how far it got.
            a.insert("prepared_served".into(), serde_json::Value::from(p.served));
            a.insert("prepared_missed".into(), serde_json::Value::from(p.missed));
            a.insert(
                "prepared_complete".into(),
                serde_json::Value::from(p.complete()),
            );
        }
        Ok((Decoded::Frames(frames), a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_paths_round_trip_and_pick_their_tiles() {
        for p in ConvPath::ALL {
            assert_eq!(ConvPath::parse(p.name()), Some(p));
        }
        assert_eq!(ConvPath::Igemm.igemm_kernel(48).0, "conv3d_128x64");
        assert_eq!(ConvPath::Igemm.igemm_kernel(128).0, "conv3d_128x128");
        assert_eq!(ConvPath::IgemmWide.igemm_kernel(1024).0, "conv3d_256x128");
        assert_eq!(ConvPath::IgemmWide.igemm_kernel(1024).4, 92_160);
        assert!(crate::cuda::kit::kernels::big_smem_kernels()
            .iter()
            .all(|(_, b)| *b <= 227 * 1024));
        let names = crate::cuda::kit::kernels::kernel_names(crate::cuda::kit::nvrtc::VAE_CU);
        for (k, _) in crate::cuda::kit::kernels::big_smem_kernels() {
            assert!(names.iter().any(|n| n == k), "{k} missing from vae.cu");
        }
        for k in [
            "vae_norm",
            "vae_bias_add",
            "vae_d2s",
            "vae_pixels",
            "vae_permute",
            "vae_rgb8",
        ] {
            assert!(names.iter().any(|n| n == k), "{k} missing from vae.cu");
        }
    }

    #[test]
    fn downloads_say_what_crosses_and_rgb8_staging_needs_three_colours() {
        assert!(Download::Both.f32() && Download::Both.rgb8());
        assert!(!Download::None.f32() && !Download::None.rgb8());
        assert!(Download::F32.f32() && !Download::F32.rgb8());
        assert!(!Download::Rgb8.f32() && Download::Rgb8.rgb8());
        assert_eq!(DecodeOptions::render(4).download, Download::Rgb8);
        let geom = (3, 121, 512, 768);
        assert_eq!(device::rgb8_staging_bytes(5, geom), 5 * 512 * 768 * 3);
        assert_eq!(device::rgb8_staging_bytes(5, (4, 121, 512, 768)), 0);
        // decode_bytes counts it: a quarter of the f32 staging on top.
        let cfg = crate::presets::vae_095();
        let st = Stream::new(&cfg, (16, 16, 24), 4, Mutation::None, &mut |_, _| Ok(0)).unwrap();
        let cap = st.pixel_frames_cap();
        let elems: usize = stream::buffer_elems(&cfg, (16, 16, 24), 4)
            .unwrap()
            .iter()
            .sum();
        let f32_staging = cap * 3 * 512 * 768 * 4;
        assert_eq!(
            decode_bytes(&cfg, (16, 16, 24), 4).unwrap() as usize,
            (elems + temb_elems(&cfg)) * 2 + f32_staging + f32_staging / 4
        );
    }

    /// The rung-2 render (ltxv-2b VAE, latent 16 x 16 x 24, chunks of 4)
    /// page-locks two halves of the stream's 33-frame cap of 768x512 RGB8:
    /// 2 x 33 x 512 x 768 x 3 = 77,856,768 bytes, what the device's load.vae
    /// close said as `decode_pinned_bytes` (bundle 27f7b8aa3adc, s31-dev1). A
    /// four-colour clip pins nothing.
    #[test]
    fn pinned_bytes_are_two_halves_of_the_pixel_cap() {
        let cfg = crate::presets::vae_095();
        assert_eq!(pinned_bytes(&cfg, (16, 16, 24), 4).unwrap(), 77_856_768);
        let (_, cap) = shapes::decode_shapes(&cfg, (4, 10, 16), 4).unwrap();
        assert_eq!(
            pinned_bytes(&cfg, (4, 10, 16), 4).unwrap(),
            (2 * cap * 320 * 512 * 3) as u64
        );
        assert!(pinned_bytes(&cfg, (16, 16, 24), 0).is_err());
    }

    #[test]
    fn decode_bytes_grow_with_the_chunk_and_count_every_buffer() {
        let cfg = crate::presets::vae_095();
        let a = decode_bytes(&cfg, (16, 16, 24), 1).unwrap();
        let b = decode_bytes(&cfg, (16, 16, 24), 4).unwrap();
        assert!(b > a && a > 0);
        assert_eq!(decode_bytes(&cfg, (40, 16, 24), 4).unwrap(), b);
        // The last stage dominates: at least the conv windows of ten convolutions.
        assert!(a > 10 * 4 * 24576 * 128 * 2, "{a}");
        assert_eq!(reorder_bytes(&cfg), 4096 * 1024 * 27 * 2);
    }
}
