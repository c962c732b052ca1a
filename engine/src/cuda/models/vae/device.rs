//! The decoder's primitives on the device: bf16 activations in tracked
//! buffers, f32 arithmetic in the kernels (`kernels/vae.cu`), the 3x3x3
//! convolutions through the chosen [`ConvPath`], the time embeddings through
//! cuBLASLt, every launch on the compute stream.

use cudarc::driver::result as dres;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaEvent;

use crate::cuda::kit::bf16::narrow;
use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::gemm::{Epilogue, Gemm};
use crate::cuda::kit::kernels::{igemm_smem, Kernels, Map, Params, NULL};
use crate::cuda::kit::memory::{download, upload, DeviceBuffer};
use crate::cuda::models::vae::cudnn::CudnnConv;
use crate::cuda::models::vae::ops::{HasBias, Loc, Mutation, NormOp, VaeOps, SINUSOID};
use crate::cuda::models::vae::pool::Queue;
use crate::cuda::models::vae::rgb8::{rgb8_bytes, Rgb8Mutation, RGB8_POISON};
use crate::cuda::models::vae::Download;
use crate::cuda::staging::{DeviceWeights, Pinned};
use crate::cuda::{CudaError, DriverContext};
use crate::frames::Frame;

/// How the 3x3x3 convolutions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPath {
    /// The engine's implicit-GEMM kernel (`conv3d_128x128` / `conv3d_128x64`).
    Igemm,
    /// The kernel with 256 x 128 tiles and 64 x 64 warp tiles (`conv3d_256x128`).
    IgemmWide,
    /// cuDNN's `cudnnConvolutionForward` (NDHWC, bf16, f32 compute).
    Cudnn,
}

impl ConvPath {
    /// Every path, in a stable order.
    pub const ALL: [ConvPath; 3] = [ConvPath::Igemm, ConvPath::IgemmWide, ConvPath::Cudnn];

    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            ConvPath::Igemm => "igemm",
            ConvPath::IgemmWide => "igemm-wide",
            ConvPath::Cudnn => "cudnn",
        }
    }

    /// Parse a name.
    pub fn parse(s: &str) -> Option<ConvPath> {
        ConvPath::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The kernel and tile of the implicit GEMM for `co` output channels:
    /// (name, block threads, tile rows, tile columns, shared bytes).
    pub fn igemm_kernel(self, co: usize) -> (&'static str, u32, usize, usize, u32) {
        if co < 128 {
            ("conv3d_128x64", 128, 128, 64, igemm_smem(128, 64, 4))
        } else if self == ConvPath::IgemmWide {
            ("conv3d_256x128", 256, 256, 128, igemm_smem(256, 128, 3))
        } else {
            ("conv3d_128x128", 256, 128, 128, igemm_smem(128, 128, 4))
        }
    }
}

/// A device vector (bf16).
#[derive(Debug, Clone, Copy)]
pub struct DevVec {
    /// Address.
    pub ptr: CUdeviceptr,
    /// Elements.
    pub len: usize,
}

/// A device convolution: weight `[co][taps][ci]` bf16 (k = 3: reordered at
/// load) or `[co][ci]` (k = 1), bias `[co]`.
#[derive(Debug, Clone, Copy)]
pub struct DevConv {
    /// Weight address.
    pub w: CUdeviceptr,
    /// Bias.
    pub b: DevVec,
    /// Input channels.
    pub ci: usize,
    /// Output channels.
    pub co: usize,
    /// Kernel size.
    pub k: usize,
}

impl HasBias<DevVec> for DevConv {
    fn bias(&self) -> &DevVec {
        &self.b
    }
}

/// A modulation: shift = shift.0 + shift.1, scale = scale.0 + scale.1 (bf16 rows).
#[derive(Debug, Clone, Copy)]
pub struct DevMod {
    /// (table row, embedding slice) of the shift.
    pub shift: (CUdeviceptr, CUdeviceptr),
    /// (table row, embedding slice) of the scale.
    pub scale: (CUdeviceptr, CUdeviceptr),
}

/// Threads per block of the VAE's elementwise kernels.
const EW: u32 = 256;

/// Where pixels go: the f32 staging buffer, its RGB8 conversion (three
/// colours only), and on the host the f32 clip and/or the frames.
struct Pixels {
    /// Two pinned halves the RGB8 frames are copied into without a wait
    /// (empty unless downloading RGB8), used in turn. Declared first so that
    /// on an error path they drop (waiting for a copy in flight) before the
    /// device staging the copy reads from is freed.
    halves: Vec<HostHalf>,
    staging: DeviceBuffer,
    rgb8: Option<DeviceBuffer>,
    cap_frames: usize,
    host: Option<Vec<f32>>,
    /// One slot per frame of the clip, filled as the frames come.
    frames: Option<Vec<Option<Frame>>>,
    /// The half the next conversion's frames go to.
    next_half: usize,
    /// [`Mutation::SkipFrameWait`]: drain the halves without waiting.
    skip_wait: bool,
    /// Poison the RGB8 staging before every conversion (checks): a byte the
    /// kernel skips shows as [`RGB8_POISON`], not as an earlier chunk's.
    repoison: bool,
    geom: (usize, usize, usize, usize),
}

