//! The CUDA arm behind the pipeline's [`Denoiser`]: the transformer staged once
//! onto the device, the whole denoise loop device-resident.
//!
//! Latents, both velocities and both prompts' text states live on the device
//! from [`Denoiser::begin`] to [`Denoiser::finish`]: a step enqueues its
//! forward(s) and the guided Euler update (`guided_euler`: classifier-free
//! guidance and the Euler step in one kernel) on the compute stream and
//! returns; the host only reads CUDA events back, and copies the latents once,
//! at the end. Events bracket each forward and each step (two steps may be in
//! flight, so there are two sets), giving `device_ms` for the markers.
//! [`open_cuda_denoiser`] turns a machine without CUDA into
//! [`CudaError::NotAvailable`] instead of a panic.
//!
//! # Dispatch (lever `denoise-graph`)
//!
//! [`Dispatch::Eager`] launches every kernel and GEMM of both forwards from the
//! host each step (~25 launches per block, ~700 per ltxv-2b forward).
//! [`Dispatch::Graph`] captures each forward ONCE, when the loop is readied at
//! open (see below), as a CUDA graph (stream capture, instantiate, upload) and
//! replays it every step of every loop: one graph launch per forward.
//!
//! # Readied at open
//!
//! [`CudaDenoiser::new`] (inside `load.dit`) allocates the forward's workspace and
//! the loop's buffer, runs the warm-up forwards (one block per prompt: every
//! GEMM plan, every kernel's lazy load, cuDNN's attention plan and its kernels'
//! first load) and, with a graph, captures the forwards. So the one-time host
//! work of a first launch (the `warm_up_ms` of `load.dit`'s close; its device
//! figures are in reports/device-notes.md, 2026-12-04) is paid in the load that
//! readies the model, and the `denoise` phase
//! holds the loop alone: [`Denoiser::begin`] only uploads the latents into the
//! buffer the graphs already point at. The buffer and the graphs live until the
//! denoiser is dropped, so a second loop replays the same graphs.
//!
//! - What is captured: one graph per prompt (the unconditional forward writing
//!   v_uncond, the conditional one writing v_cond). The guided Euler update stays
//!   a plain launch after them. So the step keeps the eager loop's events: the
//!   host records them between graph launches, each forward's span holds that
//!   forward's kernels only, and `dit.forward` ticks keep their `device_ms` on
//!   both arms (the campaign's GPU-busy share is the sum of those over the
//!   denoise wall: one whole-step graph would lose it). The price is two graph
//!   launches per guided step instead of one, a few microseconds. Under
//!   `guidance-batch = batched` a guided step is one forward over both samples
//!   (v_cond and v_uncond written side by side): one graph, one `dit.forward`
//!   span a step (`Denoiser::forwards_per_step` says 1).
//! - The step's scalars are not baked in. The noise level enters a forward only
//!   through the timestep embedding: the captured forwards read t = sigma x 1000
//!   from one device f32 (the t slot after the velocities in the loop's buffer,
//!   [`Timestep::At`]), and each step first writes its t there with a 4-byte
//!   `cuMemsetD32Async` on the compute stream. Stream order puts that write after
//!   the previous step's forwards and before this step's, so two steps may be in
//!   flight. dt = sigma_next - sigma rides by value in the `guided_euler` launch,
//!   as on the eager arm. Alternatives not taken: a device array of every step's
//!   t indexed by a device-side counter needs the whole schedule at `begin` (the
//!   [`Denoiser`] contract hands sigmas over step by step) and a counter that can
//!   drift from the host's step; patching the instantiated graph's kernel nodes
//!   (`cuGraphExecKernelNodeSetParams`) each step needs the nodes found by
//!   function handle and a host API call per patched node, for the same effect.
//! - Bit-identity with the eager arm: the same kernels in the same order with the
//!   same arguments; the eager and the graph timestep kernels share one
//!   non-inlined body and get the same f32 t (computed on the host as
//!   `sigma * 1000.0` either way); the GEMMs use the cached cuBLASLt plans (one
//!   algorithm per shape) and the one preallocated workspace
//!   ([`crate::cuda::kit::gemm::WORKSPACE_BYTES`]). `engine selftest-cuda` checks it
//!   (`check_graph`, tolerance 0).
//! - Capture needs no host synchronisation and no allocation: the warm-up
//!   forwards before it (with the graph's timestep kernel) build every GEMM plan
//!   and load every kernel first, and readying refuses a capture that grew the
//!   plan cache or the device allocations. Capture mode is thread-local: a
//!   forbidden call from this thread (a synchronising copy, a cuMemAlloc) ends
//!   the capture with an error instead of running outside the graph.
//! - The `denoise` close carries `graph` (bool); `load.dit`'s close carries
//!   `warm_up_ms` (host milliseconds of the warm-up forwards) and, with a graph,
//!   `graph_capture_ms` (host milliseconds of capture, instantiate and upload).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUdeviceptr, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{result as dres, CudaEvent, CudaGraph, CudaStream};

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::memory::{download, upload, DeviceBuffer, MemTracker, ALIGN};
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::{
    DeviceDit, DitDims, ForwardArms, Geometry, Precision, TextKv, TextSlot, Timestep, Workspace,
    FP8_BOUNCE_BOUND, LATENT_CHANNELS,
};
use crate::cuda::staging::{OpenReport, StagingOptions};
use crate::cuda::{CudaError, DriverContext};
use crate::denoise::{Conditioning, DenoiseError, Denoiser, StepQueue, IN_FLIGHT};
use crate::models::dit::DitConfig;
use crate::tensor::Tensor;
use crate::weights::safetensors::Extent;

