//! `engine selftest-cuda`: every device kernel and the device DiT forward
//! against the f32 host references ([`super::host_ref`]), on random inputs
//! (never zeros), with every output poisoned (0xFF bytes = NaN) before the
//! kernel runs, so an element left unwritten fails the check as NaN.
//!
//! Tolerances (relative L2 error ‖dev − ref‖ / ‖ref‖), argued once here:
//! - bf16 outputs of f32 math: rounding to bf16 is ≤ 2⁻⁹ relative per element,
//!   ~1.1e-3 RMS; tolerance 5e-3.
//! - f32 elementwise (residual, Euler): only reassociation; tolerance 1e-5.
//! - GEMMs and attention with bf16 operands and fp32 accumulation: operand
//!   rounding (the reference sees the same bf16 values), output rounding, and
//!   in flash attention the bf16 probabilities: expected ~3e-3; tolerance 1e-2.
//! - a whole forward: a chain of ~5 such roundings per block with the residual
//!   stream kept in f32: expected ~5e-3 to 1e-2; tolerance 2e-2.
//! - staging: byte-identical (tolerance 0).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;
use rayon::prelude::*;

use super::context::Gpu;
use super::dit::{DeviceDit, DitDims, Geometry, LATENT_CHANNELS, MASK_BIAS, NORM_EPS, QK_EPS};
use super::gemm::{Epilogue, Gemm};
use super::host_ref as hr;
use super::kernels::{AttnKernel, Kernels, RopeArgs, RowMode, NULL};
use super::memory::{download, upload, DeviceBuffer};
use super::staging::{self, DeviceWeights, StagingArm, StagingOptions};
use super::CudaError;
use crate::weights::TensorSpec;

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
    fn new(name: impl Into<String>, dev: &[f32], reference: &[f32], tol: f64) -> Check {
        let (rel, max_abs) = hr::rel_err(dev, reference);
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

/// Deterministic synthetic bf16 values for one DiT tensor: Linear weights
/// uniform ±1/√in, biases ±0.1, q/k norm weights 1 ± 0.2, scale-shift tables
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
        let v = synth_tensor(s, seed);
        // SAFETY: u16 slice viewed as its bytes (little-endian machine, as safetensors).
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) };
        f.write_all(bytes).map_err(io)?;
    }
    f.flush().map_err(io)?;
    f.get_ref().sync_all().map_err(io)?;
    Ok((8 + h.len() + off) as u64)
}

/// Host f32 copies of the synthetic weights (what the device holds, widened).
pub fn synth_host_weights(specs: &[TensorSpec], seed: u64) -> hr::HostWeights {
    specs
        .iter()
        .map(|s| (s.name.clone(), hr::widen(&synth_tensor(s, seed))))
        .collect::<HashMap<_, _>>()
}

/// The device objects every check needs.
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

    fn bf16(&self, x: &[f32]) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, x.len() * 2, "a check input")?;
        upload(&self.gpu, b.ptr(), &hr::narrow(x))?;
        Ok(b)
    }
    fn f32(&self, x: &[f32]) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, x.len() * 4, "a check input")?;
        upload(&self.gpu, b.ptr(), x)?;
        Ok(b)
    }
    /// A buffer of `bytes` filled with NaN bytes.
    fn poisoned(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let b = DeviceBuffer::alloc(&self.gpu, bytes, "a check output")?;
        b.fill_bytes(&self.gpu, 0xFF, &self.gpu.compute)?;
        Ok(b)
    }
    fn read_bf16(&self, p: CUdeviceptr, n: usize) -> Result<Vec<f32>, CudaError> {
        Ok(hr::widen(&download::<u16>(&self.gpu, p, n)?))
    }
    fn read_f32(&self, p: CUdeviceptr, n: usize) -> Result<Vec<f32>, CudaError> {
        download::<f32>(&self.gpu, p, n)
    }
}

/// Round through bf16 (what a bf16 input holds).
fn rb(x: &[f32]) -> Vec<f32> {
    hr::widen(&hr::narrow(x))
}

