//! Typed launches of the NVRTC-compiled kernels (`kernels/*.cu`).
//!
//! Pointers are raw device addresses (`u64`); each wrapper documents the element
//! types and shapes it expects. All launches are asynchronous on the stream given.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUdeviceptr, CUfunction_attribute};
use cudarc::driver::{result as dres, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::cuda::kit::context::Gpu;
use crate::cuda::kit::nvrtc::{self, Origin};
use crate::cuda::{CudaError, DriverContext};

/// Padded shared row of the implicit-GEMM tiles, elements (BK 32 + 8).
const IGEMM_SROW: usize = 40;

/// Dynamic shared memory of an implicit-GEMM tile of `stages` stages, bytes.
pub fn igemm_smem(bm: usize, bn: usize, stages: usize) -> u32 {
    (stages * (bm + bn) * IGEMM_SROW * 2) as u32
}

/// The kernels (all in `vae.cu`: its implicit-GEMM convolutions) that need
/// more than 48 KiB of dynamic shared memory, and how much; raised at load.
pub fn big_smem_kernels() -> [(&'static str, u32); 3] {
    [
        ("conv3d_128x128", igemm_smem(128, 128, 4)),
        ("conv3d_256x128", igemm_smem(256, 128, 3)),
        ("conv3d_128x64", igemm_smem(128, 64, 4)),
    ]
}

/// Null device pointer (an absent optional argument).
pub const NULL: CUdeviceptr = 0;

/// Threads per block of the elementwise kernels.
const EW_THREADS: u32 = 256;
/// Threads per block of the row-wise kernels.
const ROW_THREADS: u32 = 256;

/// The widest row `qk_norm_rope_pair` holds in registers (8 pairs a thread of
/// [`ROW_THREADS`]).
const QKN_MAX_D: usize = 2 * 8 * ROW_THREADS as usize;

/// Rows per block of `qk_norm_rope_warp` (`QKW_WARPS` in elementwise.cu).
const QKW_WARPS: u32 = 4;

/// The widest row `qk_norm_rope_warp` holds in registers: `QKW_CHUNKS` (16)
/// chunks of 8 channels a lane.
const QKW_MAX_D: usize = 8 * 32 * 16;

/// Which attention kernel to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// One thread per query, scalar f32 (the check for the fused kernel).
    Reference,
    /// The fused flash kernel (flash v2, 8 warps, ldmatrix; head dims 64 and 128).
    Flash,
    /// The fused flash kernel with several m-tiles per warp and the Q tile in
    /// shared memory (`flash_mt_fwd` in attention.cu; head dims 64 and 128).
    FlashMt(MtLayout),
}

/// A warp layout of the `flash_mt` kernels: warps per block and 16-row m-tiles
/// per warp. Each layout has one `FLASH_MT` line per head dim in attention.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtLayout {
    /// 4 warps of 2 m-tiles: 128 query rows per block.
    W4M2,
    /// 8 warps of 1 m-tile: 128 query rows per block (flash2's layout, with the
    /// Q tile in shared memory and one barrier per K/V tile).
    W8M1,
    /// 8 warps of 2 m-tiles: 256 query rows per block.
    W8M2,
    /// As `W4M2`, with half the probabilities' 2^x computed by a polynomial on
    /// the FMA pipe instead of the special-function unit (`ex2_poly`).
    W4M2Poly,
}

impl MtLayout {
    /// Every layout built.
    pub const ALL: [MtLayout; 4] = [
        MtLayout::W4M2,
        MtLayout::W8M1,
        MtLayout::W8M2,
        MtLayout::W4M2Poly,
    ];

    /// Warps per block.
    pub fn warps(self) -> u32 {
        match self {
            MtLayout::W4M2 | MtLayout::W4M2Poly => 4,
            MtLayout::W8M1 | MtLayout::W8M2 => 8,
        }
    }

    /// 16-row m-tiles per warp.
    pub fn mtiles(self) -> u32 {
        match self {
            MtLayout::W8M1 => 1,
            MtLayout::W4M2 | MtLayout::W8M2 | MtLayout::W4M2Poly => 2,
        }
    }

    /// Whether half the probabilities' 2^x run on the FMA pipe.
    pub fn poly_exp(self) -> bool {
        self == MtLayout::W4M2Poly
    }

    /// Query rows per block.
    pub fn rows(self) -> u32 {
        16 * self.warps() * self.mtiles()
    }

    /// Keys per K/V tile at head dim `hd`: 32 where two hd-128 m-tiles' f32
    /// accumulators would otherwise not fit the 255 registers without spills
    /// (`nvcc -Xptxas -v`: 240 registers at 32, 96 bytes spilled at 64).
    pub fn keys_per_tile(self, hd: usize) -> usize {
        if hd >= 128 && self.mtiles() == 2 {
            32
        } else {
            64
        }
    }

    /// Dynamic shared memory at head dim `hd`, bytes: the Q tile and two stages
    /// of the K and V tiles, rows padded by 8 elements.
    pub fn smem_bytes(self, hd: usize) -> u32 {
        ((self.rows() as usize + 4 * self.keys_per_tile(hd)) * (hd + 8) * 2) as u32
    }

    /// The entry point at head dim `hd`, with the key-bias variant when `bias`.
    pub fn entry(self, hd: usize, bias: bool) -> String {
        format!(
            "flash_mt{}_hd{hd}_w{}_x{}{}",
            self.mtiles(),
            self.warps(),
            u8::from(self.poly_exp()),
            if bias { "_bias" } else { "" }
        )
    }