/// Events of one step: start, after each forward, end.
struct StepEvents {
    start: CudaEvent,
    forwards: [CudaEvent; 2],
    end: CudaEvent,
}

impl StepEvents {
    fn new(gpu: &Gpu) -> Result<StepEvents, CudaError> {
        Ok(StepEvents {
            start: gpu.event()?,
            forwards: [gpu.event()?, gpu.event()?],
            end: gpu.event()?,
        })
    }
}

/// How a step's forwards reach the GPU (lever `denoise-graph`; see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// Every kernel and GEMM launched from the host each step.
    Eager,
    /// Each forward captured once at open as a CUDA graph, replayed each step.
    Graph,
}

impl Dispatch {
    /// The dispatch of the `denoise-graph` arm (`on` = graph).
    pub fn from_graph_lever(on: bool) -> Dispatch {
        if on {
            Dispatch::Graph
        } else {
            Dispatch::Eager
        }
    }

    /// Stable name (`eager`, `graph`).
    pub fn name(self) -> &'static str {
        match self {
            Dispatch::Eager => "eager",
            Dispatch::Graph => "graph",
        }
    }
}

/// Bytes after the three latent-sized buffers: the step's t (one f32), padded.
pub const TIMESTEP_SLOT_BYTES: usize = ALIGN;

/// The captured forwards of [`Dispatch::Graph`]: the unconditional and the
/// conditional one, or (`guidance-batch = batched`) one forward over both,
/// held as `cond`.
struct StepGraphs {
    uncond: Option<CudaGraph>,
    cond: CudaGraph,
}

/// Device addresses inside the loop's buffer.
#[derive(Debug, Clone, Copy)]
struct IoPtrs {
    lat: CUdeviceptr,
    vc: CUdeviceptr,
    vu: CUdeviceptr,
    /// The step's t = sigma x 1000 (f32), read by captured forwards.
    t: CUdeviceptr,
}

/// The device-resident denoise loop.
pub struct CudaDenoiser {
    dit: DeviceDit,
    cond: TextSlot,
    uncond: Option<TextSlot>,
    guidance: f32,
    geo: Geometry,
    dispatch: Dispatch,
    /// Samples one forward runs: 2 when a guided step's pair runs as one
    /// batched forward (lever `guidance-batch`), else 1.
    samples: usize,
    /// lat, v_cond, v_uncond: f32 [n, 128] each, then the t slot (from
    /// readying to drop).
    io: Option<DeviceBuffer>,
    /// With [`Dispatch::Graph`], from readying to drop.
    graphs: Option<StepGraphs>,
    /// Host ms of the capture (capture, instantiate, upload).
    capture_ms: Option<f64>,
    /// Host ms of the warm-up forwards (launch to completion).
    warm_up_ms: Option<f64>,
    /// Between `begin` and `finish`.
    looping: bool,
    /// The selftest's mutation: steps stop writing their t.
    skip_t_write: bool,
    events: Vec<StepEvents>,
    loop_start: CudaEvent,
    loop_end: CudaEvent,
    queued: StepQueue<()>,
    started: bool,
    /// The device context, kernels and cuBLASLt handle; declared last so every
    /// buffer above is freed while the context is alive.
    _rig: DeviceKit,
}

