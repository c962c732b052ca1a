//! `engine selftest-cuda`: every device kernel and the device DiT forward
//! against the CPU reference arm (`crate::ops`, `crate::schedule` and
//! `crate::models::dit::Transformer`, all f32), on random inputs (never zeros),
//! with every output poisoned (0xFF bytes = NaN) before the kernel runs, so an
//! element left unwritten fails the check as NaN. The reference sees exactly the
//! bf16 values the device sees (inputs rounded through bf16 first, see [`rb`]).
//!
//! Tolerances (relative L2 error ‖dev − ref‖ / ‖ref‖), argued once here:
//! - bf16 outputs of f32 math: rounding to bf16 is ≤ 2⁻⁹ relative per element,
//!   ~1.1e-3 RMS; tolerance 5e-3 (8e-3 for q/k norm + RoPE, which rounds twice:
//!   after the norm, as a bf16 model does, and after the rotation).
//! - f32 elementwise (residual add): only reassociation; tolerance 1e-5. The
//!   sampler step (guidance + Euler) rounds each operation as the CPU arm does:
//!   tolerance 0 (bit-exact).
//! - GEMMs and attention with bf16 operands and fp32 accumulation: operand
//!   rounding (the reference sees the same bf16 values), output rounding, and
//!   in flash attention the bf16 probabilities: expected ~3e-3; tolerance 1e-2.
//! - a whole forward: a chain of ~5 such roundings per block with the residual
//!   stream kept in f32: expected ~5e-3 to 1e-2; tolerance 2e-2 (device runs 1-4
//!   measured 3.3e-3 to 3.5e-3).
//! - staging: byte-identical (tolerance 0).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;
use half::bf16;
use rayon::prelude::*;

use super::context::Gpu;
use super::dit::{DeviceDit, DitDims, Geometry, LATENT_CHANNELS, MASK_BIAS, NORM_EPS, QK_EPS};
use super::gemm::{Epilogue, Gemm};
use super::kernels::{AttnKernel, Kernels, Map, RopeArgs, RowMode, NULL};
use super::memory::{download, upload, DeviceBuffer};
use super::staging::{self, DeviceWeights, StagingArm, StagingOptions};
use super::CudaError;
use crate::models::dit::{Transformer, ROPE_COMPRESSION};
use crate::ops::activation::{gelu_tanh, silu};
use crate::ops::attention::{attention, AttnBias};
use crate::ops::embed::timestep_embedding;
use crate::ops::linear::Linear;
use crate::ops::norm::{layer_norm_rows, modulate_rows, rms_norm_rows};
use crate::ops::rope::{apply_rope, ltx_rope, rope_freqs, ROPE_BASE};
use crate::schedule::{cfg_combine, euler_step};
use crate::tensor::Tensor;
use crate::weights::{MapSource, TensorSpec, VarBuilder};

/// bf16 bits to f32 (exact).
pub fn widen(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect()
}

/// f32 to bf16 bits, round to nearest even (what the device's cvt.rn does).
pub fn narrow(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect()
}

/// Round through bf16 (what a bf16 input holds).
pub fn rb(x: &[f32]) -> Vec<f32> {
    widen(&narrow(x))
}

/// ‖a − b‖₂ / ‖b‖₂ and max |a − b|; NaN when any element of `a` is not finite
/// or the lengths differ.
pub fn rel_err(a: &[f32], b: &[f32]) -> (f64, f64) {
    if a.len() != b.len() || a.iter().any(|v| !v.is_finite()) {
        return (f64::NAN, f64::NAN);
    }
    let (mut num, mut den, mut mx) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let e = (*x as f64 - *y as f64).abs();
        num += e * e;
        den += (*y as f64).powi(2);
        mx = mx.max(e);
    }
    ((num / den.max(1e-300)).sqrt(), mx)
}

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Relative L2 error (NaN when an output was not finite / not written).
    pub rel: f64,
    /// Largest absolute error.
    pub max_abs: f64,
    /// The tolerance on `rel`.
    pub tol: f64,
    /// Whether it passed.
    pub pass: bool,
    /// Extra facts (timings, sizes).
    pub note: String,
}

impl Check {
    /// A check of `dev` against `reference` at tolerance `tol` on the relative
    /// L2 error; fails on a non-finite output and on an all-zero reference.
    pub fn new(name: impl Into<String>, dev: &[f32], reference: &[f32], tol: f64) -> Check {
        let (rel, max_abs) = rel_err(dev, reference);
        let nontrivial = reference.iter().any(|v| *v != 0.0);
        Check {
            name: name.into(),
            rel,
            max_abs,
            tol,
            pass: rel.is_finite() && rel <= tol && nontrivial,
            note: if nontrivial {
                String::new()
            } else {
                "reference is all zeros".into()
            },
        }
    }

    /// One table row.
    pub fn row(&self) -> String {
        format!(
            "{:<4} {:<52} rel={:<10.3e} max_abs={:<10.3e} tol={:<8.1e} {}",
            if self.pass { "ok" } else { "FAIL" },
            self.name,
            self.rel,
            self.max_abs,
            self.tol,
            self.note
        )
    }
}