    /// Whether Q fragments stay in registers for the whole loop at head dim `hd`.
    pub fn q_in_registers(self, hd: usize) -> bool {
        hd < 128 || self.mtiles() == 1
    }
}

impl AttnKernel {
    /// The kernel the forward runs at head dim `hd`: flash_mt with 8 warps of two
    /// m-tiles where it is built, else the reference. The fastest of the four
    /// layouts at both head dims, side by side in one run of `engine
    /// selftest-cuda --only dit --bench` (device run attn-1 in
    /// `reports/device-notes.md`, log in reports/device-runs/attn-1).
    pub fn best_for(hd: usize) -> AttnKernel {
        if FLASH_HEAD_DIMS.contains(&hd) {
            AttnKernel::FlashMt(MtLayout::W8M2)
        } else {
            AttnKernel::Reference
        }
    }

    /// Every kernel, the reference first, then flash2 and the flash_mt layouts.
    pub fn all() -> Vec<AttnKernel> {
        let mut v = vec![AttnKernel::Reference, AttnKernel::Flash];
        v.extend(MtLayout::ALL.map(AttnKernel::FlashMt));
        v
    }

    /// Stable name (used in reports).
    pub fn name(self) -> &'static str {
        match self {
            AttnKernel::Reference => "reference",
            AttnKernel::Flash => "flash",
            AttnKernel::FlashMt(MtLayout::W4M2) => "flash-w4m2",
            AttnKernel::FlashMt(MtLayout::W8M1) => "flash-w8m1",
            AttnKernel::FlashMt(MtLayout::W8M2) => "flash-w8m2",
            AttnKernel::FlashMt(MtLayout::W4M2Poly) => "flash-w4m2-poly",
        }
    }

    /// The head dims the kernel is built for.
    pub fn head_dims(self) -> &'static [usize] {
        match self {
            AttnKernel::Reference => &[16, 32, 64, 128],
            AttnKernel::Flash | AttnKernel::FlashMt(_) => &FLASH_HEAD_DIMS,
        }
    }
}

/// Head dims of the flash kernel.
const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];
/// Warps per block of the flash kernel (16 query rows each).
const FLASH_WARPS: u32 = 8;
/// Threads per block of the reference attention kernel (one query each).
const REF_THREADS: u32 = 64;

/// Report of loading the kernel modules.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// (module, origin, milliseconds to obtain the CUBIN).
    pub modules: Vec<(String, Origin, f64)>,
}

/// The loaded kernel modules and their functions.
pub struct Kernels {
    _modules: Vec<Arc<CudaModule>>,
    funcs: HashMap<String, CudaFunction>,
    sms: u32,
    /// How the modules were obtained.
    pub report: LoadReport,
}

/// Dynamic shared memory of the flash kernel for head dim `hd`, bytes: K and V
/// tiles of 64 rows (padded by 8 elements), two stages each.
pub fn flash_smem_bytes(hd: usize) -> u32 {
    (4 * 64 * (hd + 8) * 2) as u32
}

/// The argument list of one launch: every kernel parameter (a device pointer,
/// an integer or an f32, none wider than 8 bytes) in its own 8-byte slot, its
/// value in the slot's low bytes (x86-64 and the GPU are little-endian), so the
/// driver reads exactly the parameter's size from each slot's address.
#[derive(Default)]
pub(crate) struct Params(Vec<u64>);

impl Params {
    pub(crate) fn ptr(mut self, v: CUdeviceptr) -> Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.0.push(v);
        self
    }
    pub(crate) fn i64(mut self, v: i64) -> Self {
        self.0.push(v as u64);
        self
    }
    pub(crate) fn i32(mut self, v: i32) -> Self {
        self.0.push(v as u32 as u64);
        self
    }
    pub(crate) fn f32(mut self, v: f32) -> Self {
        self.0.push(v.to_bits() as u64);
        self
    }
    /// An element count as the kernels' `long long n`.
    pub(crate) fn n(self, n: usize) -> Self {
        self.i64(n as i64)
    }
    /// A width or count as the kernels' `int`.
    pub(crate) fn int(self, v: usize) -> Self {
        self.i32(v as i32)
    }
}

impl Kernels {
    /// Compile (or read from the cache) and load every module on `gpu`.
    pub fn load(gpu: &Gpu) -> Result<Kernels, CudaError> {
        let cache = nvrtc::cache_dir();
        let arch = nvrtc::arch(gpu.capability)?;
        let mut modules = Vec::new();
        let mut funcs = HashMap::new();
        let mut report = LoadReport {
            modules: Vec::new(),
        };
        for (name, src) in nvrtc::MODULES {
            let t0 = Instant::now();
            let (cubin, origin) = nvrtc::compile_cached(name, src, &arch, cache.as_deref())?;
            report
                .modules
                .push((name.to_string(), origin, t0.elapsed().as_secs_f64() * 1e3));
            let module = gpu
                .ctx
                .load_module(Ptx::from_binary(cubin))
                .ctx(format!("loading kernel module '{name}'"))?;
            for f in module_kernels(name, src) {
                let func = module
                    .load_function(&f)
                    .ctx(format!("finding kernel '{f}' in module '{name}'"))?;
                funcs.insert(f, func);
            }
            modules.push(module);
        }
        let k = Kernels {
            _modules: modules,
            funcs,
            sms: gpu.sms.max(1) as u32,
            report,
        };
        // The hd128 flash kernels and the flash_mt kernels need more than the
        // default 48 KiB.
        let mut big = vec![
            ("flash2_hd128_w8".to_string(), flash_smem_bytes(128)),
            ("flash2_hd128_w8_bias".to_string(), flash_smem_bytes(128)),
        ];
        for l in MtLayout::ALL {
            for hd in FLASH_HEAD_DIMS {
                for bias in [false, true] {
                    big.push((l.entry(hd, bias), l.smem_bytes(hd)));
                }
            }
        }
        for (f, bytes) in &big {
            let func = k.func(f)?;
            // SAFETY: a valid function handle and a supported attribute.
            unsafe {
                dres::function::set_function_attribute(
                    func.cu_function(),
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    *bytes as i32,
                )
            }
            .ctx(format!("raising the shared-memory limit of {f}"))?;
        }
        for (f, bytes) in big_smem_kernels() {
            let func = k.func(f)?;
            // SAFETY: as above.
            unsafe {
                dres::function::set_function_attribute(
                    func.cu_function(),
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
            }
            .ctx(format!("raising the shared-memory limit of {f}"))?;
        }
        Ok(k)
    }

    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.funcs
            .get(name)
            .ok_or_else(|| CudaError::Invalid(format!("kernel '{name}' is not loaded")))
    }