impl Pixels {
    /// Device bytes of the staging (f32 and RGB8).
    fn device_bytes(&self) -> u64 {
        (self.staging.bytes() + self.rgb8.as_ref().map_or(0, |b| b.bytes())) as u64
    }

    /// Whether this sink serves `cap_frames` frames of a clip of `geom` with
    /// `download` (what [`DeviceOps::pixel_sink`] would allocate), and holds no
    /// copy in flight.
    fn fits(
        &self,
        cap_frames: usize,
        geom: (usize, usize, usize, usize),
        download: Download,
    ) -> bool {
        self.cap_frames == cap_frames
            && self.geom == geom
            && self.host.is_some() == download.f32()
            && self.frames.is_some() == download.rgb8()
            && self.halves.len() == if download.rgb8() { 2 } else { 0 }
            && self.halves.iter().all(|h| h.pending.is_none())
    }
}

/// One pinned host buffer of the RGB8 download: a conversion's frames are
/// copied into it on the compute stream (no host wait), and moved into
/// [`Frame`]s only after its event has fired, when the half comes round
/// again or the frames are taken.
struct HostHalf {
    buf: Pinned,
    done: CudaEvent,
    /// (first frame, frames) of the copy in flight, if any.
    pending: Option<(usize, usize)>,
}

impl HostHalf {
    fn new(gpu: &Gpu, bytes: usize) -> Result<HostHalf, CudaError> {
        Ok(HostHalf {
            buf: Pinned::new(gpu, bytes)?,
            done: gpu.event()?,
            pending: None,
        })
    }

    /// Waits for the copy in flight (unless `skip_wait`, the
    /// [`Mutation::SkipFrameWait`] defect) and moves its frames of `hh` x `ww`
    /// into `slots`; returns the host seconds blocked.
    fn drain(
        &mut self,
        slots: &mut [Option<Frame>],
        hh: usize,
        ww: usize,
        skip_wait: bool,
    ) -> Result<f64, CudaError> {
        let Some((first, frames)) = self.pending.take() else {
            return Ok(0.0);
        };
        let t0 = std::time::Instant::now();
        if !skip_wait {
            self.done
                .synchronize()
                .ctx("waiting for VAE frames to reach the host")?;
        }
        let waited = t0.elapsed().as_secs_f64();
        let fb = rgb8_bytes(1, hh, ww);
        let total = slots.len();
        let dst = slots.get_mut(first..first + frames).ok_or_else(|| {
            CudaError::Invalid(format!("VAE frames {first}+{frames} of a clip of {total}"))
        })?;
        // One frame per task: each copy allocates and faults in its own ~1 MB.
        use rayon::prelude::*;
        dst.par_iter_mut()
            .zip(self.buf.as_slice().par_chunks_exact(fb))
            .for_each(|(slot, rgb)| {
                *slot = Some(Frame {
                    width: ww,
                    height: hh,
                    rgb: rgb.to_vec(),
                });
            });
        Ok(waited)
    }
}

impl Drop for HostHalf {
    fn drop(&mut self) {
        // The pinned bytes must outlive a copy still in flight (an error
        // path): wait for it before they are freed.
        if self.pending.is_some() {
            let _ = self.done.synchronize();
        }
    }
}

/// Device bytes of the RGB8 staging for `cap_frames` frames of a clip of
/// `geom` (channels, frames, height, width): none unless the clip has three colours.
pub fn rgb8_staging_bytes(cap_frames: usize, geom: (usize, usize, usize, usize)) -> usize {
    if geom.0 == 3 {
        rgb8_bytes(cap_frames, geom.2, geom.3)
    } else {
        0
    }
}

/// Launches `vae_rgb8`: f32 pixels `[frames][3][hh][ww]` at `src` to RGB8
/// `[frames][hh][ww][3]` at `dst` (bit-exact with [`crate::frames::to_u8`]
/// unless `mutate` injects a defect), on the compute stream.
#[allow(clippy::too_many_arguments)]
pub fn launch_rgb8(
    kernels: &Kernels,
    gpu: &Gpu,
    src: CUdeviceptr,
    frames: usize,
    hh: usize,
    ww: usize,
    mutate: Rgb8Mutation,
    dst: CUdeviceptr,
) -> Result<(), CudaError> {
    if hh * ww > i32::MAX as usize || frames > i32::MAX as usize {
        return Err(CudaError::Invalid(format!(
            "RGB8 conversion of {frames} frames of {hh}x{ww}: too large for one launch"
        )));
    }
    let p = Params::default()
        .ptr(src)
        .int(frames)
        .int(hh)
        .int(ww)
        .i32(mutate.code())
        .ptr(dst);
    kernels.launch_ew("vae_rgb8", frames * hh * ww, &gpu.compute, p)
}