/// A small deterministic generator (splitmix64) for check inputs.
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| lo + (hi - lo) * ((self.next() >> 40) as f32 / 16_777_216.0))
            .collect()
    }
    /// Approximately normal values (see [`Rng::normal`]) rounded through bf16.
    pub fn normal_bf16(&mut self, n: usize, std: f32) -> Vec<f32> {
        rb(&self.normal(n, std))
    }
    /// Approximately normal (sum of 4 uniforms, scaled to unit variance) times `std`.
    pub fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let s: f32 = (0..4)
                    .map(|_| (self.next() >> 40) as f32 / 16_777_216.0 - 0.5)
                    .sum();
                s * std * 1.732_050_8
            })
            .collect()
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Deterministic synthetic bf16 values for one DiT or VAE tensor: Linear
/// weights uniform ±1/√in, convolution weights ±1/√fan-in, biases ±0.1, q/k norm weights 1 ± 0.2, scale-shift tables
/// ±0.5. A pure function of (seed, name, index).
pub fn synth_tensor(spec: &TensorSpec, seed: u64) -> Vec<u16> {
    let n = spec.numel();
    let h = name_hash(&spec.name) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let (offset, scale) =
        if spec.name.ends_with("norm_q.weight") || spec.name.ends_with("norm_k.weight") {
            (1.0f32, 0.2f32)
        } else if spec.name.ends_with("scale_shift_table") {
            (0.0, 0.5)
        } else if spec.name.ends_with(".bias") {
            (0.0, 0.1)
        } else if spec.shape.len() == 2 {
            (0.0, 1.0 / (spec.shape[1] as f32).sqrt())
        } else if spec.shape.len() == 5 {
            // Convolution weights [co, ci, kt, kh, kw]: uniform ±1/√fan-in.
            let fan_in: usize = spec.shape[1..].iter().product();
            (0.0, 1.0 / (fan_in as f32).sqrt())
        } else {
            (0.0, 0.5)
        };
    let mut out = vec![0u16; n];
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (j, o) in chunk.iter_mut().enumerate() {
                let i = (c << 16) + j;
                let u = (mix(h ^ mix(i as u64)) >> 40) as f32 / 16_777_216.0;
                *o = half::bf16::from_f32(offset + (2.0 * u - 1.0) * scale).to_bits();
            }
        });
    out
}

/// Write a safetensors file of `specs` (all bf16) with [`synth_tensor`] values,
/// streaming one tensor at a time. Returns the bytes written.
pub fn write_synth_safetensors(
    path: &Path,
    specs: &[TensorSpec],
    seed: u64,
) -> Result<u64, CudaError> {
    write_safetensors_with(path, specs, &|s| synth_tensor(s, seed))
}

/// Write a safetensors file of `specs` (all bf16), each tensor's bits from
/// `values`, streaming one tensor at a time. Returns the bytes written.
pub fn write_safetensors_with(
    path: &Path,
    specs: &[TensorSpec],
    values: &dyn Fn(&TensorSpec) -> Vec<u16>,
) -> Result<u64, CudaError> {
    let io = |source| CudaError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut hdr = serde_json::Map::new();
    let mut off = 0usize;
    for s in specs {
        hdr.insert(
            s.name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": s.shape, "data_offsets": [off, off + s.nbytes()]}),
        );
        off += s.nbytes();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(hdr))
        .map_err(|e| CudaError::Invalid(e.to_string()))?;
    while (h.len() + 8) % 256 != 0 {
        h.push(b' '); // align the data section
    }
    let mut f = BufWriter::with_capacity(8 << 20, File::create(path).map_err(io)?);
    f.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    f.write_all(&h).map_err(io)?;
    for s in specs {
        let v = values(s);
        // SAFETY: u16 slice viewed as its bytes (little-endian machine, as safetensors).
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) };
        f.write_all(bytes).map_err(io)?;
    }
    f.flush().map_err(io)?;
    f.get_ref().sync_all().map_err(io)?;
    Ok((8 + h.len() + off) as u64)
}

/// The synthetic weights of `specs` widened to f32 (exactly what the device
/// holds), as a source the CPU arm loads from.
pub fn synth_source(specs: &[TensorSpec], seed: u64) -> Result<MapSource, CudaError> {
    let mut src = MapSource::new();
    for s in specs {
        let t = Tensor::new(&s.shape, widen(&synth_tensor(s, seed)))
            .map_err(|e| CudaError::Invalid(format!("synthetic tensor {}: {e}", s.name)))?;
        src.insert(s.name.clone(), t);
    }
    Ok(src)
}

/// The device objects every check needs (cloning shares them).
#[derive(Clone)]
pub struct Rig {
    /// The GPU.
    pub gpu: Arc<Gpu>,
    /// Loaded kernels.
    pub kernels: Arc<Kernels>,
    /// cuBLASLt.
    pub gemm: Arc<Gemm>,
}

impl Rig {
    /// Open GPU 0 and load everything.
    pub fn open() -> Result<Rig, CudaError> {
        let gpu = Arc::new(Gpu::open(0)?);
        let kernels = Arc::new(Kernels::load(&gpu)?);
        let gemm = Arc::new(Gemm::new(&gpu)?);
        Ok(Rig { gpu, kernels, gemm })
    }

    /// Rig with the same GPU, kernels and cuBLASLt handle (shared).
    pub fn share(&self) -> Rig {
        Rig {
            gpu: self.gpu.clone(),
            kernels: self.kernels.clone(),
            gemm: self.gemm.clone(),
        }
    }