    pub(crate) fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        stream: &CudaStream,
        mut params: Params,
    ) -> Result<(), CudaError> {
        let f = self.func(name)?;
        let mut args: Vec<*mut c_void> = params
            .0
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: every wrapper passes exactly the kernel's parameter list, in
        // order, each slot holding a value of the parameter's type (Params).
        unsafe {
            dres::launch_kernel(
                f.cu_function(),
                grid,
                (block, 1, 1),
                smem,
                stream.cu_stream(),
                &mut args,
            )
        }
        .ctx(format!("launching kernel '{name}'"))
    }

    /// A grid-stride elementwise kernel over `n` elements.
    /// Launch a row-wise kernel: one block of [`ROW_THREADS`] threads per row of
    /// `rows`, `smem` bytes of dynamic shared memory.
    pub(crate) fn launch_rows(
        &self,
        name: &str,
        rows: usize,
        smem: u32,
        s: &CudaStream,
        params: Params,
    ) -> Result<(), CudaError> {
        self.launch(name, (rows as u32, 1, 1), ROW_THREADS, smem, s, params)
    }

    pub(crate) fn launch_ew(
        &self,
        name: &str,
        n: usize,
        s: &CudaStream,
        params: Params,
    ) -> Result<(), CudaError> {
        let blocks = n
            .div_ceil(EW_THREADS as usize)
            .clamp(1, (self.sms * 16) as usize);
        self.launch(name, (blocks as u32, 1, 1), EW_THREADS, 0, s, params)
    }

    /// `y[i] = op(x[i])` for n elements (see [`Map`]).
    pub fn map(
        &self,
        s: &CudaStream,
        op: Map,
        x: CUdeviceptr,
        y: CUdeviceptr,
        n: usize,
    ) -> Result<(), CudaError> {
        let p = Params::default().ptr(x).ptr(y).n(n);
        self.launch_ew(op.kernel(), n, s, p)
    }

    /// Weighted RMS norm of each bf16 row of d (weight `w`, bf16), then LTX RoPE
    /// when `rope` is given; may run in place (x == y).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        w: CUdeviceptr,
        rows: usize,
        d: usize,
        eps: f32,
        rope: Option<&RopeArgs>,
    ) -> Result<(), CudaError> {
        let p = Params::default().ptr(x).ptr(y).ptr(w).int(d).f32(eps);
        let p = rope_params(p, rope);
        self.launch_rows("qk_norm_rope", rows, 0, s, p)
    }

    /// [`Kernels::qk_norm_rope`] over two tensors in one launch, in place, each
    /// row read once (`qk_norm_rope_pair` in `kernels/elementwise.cu`): `q` and
    /// `k` are (bf16 rows of d, their bf16 norm weight of d, rows). Bit for bit
    /// the two-pass kernel's result. With `rope`, both must have the grid's rows.
    /// With `amax` (an FP8 attention's slot buffer, [`crate::cuda::kit::fp8::Fp8Attn`]),
    /// its q and k amax slots (f32 0 and 4, zeroed before) are raised to the
    /// largest |value| written to q and to k: bit for bit what the operand pass
    /// would read back. Needs d even and at most 4096.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_pair(
        &self,
        s: &CudaStream,
        q: (CUdeviceptr, CUdeviceptr, usize),
        k: (CUdeviceptr, CUdeviceptr, usize),
        d: usize,
        eps: f32,
        rope: Option<&RopeArgs>,
        amax: Option<CUdeviceptr>,
    ) -> Result<(), CudaError> {
        if d % 2 != 0 || d > QKN_MAX_D {
            return Err(CudaError::Invalid(format!(
                "qk_norm_rope_pair: width {d} must be even and <= {QKN_MAX_D}"
            )));
        }
        let p = qk_pair_params("qk_norm_rope_pair", q, k, d, eps, rope, amax)?;
        let rows = q.2.max(k.2).max(1) as u32;
        self.launch("qk_norm_rope_pair", (rows, 2, 1), ROW_THREADS, 0, s, p)
    }

    /// [`Kernels::qk_norm_rope_pair`] one warp per row with 16-byte loads
    /// (`qk_norm_rope_warp` in `kernels/elementwise.cu`; the `qk-norm = warp`
    /// arm): the same expressions, the sum of squares in another order, so a
    /// value may differ from the pair kernel's in its last bit. `amax` as
    /// there (the amax of this kernel's own output). Needs d a multiple of 8 and
    /// at most 4096, and 16-byte aligned tensors.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_warp(
        &self,
        s: &CudaStream,
        q: (CUdeviceptr, CUdeviceptr, usize),
        k: (CUdeviceptr, CUdeviceptr, usize),
        d: usize,
        eps: f32,
        rope: Option<&RopeArgs>,
        amax: Option<CUdeviceptr>,
    ) -> Result<(), CudaError> {
        if d % 8 != 0 || d > QKW_MAX_D {
            return Err(CudaError::Invalid(format!(
                "qk_norm_rope_warp: width {d} must be a multiple of 8 and <= {QKW_MAX_D}"
            )));
        }
        if [q.0, q.1, k.0, k.1].iter().any(|p| p % 16 != 0) {
            return Err(CudaError::Invalid(
                "qk_norm_rope_warp: q, k and their norm weights must be 16-byte aligned".into(),
            ));
        }
        let p = qk_pair_params("qk_norm_rope_warp", q, k, d, eps, rope, amax)?;
        let rows = q.2.max(k.2).max(1);
        let blocks = rows.div_ceil(QKW_WARPS as usize) as u32;
        self.launch("qk_norm_rope_warp", (blocks, 2, 1), 32 * QKW_WARPS, 0, s, p)
    }

    /// Row-scaled e4m3 quantization (`quantize_rows_e4m3` in `kernels/fp8.cu`):
    /// each of `rows` bf16 rows of `cols` at `x` becomes `cols` e4m3 codes at `q`
    /// (row-major) and one f32 scale at `scales` (`amax / 448`, or 1 for a row
    /// of zeros), bit for bit [`crate::fp8::RowScaled::quantize`] of the same
    /// values. Needs `cols` a multiple of 16 and 16-byte aligned `x` and `q`;
    /// a device of compute capability 8.9 or later.
    pub fn quantize_rows_e4m3(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        rows: usize,
        cols: usize,
        q: CUdeviceptr,
        scales: CUdeviceptr,
    ) -> Result<(), CudaError> {
        if cols == 0 || cols % 16 != 0 || cols > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "quantize_rows_e4m3: width {cols} must be a positive multiple of 16"
            )));
        }
        if x % 16 != 0 || q % 16 != 0 || scales % 4 != 0 {
            return Err(CudaError::Invalid(
                "quantize_rows_e4m3: x and q must be 16-byte aligned, scales 4-byte".into(),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let p = Params::default().ptr(x).int(cols).ptr(q).ptr(scales);
        self.launch_rows("quantize_rows_e4m3", rows, 0, s, p)
    }

    /// Zero the amax slots (f32 0, 4 and 8) of an FP8 attention's slot buffer
    /// `sc` on `s`: before a q/k norm that raises them ([`OperandAmax::Folded`]).
    pub fn fp8_attention_zero_amax(
        &self,
        s: &CudaStream,
        sc: CUdeviceptr,
    ) -> Result<(), CudaError> {
        if sc == NULL || sc % 16 != 0 {
            return Err(CudaError::Invalid(
                "fp8_attention_zero_amax: the slots must be 16-byte aligned".into(),
            ));
        }
        // SAFETY: the first 12 f32 of the caller's slot buffer (the amax slots).
        unsafe { dres::memset_d8_async(sc, 0, 48, s.cu_stream()) }
            .ctx("zeroing the FP8 attention's amax slots")
    }

    /// The FP8 attention's operands (lever `attention-precision`; see
    /// `quantize3_e4m3` in `kernels/fp8.cu`, defined by
    /// [`crate::fp8::AttentionScales`]): zero the three amax slots of `sc`,
    /// take each of q, k and v's largest magnitude (`x = (address, elements)`,
    /// bf16), encode each into its e4m3 buffer of `q8` with one scale per
    /// tensor, and write the descales and scales into `sc`
    /// ([`crate::cuda::kit::fp8::Fp8Attn`]) and `1 / scale_o` into each of the
    /// `o_rows` f32 at `o_scales`. Needs element counts that are multiples of
    /// 8, 16-byte aligned tensors, codes and `sc`.
    pub fn fp8_attention_operands(
        &self,
        s: &CudaStream,
        x: [(CUdeviceptr, usize); 3],
        q8: [CUdeviceptr; 3],
        sc: CUdeviceptr,
        (o_scales, o_rows): (CUdeviceptr, usize),
        amax: OperandAmax,
    ) -> Result<(), CudaError> {
        if let Some((p, n)) = x.iter().find(|(p, n)| n % 8 != 0 || p % 16 != 0) {
            return Err(CudaError::Invalid(format!(
                "fp8_attention_operands: a tensor of {n} elements at {p:#x} (needs a multiple \
                 of 8, 16-byte aligned)"
            )));
        }
        if q8.iter().chain([&sc]).any(|p| p % 16 != 0) || o_scales % 4 != 0 {
            return Err(CudaError::Invalid(
                "fp8_attention_operands: codes and slots must be 16-byte aligned".into(),
            ));
        }
        let most = x.iter().map(|t| t.1 / 8).max().unwrap_or(0).max(o_rows);
        let blocks = most
            .div_ceil(EW_THREADS as usize)
            .clamp(1, (self.sms * 4) as usize) as u32;
        let tensors = |p: Params| {
            p.ptr(x[0].0)
                .n(x[0].1)
                .ptr(x[1].0)
                .n(x[1].1)
                .ptr(x[2].0)
                .n(x[2].1)
        };
        match amax {
            OperandAmax::Separate => {
                self.fp8_attention_zero_amax(s, sc)?;
                let p = tensors(Params::default()).ptr(sc);
                self.launch("amax3_bf16", (blocks, 3, 1), EW_THREADS, 0, s, p)?;
            }
            OperandAmax::Folded => {
                // v's amax alone: amax3_bf16's tensor 0 is v, its slot 0 v's.
                let v = Params::default().ptr(x[2].0).n(x[2].1);
                let p = v.ptr(x[2].0).n(0).ptr(x[2].0).n(0).ptr(sc + 4 * 8);
                self.launch("amax3_bf16", (blocks, 1, 1), EW_THREADS, 0, s, p)?;
            }
        }
        let p = tensors(Params::default())
            .ptr(q8[0])
            .ptr(q8[1])
            .ptr(q8[2])
            .ptr(sc)
            .ptr(o_scales)
            .int(o_rows);
        self.launch("quantize3_e4m3", (blocks, 4, 1), EW_THREADS, 0, s, p)
    }

    /// The fused row step of the forward (see `residual_norm` in
    /// `kernels/elementwise.cu`): with `y` given, x (`x.1`: f32 [rows, d], or
    /// bf16 under [`ResidualStream::Bf16`], rounded once a step) += y (bf16) *
    /// gate (gate_tab + gate_emb, or 1 when gate_tab is NULL); then h =
    /// bf16(x) ([`RowMode::Cast`]) or the bf16 modulated RMS / LayerNorm of x,
    /// with shift = shift.0 + shift.1 and scale = scale.0 + scale.1 (bf16
    /// vectors of d); `eps` is the norm's epsilon. `out` says where h goes:
    /// written as bf16, or ([`RowOut::E4m3`]) quantized per row exactly as
    /// [`Kernels::quantize_rows_e4m3`] would quantize that bf16 h, without h
    /// being written (`residual_norm_e4m3`).
    #[allow(clippy::too_many_arguments)]
    pub fn residual_norm(
        &self,
        s: &CudaStream,
        (x, stream): (CUdeviceptr, ResidualStream),
        y: CUdeviceptr,
        gate: (CUdeviceptr, CUdeviceptr),
        rows: usize,
        d: usize,
        mode: RowMode,
        eps: f32,
        shift: (CUdeviceptr, CUdeviceptr),
        scale: (CUdeviceptr, CUdeviceptr),
        out: RowOut,
    ) -> Result<(), CudaError> {
        if d % 4 != 0 || d * 4 > 48 * 1024 {
            return Err(CudaError::Invalid(format!(
                "residual_norm: width {d} must be a multiple of 4 and <= 12288"
            )));
        }
        let p = Params::default()
            .ptr(x)
            .ptr(y)
            .ptr(gate.0)
            .ptr(gate.1)
            .int(d)
            .f32(eps)
            .i32(mode as i32)
            .ptr(shift.0)
            .ptr(scale.0)
            .ptr(shift.1)
            .ptr(scale.1);
        let bf16x = stream == ResidualStream::Bf16;
        let (name, p) = match out {
            RowOut::Bf16(h) if bf16x => ("residual_norm_bf16x", p.ptr(h)),
            RowOut::Bf16(h) => ("residual_norm", p.ptr(h)),
            RowOut::E4m3 { codes, scales } => {
                if codes % 4 != 0 || scales % 4 != 0 {
                    return Err(CudaError::Invalid(
                        "residual_norm: e4m3 codes and scales must be 4-byte aligned".into(),
                    ));
                }
                let name = if bf16x {
                    "residual_norm_e4m3_bf16x"
                } else {
                    "residual_norm_e4m3"
                };
                (name, p.ptr(codes).ptr(scales))
            }
        };
        self.launch_rows(name, rows, (d * 4) as u32, s, p)
    }

    /// The sinusoidal timestep embedding of `t` (cosines first) into bf16 [2 * half].
    pub fn timestep_sinusoid(
        &self,
        s: &CudaStream,
        out: CUdeviceptr,
        t: f32,
        half: usize,
    ) -> Result<(), CudaError> {
        let p = Params::default().ptr(out).f32(t).int(half);
        self.launch("timestep_sinusoid", (1, 1, 1), 128, 0, s, p)
    }

    /// [`Kernels::timestep_sinusoid`] with `t` read from device f32 at `t` when
    /// the kernel runs (the form a captured graph replays: see `backend`).
    pub fn timestep_sinusoid_at(
        &self,
        s: &CudaStream,
        out: CUdeviceptr,
        t: CUdeviceptr,
        half: usize,
    ) -> Result<(), CudaError> {
        let p = Params::default().ptr(out).ptr(t).int(half);
        self.launch("timestep_sinusoid_at", (1, 1, 1), 128, 0, s, p)
    }

    /// One denoise step over n f32 elements: lat += dt * v with v = u + g * (c - u)
    /// (classifier-free guidance) or v = c when `u` is NULL; each operation
    /// rounded on its own, as the CPU arm computes it.
    #[allow(clippy::too_many_arguments)]
    pub fn guided_euler(
        &self,
        s: &CudaStream,
        lat: CUdeviceptr,
        c: CUdeviceptr,
        u: CUdeviceptr,
        g: f32,
        dt: f32,
        n: usize,
    ) -> Result<(), CudaError> {
        let p = Params::default().ptr(lat).ptr(c).ptr(u).f32(g).f32(dt).n(n);
        self.launch_ew("guided_euler", n, s, p)
    }

    /// n bf16 values uniform in [-scale, scale), a pure function of (seed, index).
    pub fn fill_uniform_bf16(
        &self,
        s: &CudaStream,
        y: CUdeviceptr,
        n: usize,
        seed: u64,
        scale: f32,
    ) -> Result<(), CudaError> {
        let p = Params::default().ptr(y).n(n).u64(seed).f32(scale);
        self.launch_ew("fill_uniform_bf16", n, s, p)
    }

    /// Multi-head attention: see `kernels/attention.cu`. `q` [nq, ldq], `k` [nk,
    /// ldk], `v` [nk, ldv], `o` [nq, ldo], bf16; head h at columns h*hd..;
    /// `kbias` f32 \[nk\] or NULL. Leading dimensions in elements, multiples of 8.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        s: &CudaStream,
        kind: AttnKernel,
        heads: usize,
        hd: usize,
        q: (CUdeviceptr, usize),
        k: (CUdeviceptr, usize),
        v: (CUdeviceptr, usize),
        o: (CUdeviceptr, usize),
        nq: usize,
        nk: usize,
        kbias: CUdeviceptr,
        scale: f32,
    ) -> Result<(), CudaError> {
        if !kind.head_dims().contains(&hd) {
            return Err(CudaError::Invalid(format!(
                "attention head dim {hd}: the {} kernel is built for {:?}",
                kind.name(),
                kind.head_dims()
            )));
        }
        if nk == 0 || nq == 0 {
            return Err(CudaError::Invalid(
                "attention over an empty sequence".into(),
            ));
        }
        for (what, ld) in [("q", q.1), ("k", k.1), ("v", v.1), ("o", o.1)] {
            if ld % 8 != 0 || ld < heads * hd {
                return Err(CudaError::Invalid(format!(
                    "attention: leading dimension of {what} is {ld}, needs a multiple of 8 >= {}",
                    heads * hd
                )));
            }
        }
        // Query rows per block: one per thread for the reference, 16 per warp for
        // flash, 16 per m-tile for flash_mt.
        let (name, block, rows, smem) = match kind {
            AttnKernel::Reference => (format!("attn_ref_hd{hd}"), REF_THREADS, REF_THREADS, 0),
            AttnKernel::FlashMt(l) => (
                l.entry(hd, kbias != NULL),
                32 * l.warps(),
                l.rows(),
                l.smem_bytes(hd),
            ),
            AttnKernel::Flash => {
                let bias = if kbias != NULL { "_bias" } else { "" };
                (
                    format!("flash2_hd{hd}_w{FLASH_WARPS}{bias}"),
                    32 * FLASH_WARPS,
                    16 * FLASH_WARPS,
                    flash_smem_bytes(hd),
                )
            }
        };
        let grid = (nq.div_ceil(rows as usize) as u32, heads as u32, 1);
        let p = Params::default()
            .ptr(q.0)
            .ptr(k.0)
            .ptr(v.0)
            .ptr(o.0)
            .int(nq)
            .int(nk)
            .int(q.1)
            .int(k.1)
            .int(v.1)
            .int(o.1)
            .ptr(kbias)
            .f32(scale);
        self.launch(&name, grid, block, smem, s, p)
    }
}