/// What one decode's setup allocated, kept for a later decode of the same
/// geometry, chunking and download ([`DeviceOps::into_pool`],
/// [`DeviceOps::use_pool`]): the stream's buffers in allocation order and the
/// pixel sink (device staging and the pinned RGB8 halves).
pub struct DecodePool {
    bufs: Vec<DeviceBuffer>,
    pixels: Option<Pixels>,
}

/// Device bytes of `bufs` and of the pixel sink's staging (f32 and RGB8).
fn device_bytes_of(bufs: &[DeviceBuffer], pixels: Option<&Pixels>) -> u64 {
    let px = pixels.map_or(0, Pixels::device_bytes);
    bufs.iter().map(|b| b.bytes() as u64).sum::<u64>() + px
}

impl DecodePool {
    /// Device bytes held (buffers and pixel staging; the pinned halves are host memory).
    pub fn device_bytes(&self) -> u64 {
        device_bytes_of(&self.bufs, self.pixels.as_ref())
    }

    /// Pinned host bytes held (the RGB8 halves).
    pub fn pinned_bytes(&self) -> u64 {
        self.pixels.as_ref().map_or(0, |p| {
            p.halves.iter().map(|h| h.buf.as_slice().len() as u64).sum()
        })
    }
}

/// How a decode used the pool it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolReport {
    /// Buffer requests served from the pool.
    pub served: usize,
    /// Buffer requests the pool could not serve (allocated afresh).
    pub missed: usize,
    /// Pooled buffers dropped unused when a request did not fit.
    pub dropped: usize,
    /// Pooled buffers never asked for.
    pub left: usize,
    /// Whether the pixel sink (staging and pinned halves) came from the pool.
    pub pixels: bool,
}

impl PoolReport {
    /// Every request served, nothing dropped or left, the pixel sink reused.
    pub fn complete(&self) -> bool {
        self.served > 0 && self.missed == 0 && self.dropped == 0 && self.left == 0 && self.pixels
    }
}

/// The device backend of one decode.
pub struct DeviceOps<'a> {
    gpu: &'a Gpu,
    kernels: &'a Kernels,
    gemm: &'a Gemm,
    weights: &'a DeviceWeights,
    path: ConvPath,
    cudnn: Option<&'a mut CudnnConv>,
    bufs: Vec<DeviceBuffer>,
    pixels: Option<Pixels>,
    seg: (CudaEvent, CudaEvent),
    seg_open: bool,
    /// Device milliseconds of the closed segments since the last [`DeviceOps::take_ms`].
    ms: f64,
    /// Host seconds blocked in [`DeviceOps::end`]'s wait since the last
    /// [`DeviceOps::take_wait_ms`].
    waited_s: f64,
    /// Buffers allocated ahead ([`DeviceOps::use_pool`]), served in order.
    pool: Option<Queue<DeviceBuffer>>,
    /// A pixel sink allocated ahead, taken by [`DeviceOps::pixel_sink`] when it fits.
    pool_pixels: Option<Pixels>,
    /// Whether [`DeviceOps::pixel_sink`] took the pooled sink.
    pixels_reused: bool,
}