    pub(crate) fn bf16(&self, x: &[f32]) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, x.len() * 2, "a check input")?;
        upload(&self.gpu, b.ptr(), &narrow(x))?;
        Ok(b)
    }
    pub(crate) fn f32(&self, x: &[f32]) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, x.len() * 4, "a check input")?;
        upload(&self.gpu, b.ptr(), x)?;
        Ok(b)
    }
    /// A buffer of `bytes` filled with NaN bytes.
    pub(crate) fn poisoned(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, bytes, "a check output")?;
        b.fill_bytes(&self.gpu, 0xFF, &self.gpu.compute)?;
        Ok(b)
    }
    fn read_bf16(&self, p: CUdeviceptr, n: usize) -> Result<Vec<f32>, CudaError> {
        Ok(widen(&download::<u16>(&self.gpu, p, n)?))
    }
    fn read_f32(&self, p: CUdeviceptr, n: usize) -> Result<Vec<f32>, CudaError> {
        download::<f32>(&self.gpu, p, n)
    }
}

/// The CPU arm's modulated norm of `x` rows: `norm(x) * (1 + scale) + shift`
/// (LayerNorm when `center`, else RMS; no affine).
fn ref_norm_mod(x: &[f32], d: usize, center: bool, shift: &[f32], scale: &[f32]) -> Vec<f32> {
    let mut h = x.to_vec();
    if center {
        layer_norm_rows(&mut h, d, NORM_EPS, None, None);
    } else {
        rms_norm_rows(&mut h, d, None, NORM_EPS);
    }
    modulate_rows(&mut h, scale, shift);
    h
}

/// Elementwise and row-wise kernels.
pub fn check_kernels(rig: &Rig, rng: &mut Rng, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (k, s) = (&rig.kernels, &rig.gpu.compute);
    // Casts: bit-exact round to nearest even, and exact widening.
    {
        let x = rng.normal(100_003, 3.0);
        let xd = rig.f32(&x)?;
        let yd = rig.poisoned(x.len() * 2)?;
        k.map(s, Map::F32ToBf16, xd.ptr(), yd.ptr(), x.len())?;
        let bits = download::<u16>(&rig.gpu, yd.ptr(), x.len())?;
        let want = narrow(&x);
        let wrong = bits.iter().zip(&want).filter(|(a, b)| a != b).count();
        let zd = rig.poisoned(x.len() * 4)?;
        k.map(s, Map::Bf16ToF32, yd.ptr(), zd.ptr(), x.len())?;
        let z = rig.read_f32(zd.ptr(), x.len())?;
        let mut c = Check::new(
            "cast f32->bf16->f32 (bit-exact RNE)",
            &z,
            &widen(&want),
            0.0,
        );
        c.pass &= wrong == 0;
        c.note = format!("{wrong} of {} bf16 values differ", x.len());
        out.push(c);
    }
    // q/k RMS norm (+ RoPE), in place as the forward runs it.
    for (d, grid, rope) in [
        (64usize, (2, 3, 4), true),
        (2048, (3, 4, 5), true),
        (4096, (2, 5, 6), true),
        (2048, (1, 7, 9), false),
    ] {
        let rows = grid.0 * grid.1 * grid.2;
        let x = rb(&rng.normal(rows * d, 2.0));
        let w = rb(&rng.uniform(d, 0.8, 1.2));
        let xd = rig.bf16(&x)?;
        let wd = rig.bf16(&w)?;
        let f = rope_freqs(d);
        let fd = rig.f32(&f)?;
        let fps = 24.0;
        let args = RopeArgs {
            freqs: fd.ptr(),
            nfreq: f.len(),
            grid,
            scale: [
                (ROPE_COMPRESSION.0 as f64 / fps as f64) as f32,
                ROPE_COMPRESSION.1 as f32,
                ROPE_COMPRESSION.1 as f32,
            ],
            base: [ROPE_BASE.0, ROPE_BASE.1, ROPE_BASE.2],
        };
        k.qk_norm_rope(
            s,
            xd.ptr(),
            xd.ptr(),
            wd.ptr(),
            rows,
            d,
            QK_EPS,
            if rope { Some(&args) } else { None },
        )?;
        let y = rig.read_bf16(xd.ptr(), rows * d)?;
        let mut r = x.clone();
        rms_norm_rows(&mut r, d, Some(&w), QK_EPS);
        if rope {
            let t = ltx_rope(grid, fps, ROPE_COMPRESSION.0, ROPE_COMPRESSION.1, d);
            apply_rope(&mut r, &t);
        }
        out.push(Check::new(
            format!(
                "qk_norm{} d={d} grid={grid:?} in place",
                if rope { "+rope" } else { "" }
            ),
            &y,
            &r,
            8e-3,
        ));
    }
    // The fused residual + norm row step, every mode, with and without a residual.
    for d in [64usize, 2048, 4096] {
        for (mode, name) in [
            (RowMode::Cast, "cast"),
            (RowMode::Rms, "rms"),
            (RowMode::LayerNorm, "layernorm"),
        ] {
            for (with_y, gated) in [(true, true), (true, false), (false, false)] {
                if !with_y && mode == RowMode::Cast {
                    continue;
                }
                let rows = 19;
                let x: Vec<f32> = rng.normal(rows * d, 1.5).iter().map(|v| v + 0.2).collect();
                let y = rb(&rng.normal(rows * d, 1.0));
                let t: Vec<Vec<f32>> = (0..6).map(|_| rb(&rng.uniform(d, -0.5, 0.5))).collect();
                let xd = rig.f32(&x)?;
                let yd = rig.bf16(&y)?;
                let td: Vec<DeviceBuffer> =
                    t.iter().map(|v| rig.bf16(v)).collect::<Result<_, _>>()?;
                let hd = rig.poisoned(rows * d * 2)?;
                let gate = if gated {
                    (td[4].ptr(), td[5].ptr())
                } else {
                    (NULL, NULL)
                };
                k.residual_norm(
                    s,
                    xd.ptr(),
                    if with_y { yd.ptr() } else { NULL },
                    gate,
                    rows,
                    d,
                    mode,
                    (td[0].ptr(), td[2].ptr()),
                    (td[1].ptr(), td[3].ptr()),
                    hd.ptr(),
                )?;
                let mut rx = x.clone();
                if with_y {
                    for i in 0..rows * d {
                        let g = if gated {
                            t[4][i % d] + t[5][i % d]
                        } else {
                            1.0
                        };
                        rx[i] += y[i] * g;
                    }
                }
                let rh = match mode {
                    RowMode::Cast => rx.clone(),
                    _ => {
                        let shift: Vec<f32> = (0..d).map(|c| t[0][c] + t[2][c]).collect();
                        let scale: Vec<f32> = (0..d).map(|c| t[1][c] + t[3][c]).collect();
                        ref_norm_mod(&rx, d, mode == RowMode::LayerNorm, &shift, &scale)
                    }
                };
                let tag = format!("residual_norm {name} d={d} y={with_y} gate={gated}");
                out.push(Check::new(
                    format!("{tag} h"),
                    &rig.read_bf16(hd.ptr(), rows * d)?,
                    &rh,
                    5e-3,
                ));
                out.push(Check::new(
                    format!("{tag} x"),
                    &rig.read_f32(xd.ptr(), rows * d)?,
                    &rx,
                    1e-5,
                ));
            }
        }
    }
    // SiLU, the timestep sinusoid, the guided Euler step.
    {
        let n = 70_001;
        let x = rb(&rng.normal(n, 3.0));
        let xd = rig.bf16(&x)?;
        let yd = rig.poisoned(n * 2)?;
        k.map(s, Map::SiluBf16, xd.ptr(), yd.ptr(), n)?;
        let mut r = x.clone();
        silu(&mut r);
        out.push(Check::new("silu", &rig.read_bf16(yd.ptr(), n)?, &r, 5e-3));
        for t in [0.0f32, 37.25, 937.5] {
            let td = rig.poisoned(512)?;
            k.timestep_sinusoid(s, td.ptr(), t, 128)?;
            let mut c = Check::new(
                format!("timestep_sinusoid t={t}"),
                &rig.read_bf16(td.ptr(), 256)?,
                &timestep_embedding(t, 256),
                5e-3,
            );
            if t == 0.0 {
                c.name.push_str(" (cos=1, sin=0)");
            }
            out.push(c);
        }
        for guided in [true, false] {
            let lat = rng.normal(n, 1.0);
            let vc = rng.normal(n, 1.0);
            let vu = rng.normal(n, 1.0);
            let (sigma, sigma_next, g) = (0.8125f32, 0.7031f32, 3.0f32);
            let (ld, cd, ud) = (rig.f32(&lat)?, rig.f32(&vc)?, rig.f32(&vu)?);
            let u = if guided { ud.ptr() } else { NULL };
            k.guided_euler(s, ld.ptr(), cd.ptr(), u, g, sigma_next - sigma, n)?;
            let v = if guided {
                cfg_combine(&vu, &vc, g).map_err(|e| CudaError::Invalid(e.to_string()))?
            } else {
                vc.clone()
            };
            let mut r = lat.clone();
            euler_step(&mut r, &v, sigma, sigma_next)
                .map_err(|e| CudaError::Invalid(e.to_string()))?;
            out.push(Check::new(
                format!("guided_euler guidance={guided} vs cfg_combine+euler_step (bit-exact)"),
                &rig.read_f32(ld.ptr(), n)?,
                &r,
                0.0,
            ));
        }
    }
    Ok(())
}

