//! The CUDA arm behind the pipeline's [`Denoiser`]: the transformer staged once
//! onto the device, the whole sampler loop device-resident.
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

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaEvent;

use super::context::Gpu;
use super::dit::{DeviceDit, DitDims, Geometry, TextSlot, Workspace, LATENT_CHANNELS};
use super::memory::{download, upload, DeviceBuffer, MemTracker};
use super::selftest::Rig;
use super::staging::{self, StagingOptions, StagingReport};
use super::{CudaError, DriverContext};
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

/// What opening the device arm did (for the `load.dit` close).
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// Seconds to open the GPU, load the kernels and create the GEMM handle.
    pub device_open_s: f64,
    /// The staging run.
    pub staging: StagingReport,
}

/// The device-resident sampler loop.
pub struct CudaDenoiser {
    dit: DeviceDit,
    cond: TextSlot,
    uncond: Option<TextSlot>,
    guidance: f32,
    geo: Geometry,
    /// lat, v_cond, v_uncond: f32 [n, 128] each.
    io: Option<DeviceBuffer>,
    events: Vec<StepEvents>,
    loop_start: CudaEvent,
    loop_end: CudaEvent,
    queued: StepQueue<()>,
    started: bool,
    /// The device context, kernels and cuBLASLt handle; declared last so every
    /// buffer above is freed while the context is alive.
    _rig: Rig,
}

/// Open GPU 0, stage the transformer's tensors (`tensors`: the extents of the
/// validated checkpoint, possibly over several files) with `staging`, bind them
/// and upload the conditioning. The latent grid and fps fix the workspace.
pub fn open_cuda_denoiser(
    tensors: &[Extent],
    cfg: &DitConfig,
    staging: &StagingOptions,
    cond: &Conditioning,
    grid: (usize, usize, usize),
    fps: f32,
) -> Result<(CudaDenoiser, OpenReport), CudaError> {
    let dims = DitDims::from_config(cfg)?;
    let t0 = Instant::now();
    let rig = Rig::open()?;
    let device_open_s = t0.elapsed().as_secs_f64();
    let (w, report) = staging::stage(&rig.gpu, tensors, staging)?;
    let dit = DeviceDit::new(
        rig.gpu.clone(),
        rig.kernels.clone(),
        rig.gemm.clone(),
        dims,
        Arc::new(w),
    )?;
    let slot =
        |t: &crate::denoise::TextCond| TextSlot::upload(&rig.gpu, &dims, t.states.data(), &t.mask);
    let c = slot(&cond.cond)?;
    let u = cond.uncond.as_ref().map(slot).transpose()?;
    let events = (0..IN_FLIGHT)
        .map(|_| StepEvents::new(&rig.gpu))
        .collect::<Result<_, _>>()?;
    let (loop_start, loop_end) = (rig.gpu.event()?, rig.gpu.event()?);
    Ok((
        CudaDenoiser {
            dit,
            cond: c,
            uncond: u,
            guidance: cond.guidance,
            geo: Geometry { grid, fps },
            io: None,
            events,
            loop_start,
            loop_end,
            queued: Default::default(),
            started: false,
            _rig: rig,
        },
        OpenReport {
            device_open_s,
            staging: report,
        },
    ))
}

/// Device bytes the arm holds besides the staged weights once the DiT is
/// loaded, with `prompts` prompts of `l` text tokens on `dims`: the cuBLASLt
/// workspace, the RoPE table and the text slots.
pub fn loaded_bytes(dims: &DitDims, l: usize, prompts: usize) -> u64 {
    (super::gemm::WORKSPACE_BYTES
        + DeviceDit::rope_bytes(dims)
        + prompts * TextSlot::bytes_for(dims, l)) as u64
}

/// Device bytes the sampler loop adds over `n` tokens: the forward's workspace
/// and the latents with their two velocities.
pub fn loop_bytes(dims: &DitDims, n: usize, l: usize) -> u64 {
    (Workspace::bytes_for(dims, n, l) + 3 * n * LATENT_CHANNELS * 4) as u64
}

impl CudaDenoiser {
    /// The device allocator's tracker (for `peak_device_bytes`).
    pub fn mem(&self) -> Arc<MemTracker> {
        self.dit.gpu().mem.clone()
    }

    fn n(&self) -> usize {
        self.geo.grid.0 * self.geo.grid.1 * self.geo.grid.2
    }

    /// (lat, v_cond, v_uncond) device addresses.
    fn ptrs(&self) -> Result<(u64, u64, u64), CudaError> {
        let io = self
            .io
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("a step before begin".into()))?;
        let b = (self.n() * LATENT_CHANNELS * 4) as u64;
        Ok((io.ptr(), io.ptr() + b, io.ptr() + 2 * b))
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
        let l = self
            .uncond
            .as_ref()
            .map_or(self.cond.l, |u| u.l.max(self.cond.l));
        self.dit.workspace(n, l)?;
        let gpu = self.dit.gpu().clone();
        let io = DeviceBuffer::alloc(&gpu, 3 * n * LATENT_CHANNELS * 4, "the sampler's latents")?;
        upload(&gpu, io.ptr(), latents.data())?;
        self.io = Some(io);
        // Before any event is recorded: a one-block forward per prompt takes the
        // first launch's host work (tens of ms) out of forward 1's event span,
        // where the idle GPU would count as busy. Its output (into v_cond) is
        // overwritten by the first real forward.
        let (lat, vc, _) = self.ptrs()?;
        if let Some(u) = &self.uncond {
            self.dit.enqueue_warm_up(lat, self.geo, u, vc)?;
        }
        self.dit.enqueue_warm_up(lat, self.geo, &self.cond, vc)?;
        gpu.sync_compute()?;
        Ok(())
    }

    fn enqueue(&mut self, step: usize, sigma: f32, sigma_next: f32) -> Result<(), DenoiseError> {
        let (lat, vc, vu) = self.ptrs()?;
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
        let mut f = 0;
        if let Some(u) = &self.uncond {
            self.dit.enqueue_forward(lat, sigma, self.geo, u, vu)?;
            rec(&ev.forwards[f])?;
            f += 1;
        }
        self.dit
            .enqueue_forward(lat, sigma, self.geo, &self.cond, vc)?;
        rec(&ev.forwards[f])?;
        let u = if self.uncond.is_some() { vu } else { 0 };
        let n = self.n() * LATENT_CHANNELS;
        self.dit
            .kernels()
            .guided_euler(s, lat, vc, u, self.guidance, sigma_next - sigma, n)?;
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
        let forwards = if self.uncond.is_some() { 2 } else { 1 };
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
        let (lat, _, _) = self.ptrs()?;
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
        if !v.iter().all(|x| x.is_finite()) {
            return Err(DenoiseError::NonFinite(
                "on the device (after the last step)".into(),
            ));
        }
        self.io = None;
        let t =
            Tensor::new(&[n, LATENT_CHANNELS], v).map_err(|e| order(format!("latents: {e}")))?;
        Ok((t, ms))
    }
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
                &StagingOptions::new(staging::StagingArm::Batched),
                &cond,
                (1, 2, 2),
                25.0,
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
        let (a, b) = (loop_bytes(&d, 640, l), loop_bytes(&d, 1280, l));
        assert!(
            b - a > 640 * 2048 * 24 && b - a < 640 * 2048 * 26,
            "{a} {b}"
        );
    }
}
