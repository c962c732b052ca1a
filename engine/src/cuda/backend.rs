//! The boundary the render pipeline calls for the DiT forward, with one
//! implementation per arm. The pipeline holds a `Box<dyn DitBackend>` chosen by
//! `--device cpu|cuda` (or the rung's `device`), so nothing above this trait
//! knows whether CUDA exists; [`open_cuda_dit`] turns a machine without CUDA
//! into [`CudaError::NotAvailable`] instead of a panic.

use std::path::Path;
use std::sync::Arc;

use super::dit::{DeviceDit, DitDims, Geometry, LATENT_CHANNELS};
use super::kernels::Kernels;
use super::selftest::Rig;
use super::staging::{self, StagingOptions, StagingReport};
use super::CudaError;
use crate::models::dit::DitConfig;
use crate::tensor::Tensor;

/// A DiT forward failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The device arm failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The inputs do not fit the model.
    #[error("DiT forward input: {0}")]
    Input(String),
    /// The CPU arm failed.
    #[error("CPU DiT forward: {0}")]
    Cpu(String),
}

/// The DiT forward as the pipeline calls it.
pub trait DitBackend {
    /// `cpu` or `cuda`.
    fn arm(&self) -> &'static str;

    /// latents [tokens, 128] in (f, h, w) raster order; sigma in [0, 1]; text
    /// [L, caption_channels]; text_mask L values of 0/1; the latent grid; fps.
    /// Returns the velocity [tokens, 128].
    fn forward(
        &mut self,
        latents: &Tensor,
        sigma: f32,
        text: &Tensor,
        text_mask: &[f32],
        grid: (usize, usize, usize),
        fps: f32,
    ) -> Result<Tensor, BackendError>;

    /// Device milliseconds of the last forward (CUDA events); `None` on the CPU.
    fn last_device_ms(&self) -> Option<f64>;

    /// Device bytes held at most since the last [`DitBackend::reset_peak`];
    /// `None` on the CPU.
    fn peak_device_bytes(&self) -> Option<u64>;

    /// Start a new phase for [`DitBackend::peak_device_bytes`].
    fn reset_peak(&self);
}

/// The CPU reference arm: the `models` transformer in f32.
pub struct CpuDit {
    model: crate::models::dit::Transformer,
}

impl CpuDit {
    /// Wrap a loaded CPU transformer.
    pub fn new(model: crate::models::dit::Transformer) -> CpuDit {
        CpuDit { model }
    }
}

impl DitBackend for CpuDit {
    fn arm(&self) -> &'static str {
        "cpu"
    }

    fn forward(
        &mut self,
        latents: &Tensor,
        sigma: f32,
        text: &Tensor,
        text_mask: &[f32],
        grid: (usize, usize, usize),
        fps: f32,
    ) -> Result<Tensor, BackendError> {
        self.model
            .forward(latents, sigma, text, text_mask, grid, fps)
            .map_err(|e| BackendError::Cpu(e.to_string()))
    }

    fn last_device_ms(&self) -> Option<f64> {
        None
    }

    fn peak_device_bytes(&self) -> Option<u64> {
        None
    }

    fn reset_peak(&self) {}
}

/// The CUDA arm: weights staged once, forwards device-resident.
pub struct CudaDit {
    rig: Rig,
    dit: DeviceDit,
    last_ms: Option<f64>,
}

/// Open the GPU, stage the transformer's safetensors file and bind it.
pub fn open_cuda_dit(
    weights: &Path,
    cfg: &DitConfig,
    staging: &StagingOptions,
) -> Result<(CudaDit, StagingReport), CudaError> {
    let dims = DitDims::from_config(cfg)?;
    let rig = Rig::open()?;
    let (w, report) = staging::stage_file(&rig.gpu, weights, staging)?;
    let dit = DeviceDit::new(
        rig.gpu.clone(),
        rig.kernels.clone(),
        rig.gemm.clone(),
        dims,
        Arc::new(w),
    )?;
    Ok((
        CudaDit {
            rig,
            dit,
            last_ms: None,
        },
        report,
    ))
}

impl CudaDit {
    /// The loaded kernels (for reports).
    pub fn kernels(&self) -> &Kernels {
        &self.rig.kernels
    }
}

fn check_inputs(
    latents: &Tensor,
    text: &Tensor,
    mask: &[f32],
    caption: usize,
    grid: (usize, usize, usize),
) -> Result<(), BackendError> {
    let n = grid.0 * grid.1 * grid.2;
    if latents.shape() != [n, LATENT_CHANNELS] {
        return Err(BackendError::Input(format!(
            "latents have shape {:?}, the grid {grid:?} needs [{n}, {LATENT_CHANNELS}]",
            latents.shape()
        )));
    }
    if text.shape() != [mask.len(), caption] {
        return Err(BackendError::Input(format!(
            "text has shape {:?}, expected [{}, {caption}] (mask length x caption channels)",
            text.shape(),
            mask.len()
        )));
    }
    Ok(())
}