/// The elementwise maps of [`Kernels::map`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Map {
    /// f32 to bf16, round to nearest even.
    F32ToBf16,
    /// bf16 to f32 (exact).
    Bf16ToF32,
    /// `x * sigmoid(x)` on bf16.
    SiluBf16,
    /// `bf16(gelu_tanh(x))` on bf16 (`kernels/fp8.cu`; may run in place): the
    /// GELU of an FP8 GEMM whose epilogue could not fuse it.
    GeluTanhBf16,
}

impl Map {
    fn kernel(self) -> &'static str {
        match self {
            Map::F32ToBf16 => "cast_f32_to_bf16",
            Map::Bf16ToF32 => "cast_bf16_to_f32",
            Map::SiluBf16 => "silu_bf16",
            Map::GeluTanhBf16 => "gelu_tanh_bf16",
        }
    }
}

/// Where the FP8 attention's q and k amax come from
/// ([`Kernels::fp8_attention_operands`]); the two give the same slots bit for
/// bit (every amax goes through one device function, and a max does not
/// depend on its order). No lever: [`OperandAmax::Folded`] is the forward's,
/// [`OperandAmax::Separate`] is kept for that check and for the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperandAmax {
    /// The operand pass zeroes the slots and reads q, k and v for their amax:
    /// 2 bytes an element of each, read once more than the quantize needs.
    Separate,
    /// The q/k norm kernel raised q's and k's slots as it wrote them (the
    /// caller zeroed them with [`Kernels::fp8_attention_zero_amax`] before it);
    /// the operand pass reads v alone for its amax.
    Folded,
}

