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
//!
//! [`Gemm::linear_fp8`] is the same product on e4m3 operands quantized row by
//! row ([`crate::fp8`]): cuBLASLt's outer-vector scaling (cuBLAS 12.9+ on
//! Hopper) multiplies output column `o` by the weight row's scale and output row
//! `t` by the token's scale inside the GEMM, accumulating in f32. The layout is
//! the one FP8 GEMMs require on Hopper anyway: A transposed, B not ("TN").

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::gemm_tune::{self, AlgoChoice, Stored, TuneCache, TuneReport};
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

/// How an FP8 product accumulates (lever `fp8-accum`).
///
/// Hopper's FP8 tensor-core instructions keep their running sums with fewer
/// mantissa bits than f32. cuBLASLt's default ([`Accum::Exact`]) therefore
/// moves the partial sums into f32 registers every few k-steps (extra
/// instructions in the main loop); [`Accum::Fast`] (`FAST_ACCUM`) lets the
/// tensor core accumulate a whole k-tile chain before that, faster and less
/// exact in the sums (not in the operands: the e4m3 codes and scales are the
/// same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accum {
    /// Partial sums promoted to f32 at cuBLASLt's default cadence.
    Exact,
    /// `CUBLASLT_MATMUL_DESC_FAST_ACCUM` on.
    Fast,
}

impl Accum {
    /// The `fp8-accum` lever's arm name (`exact`, `fast`).
    pub fn name(self) -> &'static str {
        match self {
            Accum::Exact => "exact",
            Accum::Fast => "fast",
        }
    }
}

/// The granularity of an FP8 product's scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Scaling {
    /// One f32 per row of x (token) and per row of w (output channel), applied
    /// as cuBLASLt's outer-vector scales (the engine's `precision = fp8`).
    Row,
    /// One f32 for all of x and one for all of w (cuBLASLt's scalar scales);
    /// measured by the benchmark beside [`Fp8Scaling::Row`], not used by a
    /// render.
    Tensor,
}

/// The operands' element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Operands {
    /// bf16 x and w.
    Bf16,
    /// e4m3 x and w with scales of the given granularity, accumulated so.
    Fp8(Fp8Scaling, Accum),
}

/// One cached problem: descriptors and the chosen algorithm.
struct Plan {
    desc: ltsys::cublasLtMatmulDesc_t,
    a: ltsys::cublasLtMatrixLayout_t,
    b: ltsys::cublasLtMatrixLayout_t,
    c: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
    /// Whether the epilogue asked for is the one the plan runs: false when an
    /// FP8 plan asked for [`Epilogue::BiasGelu`] got no algorithm with it and
    /// runs [`Epilogue::Bias`], leaving the GELU to the caller.
    fused: bool,
    /// An FP8 plan asked for [`Accum::Fast`] that cuBLASLt refused at this
    /// shape (`NOT_SUPPORTED`), and that runs [`Accum::Exact`] instead.
    fast_refused: bool,
    /// The heuristic's answers in its order (the first is `algo` until a
    /// tuned choice replaces it); one unless the plan is for
    /// [`AlgoChoice::Tuned`].
    candidates: Vec<ltsys::cublasLtMatmulAlgo_t>,
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

type Key = (usize, usize, usize, Epilogue, Operands, AlgoChoice);

/// A problem's name in the tuning cache and the reports: "m{m} n{n} k{k}
/// {epilogue} {operands}".
fn key_name(key: &Key) -> String {
    format!("m{} n{} k{} {:?} {:?}", key.0, key.1, key.2, key.3, key.4)
}

/// The first call's pointers a plan is built with: the bias, and (x's, w's)
/// scale vectors of an FP8 product.
#[derive(Debug, Clone, Copy)]
struct Probes {
    bias: CUdeviceptr,
    scales: Option<(CUdeviceptr, CUdeviceptr)>,
    /// How many of the heuristic's answers to keep (1, or
    /// [`gemm_tune::CANDIDATES`] for a tuned plan).
    count: usize,
}

/// A cuBLASLt handle, its workspace and the plan cache.
pub struct Gemm {
    handle: ltsys::cublasLtHandle_t,
    workspace: DeviceBuffer,
    plans: Mutex<HashMap<Key, Plan>>,
    /// Whether new plans time their candidates ([`AlgoChoice::Tuned`], lever
    /// `gemm-algo`): read on every enqueue, so an atomic, not a lock.
    tuned: AtomicBool,
    /// The tuned choice's cache and report.
    tuner: Mutex<Tuner>,
    /// The cache file's name for this card and library.
    cache_name: String,
}

/// The state of [`AlgoChoice::Tuned`]: the machine's cache (opened at the
/// first tuned plan) and what the choice did.
#[derive(Default)]
struct Tuner {
    /// Where the cache lives: `None` until set or first needed.
    path: Option<Option<std::path::PathBuf>>,
    cache: Option<TuneCache>,
    report: TuneReport,
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
        // SAFETY: a plain query of the loaded library's version.
        let lt_version = unsafe { ltsys::cublasLtGetVersion() };
        Ok(Gemm {
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
            tuned: AtomicBool::new(false),
            tuner: Mutex::new(Tuner::default()),
            cache_name: gemm_tune::cache_file_name(&gpu.name, gpu.capability, lt_version),
        })
    }