impl<'a> DeviceOps<'a> {
    /// A backend on `gpu` over `weights` (convolution weights already
    /// reordered), convolving through `path` (`cudnn` required for
    /// [`ConvPath::Cudnn`]).
    pub fn new(
        gpu: &'a Gpu,
        kernels: &'a Kernels,
        gemm: &'a Gemm,
        weights: &'a DeviceWeights,
        path: ConvPath,
        cudnn: Option<&'a mut CudnnConv>,
    ) -> Result<DeviceOps<'a>, CudaError> {
        if path == ConvPath::Cudnn && cudnn.is_none() {
            return Err(CudaError::NotAvailable(
                "the cuDNN convolution path was asked for but cuDNN is not loaded".into(),
            ));
        }
        Ok(DeviceOps {
            gpu,
            kernels,
            gemm,
            weights,
            path,
            cudnn,
            bufs: Vec::new(),
            pixels: None,
            seg: (gpu.event()?, gpu.event()?),
            seg_open: false,
            ms: 0.0,
            waited_s: 0.0,
            pool: None,
            pool_pixels: None,
            pixels_reused: false,
        })
    }

    /// Hands this decode the buffers an earlier setup allocated
    /// ([`DeviceOps::into_pool`]): [`VaeOps::alloc`] takes them in order while
    /// each request matches the next one's size, and [`DeviceOps::pixel_sink`]
    /// takes the sink when its frames cap, geometry and download match.
    /// Anything else allocates afresh (and frees the rest of the pool first).
    pub fn use_pool(&mut self, pool: DecodePool) {
        self.pool = Some(Queue::new(pool.bufs));
        self.pool_pixels = pool.pixels;
    }

    /// What this decode took from its pool; `None` without one.
    pub fn pool_report(&self) -> Option<PoolReport> {
        self.pool.as_ref().map(|q| PoolReport {
            served: q.served(),
            missed: q.missed(),
            dropped: q.dropped(),
            left: q.left(),
            pixels: self.pixels_reused,
        })
    }

    /// Everything this backend allocated (buffers in allocation order and the
    /// pixel sink), for a later decode of the same shape ([`DeviceOps::use_pool`]).
    pub fn into_pool(mut self) -> DecodePool {
        DecodePool {
            bufs: std::mem::take(&mut self.bufs),
            pixels: self.pixels.take(),
        }
    }

    /// Device bytes this decode holds: its buffers and the pixel staging (f32
    /// and RGB8), whether allocated now or taken from a pool.
    pub fn held_bytes(&self) -> u64 {
        device_bytes_of(&self.bufs, self.pixels.as_ref())
    }

    /// cuDNN convolution plans built so far on this decode's handle and the host
    /// seconds they took ([`CudnnConv::plans_built`]); `(0, 0.0)` without cuDNN.
    pub fn plans_built(&self) -> (usize, f64) {
        self.cudnn.as_ref().map_or((0, 0.0), |c| c.plans_built())
    }

    /// cuDNN algorithm-heuristic calls so far ([`CudnnConv::plans_searched`]); 0
    /// without cuDNN.
    pub fn plans_searched(&self) -> usize {
        self.cudnn.as_ref().map_or(0, |c| c.plans_searched())
    }

    /// The values at `at` (bf16 widened to f32; synchronous, for checks).
    pub fn read(&self, at: Loc, elems: usize) -> Result<Vec<f32>, CudaError> {
        let p = self.ptr(at)?;
        Ok(crate::cuda::kit::bf16::widen(&download::<u16>(
            self.gpu, p, elems,
        )?))
    }

    /// The device address of `at`.
    pub fn ptr(&self, at: Loc) -> Result<CUdeviceptr, CudaError> {
        let b = self
            .bufs
            .get(at.buf)
            .ok_or_else(|| CudaError::Invalid(format!("VAE buffer {} does not exist", at.buf)))?;
        Ok(b.ptr() + (at.off * 2) as u64)
    }

    /// Allocates the pixel staging buffers for `cap_frames` frames of a clip
    /// of `geom` (channels, frames, height, width): f32, and RGB8 when the clip
    /// has three colours (converted on the device whatever `download` says,
    /// as the render does); `download` picks what is copied to the host as
    /// the frames come (RGB8 needs three colours). RGB8 frames go through
    /// two pinned host halves of `cap_frames` frames each, copied without a
    /// host wait; `mutation` [`Mutation::SkipFrameWait`] drops the wait
    /// before a half's frames are read (a defect the checks must see).
    pub fn pixel_sink(
        &mut self,
        cap_frames: usize,
        geom: (usize, usize, usize, usize),
        download: Download,
        mutation: Mutation,
    ) -> Result<(), CudaError> {
        let (c, f, h, w) = geom;
        let rgb8_bytes = rgb8_staging_bytes(cap_frames, geom);
        if download.rgb8() && c != 3 {
            return Err(CudaError::Invalid(format!(
                "RGB8 frames of a clip of {c} colours: needs 3"
            )));
        }
        if let Some(mut px) = self.pool_pixels.take() {
            if px.fits(cap_frames, geom, download) {
                // Only the sizes carry over: the per-decode state starts afresh.
                px.host = download.f32().then(|| vec![0.0f32; c * f * h * w]);
                px.frames = download.rgb8().then(|| vec![None; f]);
                px.next_half = 0;
                px.skip_wait = mutation == Mutation::SkipFrameWait;
                px.repoison = false;
                self.pixels = Some(px);
                self.pixels_reused = true;
                return Ok(());
            }
            // Another shape: free the pooled sink before allocating this one.
            drop(px);
        }
        self.pixels = Some(Pixels {
            halves: if download.rgb8() {
                vec![
                    HostHalf::new(self.gpu, rgb8_bytes)?,
                    HostHalf::new(self.gpu, rgb8_bytes)?,
                ]
            } else {
                Vec::new()
            },
            staging: DeviceBuffer::alloc(
                self.gpu,
                cap_frames * c * h * w * 4,
                "the VAE's pixel staging",
            )?,
            rgb8: if rgb8_bytes > 0 {
                Some(DeviceBuffer::alloc(
                    self.gpu,
                    rgb8_bytes,
                    "the VAE's RGB8 staging",
                )?)
            } else {
                None
            },
            cap_frames,
            host: download.f32().then(|| vec![0.0f32; c * f * h * w]),
            frames: download.rgb8().then(|| vec![None; f]),
            next_half: 0,
            skip_wait: mutation == Mutation::SkipFrameWait,
            repoison: false,
            geom,
        });
        Ok(())
    }

    /// The host clip `[c, frames, h, w]` (when downloading f32).
    pub fn take_pixels(&mut self) -> Option<Vec<f32>> {
        self.pixels.as_mut().and_then(|p| p.host.take())
    }

    /// The host frames (when downloading RGB8), after waiting for the copies
    /// still in flight; an error names the first frame that never came.
    pub fn take_frames(&mut self) -> Result<Option<Vec<Frame>>, CudaError> {
        let Some(px) = self.pixels.as_mut() else {
            return Ok(None);
        };
        let Some(mut slots) = px.frames.take() else {
            return Ok(None);
        };
        let (hh, ww) = (px.geom.2, px.geom.3);
        for half in px.halves.iter_mut() {
            self.waited_s += half.drain(&mut slots, hh, ww, px.skip_wait)?;
        }
        let mut v = Vec::with_capacity(slots.len());
        for (i, s) in slots.into_iter().enumerate() {
            v.push(s.ok_or_else(|| {
                CudaError::Invalid(format!("the VAE never delivered RGB8 frame {i}"))
            })?);
        }
        Ok(Some(v))
    }

    /// Buffers allocated so far (the next buffer's id).
    pub fn buffers(&self) -> usize {
        self.bufs.len()
    }

    /// Fills every activation buffer from id `from` on (and the pixel
    /// staging) with 0xFF bytes (NaN in bf16 and f32), so a read of anything
    /// the decoder did not write shows in the output; the RGB8 staging gets
    /// [`RGB8_POISON`] now and before every later conversion.
    pub fn poison_from(&mut self, from: usize) -> Result<(), CudaError> {
        for b in self.bufs.iter().skip(from) {
            b.fill_bytes(self.gpu, 0xFF, &self.gpu.compute)?;
        }
        if let Some(p) = self.pixels.as_mut() {
            p.staging.fill_bytes(self.gpu, 0xFF, &self.gpu.compute)?;
            if let Some(r) = &p.rgb8 {
                r.fill_bytes(self.gpu, RGB8_POISON, &self.gpu.compute)?;
            }
            p.repoison = true;
        }
        Ok(())
    }

    /// Starts timing a span of work on the compute stream.
    pub fn begin(&mut self) -> Result<(), CudaError> {
        self.seg
            .0
            .record(&self.gpu.compute)
            .ctx("recording a VAE start event")?;
        self.seg_open = true;
        Ok(())
    }

    /// Ends the span, waits for it, and adds its device time.
    pub fn end(&mut self) -> Result<(), CudaError> {
        if !self.seg_open {
            return Ok(());
        }
        self.seg
            .1
            .record(&self.gpu.compute)
            .ctx("recording a VAE end event")?;
        let t0 = std::time::Instant::now();
        self.seg.1.synchronize().ctx("waiting for the VAE")?;
        self.waited_s += t0.elapsed().as_secs_f64();
        self.ms += self
            .seg
            .0
            .elapsed_ms(&self.seg.1)
            .ctx("reading VAE event time")? as f64;
        self.seg_open = false;
        Ok(())
    }

    /// Host milliseconds blocked waiting for the device (in [`DeviceOps::end`])
    /// since the last call.
    pub fn take_wait_ms(&mut self) -> f64 {
        std::mem::take(&mut self.waited_s) * 1e3
    }

    /// Device milliseconds of the spans ended since the last call.
    pub fn take_ms(&mut self) -> f64 {
        std::mem::take(&mut self.ms)
    }

    fn ew_grid(&self, n: usize) -> (u32, u32, u32) {
        let blocks = n
            .div_ceil(EW as usize)
            .clamp(1, self.gpu.sms.max(1) as usize * 16);
        (blocks as u32, 1, 1)
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<CUdeviceptr, CudaError> {
        Ok(self.weights.get(name, shape)?.ptr)
    }

    fn small(&mut self, elems: usize, what: &str) -> Result<CUdeviceptr, CudaError> {
        let id = self.alloc(elems, what)?;
        self.ptr(Loc { buf: id, off: 0 })
    }

    /// Launches the implicit-GEMM convolution.
    #[allow(clippy::too_many_arguments)]
    pub fn igemm(
        kernels: &Kernels,
        gpu: &Gpu,
        path: ConvPath,
        x: CUdeviceptr,
        w: CUdeviceptr,
        y: CUdeviceptr,
        frames_in: usize,
        h: usize,
        wd: usize,
        ci: usize,
        co: usize,
    ) -> Result<(), CudaError> {
        let m = (frames_in - 2) * h * wd;
        if m > i32::MAX as usize || 27 * ci * co > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "VAE convolution of {m} voxels x {ci} -> {co} channels is too large for one launch"
            )));
        }
        let (name, threads, bm, bn, smem) = path.igemm_kernel(co);
        let grid = (m.div_ceil(bm) as u32, co.div_ceil(bn) as u32, 1);
        let p = Params::default()
            .ptr(x)
            .ptr(w)
            .ptr(y)
            .int(h)
            .int(wd)
            .int(ci)
            .int(co)
            .int(m);
        kernels.launch(name, grid, threads, smem, &gpu.compute, p)
    }
}