/// The number format of the forward's residual stream x (lever `residual`),
/// which [`Kernels::residual_norm`] reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResidualStream {
    /// f32 [rows, d]: each residual add is exact to f32.
    F32,
    /// bf16 [rows, d], as a bf16 model holds its hidden state: each residual
    /// add is taken in f32 and rounded once to bf16, and the norm reads the
    /// rounded row.
    Bf16,
}

impl ResidualStream {
    /// The lever arm's name (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            ResidualStream::F32 => "f32",
            ResidualStream::Bf16 => "bf16",
        }
    }

    /// Bytes an element of x.
    pub fn bytes(self) -> usize {
        match self {
            ResidualStream::F32 => 4,
            ResidualStream::Bf16 => 2,
        }
    }
}

/// Where [`Kernels::residual_norm`] puts its output row h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOut {
    /// h as bf16 [rows, d] at this address.
    Bf16(CUdeviceptr),
    /// h quantized per row for an FP8 GEMM: e4m3 codes [rows, d] and one f32
    /// scale (amax / 448) per row, as [`Kernels::quantize_rows_e4m3`] writes
    /// them for the same bf16 h; h itself is not written.
    E4m3 {
        /// The codes, row-major, 4-byte aligned.
        codes: CUdeviceptr,
        /// The row scales, f32.
        scales: CUdeviceptr,
    },
}