    /// How the plans made from now on choose their algorithm (lever
    /// `gemm-algo`); plans already made keep theirs (each choice has its own).
    pub fn set_choice(&self, choice: AlgoChoice) {
        self.tuned
            .store(choice == AlgoChoice::Tuned, Ordering::Relaxed);
    }

    /// The algorithm choice new plans use.
    pub fn choice(&self) -> AlgoChoice {
        if self.tuned.load(Ordering::Relaxed) {
            AlgoChoice::Tuned
        } else {
            AlgoChoice::Heuristic
        }
    }

    /// Keep tuned choices in `path` instead of the engine's cache directory
    /// (`None`: in memory only). Takes effect before the first tuned plan.
    pub fn set_tune_cache(&self, path: Option<std::path::PathBuf>) {
        if let Ok(mut t) = self.tuner.lock() {
            if t.cache.is_none() {
                t.path = Some(path);
            }
        }
    }

    /// The default cache file: `<engine cache dir>/gemm-algos/<card, capability,
    /// cuBLASLt version>.tsv` ([`gemm_tune`]).
    pub fn default_tune_cache(&self) -> Option<std::path::PathBuf> {
        super::nvrtc::cache_dir().map(|d| d.join("gemm-algos").join(&self.cache_name))
    }

    /// What [`AlgoChoice::Tuned`] did so far (empty when it never ran).
    pub fn tune_report(&self) -> TuneReport {
        self.tuner
            .lock()
            .map(|t| t.report.clone())
            .unwrap_or_default()
    }