/// Elementwise and row-wise kernels.
pub fn check_kernels(rig: &Rig, rng: &mut Rng, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (k, s) = (&rig.kernels, &rig.gpu.compute);
    // Casts: bit-exact round to nearest even, and exact widening.
    {
        let x = rng.normal(100_003, 3.0);
        let xd = rig.f32(&x)?;
        let yd = rig.poisoned(x.len() * 2)?;
        k.cast_f32_to_bf16(s, xd.ptr(), yd.ptr(), x.len())?;
        let bits = download::<u16>(&rig.gpu, yd.ptr(), x.len())?;
        let want = hr::narrow(&x);
        let wrong = bits.iter().zip(&want).filter(|(a, b)| a != b).count();
        let zd = rig.poisoned(x.len() * 4)?;
        k.cast_bf16_to_f32(s, yd.ptr(), zd.ptr(), x.len())?;
        let z = rig.read_f32(zd.ptr(), x.len())?;
        let mut c = Check::new(
            "cast f32->bf16->f32 (bit-exact RNE)",
            &z,
            &hr::widen(&want),
            0.0,
        );
        c.pass &= wrong == 0;
        c.note = format!("{wrong} of {} bf16 values differ", x.len());
        out.push(c);
    }
    // Modulated norms (RMS and LayerNorm), widths of tiny, 2B and 13B.
    for d in [64usize, 2048, 4096] {
        for center in [false, true] {
            let rows = 37;
            let x: Vec<f32> = rng.normal(rows * d, 1.5).iter().map(|v| v + 0.3).collect();
            let tabs: Vec<Vec<f32>> = (0..4).map(|_| rb(&rng.uniform(d, -0.5, 0.5))).collect();
            let xd = rig.f32(&x)?;
            let td: Vec<DeviceBuffer> =
                tabs.iter().map(|t| rig.bf16(t)).collect::<Result<_, _>>()?;
            let yd = rig.poisoned(rows * d * 2)?;
            k.ada_norm_mod(
                s,
                xd.ptr(),
                yd.ptr(),
                rows,
                d,
                NORM_EPS,
                center,
                td[0].ptr(),
                td[1].ptr(),
                td[2].ptr(),
                td[3].ptr(),
            )?;
            let y = rig.read_bf16(yd.ptr(), rows * d)?;
            let shift: Vec<f32> = (0..d).map(|c| tabs[0][c] + tabs[2][c]).collect();
            let scale: Vec<f32> = (0..d).map(|c| tabs[1][c] + tabs[3][c]).collect();
            let r = hr::ada_norm_mod(&x, d, NORM_EPS, center, &shift, &scale);
            out.push(Check::new(
                format!(
                    "ada_norm_mod {} d={d}",
                    if center { "layernorm" } else { "rms" }
                ),
                &y,
                &r,
                5e-3,
            ));
        }
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
        let f = super::dit::rope_freqs(d);
        let fd = rig.f32(&f)?;
        let fps = 24.0;
        let args = RopeArgs {
            freqs: fd.ptr(),
            nfreq: f.len(),
            grid,
            scale: [8.0 / fps, 32.0, 32.0],
            base: [20.0, 2048.0, 2048.0],
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
        let mut r = hr::rms_norm_w(&x, d, &w, QK_EPS);
        if rope {
            hr::rope(&mut r, d, grid, fps);
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
    // Gated residual (f32 stream), with and without a gate.
    for gated in [true, false] {
        let (rows, d) = (29, 2048);
        let x = rng.normal(rows * d, 1.0);
        let y = rb(&rng.normal(rows * d, 1.0));
        let g0 = rb(&rng.uniform(d, -1.0, 1.0));
        let g1 = rb(&rng.uniform(d, -1.0, 1.0));
        let (xd, yd, g0d, g1d) = (rig.f32(&x)?, rig.bf16(&y)?, rig.bf16(&g0)?, rig.bf16(&g1)?);
        let (gt, ge) = if gated {
            (g0d.ptr(), g1d.ptr())
        } else {
            (NULL, NULL)
        };
        k.gated_residual(s, xd.ptr(), yd.ptr(), gt, ge, d, rows * d)?;
        let got = rig.read_f32(xd.ptr(), rows * d)?;
        let r: Vec<f32> = (0..rows * d)
            .map(|i| x[i] + y[i] * if gated { g0[i % d] + g1[i % d] } else { 1.0 })
            .collect();
        out.push(Check::new(
            format!("gated_residual gate={gated}"),
            &got,
            &r,
            1e-5,
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
                        rx[i] += y[i]
                            * if gated {
                                t[4][i % d] + t[5][i % d]
                            } else {
                                1.0
                            };
                    }
                }
                let rh = match mode {
                    RowMode::Cast => rx.clone(),
                    _ => {
                        let shift: Vec<f32> = (0..d).map(|c| t[0][c] + t[2][c]).collect();
                        let scale: Vec<f32> = (0..d).map(|c| t[1][c] + t[3][c]).collect();
                        hr::ada_norm_mod(
                            &rx,
                            d,
                            NORM_EPS,
                            mode == RowMode::LayerNorm,
                            &shift,
                            &scale,
                        )
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
    // SiLU, bias + tanh-GELU, the timestep sinusoid, Euler.
    {
        let n = 70_001;
        let x = rb(&rng.normal(n, 3.0));
        let xd = rig.bf16(&x)?;
        let yd = rig.poisoned(n * 2)?;
        k.silu(s, xd.ptr(), yd.ptr(), n)?;
        let r: Vec<f32> = x.iter().map(|v| hr::silu(*v)).collect();
        out.push(Check::new("silu", &rig.read_bf16(yd.ptr(), n)?, &r, 5e-3));
        let cols = 7 * 64;
        let rows = 33;
        let y = rb(&rng.normal(rows * cols, 2.0));
        let b = rb(&rng.uniform(cols, -0.5, 0.5));
        let (ydv, bd) = (rig.bf16(&y)?, rig.bf16(&b)?);
        k.bias_act(s, ydv.ptr(), bd.ptr(), cols, rows * cols, true)?;
        let r: Vec<f32> = (0..rows * cols)
            .map(|i| hr::gelu_tanh(y[i] + b[i % cols]))
            .collect();
        out.push(Check::new(
            "bias_act gelu_tanh",
            &rig.read_bf16(ydv.ptr(), rows * cols)?,
            &r,
            5e-3,
        ));
        for t in [0.0f32, 37.25, 937.5] {
            let td = rig.poisoned(512)?;
            k.timestep_sinusoid(s, td.ptr(), t, 128)?;
            let mut c = Check::new(
                format!("timestep_sinusoid t={t}"),
                &rig.read_bf16(td.ptr(), 256)?,
                &hr::timestep_sinusoid(t),
                5e-3,
            );
            if t == 0.0 {
                c.name.push_str(" (cos=1, sin=0)");
            }
            out.push(c);
        }
        let lat = rng.normal(n, 1.0);
        let v = rng.normal(n, 1.0);
        let (ld, vd) = (rig.f32(&lat)?, rig.f32(&v)?);
        k.euler_update(s, ld.ptr(), vd.ptr(), -0.0625, n)?;
        let r: Vec<f32> = (0..n).map(|i| lat[i] - 0.0625 * v[i]).collect();
        out.push(Check::new(
            "euler_update",
            &rig.read_f32(ld.ptr(), n)?,
            &r,
            1e-6,
        ));
    }
    Ok(())
}

/// cuBLASLt GEMMs of the forward's shapes, fused epilogues against the
/// reference and against the unfused kernel path.
pub fn check_gemms(rig: &Rig, rng: &mut Rng, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (g, k, s) = (&rig.gemm, &rig.kernels, &rig.gpu.compute);
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
        let mut r = hr::linear(
            &x,
            m,
            kk,
            &w,
            n,
            if ep == Epilogue::None { None } else { Some(&b) },
        );
        if ep == Epilogue::BiasGelu {
            r.iter_mut().for_each(|v| *v = hr::gelu_tanh(*v));
        }
        out.push(Check::new(
            format!("gemm m={m} n={n} k={kk} {ep:?}"),
            &y,
            &r,
            1e-2,
        ));
        if ep == Epilogue::BiasGelu {
            // The unfused path the forward can fall back to.
            let zd = rig.poisoned(m * n * 2)?;
            g.linear(
                s,
                xd.ptr(),
                wd.ptr(),
                NULL,
                zd.ptr(),
                m,
                n,
                kk,
                Epilogue::None,
            )?;
            k.bias_act(s, zd.ptr(), bd.ptr(), n, m * n, true)?;
            let z = rig.read_bf16(zd.ptr(), m * n)?;
            out.push(Check::new(
                format!("gemm+bias_act m={m} n={n} k={kk} (unfused GELU)"),
                &z,
                &r,
                1e-2,
            ));
        }
    }
    let note = format!("{} cached plans", g.cached_plans());
    if let Some(c) = out.last_mut() {
        c.note = note;
    }
    Ok(())
}

/// Attention kernels: self (no bias) and cross (text mask bias), sequence
/// lengths that are not multiples of the 64-row tiles.
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
            let mask: Vec<f32> = (0..nk)
                .map(|j| if j < nk * 3 / 4 { 1.0 } else { 0.0 })
                .collect();
            let bias: Vec<f32> = mask.iter().map(|m| (1.0 - m) * MASK_BIAS).collect();
            let r = hr::attention(
                &q,
                &kx,
                &v,
                nq,
                nk,
                heads,
                hd,
                if masked { Some(&bias) } else { None },
            );
            let (qd, kd, vd, bd) = (
                rig.bf16(&q)?,
                rig.bf16(&kx)?,
                rig.bf16(&v)?,
                rig.f32(&bias)?,
            );
            let kinds: &[AttnKernel] = if hd == 16 {
                &[AttnKernel::Reference]
            } else {
                &[
                    AttnKernel::Reference,
                    AttnKernel::Flash,
                    AttnKernel::FlashLdsm,
                    AttnKernel::Flash2W4,
                    AttnKernel::Flash2W8,
                ]
            };
            for kind in kinds {
                let od = rig.poisoned(nq * d * 2)?;
                rig.kernels.attention(
                    &rig.gpu.compute,
                    *kind,
                    heads,
                    hd,
                    (qd.ptr(), d),
                    (kd.ptr(), d),
                    (vd.ptr(), d),
                    (od.ptr(), d),
                    nq,
                    nk,
                    if masked { bd.ptr() } else { NULL },
                    1.0 / (hd as f32).sqrt(),
                )?;
                let o = rig.read_bf16(od.ptr(), nq * d)?;
                let tol = if *kind == AttnKernel::Reference {
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

/// Stage the synthetic weights of `dims` through both arms: every tensor must
/// be byte-identical to the file and between the arms.
pub fn check_staging(
    rig: &Rig,
    file: &Path,
    out: &mut Vec<Check>,
) -> Result<DeviceWeights, CudaError> {
    let raw = std::fs::read(file).map_err(|source| CudaError::Io {
        path: file.to_path_buf(),
        source,
    })?;
    let (tensors, _) = staging::read_header(file)?;
    let (serial, rs) =
        staging::stage_file(&rig.gpu, file, &StagingOptions::new(StagingArm::Serial))?;
    let mut bo = StagingOptions::new(StagingArm::Batched);
    bo.reader = staging::Reader::PinnedRing;
    bo.chunk_bytes = 1 << 20; // many chunks: tensors straddle buffer boundaries
    let (batched, rb_) = staging::stage_file(&rig.gpu, file, &bo)?;
    let mut ro = StagingOptions::new(StagingArm::Batched);
    ro.reader = staging::Reader::Registered;
    let (registered, _) = staging::stage_file(&rig.gpu, file, &ro)?;
    let mut differ = 0usize;
    for t in &tensors {
        let want = &raw[t.offset as usize..][..t.bytes];
        let a = serial.download(&rig.gpu, &t.name)?;
        let b = batched.download(&rig.gpu, &t.name)?;
        let c = registered.download(&rig.gpu, &t.name)?;
        if a != want || b != want || c != want {
            differ += 1;
        }
    }
    out.push(Check {
        name: format!(
            "staging serial vs batched vs file ({} tensors)",
            tensors.len()
        ),
        rel: differ as f64,
        max_abs: 0.0,
        tol: 0.0,
        pass: differ == 0 && !tensors.is_empty(),
        note: format!(
            "{differ} differ; serial {} copies, batched {} copies in 1 arena; {:.1} MB",
            rs.copies,
            rb_.copies,
            rs.bytes as f64 / 1e6
        ),
    });
    Ok(batched)
}

/// One device forward of `dims` on staged weights against the host reference.
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
    kinds: &[AttnKernel],
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
    let t0 = Instant::now();
    let hw = synth_host_weights(&dims.tensor_specs(), seed);
    let r = hr::dit_forward(&hw, &dims, &lat, sigma, &text, &mask, grid, fps);
    let host_s = t0.elapsed().as_secs_f64();
    // The CPU arm itself (the models transformer) on the same weights.
    let cpu = cpu_arm_forward(&dims, hw, &lat, sigma, &text, &mask, grid, fps)?;
    let mut dit = DeviceDit::new(
        rig.gpu.clone(),
        rig.kernels.clone(),
        rig.gemm.clone(),
        dims,
        weights,
    )?;
    let mut runs: Vec<(AttnKernel, bool)> = kinds.iter().map(|k| (*k, true)).collect();
    runs.push((kinds[0], false)); // the unfused row path too
    for (kind, fused) in &runs {
        dit.attn = *kind;
        dit.fused_rows = *fused;
        dit.workspace(n, l)?.poison(&rig.gpu)?;
        dit.set_latents(&lat)?;
        dit.set_text(&text, &mask)?;
        dit.enqueue_forward(sigma, Geometry { grid, fps }, true)?;
        let ms = dit.last_device_ms()?;
        let (_, outp) = dit
            .io_ptrs()
            .ok_or_else(|| CudaError::Invalid("no workspace".into()))?;
        let v = rig.read_f32(outp, n * LATENT_CHANNELS)?;
        let mut c = Check::new(
            format!(
                "forward {label} attn={}{} grid={grid:?} l={l}",
                kind.name(),
                if *fused { "" } else { " unfused-rows" }
            ),
            &v,
            &r,
            2e-2,
        );
        c.note = format!("device {ms:.2} ms, host ref {host_s:.1} s");
        out.push(c);
        if *kind == kinds[0] && *fused {
            out.push(Check::new(
                format!(
                    "forward {label} attn={} vs the CPU arm (models::Transformer)",
                    kind.name()
                ),
                &v,
                &cpu,
                2e-2,
            ));
        }
    }
    let mut c = Check::new(
        format!("host reference vs the CPU arm, {label} (f32 both)"),
        &r,
        &cpu,
        1e-4,
    );
    c.note = "the device checks' reference computes the CPU arm's function".into();
    out.push(c);
    Ok(())
}

/// The DiT config of `dims` (the released architecture with these sizes).
pub fn dims_config(dims: &DitDims) -> crate::models::dit::DitConfig {
    let mut c = crate::presets::dit_2b();
    c.num_layers = dims.layers;
    c.num_attention_heads = dims.heads;
    c.attention_head_dim = dims.head_dim;
    c.cross_attention_dim = dims.dim();
    c.caption_channels = dims.caption_channels;
    c
}

/// The CPU arm's forward (models::Transformer, f32) on host weights.
#[allow(clippy::too_many_arguments)]
fn cpu_arm_forward(
    dims: &DitDims,
    hw: hr::HostWeights,
    lat: &[f32],
    sigma: f32,
    text: &[f32],
    mask: &[f32],
    grid: (usize, usize, usize),
    fps: f32,
) -> Result<Vec<f32>, CudaError> {
    use crate::tensor::Tensor;
    use crate::weights::{MapSource, VarBuilder};
    let bad = |e: String| CudaError::Invalid(format!("CPU arm: {e}"));
    let mut src = MapSource::new();
    for spec in dims.tensor_specs() {
        let v = hw
            .get(&spec.name)
            .cloned()
            .ok_or_else(|| bad(format!("no host tensor {}", spec.name)))?;
        src.insert(
            spec.name.clone(),
            Tensor::new(&spec.shape, v).map_err(|e| bad(e.to_string()))?,
        );
    }
    drop(hw);
    let model = crate::models::dit::Transformer::load(&VarBuilder::new(&src), &dims_config(dims))
        .map_err(|e| bad(e.to_string()))?;
    drop(src);
    let n = grid.0 * grid.1 * grid.2;
    let lt = Tensor::new(&[n, LATENT_CHANNELS], lat.to_vec()).map_err(|e| bad(e.to_string()))?;
    let tt = Tensor::new(&[mask.len(), dims.caption_channels], text.to_vec())
        .map_err(|e| bad(e.to_string()))?;
    let v = model
        .forward(&lt, sigma, &tt, mask, grid, fps)
        .map_err(|e| bad(e.to_string()))?;
    Ok(v.into_data())
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// Scratch directory for weight files (must be durable and large enough:
    /// a few GB with `bench`).
    pub scratch: PathBuf,
    /// Run the benchmarks after the checks.
    pub bench: bool,
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
    // 1. Staging first: the tiny model's weights through both arms.
    let tiny = DitDims::from_config(&crate::presets::dit_tiny())?;
    let tiny_file = opts.scratch.join("tiny-dit.safetensors");
    write_synth_safetensors(&tiny_file, &tiny.tensor_specs(), 11)?;
    let tiny_w = Arc::new(check_staging(&rig, &tiny_file, &mut checks)?);
    report(&checks, 0);
    let mut from = checks.len();
    // 2. Kernels, GEMMs, attention.
    check_kernels(&rig, &mut rng, &mut checks)?;
    check_gemms(&rig, &mut rng, &mut checks)?;
    check_attention(&rig, &mut rng, &mut checks)?;
    report(&checks, from);
    from = checks.len();
    // 3. Whole forwards: tiny (2 blocks), one ltxv-2b block, one ltxv-13b block.
    check_forward(
        &rig,
        &mut rng,
        "tiny",
        tiny,
        tiny_w,
        11,
        (2, 2, 3),
        32,
        &[AttnKernel::Reference],
        &mut checks,
    )?;
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
            &rig,
            &mut rng,
            label,
            dims,
            Arc::new(w),
            seed,
            (3, 8, 12),
            128,
            &[
                AttnKernel::Flash2W4,
                AttnKernel::Flash2W8,
                AttnKernel::FlashLdsm,
                AttnKernel::Reference,
            ],
            &mut checks,
        )?;
        let _ = std::fs::remove_file(&f);
    }
    report(&checks, from);
    let bench_rows = if opts.bench {
        super::bench::run(&rig, &opts.scratch)?
    } else {
        Vec::new()
    };
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
    for c in &checks {
        println!("{}", c.row());
    }
    println!("{passed} passed, {} failed", checks.len() - passed);
    for r in &bench_rows {
        println!("{r}");
    }
    Ok(passed == checks.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::DType;

    #[test]
    fn synth_values_are_deterministic_scaled_and_not_constant() {
        let s = TensorSpec::new("a.to_q.weight", &[64, 256], DType::BF16);
        let a = hr::widen(&synth_tensor(&s, 1));
        assert_eq!(a, hr::widen(&synth_tensor(&s, 1)));
        assert_ne!(a, hr::widen(&synth_tensor(&s, 2)));
        let bound = 1.0 / 16.0 * 1.01;
        assert!(a.iter().all(|v| v.abs() <= bound));
        let mean_abs = a.iter().map(|v| v.abs()).sum::<f32>() / a.len() as f32;
        assert!((mean_abs - 1.0 / 32.0).abs() < 0.003, "{mean_abs}");
        let n = TensorSpec::new("a.norm_q.weight", &[64], DType::BF16);
        assert!(hr::widen(&synth_tensor(&n, 1))
            .iter()
            .all(|v| (0.79..=1.21).contains(v)));
    }

    #[test]
    fn synth_file_reads_back_through_the_staging_header() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch")
            .join(format!("synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dims = DitDims::from_config(&crate::presets::dit_tiny()).unwrap();
        let specs = dims.tensor_specs();
        let p = dir.join("t.safetensors");
        let bytes = write_synth_safetensors(&p, &specs, 5).unwrap();
        assert_eq!(bytes, std::fs::metadata(&p).unwrap().len());
        let (t, _) = staging::read_header(&p).unwrap();
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
    fn dims_config_round_trips() {
        for d in [
            DitDims::LTXV_2B,
            DitDims::LTXV_13B.with_layers(1),
            DitDims::from_config(&crate::presets::dit_tiny()).unwrap(),
        ] {
            assert_eq!(DitDims::from_config(&dims_config(&d)).unwrap(), d);
        }
    }

    #[test]
    fn a_check_fails_on_nan_and_on_all_zero_references() {
        assert!(!Check::new("x", &[f32::NAN, 1.0], &[1.0, 1.0], 1.0).pass);
        assert!(!Check::new("x", &[0.0, 0.0], &[0.0, 0.0], 1.0).pass);
        assert!(Check::new("x", &[1.0, 2.0], &[1.0, 2.0], 0.0).pass);
        assert!(!Check::new("x", &[1.1, 2.0], &[1.0, 2.0], 1e-3).pass);
    }
}