/// cuBLASLt GEMMs of the forward's shapes, fused epilogues, against the CPU
/// arm's `Linear` (and its tanh-GELU).
pub fn check_gemms(rig: &Rig, rng: &mut Rng, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (g, s) = (&rig.gemm, &rig.gpu.compute);
    let shapes = [
        (300usize, 2048usize, 2048usize, Epilogue::Bias),
        (300, 8192, 2048, Epilogue::BiasGelu),
        (300, 2048, 8192, Epilogue::Bias),
        (1, 12288, 2048, Epilogue::Bias),
        (77, 4096, 4096, Epilogue::BiasGelu),
        (300, 128, 4096, Epilogue::Bias),
        (129, 64, 64, Epilogue::None),
        (64, 4096, 128, Epilogue::BiasGelu),
    ];
    for (m, n, kk, ep) in shapes {
        let x = rb(&rng.normal(m * kk, 1.0));
        let w = rb(&rng
            .uniform(n * kk, -1.0, 1.0)
            .iter()
            .map(|v| v / (kk as f32).sqrt())
            .collect::<Vec<_>>());
        let b = rb(&rng.uniform(n, -0.5, 0.5));
        let (xd, wd, bd) = (rig.bf16(&x)?, rig.bf16(&w)?, rig.bf16(&b)?);
        let yd = rig.poisoned(m * n * 2)?;
        g.linear(s, xd.ptr(), wd.ptr(), bd.ptr(), yd.ptr(), m, n, kk, ep)?;
        let y = rig.read_bf16(yd.ptr(), m * n)?;
        let wt = Tensor::new(&[n, kk], w).map_err(|e| CudaError::Invalid(e.to_string()))?;
        let lin = Linear::new(wt, (ep != Epilogue::None).then_some(b));
        let mut r = lin.forward(&x, m);
        if ep == Epilogue::BiasGelu {
            gelu_tanh(&mut r);
        }
        out.push(Check::new(
            format!("gemm m={m} n={n} k={kk} {ep:?}"),
            &y,
            &r,
            1e-2,
        ));
    }
    let note = format!("{} cached plans", g.cached_plans());
    if let Some(c) = out.last_mut() {
        c.note = note;
    }
    Ok(())
}