    /// Number of cached plans (each built once).
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// The (m, n, k) of every FP8 product with `scaling` planned so far that
    /// asked for [`Accum::Fast`] and runs [`Accum::Exact`] because cuBLASLt had
    /// no fast algorithm for it, sorted.
    pub fn fast_refused(&self, scaling: Fp8Scaling) -> Vec<(usize, usize, usize)> {
        let mut v: Vec<(usize, usize, usize)> = self
            .plans
            .lock()
            .map(|p| {
                p.iter()
                    .filter(|(key, plan)| {
                        plan.fast_refused && key.4 == Operands::Fp8(scaling, Accum::Fast)
                    })
                    .map(|(key, _)| (key.0, key.1, key.2))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The plan of one product. An FP8 product asked for [`Accum::Fast`] at a
    /// shape where cuBLASLt has no fast algorithm (seen on an H100 at m=300
    /// n=2048 k=8192 with outer-vector scales, while m=6144 had one) runs
    /// [`Accum::Exact`] and says so ([`Gemm::fast_refused`]): one refused
    /// shape must not fail a render, nor pass unrecorded.
    fn plan(
        &self,
        (m, n, k): (usize, usize, usize),
        ep: Epilogue,
        ops: Operands,
        probes: Probes,
    ) -> Result<Plan, CudaError> {
        match ops {
            Operands::Fp8(scaling, Accum::Fast) => or_fallback(
                self.plan_epilogue((m, n, k), ep, ops, probes),
                || {
                    let exact = Operands::Fp8(scaling, Accum::Exact);
                    self.plan_epilogue((m, n, k), ep, exact, probes)
                },
                |p| p.fast_refused = true,
            ),
            _ => self.plan_epilogue((m, n, k), ep, ops, probes),
        }
    }

    fn plan_epilogue(
        &self,
        (m, n, k): (usize, usize, usize),
        ep: Epilogue,
        ops: Operands,
        probes: Probes,
    ) -> Result<Plan, CudaError> {
        match (ops, ep) {
            // An FP8 GELU epilogue may not exist for outer-vector scales: then the
            // plan runs the bias epilogue and the caller the GELU.
            (Operands::Fp8(..), Epilogue::BiasGelu) => or_fallback(
                self.plan_exactly((m, n, k), ep, ops, probes),
                || self.plan_exactly((m, n, k), Epilogue::Bias, ops, probes),
                |p| p.fused = false,
            ),
            _ => self.plan_exactly((m, n, k), ep, ops, probes),
        }
    }

    /// The plan of one product with `probes.count` of the heuristic's answers
    /// (its first as the algorithm).
    fn plan_exactly(
        &self,
        (m, n, k): (usize, usize, usize),
        ep: Epilogue,
        ops: Operands,
        probes: Probes,
    ) -> Result<Plan, CudaError> {
        let bias_probe = probes.bias;
        let bf16 = ltsys::cudaDataType::CUDA_R_16BF;
        let input = match ops {
            Operands::Bf16 => bf16,
            Operands::Fp8(..) => ltsys::cudaDataType::CUDA_R_8F_E4M3,
        };
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        )
        .ctx("creating a matmul descriptor")?;
        let mk = |ty, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64)
                .ctx("creating a matrix layout")
        };
        let a = mk(input, k, n, k)?;
        let b = mk(input, k, m, k)?;
        let c = mk(bf16, n, m, n)?;
        let mut plan = Plan {
            desc,
            a,
            b,
            c,
            // SAFETY: a plain C struct of integers, overwritten below.
            algo: unsafe { std::mem::zeroed() },
            fused: true,
            fast_refused: false,
            candidates: Vec::new(),
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
        if let Operands::Fp8(scaling, accum) = ops {
            // Row: one f32 per row of op(A) (the weight's output channels) and
            // per column of op(B) (the tokens); Tensor: one f32 each. The bias
            // stays bf16 like the output.
            if scaling == Fp8Scaling::Row {
                let outer =
                    ltsys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                        as i32;
                for attr in [
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                ] {
                    set_desc(desc, attr, &outer)?;
                }
            }
            set_desc(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &(bf16 as i32),
            )?;
            // Said either way (off is cuBLASLt's default): see [`Accum`].
            set_desc(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                &i8::from(accum == Accum::Fast),
            )?;
            // The first call's scales, so that the heuristic sees the problem
            // whole (each call sets its own before the product).
            if let Some((sx, sw)) = probes.scales {
                set_desc(
                    desc,
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                    &sw,
                )?;
                set_desc(
                    desc,
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                    &sx,
                )?;
            }
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
        let heur = r.and_then(|_| {
            heuristics(self.handle, &plan, pref, probes.count).ctx(format!(
                "choosing an algorithm for m={m} n={n} k={k} {ep:?} {ops:?}"
            ))
        });
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        plan.candidates = heur?;
        plan.algo = plan.candidates[0];
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
        self.enqueue(stream, (x, w, None), bias, y, (m, n, k), ep, Operands::Bf16)
            .map(|_| ())
    }

    /// Enqueue the FP8 Linear `y[t, o] = sx[t] · sw[o] · Σ_i x[t, i] · w[o, i]
    /// (+ bias[o]) (→ GELU)` on `stream`: `x` = (e4m3 codes [m, k], f32 scales
    /// \[m\]), `w` = (e4m3 codes [n, k], f32 scales \[n\]) as
    /// [`crate::fp8::RowScaled`] lays them out, bias bf16 \[n\], y bf16 [m, n];
    /// f32 accumulation at `accum`'s cadence ([`Accum`]). Codes, bias and y
    /// 16-byte aligned, k a multiple of 16.
    ///
    /// Returns whether the GELU of [`Epilogue::BiasGelu`] was applied: false
    /// when cuBLASLt has no FP8 algorithm with that epilogue, and then `y`
    /// holds the biased product and the caller applies the GELU.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_fp8(
        &self,
        stream: &CudaStream,
        x: (CUdeviceptr, CUdeviceptr),
        w: (CUdeviceptr, CUdeviceptr),
        bias: CUdeviceptr,
        y: CUdeviceptr,
        (m, n, k): (usize, usize, usize),
        ep: Epilogue,
        accum: Accum,
    ) -> Result<bool, CudaError> {
        self.linear_fp8_scaled(
            stream,
            x,
            w,
            bias,
            y,
            (m, n, k),
            ep,
            (Fp8Scaling::Row, accum),
        )
    }

    /// [`Gemm::linear_fp8`] with the scales' granularity named: with
    /// [`Fp8Scaling::Tensor`], `x.1` and `w.1` each point at one f32 and `y = sx
    /// · sw · x · wᵀ (+ bias) (→ GELU)` (the benchmark's comparison of scale
    /// granularities); with [`Fp8Scaling::Row`] it is [`Gemm::linear_fp8`].
    #[allow(clippy::too_many_arguments)]
    pub fn linear_fp8_scaled(
        &self,
        stream: &CudaStream,
        x: (CUdeviceptr, CUdeviceptr),
        w: (CUdeviceptr, CUdeviceptr),
        bias: CUdeviceptr,
        y: CUdeviceptr,
        (m, n, k): (usize, usize, usize),
        ep: Epilogue,
        (scaling, accum): (Fp8Scaling, Accum),
    ) -> Result<bool, CudaError> {
        if k % 16 != 0 {
            return Err(CudaError::Invalid(format!(
                "an FP8 GEMM needs k a multiple of 16 (m={m} n={n} k={k})"
            )));
        }
        for (what, ptr) in [("x scales", x.1), ("w scales", w.1)] {
            if ptr == 0 || ptr % 4 != 0 {
                return Err(CudaError::Invalid(format!(
                    "FP8 GEMM {what} at {ptr:#x} is null or not 4-byte aligned"
                )));
            }
        }
        self.enqueue(
            stream,
            (x.0, w.0, Some((x.1, w.1))),
            bias,
            y,
            (m, n, k),
            ep,
            Operands::Fp8(scaling, accum),
        )
    }

    /// Plan (once) and enqueue one product; `scales` = (x's, w's) for FP8.
    /// Returns whether the epilogue asked for ran whole (see [`Plan::fused`]).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        stream: &CudaStream,
        (x, w, scales): (CUdeviceptr, CUdeviceptr, Option<(CUdeviceptr, CUdeviceptr)>),
        bias: CUdeviceptr,
        y: CUdeviceptr,
        (m, n, k): (usize, usize, usize),
        ep: Epilogue,
        ops: Operands,
    ) -> Result<bool, CudaError> {
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
        let choice = self.choice();
        let key = (m, n, k, ep, ops, choice);
        let count = match choice {
            AlgoChoice::Heuristic => 1,
            AlgoChoice::Tuned => gemm_tune::CANDIDATES,
        };
        let (plan, fresh) = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => (o.into_mut(), false),
            std::collections::hash_map::Entry::Vacant(v) => (
                v.insert(self.plan(
                    (m, n, k),
                    ep,
                    ops,
                    Probes {
                        bias,
                        scales,
                        count,
                    },
                )?),
                true,
            ),
        };
        if ep != Epilogue::None {
            set_desc(
                plan.desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias,
            )?;
        }
        if let Some((sx, sw)) = scales {
            // A is the weight, B the activations (see the module doc).
            set_desc(
                plan.desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &sw,
            )?;
            set_desc(
                plan.desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &sx,
            )?;
        }
        if fresh && choice == AlgoChoice::Tuned {
            self.choose(plan, &key, stream, (x, w, y))?;
        }
        let algo = plan.algo;
        self.matmul(plan, &algo, stream, (x, w, y))
            .ctx(format!("running a GEMM m={m} n={n} k={k} {ep:?} {ops:?}"))?;
        Ok(plan.fused)
    }

    /// Enqueue `plan`'s product with `algo` (its descriptor's bias and scale
    /// pointers already set).
    fn matmul(
        &self,
        plan: &Plan,
        algo: &ltsys::cublasLtMatmulAlgo_t,
        stream: &CudaStream,
        (x, w, y): (CUdeviceptr, CUdeviceptr, CUdeviceptr),
    ) -> Result<(), CublasError> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: descriptors match the operands' shapes and types; the pointers
        // name device ranges of the documented sizes; the workspace is ours.
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
                algo,
                self.workspace.ptr() as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as ltsys::cudaStream_t,
            )
        }
    }

    /// [`AlgoChoice::Tuned`] for a fresh plan: the machine's stored choice
    /// where the library still accepts it, else its candidates timed on these
    /// operands (`y` is overwritten; the caller's product follows) and the
    /// pick stored. A plan made while `stream` is being captured cannot be
    /// timed and keeps the heuristic's first.
    fn choose(
        &self,
        plan: &mut Plan,
        key: &Key,
        stream: &CudaStream,
        io: (CUdeviceptr, CUdeviceptr, CUdeviceptr),
    ) -> Result<(), CudaError> {
        let name = key_name(key);
        let mut t = self
            .tuner
            .lock()
            .map_err(|_| CudaError::Invalid("the GEMM tuner was poisoned by a panic".into()))?;
        let t = &mut *t;
        if t.cache.is_none() {
            let path = t.path.clone().unwrap_or_else(|| self.default_tune_cache());
            let cache = TuneCache::open(path);
            t.report.cache_rejected += cache.bad_lines.len();
            t.report.cache_file = cache.path().map(|p| p.to_path_buf());
            t.cache = Some(cache);
        }
        let (cache, report) = match t.cache.as_mut() {
            Some(c) => (c, &mut t.report),
            None => {
                return Err(CudaError::Invalid(
                    "the GEMM tuning cache is missing".into(),
                ))
            }
        };
        if let Some(s) = cache.get(&name) {
            let algo = ltsys::cublasLtMatmulAlgo_t { data: s.algo };
            if self.accepts(plan, &algo) {
                plan.algo = algo;
                report.from_cache += 1;
                report.not_first += usize::from(s.index != 0);
                report.choices.insert(name, (s.index, s.algo, None));
                return Ok(());
            }
            cache.remove(&name);
            report.cache_rejected += 1;
        }
        let capturing = stream
            .capture_status()
            .ctx("reading the stream's capture status")?;
        if capturing != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            report.untimed_in_capture += 1;
            report.choices.insert(name, (0, plan.algo.data, None));
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let times = self.time_candidates(plan, stream, io)?;
        report.tune_ms += t0.elapsed().as_secs_f64() * 1e3;
        let i = gemm_tune::pick(&times, gemm_tune::MIN_GAIN).ok_or_else(|| {
            CudaError::Invalid(format!(
                "none of the {} algorithms cuBLASLt offered for {name} ran",
                times.len()
            ))
        })?;
        plan.algo = plan.candidates[i];
        let gain = (times[0].is_finite()).then(|| 1.0 - times[i] / times[0]);
        report.tuned += 1;
        report.not_first += usize::from(i != 0);
        report
            .choices
            .insert(name.clone(), (i, plan.algo.data, gain));
        let stored = Stored {
            index: i,
            algo: plan.algo.data,
        };
        if let Err(e) = cache.insert(&name, stored) {
            report.cache_error = Some(e);
        }
        Ok(())
    }

    /// Each candidate's mean device ms over [`gemm_tune::TIMED_RUNS`] runs
    /// after one untimed run; infinite for one that did not run.
    fn time_candidates(
        &self,
        plan: &Plan,
        stream: &CudaStream,
        io: (CUdeviceptr, CUdeviceptr, CUdeviceptr),
    ) -> Result<Vec<f64>, CudaError> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev0 = stream.context().new_event(flags).ctx("creating an event")?;
        let ev1 = stream.context().new_event(flags).ctx("creating an event")?;
        let mut times = Vec::with_capacity(plan.candidates.len());
        for algo in &plan.candidates {
            if self.matmul(plan, algo, stream, io).is_err() {
                times.push(f64::INFINITY);
                continue;
            }
            ev0.record(stream).ctx("recording a start event")?;
            let mut ran = true;
            for _ in 0..gemm_tune::TIMED_RUNS {
                ran &= self.matmul(plan, algo, stream, io).is_ok();
            }
            ev1.record(stream).ctx("recording an end event")?;
            ev1.synchronize().ctx("waiting for a candidate's runs")?;
            let ms = ev0.elapsed_ms(&ev1).ctx("reading a candidate's time")? as f64;
            times.push(if ran {
                ms / gemm_tune::TIMED_RUNS as f64
            } else {
                f64::INFINITY
            });
        }
        Ok(times)
    }

    /// Whether cuBLASLt accepts `algo` for `plan`'s problem within the
    /// workspace (`cublasLtMatmulAlgoCheck`): a stored algorithm from an older
    /// plan of the same name may no longer fit.
    fn accepts(&self, plan: &Plan, algo: &ltsys::cublasLtMatmulAlgo_t) -> bool {
        // SAFETY: a plain C struct the call overwrites.
        let mut r: ltsys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptors are live; `algo` and `r` are valid for the call.
        let st = unsafe {
            ltsys::cublasLtMatmulAlgoCheck(
                self.handle,
                plan.desc,
                plan.a,
                plan.b,
                plan.c,
                plan.c,
                algo,
                &mut r,
            )
        };
        st == ltsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.state == ltsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.workspaceSize <= WORKSPACE_BYTES
    }
}