/// The CUDA arm's errors inside the denoise boundary's error (`?` in the
/// arm's [`Denoiser`] methods), shown as they are.
impl From<CudaError> for DenoiseError {
    fn from(e: CudaError) -> DenoiseError {
        DenoiseError::Device(e.into())
    }
}

/// Open GPU 0, stage the transformer's tensors (`tensors`: the extents of the
/// validated checkpoint, possibly over several files) with `staging`, bind them
/// and upload the conditioning. The geometry (latent grid and fps) fixes the
/// workspace; `dispatch` is the `denoise-graph` lever's arm and `arms`
/// the forward's kernel arms (levers `attention`, `cross-attention`, `qk-norm`,
/// `precision`; cuDNN is loaded here when one of them runs on it).
///
/// With `precision = fp8` the DiT is loaded fp8-resident
/// ([`DeviceDit::load_fp8_resident`]): the block Linears' weights are quantized
/// to e4m3 window by window as they are staged, through a bounce buffer of at
/// most [`FP8_BOUNCE_BOUND`] freed before this returns, and never stay in
/// bf16, so their device memory halves instead of growing by the e4m3 copies.
/// The staging report still counts every byte copied (all of them bf16, as on
/// the bf16 arm). Such a denoiser runs fp8 only.
pub fn open_cuda_denoiser(
    tensors: &[Extent],
    cfg: &DitConfig,
    staging: &StagingOptions,
    cond: &Conditioning,
    geo: Geometry,
    dispatch: Dispatch,
    arms: ForwardArms,
) -> Result<(CudaDenoiser, OpenReport), CudaError> {
    let dims = DitDims::from_config(cfg)?;
    let t0 = Instant::now();
    let kit = DeviceKit::open()?;
    let device_open_s = t0.elapsed().as_secs_f64();
    let opened = kit.opened;
    let (mut dit, report) = match arms.precision {
        Precision::Fp8 => {
            DeviceDit::load_fp8_resident(&kit, dims, tensors, staging, FP8_BOUNCE_BOUND)?
        }
        Precision::Bf16 => DeviceDit::load_bf16(&kit, dims, tensors, staging)?,
    };
    dit.set_arms(arms)?;
    let den = CudaDenoiser::new(kit, dit, cond, geo, dispatch)?;
    Ok((
        den,
        OpenReport {
            device_open_s,
            opened,
            staging: report,
        },
    ))
}

/// Device bytes the arm holds besides the staged weights once the DiT is
/// loaded, with `prompts` prompts of `l` text tokens on `dims`: the cuBLASLt
/// workspace, the RoPE table and the text slots.
pub fn loaded_bytes(dims: &DitDims, l: usize, prompts: usize) -> u64 {
    (crate::cuda::kit::gemm::WORKSPACE_BYTES
        + DeviceDit::rope_bytes(dims)
        + prompts * TextSlot::bytes_for(dims, l)) as u64
}

/// Device bytes `text-kv = cached` adds once the loop is readied: each of
/// `prompts` prompts' keys and values of `l` text tokens ([`TextKv`]).
pub fn text_kv_bytes(dims: &DitDims, l: usize, prompts: usize) -> u64 {
    (prompts * TextKv::bytes_for(dims, l)) as u64
}

/// Device bytes the denoise loop adds over `n` tokens: the forward's workspace
/// for `samples` samples a forward (2 under `guidance-batch = batched` with
/// guidance, else 1) and the latents with their two velocities and the t slot
/// (on both arms).
pub fn loop_bytes(dims: &DitDims, n: usize, l: usize, samples: usize) -> u64 {
    (Workspace::bytes_for(dims, n, l, samples) + 3 * n * LATENT_CHANNELS * 4 + TIMESTEP_SLOT_BYTES)
        as u64
}

