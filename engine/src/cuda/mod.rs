//! The device-resident CUDA arm.
//!
//! Compiled on every machine; CUDA itself is loaded at run time (cudarc with
//! dynamic loading), so a build or test without a GPU never touches a CUDA
//! library. [`kit::context::probe_libraries`] checks that the libraries exist before anything
//! asks cudarc for a symbol (cudarc panics on a missing library), and turns their
//! absence into [`CudaError::NotAvailable`].
//!
//! Layered so that every import points down the list (`tests/it/layout.rs`
//! holds it):
//! 1. [`kit`]: the device kit every model is built on: the GPU, streams and
//!    events ([`kit::context`]), buffers and arenas ([`kit::memory`]), run-time
//!    compiled kernels ([`kit::nvrtc`], [`kit::kernels`]), cuBLASLt GEMMs
//!    ([`kit::gemm`]), bf16 on the host ([`kit::bf16`]), and [`kit::DeviceKit`]
//!    holding them together.
//! 2. [`staging`]: checkpoint tensors onto the device (the `staging` lever).
//! 3. [`models`]: the device forwards: the DiT ([`models::dit`]), the T5 encoder
//!    ([`models::t5`]) and the video VAE decoder ([`models::vae`]).
//! 4. [`denoise`]: the device-resident denoise loop behind
//!    [`crate::denoise::Denoiser`] (eager or graph-replayed); [`burn`]: the
//!    known GEMM load of the GPU-utilization control.
//! 5. Checks and benchmarks, imported by nothing but the command line and
//!    crate-private (not part of the library's surface): `selftest`
//!    (`engine selftest-cuda`: every device model and kernel against the CPU
//!    arm), `bench` (the device benchmarks) and `fixtures` (seeded inputs and
//!    synthetic weight files both use).

pub(crate) mod bench;
pub mod burn;
pub mod denoise;
pub(crate) mod fixtures;
pub mod kit;
pub mod models;
pub(crate) mod selftest;
pub mod staging;

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