/// Up to `count` of cuBLASLt's heuristic answers for `plan`'s problem, in its
/// order (the first is the one the heuristic picks), or the status it
/// answered (`NOT_SUPPORTED` where it has none).
fn heuristics(
    handle: ltsys::cublasLtHandle_t,
    plan: &Plan,
    pref: ltsys::cublasLtMatmulPreference_t,
    count: usize,
) -> Result<Vec<ltsys::cublasLtMatmulAlgo_t>, CublasError> {
    let count = count.max(1);
    // SAFETY: plain C structs the call overwrites.
    let mut out: Vec<ltsys::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { std::mem::zeroed() }; count];
    let mut found = 0i32;
    // SAFETY: the descriptors are live; `out` holds `count` results.
    let st = unsafe {
        ltsys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            plan.desc,
            plan.a,
            plan.b,
            plan.c,
            plan.c,
            pref,
            count as i32,
            out.as_mut_ptr(),
            &mut found,
        )
    };
    if st != ltsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(CublasError(st));
    }
    let algos: Vec<ltsys::cublasLtMatmulAlgo_t> = out
        .iter()
        .take(found.max(0) as usize)
        .filter(|r| r.state == ltsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|r| r.algo)
        .collect();
    if algos.is_empty() {
        return Err(CublasError(
            ltsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        ));
    }
    Ok(algos)
}