/// Attention kernels against the CPU arm's attention: self (no bias) and cross
/// (text mask bias), sequence lengths that are not multiples of the tiles.
pub fn check_attention(rig: &Rig, rng: &mut Rng, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let heads = 4;
    for hd in [16usize, 64, 128] {
        let d = heads * hd;
        for (nq, nk, masked) in [
            (333usize, 333usize, false),
            (333, 77, true),
            (64, 64, false),
            (200, 130, true),
        ] {
            let q = rb(&rng.normal(nq * d, 1.5));
            let kx = rb(&rng.normal(nk * d, 1.5));
            let v = rb(&rng.normal(nk * d, 1.0));
            let bias: Vec<f32> = (0..nk)
                .map(|j| if j < nk * 3 / 4 { 0.0 } else { MASK_BIAS })
                .collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let r = attention(
                &q,
                &kx,
                &v,
                nq,
                nk,
                heads,
                hd,
                scale,
                AttnBias {
                    per_key: masked.then_some(bias.as_slice()),
                    per_head: None,
                },
            );
            let (qd, kd, vd, bd) = (
                rig.bf16(&q)?,
                rig.bf16(&kx)?,
                rig.bf16(&v)?,
                rig.f32(&bias)?,
            );
            for kind in AttnKernel::all() {
                if !kind.head_dims().contains(&hd) {
                    continue;
                }
                let od = rig.poisoned(nq * d * 2)?;
                rig.kernels.attention(
                    &rig.gpu.compute,
                    kind,
                    heads,
                    hd,
                    (qd.ptr(), d),
                    (kd.ptr(), d),
                    (vd.ptr(), d),
                    (od.ptr(), d),
                    nq,
                    nk,
                    if masked { bd.ptr() } else { NULL },
                    scale,
                )?;
                let o = rig.read_bf16(od.ptr(), nq * d)?;
                let tol = if kind == AttnKernel::Reference {
                    5e-3
                } else {
                    1e-2
                };
                out.push(Check::new(
                    format!(
                        "attention {} hd={hd} nq={nq} nk={nk}{}",
                        kind.name(),
                        if masked { " masked" } else { "" }
                    ),
                    &o,
                    &r,
                    tol,
                ));
            }
        }
    }
    Ok(())
}

/// The fused kernels at the forward's exact self-attention shapes (6144 x 6144
/// tokens, 32 heads of hd 64 as in ltxv-2b and of hd 128 as in ltxv-13b) against
/// the reference kernel on the device (the CPU arm would take minutes here).
/// Inputs uniform in [-2, 2] (q, k) and [-1, 1] (v) from the device generator:
/// scores q.k * hd^-1/2 then have std ~1.3, so the softmax spreads over many
/// keys and the running max grows over the tiles (the max of the first 64 keys
/// is ~1.7 below the final one). Tolerance 1e-2, argued as for the CPU checks:
/// both outputs are rounded to bf16 (~1.1e-3 RMS each) and the fused kernels
/// also round the probabilities to bf16 (~1.1e-3 relative, averaging over the
/// keys; the poly layout's 2^x adds at most 7.5e-5 relative per probability);
/// expected ~2-3e-3. Red on: the running output not rescaled when the
/// max grows (errors O(1), corrections ~0.2), a K/V stage overwritten before
/// all warps read it (a different tile's keys), rows past a tile not written
/// (NaN from the poisoned output).
pub fn check_attention_long(rig: &Rig, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (n, heads) = (6144usize, 32usize);
    let s = &rig.gpu.compute;
    for hd in [64usize, 128] {
        let d = heads * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let (q, k, v) = (
            rig.poisoned(n * d * 2)?,
            rig.poisoned(n * d * 2)?,
            rig.poisoned(n * d * 2)?,
        );
        rig.kernels
            .fill_uniform_bf16(s, q.ptr(), n * d, 71 + hd as u64, 2.0)?;
        rig.kernels
            .fill_uniform_bf16(s, k.ptr(), n * d, 72 + hd as u64, 2.0)?;
        rig.kernels
            .fill_uniform_bf16(s, v.ptr(), n * d, 73 + hd as u64, 1.0)?;
        let mut reference = Vec::new();
        for kind in AttnKernel::all() {
            let o = rig.poisoned(n * d * 2)?;
            rig.kernels.attention(
                s,
                kind,
                heads,
                hd,
                (q.ptr(), d),
                (k.ptr(), d),
                (v.ptr(), d),
                (o.ptr(), d),
                n,
                n,
                NULL,
                scale,
            )?;
            let got = rig.read_bf16(o.ptr(), n * d)?;
            if kind == AttnKernel::Reference {
                reference = got;
                continue;
            }
            out.push(Check::new(
                format!(
                    "attention {} hd={hd} heads={heads} nq=nk={n} vs the reference kernel",
                    kind.name()
                ),
                &got,
                &reference,
                1e-2,
            ));
        }
    }
    Ok(())
}