/// What [`Kernels::residual_norm`] computes as h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowMode {
    /// bf16(x).
    Cast = 0,
    /// bf16(rms(x) * (1 + scale) + shift).
    Rms = 1,
    /// bf16(layernorm(x) * (1 + scale) + shift).
    LayerNorm = 2,
}

/// RoPE parameters of [`Kernels::qk_norm_rope`].
#[derive(Debug, Clone, Copy)]
pub struct RopeArgs {
    /// Device f32 \[nfreq\]: the per-frequency factor ([`crate::ops::rope::rope_freqs`]).
    pub freqs: CUdeviceptr,
    /// Frequencies per axis (D / 6).
    pub nfreq: usize,
    /// Latent grid (frames, height, width); tokens in raster order.
    pub grid: (usize, usize, usize),
    /// Per-axis position scale (8 / fps, 32, 32 for LTX-Video).
    pub scale: [f32; 3],
    /// Per-axis base divisor (20, 2048, 2048): pos = index * scale / base,
    /// rotated by 2 * pos - 1.
    pub base: [f32; 3],
}

/// The flash entry points, generated by the `FLASH2` and `FLASH_MT` macros in
/// attention.cu.
pub fn flash_names() -> Vec<String> {
    let mut v = Vec::new();
    for hd in FLASH_HEAD_DIMS {
        v.push(format!("flash2_hd{hd}_w{FLASH_WARPS}"));
        v.push(format!("flash2_hd{hd}_w{FLASH_WARPS}_bias"));
        for l in MtLayout::ALL {
            v.push(l.entry(hd, false));
            v.push(l.entry(hd, true));
        }
    }
    v
}