/// Capture what `enqueue` puts on `stream` as an instantiated graph. The
/// capture is ended even when `enqueue` fails (then its error is returned).
fn capture(
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<(), CudaError>,
) -> Result<CudaGraph, CudaError> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ctx("beginning a stream capture")?;
    let queued = enqueue();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    queued?;
    graph
        .ctx("ending the capture and instantiating the graph")?
        .ok_or_else(|| CudaError::Invalid("the forward's capture is empty".into()))
}

impl CudaDenoiser {
    /// A loop over `dit` (built on `kit`'s device) conditioned on `cond` over
    /// `geo`, dispatching steps as `dispatch` says, readied: workspace and loop
    /// buffer allocated, warm-up forwards run and (with a graph) the forwards
    /// captured (see the module doc). `kit` is kept, and dropped last.
    pub fn new(
        kit: DeviceKit,
        dit: DeviceDit,
        cond: &Conditioning,
        geo: Geometry,
        dispatch: Dispatch,
    ) -> Result<CudaDenoiser, CudaError> {
        let dims = *dit.dims();
        let slot = |t: &crate::denoise::TextCond| {
            TextSlot::upload(&kit.gpu, &dims, t.states.data(), &t.mask)
        };
        let c = slot(&cond.cond)?;
        let u = cond.uncond.as_ref().map(slot).transpose()?;
        let events = (0..IN_FLIGHT)
            .map(|_| StepEvents::new(&kit.gpu))
            .collect::<Result<_, _>>()?;
        let (loop_start, loop_end) = (kit.gpu.event()?, kit.gpu.event()?);
        let samples = dit.arms().guidance.samples(1 + usize::from(u.is_some()));
        let mut den = CudaDenoiser {
            dit,
            cond: c,
            uncond: u,
            guidance: cond.guidance,
            geo,
            dispatch,
            samples,
            io: None,
            graphs: None,
            capture_ms: None,
            warm_up_ms: None,
            looping: false,
            skip_t_write: false,
            events,
            loop_start,
            loop_end,
            queued: Default::default(),
            started: false,
            _rig: kit,
        };
        den.ready()?;
        Ok(den)
    }

    /// Host milliseconds of the warm-up forwards run while readying.
    pub fn warm_up_ms(&self) -> Option<f64> {
        self.warm_up_ms
    }

    /// Allocate the workspace and the loop's buffer (zeroed), run one
    /// one-block warm-up forward per prompt (one over both samples when the
    /// pair is batched) and, with a graph, capture the forwards. Before any
    /// event is recorded: the warm-up takes the first
    /// launch's host work out of forward 1's event span, where the idle GPU
    /// would count as busy. Its output (into v_cond) is overwritten by the
    /// first real forward. With a graph it runs the graph's timestep kernel,
    /// so the capture loads nothing.
    fn ready(&mut self) -> Result<(), CudaError> {
        if self.io.is_some() {
            return Ok(());
        }
        let (n, l) = (self.n(), self.l());
        self.dit.workspace_for(n, l, self.samples)?;
        // Each prompt's cross-attention keys and values, once (`text-kv =
        // cached`; nothing on `per-forward`), before the warm-up reads them.
        self.dit.prepare_text(&mut self.cond)?;
        if let Some(u) = self.uncond.as_mut() {
            self.dit.prepare_text(u)?;
        }
        let gpu = self.dit.gpu().clone();
        let bytes = 3 * n * LATENT_CHANNELS * 4 + TIMESTEP_SLOT_BYTES;
        let io = DeviceBuffer::alloc(&gpu, bytes, "the denoise loop's latents")?;
        // SAFETY: the whole of the buffer just allocated, on its context's stream.
        unsafe { dres::memset_d8_async(io.ptr(), 0, bytes, gpu.compute.cu_stream()) }
            .ctx("zeroing the denoise loop's buffer")?;
        self.io = Some(io);
        let t0 = Instant::now();
        let p = self.ptrs()?;
        let ts = match self.dispatch {
            Dispatch::Eager => Timestep::Sigma(1.0),
            Dispatch::Graph => {
                self.write_t(p.t, 1.0)?;
                Timestep::At(p.t)
            }
        };
        match (&self.uncond, self.samples) {
            (Some(u), 2) => {
                let texts = [&self.cond, u];
                self.dit
                    .enqueue_warm_up(p.lat, ts, self.geo, &texts, p.vc)?;
            }
            (u, _) => {
                if let Some(u) = u {
                    self.dit.enqueue_warm_up(p.lat, ts, self.geo, &[u], p.vc)?;
                }
                self.dit
                    .enqueue_warm_up(p.lat, ts, self.geo, &[&self.cond], p.vc)?;
            }
        }
        gpu.sync_compute()?;
        self.warm_up_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        if self.dispatch == Dispatch::Graph {
            self.capture_forwards(p)?;
        }
        Ok(())
    }