/// Stage the synthetic weights in `file` through both arms and both readers of
/// the batched arm: every tensor must be byte-identical to the file and between
/// the arms.
pub fn check_staging(
    rig: &Rig,
    file: &Path,
    out: &mut Vec<Check>,
) -> Result<DeviceWeights, CudaError> {
    let raw = std::fs::read(file).map_err(|source| CudaError::Io {
        path: file.to_path_buf(),
        source,
    })?;
    let tensors = staging::file_extents(file)?;
    let (serial, rs) =
        staging::stage(&rig.gpu, &tensors, &StagingOptions::new(StagingArm::Serial))?;
    let mut bo = StagingOptions::new(StagingArm::Batched);
    bo.reader = staging::Reader::PinnedRing;
    bo.chunk_bytes = 1 << 20; // many chunks: tensors straddle buffer boundaries
    let (ring, rr) = staging::stage(&rig.gpu, &tensors, &bo)?;
    let (registered, rg) = staging::stage(
        &rig.gpu,
        &tensors,
        &StagingOptions::new(StagingArm::Batched),
    )?;
    let mut differ = 0usize;
    for t in &tensors {
        let want = &raw[t.offset as usize..][..t.bytes];
        let a = serial.download(&rig.gpu, &t.name)?;
        let b = ring.download(&rig.gpu, &t.name)?;
        let c = registered.download(&rig.gpu, &t.name)?;
        if a != want || b != want || c != want {
            differ += 1;
        }
    }
    out.push(Check {
        name: format!(
            "staging serial vs batched (ring, registered) vs file ({} tensors)",
            tensors.len()
        ),
        rel: differ as f64,
        max_abs: 0.0,
        tol: 0.0,
        pass: differ == 0 && !tensors.is_empty(),
        note: format!(
            "{differ} differ; serial {} copies; ring {} and registered {} copies in 1 arena; {:.1} MB",
            rs.copies,
            rr.copies,
            rg.copies,
            rs.bytes as f64 / 1e6
        ),
    });
    Ok(registered)
}

/// A sharded checkpoint (the tiny model's tensors over three files, as a
/// sharded release stores them) staged through every arm: ONE arena for the
/// batched arm, and every tensor byte-identical to the single-file staging.
pub fn check_sharded_staging(
    rig: &Rig,
    dir: &Path,
    specs: &[TensorSpec],
    seed: u64,
    single: &DeviceWeights,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let per = specs.len().div_ceil(3);
    let mut files = Vec::new();
    for (i, part) in specs.chunks(per).enumerate() {
        let f = dir.join(format!("tiny-dit-0000{}-of-00003.safetensors", i + 1));
        write_synth_safetensors(&f, part, seed)?;
        files.push(f);
    }
    let src = crate::weights::safetensors::SafetensorsSource::open(
        "transformer",
        &files,
        &|n, _| Some(n.to_string()),
        crate::weights::safetensors::LoadOptions::default(),
    )?;
    let tensors = src.extents()?;
    let mut ring = StagingOptions::new(StagingArm::Batched);
    ring.reader = staging::Reader::PinnedRing;
    ring.chunk_bytes = 1 << 20;
    let mut differ = 0usize;
    let mut notes = Vec::new();
    for (label, o) in [
        ("registered", StagingOptions::new(StagingArm::Batched)),
        ("ring", ring),
        ("serial", StagingOptions::new(StagingArm::Serial)),
    ] {
        let (w, r) = staging::stage(&rig.gpu, &tensors, &o)?;
        for t in &tensors {
            if w.download(&rig.gpu, &t.name)? != single.download(&rig.gpu, &t.name)? {
                differ += 1;
            }
        }
        let one_arena = o.arm == StagingArm::Serial || r.allocations == 1;
        if !one_arena || r.files != files.len() {
            differ += 1;
        }
        notes.push(format!(
            "{label}: {} files, {} allocations",
            r.files, r.allocations
        ));
    }
    out.push(Check {
        name: format!("staging a 3-shard checkpoint ({} tensors)", tensors.len()),
        rel: differ as f64,
        max_abs: 0.0,
        tol: 0.0,
        pass: differ == 0 && tensors.len() == specs.len(),
        note: format!("{differ} differ; {}", notes.join("; ")),
    });
    Ok(())
}

/// One device forward of `dims` on staged weights against the CPU arm's
/// `Transformer` on the same (widened) weights, with each attention kernel.
#[allow(clippy::too_many_arguments)]
pub fn check_forward(
    rig: &Rig,
    rng: &mut Rng,
    label: &str,
    dims: DitDims,
    weights: Arc<DeviceWeights>,
    seed: u64,
    grid: (usize, usize, usize),
    l: usize,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let n = grid.0 * grid.1 * grid.2;
    let fps = 25.0;
    let sigma = 0.7;
    let lat = rng.normal(n * LATENT_CHANNELS, 1.0);
    let text = rng.normal(l * dims.caption_channels, 1.0);
    let mask: Vec<f32> = (0..l)
        .map(|j| if j < l * 3 / 4 { 1.0 } else { 0.0 })
        .collect();
    let bad = |e: String| CudaError::Invalid(format!("CPU arm: {e}"));
    let t0 = Instant::now();
    let src = synth_source(&dims.tensor_specs(), seed)?;
    let model = Transformer::load(&VarBuilder::new(&src), &dims.config())
        .map_err(|e| bad(e.to_string()))?;
    drop(src);
    let lt = Tensor::new(&[n, LATENT_CHANNELS], lat.clone()).map_err(|e| bad(e.to_string()))?;
    let tt =
        Tensor::new(&[l, dims.caption_channels], text.clone()).map_err(|e| bad(e.to_string()))?;
    let cpu = model
        .forward(&lt, sigma, &tt, &mask, grid, fps)
        .map_err(|e| bad(e.to_string()))?
        .into_data();
    drop(model);
    let cpu_s = t0.elapsed().as_secs_f64();
    let mut dit = DeviceDit::new(
        rig.gpu.clone(),
        rig.kernels.clone(),
        rig.gemm.clone(),
        dims,
        weights,
    )?;
    for kind in AttnKernel::all().into_iter().rev() {
        if !kind.head_dims().contains(&dims.head_dim) {
            continue;
        }
        dit.attn = kind;
        let (v, ms) = dit.forward(&lat, sigma, &text, &mask, Geometry { grid, fps }, true)?;
        let mut c = Check::new(
            format!(
                "forward {label} attn={} grid={grid:?} l={l} vs the CPU arm",
                kind.name()
            ),
            &v,
            &cpu,
            2e-2,
        );
        c.note = format!("device {ms:.2} ms, CPU arm {cpu_s:.1} s");
        out.push(c);
    }
    Ok(())
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// Scratch directory for weight files (must be durable and large enough:
    /// a few GB with `bench`, ~10 GB with the T5 benchmark).
    pub scratch: PathBuf,
    /// Run the benchmarks after the checks.
    pub bench: bool,
    /// Run one section only (every section when `None`).
    pub only: Option<Section>,
}

