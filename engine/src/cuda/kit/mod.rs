//! The device kit: the GPU ([`context`]), memory ([`memory`]), run-time
//! compiled kernels ([`nvrtc`], [`kernels`]), cuBLASLt GEMMs ([`gemm`]), e4m3 weights and
//! activations for FP8 GEMMs ([`fp8`]), cuDNN's fused attention ([`sdpa`]) and its FP8 form
//! ([`sdpa_fp8`]) over its backend graph API ([`cudnn_graph`]), the
//! device bytes held ([`tracker`]) and the host's bf16 conversions ([`bf16`]). Everything in `cuda/` is built on it;
//! it imports nothing else of `cuda/` but [`super::CudaError`].

pub mod bf16;
pub mod context;
pub mod cudnn_graph;
pub mod fp8;
pub mod gemm;
pub mod gemm_tune;
pub mod kernels;
pub mod memory;
pub mod nvrtc;
pub mod sdpa;
pub mod sdpa_fp8;
pub mod tracker;

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;

use self::bf16::{narrow, widen};
use self::context::Gpu;
use self::gemm::Gemm;
use self::kernels::Kernels;
use self::memory::{download, upload, DeviceBuffer};
use super::CudaError;

/// The device objects every device model and check is built on: the GPU, its
/// loaded kernels and the cuBLASLt handle (cloning shares them).
#[derive(Clone)]
pub struct DeviceKit {
    /// The GPU.
    pub gpu: Arc<Gpu>,
    /// Loaded kernels.
    pub kernels: Arc<Kernels>,
    /// cuBLASLt.
    pub gemm: Arc<Gemm>,
    /// Where [`DeviceKit::open`] spent its time.
    pub opened: OpenTimes,
}

/// Where a [`DeviceKit::open`] spent its time (host seconds each): the
/// context (the process's first CUDA call initialises the driver), the kernel
/// modules (each read from the disk cache or compiled by NVRTC, then loaded)
/// and the cuBLASLt handle. A render's load phases carry them beside
/// `device_open_s` (`load.text_encoder`'s open is the process's first).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpenTimes {
    /// Seconds to open GPU 0's context and its streams.
    pub context_s: f64,
    /// Seconds to obtain and load every kernel module.
    pub kernels_s: f64,
    /// Seconds to create the cuBLASLt handle.
    pub gemm_s: f64,
    /// Kernel modules compiled by NVRTC (not found in the disk cache).
    pub modules_compiled: usize,
}

impl DeviceKit {
    /// Open GPU 0 and load everything, timing each part ([`OpenTimes`]).
    pub fn open() -> Result<DeviceKit, CudaError> {
        let t0 = std::time::Instant::now();
        let gpu = Arc::new(Gpu::open(0)?);
        let t1 = std::time::Instant::now();
        let kernels = Arc::new(Kernels::load(&gpu)?);
        let t2 = std::time::Instant::now();
        let gemm = Arc::new(Gemm::new(&gpu)?);
        let t3 = std::time::Instant::now();
        let modules_compiled = kernels
            .report
            .modules
            .iter()
            .filter(|m| m.1 == nvrtc::Origin::Compiled)
            .count();
        let opened = OpenTimes {
            context_s: (t1 - t0).as_secs_f64(),
            kernels_s: (t2 - t1).as_secs_f64(),
            gemm_s: (t3 - t2).as_secs_f64(),
            modules_compiled,
        };
        Ok(DeviceKit {
            gpu,
            kernels,
            gemm,
            opened,
        })
    }

    /// A kit with the same GPU, kernels and cuBLASLt handle (shared).
    pub fn share(&self) -> DeviceKit {
        DeviceKit {
            gpu: self.gpu.clone(),
            kernels: self.kernels.clone(),
            gemm: self.gemm.clone(),
            opened: self.opened,
        }
    }

    /// `x` rounded to bf16 in a new device buffer.
    pub(crate) fn bf16(&self, x: &[f32]) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, x.len() * 2, "a host input")?;
        upload(&self.gpu, b.ptr(), &narrow(x))?;
        Ok(b)
    }
    /// `x` in a new f32 device buffer.
    pub(crate) fn f32(&self, x: &[f32]) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, x.len() * 4, "a host input")?;
        upload(&self.gpu, b.ptr(), x)?;
        Ok(b)
    }
    /// A buffer of `bytes` filled with NaN bytes.
    pub(crate) fn poisoned(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, bytes, "a poisoned output")?;
        b.fill_bytes(&self.gpu, 0xFF, &self.gpu.compute)?;
        Ok(b)
    }
    /// `n` bf16 values at `p`, widened.
    pub(crate) fn read_bf16(&self, p: CUdeviceptr, n: usize) -> Result<Vec<f32>, CudaError> {
        Ok(widen(&download::<u16>(&self.gpu, p, n)?))
    }
    /// `n` f32 values at `p`.
    pub(crate) fn read_f32(&self, p: CUdeviceptr, n: usize) -> Result<Vec<f32>, CudaError> {
        download::<f32>(&self.gpu, p, n)
    }
}