impl DitBackend for CudaDit {
    fn arm(&self) -> &'static str {
        "cuda"
    }

    fn forward(
        &mut self,
        latents: &Tensor,
        sigma: f32,
        text: &Tensor,
        text_mask: &[f32],
        grid: (usize, usize, usize),
        fps: f32,
    ) -> Result<Tensor, BackendError> {
        check_inputs(
            latents,
            text,
            text_mask,
            self.dit.dims().caption_channels,
            grid,
        )?;
        let (v, ms) = self.dit.forward(
            latents.data(),
            sigma,
            text.data(),
            text_mask,
            Geometry { grid, fps },
        )?;
        self.last_ms = Some(ms);
        Tensor::new(latents.shape(), v).map_err(|e| BackendError::Input(e.to_string()))
    }

    fn last_device_ms(&self) -> Option<f64> {
        self.last_ms
    }

    fn peak_device_bytes(&self) -> Option<u64> {
        Some(self.rig.gpu.mem.peak())
    }

    fn reset_peak(&self) {
        self.rig.gpu.mem.reset_peak();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_dit_without_cuda_is_a_clean_error() {
        let cfg = crate::presets::dit_tiny();
        let r = std::panic::catch_unwind(|| {
            open_cuda_dit(
                Path::new("/nonexistent/transformer.safetensors"),
                &cfg,
                &StagingOptions::new(staging::StagingArm::Batched),
            )
            .map(|_| ())
        })
        .expect("must not panic");
        let e = r.expect_err("no file: must fail");
        let s = e.to_string();
        assert!(
            s.starts_with("no CUDA here") || s.contains("/nonexistent/transformer.safetensors"),
            "{s}"
        );
    }

    #[test]
    fn cpu_arm_behind_the_trait_runs_the_models_transformer() {
        use crate::cuda::selftest::{synth_host_weights, Rng};
        use crate::weights::{MapSource, VarBuilder};
        let cfg = crate::presets::dit_tiny();
        let dims = DitDims::from_config(&cfg).unwrap();
        let mut src = MapSource::new();
        for (name, v) in synth_host_weights(&dims.tensor_specs(), 3) {
            let spec = dims
                .tensor_specs()
                .into_iter()
                .find(|s| s.name == name)
                .unwrap();
            src.insert(name, Tensor::new(&spec.shape, v).unwrap());
        }
        let model = crate::models::dit::Transformer::load(&VarBuilder::new(&src), &cfg).unwrap();
        let mut b: Box<dyn DitBackend> = Box::new(CpuDit::new(model));
        let mut rng = Rng::new(4);
        let grid = (2, 2, 3);
        let lat = Tensor::new(&[12, 128], rng.normal(12 * 128, 1.0)).unwrap();
        let text = Tensor::new(&[8, 64], rng.normal(8 * 64, 1.0)).unwrap();
        let mask = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
        let v = b.forward(&lat, 0.6, &text, &mask, grid, 25.0).unwrap();
        assert_eq!(b.arm(), "cpu");
        assert!(b.last_device_ms().is_none() && b.peak_device_bytes().is_none());
        // The CPU arm and the device checks' host reference compute the same
        // function (f32 both: only summation order differs).
        let hw = synth_host_weights(&dims.tensor_specs(), 3);
        let r = crate::cuda::host_ref::dit_forward(
            &hw,
            &dims,
            lat.data(),
            0.6,
            text.data(),
            &mask,
            grid,
            25.0,
        );
        let (rel, _) = crate::cuda::host_ref::rel_err(v.data(), &r);
        assert!(rel < 1e-4, "CPU arm vs host reference: rel {rel}");
        let e = b
            .forward(&lat, 0.6, &text, &mask[..7], grid, 25.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("text_mask"), "{e}");
    }

    #[test]
    fn input_shapes_are_checked_with_the_expected_shape_named() {
        let lat = Tensor::zeros(&[6, 128]);
        let text = Tensor::zeros(&[4, 64]);
        assert!(check_inputs(&lat, &text, &[1.0; 4], 64, (1, 2, 3)).is_ok());
        let e = check_inputs(&lat, &text, &[1.0; 4], 64, (1, 2, 4))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[8, 128]"), "{e}");
        let e = check_inputs(&lat, &text, &[1.0; 3], 64, (1, 2, 3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[3, 64]"), "{e}");
    }
}