/// A part of the selftest that can run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    /// Staging, the DiT's kernels, GEMMs, attention and forwards (and their benchmarks).
    Dit,
    /// The T5 encoder's kernels and forwards (and its benchmark).
    T5,
    /// The `denoise-graph` lever: graph vs eager loops, and with `bench` the
    /// loop benchmark only ([`super::graph_bench::denoise_graph`]).
    Graph,
    /// The video VAE decoder's primitives and whole decodes (and its benchmark).
    Vae,
}

/// Sections 1-3: staging, kernels, GEMMs, attention, whole DiT forwards.
fn run_dit_sections(
    rig: &Rig,
    opts: &SelftestOptions,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let report = |checks: &Vec<Check>, from: usize| {
        for c in &checks[from..] {
            eprintln!("{}", c.row());
        }
    };
    // 1. Staging first: the tiny model's weights through both arms.
    let tiny = DitDims::from_config(&crate::presets::dit_tiny())?;
    let tiny_file = opts.scratch.join("tiny-dit.safetensors");
    write_synth_safetensors(&tiny_file, &tiny.tensor_specs(), 11)?;
    let tiny_w = Arc::new(check_staging(rig, &tiny_file, checks)?);
    check_sharded_staging(
        rig,
        &opts.scratch,
        &tiny.tensor_specs(),
        11,
        &tiny_w,
        checks,
    )?;
    report(checks, 0);
    let mut from = checks.len();
    // 2. Kernels, GEMMs, attention.
    check_kernels(rig, rng, checks)?;
    check_gemms(rig, rng, checks)?;
    check_attention(rig, rng, checks)?;
    check_attention_long(rig, checks)?;
    report(checks, from);
    from = checks.len();
    // 3. Whole forwards: tiny (2 blocks), one ltxv-2b block, one ltxv-13b block.
    check_forward(rig, rng, "tiny", tiny, tiny_w, 11, (2, 2, 3), 32, checks)?;
    for (label, dims, seed) in [
        ("ltxv-2b x1 block", DitDims::LTXV_2B.with_layers(1), 21u64),
        ("ltxv-13b x1 block", DitDims::LTXV_13B.with_layers(1), 31u64),
    ] {
        let f = opts
            .scratch
            .join(format!("{}-1block.safetensors", dims.head_dim));
        write_synth_safetensors(&f, &dims.tensor_specs(), seed)?;
        let (w, _) = staging::stage_file(&rig.gpu, &f, &StagingOptions::new(StagingArm::Batched))?;
        check_forward(
            rig,
            rng,
            label,
            dims,
            Arc::new(w),
            seed,
            (3, 8, 12),
            128,
            checks,
        )?;
        let _ = std::fs::remove_file(&f);
    }
    report(checks, from);
    Ok(())
}

/// Run every check (and the benchmarks with `bench`), printing one line per
/// check as it completes and the table last. Returns whether all passed.
pub fn run(opts: &SelftestOptions) -> Result<bool, CudaError> {
    std::fs::create_dir_all(&opts.scratch).map_err(|source| CudaError::Io {
        path: opts.scratch.clone(),
        source,
    })?;
    let t0 = Instant::now();
    let rig = Rig::open()?;
    eprintln!(
        "selftest-cuda: {} (sm_{}{}, {} SMs); kernels {:?}; setup {:.2} s",
        rig.gpu.name,
        rig.gpu.capability.0,
        rig.gpu.capability.1,
        rig.gpu.sms,
        rig.kernels.report.modules,
        t0.elapsed().as_secs_f64()
    );
    let mut checks = Vec::new();
    let mut rng = Rng::new(0x5eed_cafe);
    let report = |checks: &Vec<Check>, from: usize| {
        for c in &checks[from..] {
            eprintln!("{}", c.row());
        }
    };
    let all = opts.only.is_none();
    let wants = |s: Section| all || opts.only == Some(s);
    let mut bench_rows = Vec::new();
    // A benchmark that stops on an error says so in its rows; the checks go on.
    let bench = |rows: &mut Vec<String>, what: &str, r: Result<Vec<String>, CudaError>| match r {
        Ok(v) => rows.extend(v),
        Err(e) => rows.push(format!("{what} bench FAILED: {e}")),
    };
    // 1-3. Staging, kernels, GEMMs, attention, whole DiT forwards.
    if wants(Section::Dit) {
        run_dit_sections(&rig, opts, &mut rng, &mut checks)?;
    }
    // 4. The denoise loop replayed from CUDA graphs against the eager loop.
    if wants(Section::Graph) {
        let from = checks.len();
        super::graph_check::check_graphs(&rig, &mut rng, &mut checks)?;
        report(&checks, from);
    }
    if opts.bench {
        if all || opts.only == Some(Section::Dit) {
            // Staging, forwards and the graph on/off loop (bench::run).
            bench(
                &mut bench_rows,
                "dit",
                super::bench::run(&rig, &opts.scratch),
            );
        } else if opts.only == Some(Section::Graph) {
            let mut rows = Vec::new();
            let r = super::graph_bench::denoise_graph(&rig, &mut rows).map(|_| rows);
            bench(&mut bench_rows, "graph", r);
        }
    }
    // 5. The T5 encoder.
    if wants(Section::T5) {
        let from = checks.len();
        super::t5_check::check_t5(&rig, &mut rng, &opts.scratch, &mut checks)?;
        report(&checks, from);
        if opts.bench {
            bench(
                &mut bench_rows,
                "t5",
                super::bench::run_t5(&rig, &opts.scratch),
            );
        }
    }
    // 6. The VAE decoder.
    if wants(Section::Vae) {
        let from = checks.len();
        super::vae::check::check_vae(&rig, &opts.scratch, &mut checks)?;
        report(&checks, from);
        if opts.bench {
            bench(&mut bench_rows, "vae", super::vae::bench::bench_vae(&rig));
        }
    }
    Ok(summary(&rig, &checks, &bench_rows, t0))
}

