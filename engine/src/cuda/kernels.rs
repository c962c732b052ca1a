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

use super::context::Gpu;
use super::nvrtc::{self, Origin};
use super::{CudaError, DriverContext};

/// Null device pointer (an absent optional argument).
pub const NULL: CUdeviceptr = 0;

/// Threads per block of the elementwise kernels.
const EW_THREADS: u32 = 256;
/// Threads per block of the row-wise kernels.
const ROW_THREADS: u32 = 256;

/// Which attention kernel to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// One thread per query, scalar f32 (the check for the others).
    Reference,
    /// Fused flash kernel, plain shared-memory fragment loads.
    Flash,
    /// Fused flash kernel, ldmatrix fragment loads.
    FlashLdsm,
    /// Flash v2 (trimmed softmax, masking only in the last tile), 4 warps.
    Flash2W4,
    /// Flash v2 with 8 warps (128 query rows share each K/V tile).
    Flash2W8,
}

impl AttnKernel {
    /// The fastest kernel built for head dim `hd`: flash v2 with 8 warps
    /// (device run 2, 6144 tokens: hd64 1.48 ms/block vs 1.39 for 4 warps alone
    /// but 77.6 vs 78.3 ms per ltxv-2b forward; hd128 2.59 vs 3.00 ms/block).
    pub fn best_for(hd: usize) -> AttnKernel {
        if hd == 64 || hd == 128 {
            AttnKernel::Flash2W8
        } else {
            AttnKernel::Reference
        }
    }

    /// Stable name (used in reports).
    pub fn name(self) -> &'static str {
        match self {
            AttnKernel::Reference => "reference",
            AttnKernel::Flash => "flash",
            AttnKernel::FlashLdsm => "flash-ldsm",
            AttnKernel::Flash2W4 => "flash2-w4",
            AttnKernel::Flash2W8 => "flash2-w8",
        }
    }
}

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

/// Dynamic shared memory of the flash kernel for head dim `hd`, bytes.
pub fn flash_smem_bytes(hd: usize) -> u32 {
    (4 * 64 * (hd + 8) * 2) as u32
}

impl Kernels {
    /// Compile (or read from the cache) and load every module on `gpu`.
    pub fn load(gpu: &Gpu) -> Result<Kernels, CudaError> {
        let cache = nvrtc::cache_dir();
        let mut modules = Vec::new();
        let mut funcs = HashMap::new();
        let mut report = LoadReport {
            modules: Vec::new(),
        };
        for (name, src) in nvrtc::MODULES {
            let t0 = Instant::now();
            let (cubin, origin) = nvrtc::compile_cached(name, src, cache.as_deref())?;
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
        // The hd128 flash kernels need more than the default 48 KiB.
        for f in [
            "flash_attn_hd128",
            "flash_attn_ldsm_hd128",
            "flash2_hd128_w4",
            "flash2_hd128_w4_bias",
            "flash2_hd128_w8",
            "flash2_hd128_w8_bias",
        ] {
            let func = k.func(f)?;
            // SAFETY: a valid function handle and a supported attribute.
            unsafe {
                dres::function::set_function_attribute(
                    func.cu_function(),
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    flash_smem_bytes(128) as i32,
                )
            }
            .ctx(format!("raising the shared-memory limit of {f}"))?;
        }
        Ok(k)
    }

    fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.funcs
            .get(name)
            .ok_or_else(|| CudaError::Invalid(format!("kernel '{name}' is not loaded")))
    }

    fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        stream: &CudaStream,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let f = self.func(name)?;
        // SAFETY: every wrapper passes exactly the kernel's parameter list, each a
        // pointer to a live local of the parameter's type.
        unsafe { dres::launch_kernel(f.cu_function(), grid, block, smem, stream.cu_stream(), args) }
            .ctx(format!("launching kernel '{name}'"))
    }

    fn ew_grid(&self, n: usize) -> (u32, u32, u32) {
        let blocks = n
            .div_ceil(EW_THREADS as usize)
            .clamp(1, (self.sms * 16) as usize);
        (blocks as u32, 1, 1)
    }

    /// y[i] = bf16(x[i]) for n f32 elements.
    pub fn cast_f32_to_bf16(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        n: usize,
    ) -> Result<(), CudaError> {
        let (mut x, mut y, mut n64) = (x, y, n as i64);
        let mut a = [p(&mut x), p(&mut y), p(&mut n64)];
        self.launch(
            "cast_f32_to_bf16",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// y[i] = f32(x[i]) for n bf16 elements.
    pub fn cast_bf16_to_f32(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        n: usize,
    ) -> Result<(), CudaError> {
        let (mut x, mut y, mut n64) = (x, y, n as i64);
        let mut a = [p(&mut x), p(&mut y), p(&mut n64)];
        self.launch(
            "cast_bf16_to_f32",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// Row-wise modulated norm: `x` f32 [rows, d] -> `y` bf16 [rows, d],
    /// y = norm(x) * (1 + scale) + shift with shift = shift_tab + shift_emb and
    /// scale = scale_tab + scale_emb (bf16 vectors of d). `center`: LayerNorm
    /// (true) or RMS (false), no affine.
    #[allow(clippy::too_many_arguments)]
    pub fn ada_norm_mod(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        rows: usize,
        d: usize,
        eps: f32,
        center: bool,
        shift_tab: CUdeviceptr,
        scale_tab: CUdeviceptr,
        shift_emb: CUdeviceptr,
        scale_emb: CUdeviceptr,
    ) -> Result<(), CudaError> {
        let (mut x, mut y, mut d32, mut eps, mut c) = (x, y, d as i32, eps, center as i32);
        let (mut a0, mut a1, mut a2, mut a3) = (shift_tab, scale_tab, shift_emb, scale_emb);
        let mut a = [
            p(&mut x),
            p(&mut y),
            p(&mut d32),
            p(&mut eps),
            p(&mut c),
            p(&mut a0),
            p(&mut a1),
            p(&mut a2),
            p(&mut a3),
        ];
        self.launch(
            "ada_norm_mod",
            (rows as u32, 1, 1),
            (ROW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
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
        let (mut x, mut y, mut w, mut d32, mut eps) = (x, y, w, d as i32, eps);
        let r = rope.copied().unwrap_or(RopeArgs {
            freqs: NULL,
            nfreq: 0,
            grid: (1, 1, 1),
            scale: [0.0; 3],
            base: [1.0; 3],
        });
        let (mut fr, mut nf, mut gh, mut gw) =
            (r.freqs, r.nfreq as i32, r.grid.1 as i32, r.grid.2 as i32);
        let (mut sf, mut sh, mut sw) = (r.scale[0], r.scale[1], r.scale[2]);
        let (mut bf, mut bh, mut bw) = (r.base[0], r.base[1], r.base[2]);
        let mut a = [
            p(&mut x),
            p(&mut y),
            p(&mut w),
            p(&mut d32),
            p(&mut eps),
            p(&mut fr),
            p(&mut nf),
            p(&mut gh),
            p(&mut gw),
            p(&mut sf),
            p(&mut sh),
            p(&mut sw),
            p(&mut bf),
            p(&mut bh),
            p(&mut bw),
        ];
        self.launch(
            "qk_norm_rope",
            (rows as u32, 1, 1),
            (ROW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// x (f32 [n / d, d]) += y (bf16) * gate, gate = gate_tab + gate_emb (bf16 of
    /// d); `gate_tab == NULL` adds y unscaled.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_residual(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        gate_tab: CUdeviceptr,
        gate_emb: CUdeviceptr,
        d: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        let (mut x, mut y, mut g0, mut g1, mut d32, mut n64) =
            (x, y, gate_tab, gate_emb, d as i32, n as i64);
        let mut a = [
            p(&mut x),
            p(&mut y),
            p(&mut g0),
            p(&mut g1),
            p(&mut d32),
            p(&mut n64),
        ];
        self.launch(
            "gated_residual",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// The fused row step of the forward (see `residual_norm` in
    /// `kernels/elementwise.cu`): with `y` given, x (f32 [rows, d]) += y (bf16) *
    /// gate (gate_tab + gate_emb, or 1 when gate_tab is NULL); then h (bf16) =
    /// bf16(x) ([`RowMode::Cast`]) or the modulated RMS / LayerNorm of x.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_norm(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        gate: (CUdeviceptr, CUdeviceptr),
        rows: usize,
        d: usize,
        mode: RowMode,
        shift: (CUdeviceptr, CUdeviceptr),
        scale: (CUdeviceptr, CUdeviceptr),
        h: CUdeviceptr,
    ) -> Result<(), CudaError> {
        if d % 4 != 0 || d * 4 > 48 * 1024 {
            return Err(CudaError::Invalid(format!(
                "residual_norm: width {d} must be a multiple of 4 and <= 12288"
            )));
        }
        let (mut x, mut y, mut g0, mut g1, mut d32) = (x, y, gate.0, gate.1, d as i32);
        let (mut eps, mut m) = (super::dit::NORM_EPS, mode as i32);
        let (mut a0, mut a1, mut a2, mut a3, mut h) = (shift.0, scale.0, shift.1, scale.1, h);
        let mut a = [
            p(&mut x),
            p(&mut y),
            p(&mut g0),
            p(&mut g1),
            p(&mut d32),
            p(&mut eps),
            p(&mut m),
            p(&mut a0),
            p(&mut a1),
            p(&mut a2),
            p(&mut a3),
            p(&mut h),
        ];
        self.launch(
            "residual_norm",
            (rows as u32, 1, 1),
            (ROW_THREADS, 1, 1),
            (d * 4) as u32,
            s,
            &mut a,
        )
    }

    /// y = silu(x), n bf16 elements.
    pub fn silu(
        &self,
        s: &CudaStream,
        x: CUdeviceptr,
        y: CUdeviceptr,
        n: usize,
    ) -> Result<(), CudaError> {
        let (mut x, mut y, mut n64) = (x, y, n as i64);
        let mut a = [p(&mut x), p(&mut y), p(&mut n64)];
        self.launch(
            "silu_bf16",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// In place over bf16 [n / cols, cols]: y = act(y + b) with `b` (bf16 of cols,
    /// or NULL) and act identity or tanh-GELU.
    pub fn bias_act(
        &self,
        s: &CudaStream,
        y: CUdeviceptr,
        b: CUdeviceptr,
        cols: usize,
        n: usize,
        gelu: bool,
    ) -> Result<(), CudaError> {
        let (mut y, mut b, mut c, mut n64, mut act) = (y, b, cols as i32, n as i64, gelu as i32);
        let mut a = [p(&mut y), p(&mut b), p(&mut c), p(&mut n64), p(&mut act)];
        self.launch(
            "bias_act",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// The sinusoidal timestep embedding of `t` (cosines first) into bf16 [2 * half].
    pub fn timestep_sinusoid(
        &self,
        s: &CudaStream,
        out: CUdeviceptr,
        t: f32,
        half: usize,
    ) -> Result<(), CudaError> {
        let (mut o, mut t, mut h) = (out, t, half as i32);
        let mut a = [p(&mut o), p(&mut t), p(&mut h)];
        self.launch("timestep_sinusoid", (1, 1, 1), (128, 1, 1), 0, s, &mut a)
    }

    /// lat += dt * v over n f32 elements.
    pub fn euler_update(
        &self,
        s: &CudaStream,
        lat: CUdeviceptr,
        v: CUdeviceptr,
        dt: f32,
        n: usize,
    ) -> Result<(), CudaError> {
        let (mut l, mut v, mut dt, mut n64) = (lat, v, dt, n as i64);
        let mut a = [p(&mut l), p(&mut v), p(&mut dt), p(&mut n64)];
        self.launch(
            "euler_update",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
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
        let (mut y, mut n64, mut seed, mut sc) = (y, n as i64, seed, scale);
        let mut a = [p(&mut y), p(&mut n64), p(&mut seed), p(&mut sc)];
        self.launch(
            "fill_uniform_bf16",
            self.ew_grid(n),
            (EW_THREADS, 1, 1),
            0,
            s,
            &mut a,
        )
    }

    /// Multi-head attention: see `kernels/attention.cu`. `q` [nq, ldq], `k` [nk,
    /// ldk], `v` [nk, ldv], `o` [nq, ldo], bf16; head h at columns h*hd..;
    /// `kbias` f32 [nk] or NULL. Leading dimensions in elements, multiples of 8.
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
        let built: &[usize] = match kind {
            AttnKernel::Reference => &[16, 32, 64, 128],
            _ => &[64, 128],
        };
        if !built.contains(&hd) {
            return Err(CudaError::Invalid(format!(
                "attention head dim {hd}: the {} kernel is built for {built:?}",
                kind.name()
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
        let (name, block, smem) = match kind {
            AttnKernel::Reference => (format!("attn_ref_hd{hd}"), 64u32, 0u32),
            AttnKernel::Flash => (format!("flash_attn_hd{hd}"), 128, flash_smem_bytes(hd)),
            AttnKernel::FlashLdsm => (format!("flash_attn_ldsm_hd{hd}"), 128, flash_smem_bytes(hd)),
            AttnKernel::Flash2W4 | AttnKernel::Flash2W8 => {
                let w = if kind == AttnKernel::Flash2W4 { 4 } else { 8 };
                let bias = if kbias != NULL { "_bias" } else { "" };
                (
                    format!("flash2_hd{hd}_w{w}{bias}"),
                    32 * w,
                    flash_smem_bytes(hd),
                )
            }
        };
        // Query rows per block: one per thread for the reference, 16 per warp otherwise.
        let rows = if kind == AttnKernel::Reference {
            block as usize
        } else {
            block as usize / 2
        };
        let grid = (nq.div_ceil(rows) as u32, heads as u32, 1);
        let (mut qp, mut kp, mut vp, mut op) = (q.0, k.0, v.0, o.0);
        let (mut nq32, mut nk32) = (nq as i32, nk as i32);
        let (mut lq, mut lk, mut lv, mut lo) = (q.1 as i32, k.1 as i32, v.1 as i32, o.1 as i32);
        let (mut kb, mut sc) = (kbias, scale);
        let mut a = [
            p(&mut qp),
            p(&mut kp),
            p(&mut vp),
            p(&mut op),
            p(&mut nq32),
            p(&mut nk32),
            p(&mut lq),
            p(&mut lk),
            p(&mut lv),
            p(&mut lo),
            p(&mut kb),
            p(&mut sc),
        ];
        self.launch(&name, grid, (block, 1, 1), smem, s, &mut a)
    }
}

/// What [`Kernels::residual_norm`] writes into `h`.
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
    /// Device f32 [nfreq]: the per-frequency factor (pi/2 * 10000^linspace(0, 1, nfreq)).
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

fn p<T>(x: &mut T) -> *mut c_void {
    x as *mut T as *mut c_void
}

/// The flash v2 entry points, generated by the `FLASH2` macro in attention.cu.
pub fn flash2_names() -> Vec<String> {
    let mut v = Vec::new();
    for hd in [64, 128] {
        for w in [4, 8] {
            v.push(format!("flash2_hd{hd}_w{w}"));
            v.push(format!("flash2_hd{hd}_w{w}_bias"));
        }
    }
    v
}

/// Every entry point of module `name`: the declared ones plus the
/// macro-generated ones.
pub fn module_kernels(name: &str, src: &str) -> Vec<String> {
    let mut v = kernel_names(src);
    if name == "attention" {
        v.extend(flash2_names());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_finds_every_entry_point() {
        let e = kernel_names(nvrtc::ELEMENTWISE_CU);
        for k in [
            "cast_f32_to_bf16",
            "cast_bf16_to_f32",
            "ada_norm_mod",
            "qk_norm_rope",
            "gated_residual",
            "silu_bf16",
            "bias_act",
            "euler_update",
            "fill_uniform_bf16",
            "timestep_sinusoid",
            "residual_norm",
        ] {
            assert!(e.iter().any(|n| n == k), "{k} missing from {e:?}");
        }
        let a = kernel_names(nvrtc::ATTENTION_CU);
        assert_eq!(a.len(), 8, "{a:?}");
        let a = module_kernels("attention", nvrtc::ATTENTION_CU);
        assert_eq!(a.len(), 16, "{a:?}");
        for f in flash2_names() {
            let macro_line = format!(
                "FLASH2({}, {})",
                &f[9..f.find("_w").unwrap()],
                &f[f.find("_w").unwrap() + 2..][..1]
            );
            assert!(
                nvrtc::ATTENTION_CU.contains(&macro_line),
                "{macro_line} not instantiated"
            );
        }
        assert!(a.iter().any(|n| n == "flash_attn_ldsm_hd128"));
    }

    #[test]
    fn flash_smem_fits_the_h200_limit() {
        assert_eq!(flash_smem_bytes(64), 36_864);
        assert_eq!(flash_smem_bytes(128), 69_632);
        assert!(flash_smem_bytes(128) <= 227 * 1024);
    }
}