    /// The device allocator's tracker (for `peak_device_bytes`).
    pub fn mem(&self) -> Arc<MemTracker> {
        self.dit.gpu().mem.clone()
    }

    /// The loaded cuDNN's version when the self-attention runs on cuDNN.
    pub fn cudnn_version(&self) -> Option<usize> {
        self.dit.cudnn_version()
    }

    /// The FP8 GEMM shapes that asked for `fp8-accum = fast` and run exact
    /// (planned in the load's warm-up forwards); see
    /// [`DeviceDit::fp8_fast_refused`].
    pub fn fp8_fast_refused(&self) -> Vec<(usize, usize, usize)> {
        self.dit.fp8_fast_refused()
    }

    /// What `gemm-algo = tuned` did while the loop was readied (timed or read
    /// from the machine's cache; empty on `heuristic`).
    pub fn gemm_tune_report(&self) -> crate::cuda::kit::gemm_tune::TuneReport {
        self.dit.gemm().tune_report()
    }

    /// How steps are dispatched.
    pub fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// The selftest's mutation (never set by a render): graph steps stop writing
    /// their t, so every forward replays the warm-up's t (sigma 1). The
    /// graph-vs-eager check must fail on it.
    #[doc(hidden)]
    pub fn mutate_skip_timestep_write(&mut self) {
        self.skip_t_write = true;
    }

    fn n(&self) -> usize {
        self.geo.grid.0 * self.geo.grid.1 * self.geo.grid.2
    }

    /// The longest text a forward reads.
    fn l(&self) -> usize {
        self.uncond
            .as_ref()
            .map_or(self.cond.l, |u| u.l.max(self.cond.l))
    }