/// Print the table (every check, then the benchmark rows); whether all passed.
fn summary(rig: &Rig, checks: &[Check], bench_rows: &[String], t0: Instant) -> bool {
    let passed = checks.iter().filter(|c| c.pass).count();
    println!(
        "== selftest-cuda: {} on {} ({:.1} s) ==",
        if passed == checks.len() {
            "PASS"
        } else {
            "FAIL"
        },
        rig.gpu.name,
        t0.elapsed().as_secs_f64()
    );
    for c in checks {
        println!("{}", c.row());
    }
    println!("{passed} passed, {} failed", checks.len() - passed);
    for r in bench_rows {
        println!("{r}");
    }
    passed == checks.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::DType;

    #[test]
    fn synth_values_are_deterministic_scaled_and_not_constant() {
        let s = TensorSpec::new("a.to_q.weight", &[64, 256], DType::BF16);
        let a = widen(&synth_tensor(&s, 1));
        assert_eq!(a, widen(&synth_tensor(&s, 1)));
        assert_ne!(a, widen(&synth_tensor(&s, 2)));
        let bound = 1.0 / 16.0 * 1.01;
        assert!(a.iter().all(|v| v.abs() <= bound));
        let mean_abs = a.iter().map(|v| v.abs()).sum::<f32>() / a.len() as f32;
        assert!((mean_abs - 1.0 / 32.0).abs() < 0.003, "{mean_abs}");
        let n = TensorSpec::new("a.norm_q.weight", &[64], DType::BF16);
        assert!(widen(&synth_tensor(&n, 1))
            .iter()
            .all(|v| (0.79..=1.21).contains(v)));
    }

    #[test]
    fn synth_file_reads_back_through_the_staging_extents() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch")
            .join(format!("synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dims = DitDims::from_config(&crate::presets::dit_tiny()).unwrap();
        let specs = dims.tensor_specs();
        let p = dir.join("t.safetensors");
        let bytes = write_synth_safetensors(&p, &specs, 5).unwrap();
        assert_eq!(bytes, std::fs::metadata(&p).unwrap().len());
        let t = staging::file_extents(&p).unwrap();
        assert_eq!(t.len(), specs.len());
        assert_eq!(t[0].offset % 256, 0);
        let raw = std::fs::read(&p).unwrap();
        let s0 = specs.iter().find(|s| s.name == t[3].name).unwrap();
        let want = synth_tensor(s0, 5);
        let got: Vec<u16> = raw[t[3].offset as usize..][..t[3].bytes]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn synth_source_loads_into_the_cpu_arm() {
        let dims = DitDims::from_config(&crate::presets::dit_tiny()).unwrap();
        let src = synth_source(&dims.tensor_specs(), 3).unwrap();
        assert!(Transformer::load(&VarBuilder::new(&src), &dims.config()).is_ok());
    }

    #[test]
    fn bf16_helpers_round_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        let x = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5, 0.1];
        let r = rb(&x);
        assert_eq!(r[0], 1.0);
        assert_eq!(r[1], 1.0 + 4.0 / 256.0);
        assert_eq!(r[2], -2.5);
        assert!((r[3] - 0.1).abs() < 0.1 / 256.0 && r[3] != 0.1);
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), (0.0, 0.0));
        let (rel, mx) = rel_err(&[3.0, 4.0], &[0.0, 0.0 + 4.0]);
        assert!((rel - 0.75).abs() < 1e-12 && mx == 3.0);
        assert!(rel_err(&[f32::NAN], &[1.0]).0.is_nan());
    }

    #[test]
    fn a_check_fails_on_nan_and_on_all_zero_references() {
        assert!(!Check::new("x", &[f32::NAN, 1.0], &[1.0, 1.0], 1.0).pass);
        assert!(!Check::new("x", &[0.0, 0.0], &[0.0, 0.0], 1.0).pass);
        assert!(Check::new("x", &[1.0, 2.0], &[1.0, 2.0], 0.0).pass);
        assert!(!Check::new("x", &[1.1, 2.0], &[1.0, 2.0], 1e-3).pass);
    }
}