impl VaeOps for DeviceOps<'_> {
    type Vec = DevVec;
    type Conv = DevConv;
    type Mod = DevMod;

    fn alloc(&mut self, elems: usize, what: &str) -> Result<usize, CudaError> {
        // DeviceBuffer::alloc holds at least one byte: a pooled buffer is
        // matched on the size it really has.
        let bytes = (elems * 2).max(1);
        let b = match self.pool.as_mut().and_then(|q| q.take(bytes)) {
            Some(b) => b,
            None => DeviceBuffer::alloc(self.gpu, bytes, what)?,
        };
        self.bufs.push(b);
        Ok(self.bufs.len() - 1)
    }

    fn copy(&mut self, src: Loc, dst: Loc, elems: usize) -> Result<(), CudaError> {
        let (s, d) = (self.ptr(src)?, self.ptr(dst)?);
        self.gpu.bind()?;
        // SAFETY: both ranges lie in live buffers of this backend (the stream
        // sizes every buffer for what it copies) and do not overlap.
        unsafe { dres::memcpy_dtod_async(d, s, elems * 2, self.gpu.compute.cu_stream()) }
            .ctx("copying VAE frames")
    }

    fn upload(&mut self, dst: Loc, data: &[f32]) -> Result<(), CudaError> {
        let d = self.ptr(dst)?;
        upload(self.gpu, d, &narrow(data))
    }

    fn conv3(
        &mut self,
        conv: &DevConv,
        x: Loc,
        frames_in: usize,
        h: usize,
        w: usize,
        y: Loc,
    ) -> Result<(), CudaError> {
        if conv.k != 3 || conv.ci % 8 != 0 || conv.co % 8 != 0 || frames_in < 3 {
            return Err(CudaError::Invalid(format!(
                "VAE conv3 with k={} {} -> {} channels over {frames_in} frames: needs k = 3, \
                 channels multiples of 8 and at least 3 frames",
                conv.k, conv.ci, conv.co
            )));
        }
        let (xp, yp) = (self.ptr(x)?, self.ptr(y)?);
        match self.path {
            ConvPath::Cudnn => {
                let c = self
                    .cudnn
                    .as_deref_mut()
                    .ok_or_else(|| CudaError::NotAvailable("cuDNN is not loaded".into()))?;
                c.forward(self.gpu, xp, conv.w, yp, frames_in, h, w, conv.ci, conv.co)
            }
            p => Self::igemm(
                self.kernels,
                self.gpu,
                p,
                xp,
                conv.w,
                yp,
                frames_in,
                h,
                w,
                conv.ci,
                conv.co,
            ),
        }
    }

    fn conv1(&mut self, conv: &DevConv, x: Loc, rows: usize, y: Loc) -> Result<(), CudaError> {
        let (xp, yp) = (self.ptr(x)?, self.ptr(y)?);
        self.gemm.linear(
            &self.gpu.compute,
            xp,
            conv.w,
            conv.b.ptr,
            yp,
            rows,
            conv.co,
            conv.ci,
            Epilogue::Bias,
        )
    }

    fn norm(
        &mut self,
        x: Loc,
        rows: usize,
        c: usize,
        bias: Option<&DevVec>,
        op: &NormOp<'_, Self>,
        y: Loc,
    ) -> Result<(), CudaError> {
        if c % 8 != 0 {
            return Err(CudaError::Invalid(format!(
                "VAE norm over {c} channels: needs a multiple of 8"
            )));
        }
        let (xp, yp) = (self.ptr(x)?, self.ptr(y)?);
        let (mode, eps, t) = match op {
            NormOp::RmsSilu(Some(m)) => (
                0,
                crate::cuda::models::vae::host::PIXEL_NORM_EPS,
                [m.shift.0, m.shift.1, m.scale.0, m.scale.1],
            ),
            NormOp::RmsSilu(None) => (0, crate::cuda::models::vae::host::PIXEL_NORM_EPS, [NULL; 4]),
            NormOp::LayerNorm { weight, bias, eps } => {
                (1, *eps, [weight.ptr, NULL, bias.ptr, NULL])
            }
        };
        let p = Params::default()
            .ptr(xp)
            .ptr(bias.map_or(NULL, |b| b.ptr))
            .n(rows)
            .int(c)
            .f32(eps)
            .i32(mode)
            .ptr(t[0])
            .ptr(t[1])
            .ptr(t[2])
            .ptr(t[3])
            .ptr(yp);
        let rows_per_block = (EW / 32) as usize;
        let grid = (rows.div_ceil(rows_per_block) as u32, 1, 1);
        self.kernels
            .launch("vae_norm", grid, EW, 0, &self.gpu.compute, p)
    }

    fn bias_add(
        &mut self,
        y: Loc,
        rows: usize,
        c: usize,
        bias: &DevVec,
        skip: Option<Loc>,
    ) -> Result<(), CudaError> {
        let yp = self.ptr(y)?;
        let sp = match skip {
            Some(s) => self.ptr(s)?,
            None => NULL,
        };
        let n8 = rows * c / 8;
        let p = Params::default().ptr(yp).ptr(bias.ptr).ptr(sp).n(n8).int(c);
        let grid = self.ew_grid(n8);
        self.kernels
            .launch("vae_bias_add", grid, EW, 0, &self.gpu.compute, p)
    }

    fn d2s(
        &mut self,
        y: Loc,
        frames: usize,
        h: usize,
        w: usize,
        cy: usize,
        bias: &DevVec,
        res: Option<(Loc, usize)>,
        drop: bool,
        out: Loc,
    ) -> Result<(), CudaError> {
        let (yp, op) = (self.ptr(y)?, self.ptr(out)?);
        let (rp, cr) = match res {
            Some((r, cr)) => (self.ptr(r)?, cr),
            None => (NULL, 8),
        };
        let n = frames * h * w * cy / 8;
        let p = Params::default()
            .ptr(yp)
            .ptr(bias.ptr)
            .ptr(rp)
            .int(frames)
            .int(h)
            .int(w)
            .int(cy)
            .int(cr)
            .i32(i32::from(drop))
            .ptr(op);
        let grid = self.ew_grid(n);
        self.kernels
            .launch("vae_d2s", grid, EW, 0, &self.gpu.compute, p)
    }

    fn pixels(
        &mut self,
        y: Loc,
        frames: usize,
        h: usize,
        w: usize,
        bias: &DevVec,
        p: usize,
        first: usize,
    ) -> Result<(), CudaError> {
        let yp = self.ptr(y)?;
        let (staging, rgb8, cap, geom) = match &self.pixels {
            Some(px) => (
                px.staging.ptr(),
                px.rgb8.as_ref().map(|b| (b.ptr(), px.repoison)),
                px.cap_frames,
                px.geom,
            ),
            None => {
                return Err(CudaError::Invalid(
                    "VAE pixels before the pixel sink exists".into(),
                ))
            }
        };
        let (oc, total, hh, ww) = geom;
        if frames > cap || first + frames > total || h * p != hh || w * p != ww {
            return Err(CudaError::Invalid(format!(
                "VAE pixels: frames {first}+{frames} of {total} (staging {cap}) at {}x{} into {hh}x{ww}",
                h * p,
                w * p
            )));
        }
        let n = frames * oc * hh * ww;
        let prm = Params::default()
            .ptr(yp)
            .ptr(bias.ptr)
            .int(frames)
            .int(h)
            .int(w)
            .int(oc)
            .int(p)
            .ptr(staging);
        let grid = self.ew_grid(n);
        self.kernels
            .launch("vae_pixels", grid, EW, 0, &self.gpu.compute, prm)?;
        if let Some((rp, poison)) = rgb8 {
            if let Some(b) = self.pixels.as_ref().and_then(|p| p.rgb8.as_ref()) {
                if poison {
                    b.fill_bytes(self.gpu, RGB8_POISON, &self.gpu.compute)?;
                }
            }
            launch_rgb8(
                self.kernels,
                self.gpu,
                staging,
                frames,
                hh,
                ww,
                Rgb8Mutation::None,
                rp,
            )?;
        }
        if let (Some(px), Some((rp, poison))) = (self.pixels.as_mut(), rgb8) {
            if let Some(slots) = px.frames.as_mut() {
                // The frames go to a pinned half with no host wait: the copy
                // follows the conversion on the compute stream (so the next
                // conversion cannot overwrite the staging before it is read),
                // and the host waits only when the half comes round again,
                // two conversions later.
                let k = px.next_half % px.halves.len().max(1);
                let half = px.halves.get_mut(k).ok_or_else(|| {
                    CudaError::Invalid("VAE RGB8 frames without a host buffer".into())
                })?;
                px.next_half = k + 1;
                self.waited_s += half.drain(slots, hh, ww, px.skip_wait)?;
                let n = rgb8_bytes(frames, hh, ww);
                let have = half.buf.as_slice().len();
                let dst = half.buf.as_mut_slice().get_mut(..n).ok_or_else(|| {
                    CudaError::Invalid(format!(
                        "VAE frames: {n} bytes into a host buffer of {have}"
                    ))
                })?;
                if poison {
                    // A frame read before its copy landed shows as poison.
                    dst.fill(RGB8_POISON);
                }
                // SAFETY: `dst` is pinned and lives in `half`, which waits
                // for this copy before it is reused or freed; the source is
                // the first `n` bytes of the RGB8 staging (frames <= cap).
                unsafe { dres::memcpy_dtoh_async(dst, rp, self.gpu.compute.cu_stream()) }
                    .ctx("copying VAE frames to the host")?;
                half.done
                    .record(&self.gpu.compute)
                    .ctx("recording a VAE frames event")?;
                half.pending = Some((first, frames));
            }
        }
        let f32_host = self.pixels.as_ref().is_some_and(|p| p.host.is_some());
        if f32_host {
            let was_open = self.seg_open;
            self.end()?;
            if !was_open {
                // No timed span to wait on (a direct call): the copies below
                // run on the legacy stream, which does not wait for the
                // non-blocking compute stream.
                self.gpu.sync_compute()?;
            }
            let plane = hh * ww;
            if let Some(host) = self.pixels.as_mut().and_then(|p| p.host.as_mut()) {
                for j in 0..frames {
                    for c in 0..oc {
                        let dst = &mut host[(c * total + first + j) * plane..][..plane];
                        let src = staging + (((j * oc + c) * plane) * 4) as u64;
                        // SAFETY: `dst` has room for one plane; the source
                        // plane lies inside the staging buffer (frames <= cap);
                        // the end() above waited for the kernel.
                        unsafe { dres::memcpy_dtoh_sync(dst, src) }
                            .ctx("copying VAE pixels to the host")?;
                    }
                }
            }
            if was_open {
                self.begin()?;
            }
        }
        Ok(())
    }

    fn conv_weight(
        &mut self,
        name: &str,
        ci: usize,
        co: usize,
        k: usize,
    ) -> Result<DevConv, CudaError> {
        let shape = [co, ci, k, k, k];
        Ok(DevConv {
            w: self.tensor(&format!("{name}.weight"), &shape)?,
            b: DevVec {
                ptr: self.tensor(&format!("{name}.bias"), &[co])?,
                len: co,
            },
            ci,
            co,
            k,
        })
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<DevVec, CudaError> {
        Ok(DevVec {
            ptr: self.tensor(name, &[len])?,
            len,
        })
    }

    fn scalar(&mut self, name: &str) -> Result<f32, CudaError> {
        let p = self.tensor(name, &[])?;
        let v = download::<u16>(self.gpu, p, 1)?;
        Ok(half::bf16::from_bits(v[0]).to_f32())
    }

    fn time_embedding(&mut self, prefix: &str, dim: usize, t: f32) -> Result<DevVec, CudaError> {
        let e = format!("{prefix}.time_embedder.timestep_embedder");
        let w1 = self.tensor(&format!("{e}.linear_1.weight"), &[dim, SINUSOID])?;
        let b1 = self.tensor(&format!("{e}.linear_1.bias"), &[dim])?;
        let w2 = self.tensor(&format!("{e}.linear_2.weight"), &[dim, dim])?;
        let b2 = self.tensor(&format!("{e}.linear_2.bias"), &[dim])?;
        let sin = self.small(SINUSOID, "a VAE timestep sinusoid")?;
        let h = self.small(dim, "a VAE time embedding")?;
        let hs = self.small(dim, "a VAE time embedding")?;
        let out = self.small(dim, "a VAE time embedding")?;
        let s = &self.gpu.compute;
        self.kernels.timestep_sinusoid(s, sin, t, SINUSOID / 2)?;
        self.gemm
            .linear(s, sin, w1, b1, h, 1, dim, SINUSOID, Epilogue::Bias)?;
        self.kernels.map(s, Map::SiluBf16, h, hs, dim)?;
        self.gemm
            .linear(s, hs, w2, b2, out, 1, dim, dim, Epilogue::Bias)?;
        Ok(DevVec { ptr: out, len: dim })
    }

    fn modulation(
        &mut self,
        table: &str,
        rows: usize,
        c: usize,
        emb: &DevVec,
        k: usize,
    ) -> Result<DevMod, CudaError> {
        let t = self.tensor(table, &[rows, c])?;
        if emb.len != rows * c || 2 * k + 2 > rows {
            return Err(CudaError::Invalid(format!(
                "VAE modulation {k} of {table} [{rows}, {c}] with an embedding of {}",
                emb.len
            )));
        }
        let row = |base: CUdeviceptr, r: usize| base + (r * c * 2) as u64;
        Ok(DevMod {
            shift: (row(t, 2 * k), row(emb.ptr, 2 * k)),
            scale: (row(t, 2 * k + 1), row(emb.ptr, 2 * k + 1)),
        })
    }
}