    fn ptrs(&self) -> Result<IoPtrs, CudaError> {
        let io = self
            .io
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("the loop's buffer before readying".into()))?;
        let b = (self.n() * LATENT_CHANNELS * 4) as u64;
        Ok(IoPtrs {
            lat: io.ptr(),
            vc: io.ptr() + b,
            vu: io.ptr() + 2 * b,
            t: io.ptr() + 3 * b,
        })
    }

    /// Write t = `sigma` x 1000 into the t slot, in stream order (the same f32
    /// product the eager timestep kernel gets by value).
    fn write_t(&self, slot: CUdeviceptr, sigma: f32) -> Result<(), CudaError> {
        let t = sigma * 1000.0;
        // SAFETY: the slot is 4 aligned bytes inside the loop's buffer.
        unsafe {
            cudarc::driver::sys::cuMemsetD32Async(
                slot,
                t.to_bits(),
                1,
                self.dit.gpu().compute.cu_stream(),
            )
        }
        .result()
        .ctx("writing the step's timestep")
    }

    /// Capture each forward as a graph (after the warm-up: no plan is built and
    /// nothing allocated inside, which is checked).
    fn capture_forwards(&mut self, p: IoPtrs) -> Result<(), CudaError> {
        let gpu = self.dit.gpu().clone();
        let plans = self.dit.gemm().cached_plans();
        let held = gpu.mem.current();
        let t0 = Instant::now();
        let ts = Timestep::At(p.t);
        let (dit, geo) = (&self.dit, self.geo);
        let (uncond, cond) = match (&self.uncond, self.samples) {
            // Both samples in one forward: v_cond then v_uncond, adjacent.
            (Some(u), 2) => {
                let texts = [&self.cond, u];
                let both = capture(&gpu.compute, || {
                    dit.enqueue_batch_at(p.lat, ts, geo, &texts, p.vc)
                })?;
                (None, both)
            }
            (u, _) => {
                let uncond = match u {
                    Some(u) => Some(capture(&gpu.compute, || {
                        dit.enqueue_at(p.lat, ts, geo, u, p.vu)
                    })?),
                    None => None,
                };
                let cond = capture(&gpu.compute, || {
                    dit.enqueue_at(p.lat, ts, geo, &self.cond, p.vc)
                })?;
                (uncond, cond)
            }
        };
        for g in uncond.iter().chain([&cond]) {
            g.upload().ctx("uploading a captured forward")?;
        }
        gpu.sync_compute()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let (plans_after, held_after) = (self.dit.gemm().cached_plans(), gpu.mem.current());
        if plans_after != plans || held_after != held {
            return Err(CudaError::Invalid(format!(
                "capturing the forwards built {} GEMM plans and changed the device allocations \
                 by {} bytes: the warm-up must leave nothing to build",
                plans_after.saturating_sub(plans),
                held_after as i64 - held as i64
            )));
        }
        self.graphs = Some(StepGraphs { uncond, cond });
        self.capture_ms = Some(ms);
        Ok(())
    }

    /// Fill both velocities and the forward's workspace with NaN bytes on the
    /// compute stream (a check's poison: every step must write them again).
    pub fn poison_outputs(&mut self) -> Result<(), CudaError> {
        let p = self.ptrs()?;
        let (n, l) = (self.n(), self.l());
        let gpu = self.dit.gpu().clone();
        self.dit.workspace(n, l)?.poison(&gpu)?;
        // SAFETY: v_cond and v_uncond are the 2 x n x 128 f32 after the latents.
        unsafe {
            dres::memset_d8_async(
                p.vc,
                0xFF,
                2 * n * LATENT_CHANNELS * 4,
                gpu.compute.cu_stream(),
            )
        }
        .ctx("poisoning the velocities")
    }

    /// The batched forward of a guided step (`guidance-batch = batched`): the
    /// captured graph, or the eager launches, writing v_cond and v_uncond.
    fn forward_both(&self, sigma: f32, p: IoPtrs) -> Result<(), CudaError> {
        let u = self
            .uncond
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("a batched forward without guidance".into()))?;
        match self.dispatch {
            Dispatch::Eager => {
                let texts = [&self.cond, u];
                let ts = Timestep::Sigma(sigma);
                self.dit.enqueue_batch_at(p.lat, ts, self.geo, &texts, p.vc)
            }
            Dispatch::Graph => self
                .graphs
                .as_ref()
                .ok_or_else(|| CudaError::Invalid("a graph step without captured forwards".into()))?
                .cond
                .launch()
                .ctx("launching the captured batched forward"),
        }
    }

    /// One forward of the step: the captured graph, or the eager launches.
    fn forward(&self, uncond: bool, sigma: f32, p: IoPtrs) -> Result<(), CudaError> {
        let (text, out) = match (uncond, &self.uncond) {
            (true, Some(u)) => (u, p.vu),
            (true, None) => return Err(CudaError::Invalid("no unconditional prompt".into())),
            (false, _) => (&self.cond, p.vc),
        };
        match self.dispatch {
            Dispatch::Eager => self.dit.enqueue_forward(p.lat, sigma, self.geo, text, out),
            Dispatch::Graph => {
                let g = self.graphs.as_ref().ok_or_else(|| {
                    CudaError::Invalid("a graph step without captured forwards".into())
                })?;
                let graph = if uncond {
                    g.uncond.as_ref()
                } else {
                    Some(&g.cond)
                };
                graph
                    .ok_or_else(|| CudaError::Invalid("no captured unconditional forward".into()))?
                    .launch()
                    .ctx("launching a captured forward")
            }
        }
    }
}

fn order(msg: String) -> DenoiseError {
    DenoiseError::Order(msg)
}