/// Every entry point of module `name`: the declared ones plus the
/// macro-generated ones.
pub fn module_kernels(name: &str, src: &str) -> Vec<String> {
    let mut v = kernel_names(src);
    if name == "attention" {
        v.extend(flash_names());
    }
    v
}

/// The `extern "C" __global__` function names declared literally in a kernel
/// source (names pasted together by a macro are skipped).
pub fn kernel_names(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let l = line.trim_start();
        if !l.starts_with("extern \"C\" __global__") {
            continue;
        }
        // Drop `__launch_bounds__(..)` so the first parenthesis opens the parameters.
        let l = match l.find("__launch_bounds__(") {
            Some(i) => match l[i..].find(')') {
                Some(c) => format!("{}{}", &l[..i], &l[i + c + 1..]),
                None => l.to_string(),
            },
            None => l.to_string(),
        };
        if let Some(paren) = l.find('(') {
            if let Some(name) = l[..paren].split_whitespace().last() {
                if !name.contains('#') {
                    out.push(name.to_string());
                }
            }
        }
    }
    out
}

/// The parameters of the two-tensor q/k norm kernels (`kernel` names the one
/// an error is about): q and k (pointer, norm weight, rows), the width, epsilon
/// and the RoPE tail; with `rope`, both tensors must have the grid's rows.
fn qk_pair_params(
    kernel: &str,
    q: (CUdeviceptr, CUdeviceptr, usize),
    k: (CUdeviceptr, CUdeviceptr, usize),
    d: usize,
    eps: f32,
    rope: Option<&RopeArgs>,
    amax: Option<CUdeviceptr>,
) -> Result<Params, CudaError> {
    if amax.is_some_and(|p| p == NULL || p % 4 != 0) {
        return Err(CudaError::Invalid(format!(
            "{kernel}: the amax slots must be a non-null, 4-byte aligned address"
        )));
    }
    if let Some(r) = rope {
        let tokens = r.grid.0 * r.grid.1 * r.grid.2;
        if q.2 != tokens || k.2 != tokens {
            return Err(CudaError::Invalid(format!(
                "{kernel}: RoPE over grid {:?} ({tokens} tokens) given {} and {} rows",
                r.grid, q.2, k.2
            )));
        }
    }
    let p = Params::default()
        .ptr(q.0)
        .ptr(q.1)
        .int(q.2)
        .ptr(k.0)
        .ptr(k.1)
        .int(k.2)
        .int(d)
        .f32(eps);
    Ok(rope_params(p, rope).ptr(amax.unwrap_or(NULL)))
}

