//! cuBLASLt GEMMs for the DiT: `Y[m, n] = X[m, k] · W[n, k]ᵀ (+ b) (→ GELU)`,
//! bf16 operands and output, fp32 accumulation and scaling, row-major tensors as
//! the checkpoint stores them (a Linear's weight is [out, in]).
//!
//! The safe cudarc `matmul` rebuilds the descriptors and reruns the algorithm
//! heuristic on every call (~21 us of host time); here the matmul descriptor,
//! the three layouts and the heuristic's algorithm are built once per
//! (m, n, k, epilogue) and kept in a `Plan`; a call only sets the bias pointer
//! and enqueues the product.
//!
//! Row-major to cuBLASLt's column-major: Yᵀ (n × m, ld n) = op(A)·op(B) with
//! A = W read as a k × n column-major matrix and transposed, B = X read as a
//! k × m column-major matrix, not transposed.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::{CudaError, DriverContext};

/// cuBLASLt workspace: NVIDIA's recommendation for Hopper.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// What the GEMM applies after the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// Y = X Wᵀ.
    None,
    /// Y = X Wᵀ + b.
    Bias,
    /// Y = gelu_tanh(X Wᵀ + b).
    BiasGelu,
}

/// One cached problem: descriptors and the chosen algorithm.
struct Plan {
    desc: ltsys::cublasLtMatmulDesc_t,
    a: ltsys::cublasLtMatrixLayout_t,
    b: ltsys::cublasLtMatrixLayout_t,
    c: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created once by `Gemm::plan`, destroyed once here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

type Key = (usize, usize, usize, Epilogue);

/// A cuBLASLt handle, its workspace and the plan cache.
pub struct Gemm {
    handle: ltsys::cublasLtHandle_t,
    workspace: DeviceBuffer,
    plans: Mutex<HashMap<Key, Plan>>,
}

// SAFETY: the handle is used from one thread at a time (the plan mutex is held
// for the duration of each enqueue).
unsafe impl Send for Gemm {}
unsafe impl Sync for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        if let Ok(mut p) = self.plans.lock() {
            p.clear();
        }
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn set_desc<T>(
    desc: ltsys::cublasLtMatmulDesc_t,
    attr: ltsys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<(), CudaError> {
    // SAFETY: `v` points to a value of the attribute's documented type and size.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .ctx("setting a matmul descriptor attribute")
}

impl Gemm {
    /// A handle and workspace on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Gemm, CudaError> {
        gpu.bind()?;
        let handle = lt::create_handle().ctx("creating the cuBLASLt handle")?;
        let workspace = DeviceBuffer::alloc(gpu, WORKSPACE_BYTES, "the cuBLASLt workspace")?;
        Ok(Gemm {
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// Number of cached plans (each built once).
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.len()).unwrap_or(0)
    }

    fn plan(
        &self,
        m: usize,
        n: usize,
        k: usize,
        ep: Epilogue,
        bias_probe: CUdeviceptr,
    ) -> Result<Plan, CudaError> {
        let bf16 = ltsys::cudaDataType::CUDA_R_16BF;
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        )
        .ctx("creating a matmul descriptor")?;
        let mk = |rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(bf16, rows as u64, cols as u64, ld as i64)
                .ctx("creating a matrix layout")
        };
        let a = mk(k, n, k)?;
        let b = mk(k, m, k)?;
        let c = mk(n, m, n)?;
        let mut plan = Plan {
            desc,
            a,
            b,
            c,
            // SAFETY: a plain C struct of integers, overwritten below.
            algo: unsafe { std::mem::zeroed() },
        };
        set_desc(
            desc,
            ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &1i32, /* CUBLAS_OP_T */
        )?;
        set_desc(
            desc,
            ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &0i32, /* CUBLAS_OP_N */
        )?;
        let epi = match ep {
            Epilogue::None => ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGelu => ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        set_desc(
            desc,
            ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &(epi as u32),
        )?;
        if ep != Epilogue::None {
            set_desc(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias_probe,
            )?;
        }
        let pref = lt::create_matmul_pref().ctx("creating matmul preferences")?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: the attribute is a u64 byte count.
        let r = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            )
        }
        .ctx("setting the workspace preference");
        // SAFETY: all descriptors are live.
        let heur = r.and_then(|_| {
            unsafe { lt::get_matmul_algo_heuristic(self.handle, desc, a, b, c, c, pref) }.ctx(
                format!("choosing an algorithm for m={m} n={n} k={k} {ep:?}"),
            )
        });
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        plan.algo = heur?.algo;
        Ok(plan)
    }

    /// Enqueue `y = x · wᵀ (+ bias) (→ GELU)` on `stream`: x bf16 [m, k], w bf16
    /// \[n, k\], bias bf16 \[n\] (ignored for [`Epilogue::None`]), y bf16 \[m, n\]. All
    /// pointers 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        stream: &CudaStream,
        x: CUdeviceptr,
        w: CUdeviceptr,
        bias: CUdeviceptr,
        y: CUdeviceptr,
        m: usize,
        n: usize,
        k: usize,
        ep: Epilogue,
    ) -> Result<(), CudaError> {
        if m == 0 || n == 0 || k == 0 {
            return Err(CudaError::Invalid(format!(
                "GEMM with an empty dimension (m={m} n={n} k={k})"
            )));
        }
        for (what, ptr) in [("x", x), ("w", w), ("y", y)] {
            if ptr % 16 != 0 {
                return Err(CudaError::Invalid(format!(
                    "GEMM operand {what} at {ptr:#x} is not 16-byte aligned"
                )));
            }
        }
        if ep != Epilogue::None && (bias == 0 || bias % 16 != 0) {
            return Err(CudaError::Invalid(format!(
                "GEMM bias at {bias:#x} is null or not 16-byte aligned"
            )));
        }
        let mut plans = self.plans.lock().map_err(|_| {
            CudaError::Invalid("the GEMM plan cache was poisoned by a panic".into())
        })?;
        let key = (m, n, k, ep);
        let plan = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(self.plan(m, n, k, ep, bias)?),
        };
        if ep != Epilogue::None {
            set_desc(
                plan.desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias,
            )?;
        }
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: descriptors match the operands' shapes; the pointers name device
        // ranges of the documented sizes; the workspace is ours.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w as *const c_void,
                plan.a,
                x as *const c_void,
                plan.b,
                y as *const c_void,
                plan.c,
                y as *mut c_void,
                plan.c,
                &plan.algo,
                self.workspace.ptr() as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as ltsys::cudaStream_t,
            )
        }
        .ctx(format!("running a GEMM m={m} n={n} k={k} {ep:?}"))
    }
}

/// FLOPs of one `linear` call (2 m n k).
pub fn flops(m: usize, n: usize, k: usize) -> f64 {
    2.0 * m as f64 * n as f64 * k as f64
}