impl Denoiser for CudaDenoiser {
    fn arm(&self) -> &'static str {
        "cuda"
    }

    fn begin(&mut self, latents: Tensor) -> Result<(), DenoiseError> {
        let n = self.n();
        if latents.shape() != [n, LATENT_CHANNELS] {
            return Err(order(format!(
                "latents of shape {:?} for grid {:?} (needs [{n}, {LATENT_CHANNELS}])",
                latents.shape(),
                self.geo.grid
            )));
        }
        self.started = false;
        // Readied at open (a no-op here).
        self.ready()?;
        let gpu = self.dit.gpu().clone();
        upload(&gpu, self.ptrs()?.lat, latents.data())?;
        self.looping = true;
        Ok(())
    }

    fn enqueue(&mut self, step: usize, sigma: f32, sigma_next: f32) -> Result<(), DenoiseError> {
        if !self.looping {
            return Err(order(format!("step {step} enqueued outside begin..finish")));
        }
        let p = self.ptrs()?;
        // Refuses a third pending step: its events would still be in use.
        self.queued.push(step, ())?;
        let gpu = self.dit.gpu().clone();
        let s = &gpu.compute;
        let ev = &self.events[step % IN_FLIGHT];
        let rec = |e: &CudaEvent| e.record(s).ctx("recording a step event");
        if !self.started {
            rec(&self.loop_start)?;
            self.started = true;
        }
        rec(&ev.start)?;
        if self.dispatch == Dispatch::Graph && !self.skip_t_write {
            // Inside the first forward's span, where the eager arm's timestep
            // kernel takes its t by value.
            self.write_t(p.t, sigma)?;
        }
        if self.samples == 2 {
            self.forward_both(sigma, p)?;
            rec(&ev.forwards[0])?;
        } else {
            let mut f = 0;
            if self.uncond.is_some() {
                self.forward(true, sigma, p)?;
                rec(&ev.forwards[f])?;
                f += 1;
            }
            self.forward(false, sigma, p)?;
            rec(&ev.forwards[f])?;
        }
        let u = if self.uncond.is_some() { p.vu } else { 0 };
        let n = self.n() * LATENT_CHANNELS;
        self.dit
            .kernels()
            .guided_euler(s, p.lat, p.vc, u, self.guidance, sigma_next - sigma, n)?;
        rec(&ev.end)?;
        Ok(())
    }

    fn wait(
        &mut self,
        step: usize,
        on_forward: &mut dyn FnMut(Option<f64>),
    ) -> Result<Option<f64>, DenoiseError> {
        self.queued.pop(step)?;
        let ev = &self.events[step % IN_FLIGHT];
        let forwards = self.forwards_per_step();
        let mut from = &ev.start;
        for e in &ev.forwards[..forwards] {
            e.synchronize().ctx("waiting for a forward")?;
            let ms = from.elapsed_ms(e).ctx("reading a forward's events")?;
            on_forward(Some(ms as f64));
            from = e;
        }
        ev.end.synchronize().ctx("waiting for a step")?;
        let ms = ev
            .start
            .elapsed_ms(&ev.end)
            .ctx("reading a step's events")?;
        Ok(Some(ms as f64))
    }

    fn finish(&mut self) -> Result<(Tensor, Option<f64>), DenoiseError> {
        self.queued.check_empty()?;
        let lat = self.ptrs()?.lat;
        let gpu = self.dit.gpu().clone();
        self.loop_end
            .record(&gpu.compute)
            .ctx("recording the loop end")?;
        let n = self.n();
        let v = download::<f32>(&gpu, lat, n * LATENT_CHANNELS)?;
        let ms = if self.started {
            Some(
                self.loop_start
                    .elapsed_ms(&self.loop_end)
                    .ctx("reading the loop events")? as f64,
            )
        } else {
            None
        };
        // The buffer and the graphs stay for the next loop.
        self.looping = false;
        if !v.iter().all(|x| x.is_finite()) {
            return Err(DenoiseError::NonFinite(
                "on the device (after the last step)".into(),
            ));
        }
        let t =
            Tensor::new(&[n, LATENT_CHANNELS], v).map_err(|e| order(format!("latents: {e}")))?;
        Ok((t, ms))
    }

    fn graph_capture_ms(&self) -> Option<f64> {
        self.capture_ms
    }

    fn forwards_per_step(&self) -> usize {
        match (&self.uncond, self.samples) {
            (Some(_), 1) => 2,
            _ => 1,
        }
    }
}