/// The RoPE tail of the q/k norm kernels' parameters (`freqs`, `nfreq`, the
/// grid's height and width, three scales, three bases), appended to `p`; without
/// `rope`, a null table the kernels read as "no rotation".
fn rope_params(p: Params, rope: Option<&RopeArgs>) -> Params {
    let r = rope.copied().unwrap_or(RopeArgs {
        freqs: NULL,
        nfreq: 0,
        grid: (1, 1, 1),
        scale: [0.0; 3],
        base: [1.0; 3],
    });
    p.ptr(r.freqs)
        .int(r.nfreq)
        .int(r.grid.1)
        .int(r.grid.2)
        .f32(r.scale[0])
        .f32(r.scale[1])
        .f32(r.scale[2])
        .f32(r.base[0])
        .f32(r.base[1])
        .f32(r.base[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_finds_every_entry_point() {
        let e = kernel_names(nvrtc::ELEMENTWISE_CU);
        let mut want = vec![
            "cast_f32_to_bf16",
            "cast_bf16_to_f32",
            "qk_norm_rope",
            "qk_norm_rope_pair",
            "qk_norm_rope_warp",
            "silu_bf16",
            "guided_euler",
            "fill_uniform_bf16",
            "timestep_sinusoid",
            "timestep_sinusoid_at",
            "residual_norm",
            "residual_norm_e4m3",
            "residual_norm_bf16x",
            "residual_norm_e4m3_bf16x",
        ];
        let mut got: Vec<&str> = e.iter().map(String::as_str).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(
            kernel_names(nvrtc::FP8_CU),
            [
                "quantize_rows_e4m3",
                "gelu_tanh_bf16",
                "amax3_bf16",
                "quantize3_e4m3"
            ]
        );
        // Every Map names a kernel some module declares (the funcs map is
        // global, so a Map may launch from any module).
        let all: Vec<String> = nvrtc::MODULES
            .iter()
            .flat_map(|(name, src)| module_kernels(name, src))
            .collect();
        for m in [
            Map::F32ToBf16,
            Map::Bf16ToF32,
            Map::SiluBf16,
            Map::GeluTanhBf16,
        ] {
            assert!(all.iter().any(|k| k == m.kernel()), "{m:?}");
        }
        let a = kernel_names(nvrtc::ATTENTION_CU);
        assert_eq!(
            a,
            [
                "attn_ref_hd16",
                "attn_ref_hd32",
                "attn_ref_hd64",
                "attn_ref_hd128"
            ]
        );
        let a = module_kernels("attention", nvrtc::ATTENTION_CU);
        assert_eq!(a.len(), 8 + 16, "{a:?}");
        for hd in FLASH_HEAD_DIMS {
            let macro_line = format!("FLASH2({hd}, {FLASH_WARPS})");
            assert!(
                nvrtc::ATTENTION_CU.contains(&macro_line),
                "{macro_line} not instantiated"
            );
        }
        // Exactly the instantiations the launcher names: no dead variants.
        assert_eq!(nvrtc::ATTENTION_CU.matches("\nFLASH2(").count(), 2);
        // Each layout's table entry (warps, m-tiles, keys per tile, Q in
        // registers) is the instantiated one.
        for l in MtLayout::ALL {
            for hd in FLASH_HEAD_DIMS {
                let line = format!(
                    "\nFLASH_MT({hd}, {}, {}, {}, {}, {})",
                    l.warps(),
                    l.mtiles(),
                    l.keys_per_tile(hd),
                    l.q_in_registers(hd),
                    u8::from(l.poly_exp())
                );
                assert!(nvrtc::ATTENTION_CU.contains(&line), "{line} missing");
            }
        }
        assert_eq!(
            nvrtc::ATTENTION_CU.matches("\nFLASH_MT(").count(),
            MtLayout::ALL.len() * FLASH_HEAD_DIMS.len()
        );
    }

    #[test]
    fn params_put_each_value_in_the_low_bytes_of_its_slot() {
        let p = Params::default()
            .ptr(0x1234_5678_9abc)
            .i32(-2)
            .f32(1.5)
            .n(7)
            .u64(u64::MAX);
        assert_eq!(p.0[0], 0x1234_5678_9abc);
        assert_eq!((p.0[1] as u32) as i32, -2);
        assert_eq!(p.0[1] >> 32, 0);
        assert_eq!(f32::from_bits(p.0[2] as u32), 1.5);
        assert_eq!(p.0[3] as i64, 7);
        assert_eq!(p.0[4], u64::MAX);
    }

    #[test]
    fn flash_smem_fits_the_h200_limit() {
        assert_eq!(flash_smem_bytes(64), 36_864);
        assert_eq!(flash_smem_bytes(128), 69_632);
        assert!(flash_smem_bytes(128) <= 227 * 1024);
        // W4M2 at hd 64: Q 128 rows + 4 K/V tiles of 64, rows of 72 bf16.
        assert_eq!(MtLayout::W4M2.smem_bytes(64), (128 + 256) * 72 * 2);
        assert_eq!(MtLayout::W8M2.smem_bytes(128), (256 + 128) * 136 * 2);
        for l in MtLayout::ALL {
            for hd in FLASH_HEAD_DIMS {
                assert!(l.smem_bytes(hd) <= 227 * 1024, "{l:?} hd {hd}");
            }
        }
    }

    #[test]
    fn flash_mt_names_and_rows_follow_the_layout() {
        assert_eq!(MtLayout::W4M2.entry(64, false), "flash_mt2_hd64_w4_x0");
        assert_eq!(
            MtLayout::W8M1.entry(128, true),
            "flash_mt1_hd128_w8_x0_bias"
        );
        assert_eq!(MtLayout::W4M2Poly.entry(64, false), "flash_mt2_hd64_w4_x1");
        assert_eq!(MtLayout::W4M2.rows(), 128);
        assert_eq!(MtLayout::W8M1.rows(), 128);
        assert_eq!(MtLayout::W8M2.rows(), 256);
        assert_eq!(MtLayout::W4M2.keys_per_tile(128), 32);
        assert_eq!(MtLayout::W8M1.keys_per_tile(128), 64);
        let names: Vec<&str> = MtLayout::ALL
            .iter()
            .map(|&l| AttnKernel::FlashMt(l).name())
            .collect();
        assert_eq!(
            names,
            ["flash-w4m2", "flash-w8m1", "flash-w8m2", "flash-w4m2-poly"]
        );
    }

    #[test]
    fn the_forward_uses_flash_where_it_is_built() {
        assert_eq!(
            AttnKernel::best_for(64),
            AttnKernel::FlashMt(MtLayout::W8M2)
        );
        assert_eq!(
            AttnKernel::best_for(128),
            AttnKernel::FlashMt(MtLayout::W8M2)
        );
        assert_eq!(AttnKernel::best_for(16), AttnKernel::Reference);
    }
}