/// `first`, or where it failed, `second()` marked by `mark`; `second`'s error
/// where both fail. The shape of both of [`Gemm::plan`]'s fallbacks (an FP8
/// GELU epilogue cuBLASLt lacks, a fast accumulation it refuses).
fn or_fallback<T, E>(
    first: Result<T, E>,
    second: impl FnOnce() -> Result<T, E>,
    mark: impl FnOnce(&mut T),
) -> Result<T, E> {
    match first {
        Ok(p) => Ok(p),
        Err(_) => {
            let mut p = second()?;
            mark(&mut p);
            Ok(p)
        }
    }
}

/// FLOPs of one `linear` call (2 m n k).
pub fn flops(m: usize, n: usize, k: usize) -> f64 {
    2.0 * m as f64 * n as f64 * k as f64
}

#[cfg(test)]
mod tests {
    use super::or_fallback;

    /// Red on: the fallback taken (or the mark applied) when the first plan
    /// succeeded, the mark dropped, or the first error returned when the
    /// fallback succeeded: the cases that decide whether a render's fast or
    /// GELU plan says truly what it runs.
    #[test]
    fn a_fallback_runs_and_is_marked_only_when_the_first_plan_fails() {
        let mut called = false;
        let got: Result<(u32, bool), &str> = or_fallback(
            Ok((1, false)),
            || {
                called = true;
                Ok((2, false))
            },
            |p| p.1 = true,
        );
        assert_eq!(got, Ok((1, false)));
        assert!(
            !called,
            "the fallback ran although the first plan succeeded"
        );
        let got: Result<(u32, bool), &str> =
            or_fallback(Err("not supported"), || Ok((2, false)), |p| p.1 = true);
        assert_eq!(got, Ok((2, true)));
        let got: Result<(u32, bool), &str> =
            or_fallback(Err("first"), || Err("second"), |p| p.1 = true);
        assert_eq!(got, Err("second"));
    }
}
