//! The device-resident CUDA arm.
//!
//! Compiled on every machine; CUDA itself is loaded at run time (cudarc with
//! dynamic loading), so a build or test without a GPU never touches a CUDA
//! library. [`context::probe_libraries`] checks that the libraries exist before anything
//! asks cudarc for a symbol (cudarc panics on a missing library), and turns their
//! absence into [`CudaError::NotAvailable`].
//!
//! One file per concern:
//! - [`context`]: the device, its compute and copy streams, events, the probe.
//! - [`memory`]: device buffers with an allocator high-water mark, and a bump
//!   arena for workspaces.
//! - [`nvrtc`]: run-time compilation of `kernels/*.cu` for sm_90, cached on disk.
//! - [`kernels`]: typed launches of the elementwise, row-wise and attention
//!   kernels (a scalar reference attention and the fused flash kernel).
//! - [`gemm`]: cuBLASLt bf16 GEMMs with fused bias / GELU epilogues and cached plans.
//! - [`staging`]: weights from a safetensors file onto the device (serial | batched).
//! - [`dit`]: the LTX-Video transformer forward, device-resident end to end.
//! - [`backend`]: the device-resident sampler loop behind [`crate::denoise::Denoiser`].
//! - [`t5`]: the T5 text encoder forward (lever `conditioning = device`);
//!   [`t5_check`] its checks against the host arm.
//! - [`vae`]: the video VAE decoder on the device, streamed in temporal chunks.
//! - [`selftest`] / [`bench`] / [`burn`]: device checks against the CPU arm,
//!   benchmarks, the GEMM load; [`graph_check`] / [`graph_bench`]: graph-replayed vs eager
//!   loops, checked and timed.

pub mod backend;
pub mod bench;
pub mod burn;
pub mod context;
pub mod dit;
pub mod gemm;
pub mod graph_bench;
pub mod graph_check;
pub mod kernels;
pub mod memory;
pub mod nvrtc;
pub mod selftest;
pub mod staging;
pub mod t5;
pub mod t5_check;
pub mod vae;

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;

/// Errors of the CUDA arm. Each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA here: a library or the device is missing.
    #[error("no CUDA here: {0}")]
    NotAvailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {what}: {source:?}")]
    Driver {
        /// What the engine was doing.
        what: String,
        /// The driver's error.
        source: DriverError,
    },
    /// A kernel module did not compile.
    #[error("NVRTC could not compile kernel module '{module}': {log}")]
    Compile {
        /// Module name (`elementwise`, `attention`).
        module: String,
        /// The compiler's log.
        log: String,
    },
    /// A cuBLASLt call failed.
    #[error("cuBLASLt error while {what}: {source:?}")]
    Blas {
        /// What the engine was doing.
        what: String,
        /// The library's status.
        source: CublasError,
    },
    /// A device allocation could not be satisfied.
    #[error("device out of memory: asked for {requested} bytes while {what} ({free} of {total} bytes free)")]
    OutOfMemory {
        /// What the allocation was for.
        what: String,
        /// Bytes asked for.
        requested: usize,
        /// Free device bytes at the time.
        free: usize,
        /// Total device bytes.
        total: usize,
    },
    /// Shapes or arguments that the device code cannot accept.
    #[error("invalid device operation: {0}")]
    Invalid(String),
    /// A weights file could not be staged.
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightError),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Attach `what` to a driver result.
pub(crate) trait DriverContext<T> {
    /// Map the driver error into [`CudaError::Driver`] naming `what`.
    fn ctx(self, what: impl Into<String>) -> Result<T, CudaError>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn ctx(self, what: impl Into<String>) -> Result<T, CudaError> {
        self.map_err(|source| CudaError::Driver {
            what: what.into(),
            source,
        })
    }
}

impl<T> DriverContext<T> for Result<T, CublasError> {
    fn ctx(self, what: impl Into<String>) -> Result<T, CudaError> {
        self.map_err(|source| CudaError::Blas {
            what: what.into(),
            source,
        })
    }
}