/// What one [`run_loop`] measured.
#[derive(Debug, Clone)]
pub struct LoopRun {
    /// The final latents `[tokens, 128]`.
    pub latents: Tensor,
    /// Every forward's device milliseconds (CUDA events), in order.
    pub forward_ms: Vec<f64>,
    /// Every step's device milliseconds (CUDA events), in order.
    pub step_ms: Vec<f64>,
    /// Host seconds from the first `enqueue` to the last `wait`'s return.
    pub wall_s: f64,
    /// Host seconds spent inside `enqueue` calls (the dispatch cost).
    pub enqueue_s: f64,
    /// Host ms of the graph capture at open (graph dispatch only).
    pub capture_ms: Option<f64>,
}

/// Drive `den` over `sigmas` (steps + 1 values) from `latents` as the pipeline
/// does (begin; step k + 1 queued before step k is waited for; finish), for
/// checks and benchmarks. With `poison` the velocities and the workspace are
/// NaN bytes before step 1 (after `begin`'s warm-up and capture).
pub fn run_loop(
    den: &mut CudaDenoiser,
    latents: Tensor,
    sigmas: &[f32],
    poison: bool,
) -> Result<LoopRun, DenoiseError> {
    let steps = sigmas.len().saturating_sub(1);
    if steps == 0 {
        return Err(order("a loop needs at least two sigmas".into()));
    }
    den.begin(latents)?;
    if poison {
        den.poison_outputs()?;
    }
    let (mut forward_ms, mut step_ms) = (Vec::new(), Vec::new());
    let mut enqueue_s = 0.0;
    let t0 = Instant::now();
    let mut enqueue = |den: &mut CudaDenoiser, k: usize| -> Result<(), DenoiseError> {
        let t = Instant::now();
        den.enqueue(k, sigmas[k], sigmas[k + 1])?;
        enqueue_s += t.elapsed().as_secs_f64();
        Ok(())
    };
    enqueue(den, 0)?;
    for k in 0..steps {
        if k + 1 < steps {
            enqueue(den, k + 1)?;
        }
        let ms = den.wait(k, &mut |ms| forward_ms.extend(ms))?;
        step_ms.extend(ms);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let (latents, _) = den.finish()?;
    Ok(LoopRun {
        latents,
        forward_ms,
        step_ms,
        wall_s,
        enqueue_s,
        capture_ms: den.graph_capture_ms(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::denoise::TextCond;

    #[test]
    fn the_device_arm_without_cuda_is_a_clean_error() {
        let cfg = crate::presets::dit_tiny();
        let cond = Conditioning {
            cond: TextCond {
                states: Tensor::zeros(&[2, 64]),
                mask: vec![1.0, 0.0],
            },
            uncond: None,
            guidance: 1.0,
        };
        let r = std::panic::catch_unwind(|| {
            open_cuda_denoiser(
                &[],
                &cfg,
                &StagingOptions::new(crate::cuda::staging::StagingMethod::Batched),
                &cond,
                Geometry {
                    grid: (1, 2, 2),
                    fps: 25.0,
                },
                Dispatch::Graph,
                ForwardArms::OWN,
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
    fn projected_bytes_grow_with_prompts_and_tokens() {
        let d = DitDims::LTXV_2B;
        let l = 128;
        assert_eq!(
            loaded_bytes(&d, l, 2) - loaded_bytes(&d, l, 1),
            TextSlot::bytes_for(&d, l) as u64
        );
        assert!(loaded_bytes(&d, l, 1) > (32 << 20));
        // x f32 + 6 bf16 [n, D] + ff [n, 4D] dominate: ~24 bytes x n x D.
        let (a, b) = (loop_bytes(&d, 640, l, 1), loop_bytes(&d, 1280, l, 1));
        assert!(
            b - a > 640 * 2048 * 24 && b - a < 640 * 2048 * 26,
            "{a} {b}"
        );
    }
}
