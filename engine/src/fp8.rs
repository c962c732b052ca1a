//! FP8 (e4m3) row-scaled quantization: the host's definition of what the CUDA
//! arm's `precision = fp8` computes, against which its quantize kernel and its
//! FP8 GEMMs are checked.
//!
//! A matrix of `rows × cols` becomes one e4m3 code per element and one f32
//! scale per row: `scale = amax / 448`, `code = e4m3(x · (448 / amax))` with
//! round-to-nearest-even and saturation to ±448 (NVIDIA's `__NV_SATFINITE`,
//! which the `float8` crate ports and `cvt.rn.satfinite.e4m3x2.f32` computes on
//! the device), so that `x ≈ decode(code) · scale`. A row whose amax is zero or
//! not finite keeps scale 1 (codes of the raw values), so nothing divides by
//! zero and no scale is infinite.
//!
//! Why rows on both sides: a Linear's weight `[out, in]` is scaled per output
//! channel (a row of the weight) at staging, and its input `[tokens, in]` per
//! token (a row of the activations) on the fly. Both scales then sit outside
//! the sum over `in`, so the product is `y[t, o] = s_x[t] · s_w[o] · Σ_i
//! q_x[t, i] · q_w[o, i]`: cuBLASLt's outer-vector scaling on Hopper applies
//! them in the GEMM itself. Per-tensor scales would let one outlier token (the
//! DiT's modulated norms differ by orders of magnitude between tokens) push
//! every other token's values into e4m3's subnormals.

use float8::F8E4M3;
use rayon::prelude::*;

/// The largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The e4m3 code of `x`: round to nearest even, saturate to ±448, NaN to NaN.
pub fn encode(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// The value of e4m3 code `c` (exact in f32).
pub fn decode(c: u8) -> f32 {
    F8E4M3::from_bits(c).to_f32()
}

/// `(inv, scale)` of a row whose largest magnitude is `amax`: values are
/// multiplied by `inv = 448 / amax` before encoding and decoded values by
/// `scale = amax / 448`; `(1, 1)` when amax is zero or not finite.
pub fn row_factors(amax: f32) -> (f32, f32) {
    if amax > 0.0 && amax.is_finite() {
        (E4M3_MAX / amax, amax / E4M3_MAX)
    } else {
        (1.0, 1.0)
    }
}

/// A matrix quantized row by row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowScaled {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns (elements per row).
    pub cols: usize,
    /// e4m3 codes, row-major `[rows, cols]`.
    pub codes: Vec<u8>,
    /// One scale per row: row `r`'s values are `decode(code) · scales[r]`.
    pub scales: Vec<f32>,
}

/// A matrix whose length is not `rows × cols`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a matrix of {rows} x {cols} needs {} values, got {len}", rows * cols)]
pub struct ShapeError {
    /// Rows asked for.
    pub rows: usize,
    /// Columns asked for.
    pub cols: usize,
    /// Values given.
    pub len: usize,
}

impl RowScaled {
    /// Quantize `x` (row-major `[rows, cols]`) row by row.
    pub fn quantize(x: &[f32], rows: usize, cols: usize) -> Result<RowScaled, ShapeError> {
        if x.len() != rows * cols {
            return Err(ShapeError {
                rows,
                cols,
                len: x.len(),
            });
        }
        let mut codes = vec![0u8; rows * cols];
        let mut scales = vec![0f32; rows];
        if cols > 0 {
            codes
                .par_chunks_mut(cols)
                .zip(scales.par_iter_mut())
                .zip(x.par_chunks(cols))
                .for_each(|((q, s), row)| {
                    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let (inv, scale) = row_factors(amax);
                    *s = scale;
                    for (c, v) in q.iter_mut().zip(row) {
                        *c = encode(v * inv);
                    }
                });
        } else {
            scales.fill(1.0);
        }
        Ok(RowScaled {
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// The values the codes and scales stand for, row-major `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.codes.len());
        for (r, &s) in self.scales.iter().enumerate() {
            let row = &self.codes[r * self.cols..(r + 1) * self.cols];
            out.extend(row.iter().map(|&c| decode(c) * s));
        }
        out
    }
}

/// The FP8 Linear as exact arithmetic: `y[t, o] = s_x[t] · s_w[o] · Σ_i
/// decode(q_x[t, i]) · decode(q_w[o, i]) + bias[o]`, the sum in f64 (each
/// product of two e4m3 values is exact), row-major `[x.rows, w.rows]`. What a
/// device FP8 GEMM is checked against: it may differ only by its accumulation
/// order and precision and by the rounding of its output.
pub fn linear_reference(
    x: &RowScaled,
    w: &RowScaled,
    bias: Option<&[f32]>,
) -> Result<Vec<f64>, ShapeError> {
    if x.cols != w.cols {
        return Err(ShapeError {
            rows: w.rows,
            cols: x.cols,
            len: w.codes.len(),
        });
    }
    if let Some(b) = bias {
        if b.len() != w.rows {
            return Err(ShapeError {
                rows: 1,
                cols: w.rows,
                len: b.len(),
            });
        }
    }
    let table: Vec<f64> = (0..=255u8).map(|c| decode(c) as f64).collect();
    let k = x.cols;
    let mut y = vec![0f64; x.rows * w.rows];
    y.par_chunks_mut(w.rows.max(1))
        .enumerate()
        .for_each(|(t, out)| {
            let xr = &x.codes[t * k..(t + 1) * k];
            for (o, yo) in out.iter_mut().enumerate() {
                let wr = &w.codes[o * k..(o + 1) * k];
                let dot: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| table[a as usize] * table[b as usize])
                    .sum();
                *yo = dot * x.scales[t] as f64 * w.scales[o] as f64
                    + bias.map_or(0.0, |b| b[o] as f64);
            }
        });
    Ok(y)
}

/// Headroom of the attention output's e4m3 scale over its bound (see
/// [`AttentionScales`]).
pub const ATTENTION_OUTPUT_MARGIN: f32 = 1.125;

/// The per-tensor scales of an FP8 attention (lever `attention-precision`):
/// cuDNN's FP8 SDPA takes one scale per q, k and v, not per row.
///
/// Why per tensor is enough here, where [`RowScaled`] argues rows for the
/// Linears: q and k leave the blocks' RMS norm (over the whole width, then a
/// learned weight and RoPE), and v is the projection of a modulated RMS norm,
/// so no token carries the residual stream's orders-of-magnitude outliers; a
/// value 2^-6 / 448 (3.5e-5) of its tensor's amax still has e4m3's full 3-bit
/// mantissa.
///
/// The probabilities are scaled by 448 (`scale_s`): they lie in \[0, 1\]. The
/// output is `o = Σ_j p_j v_j` with `Σ p = 1` (each p rounded to e4m3, so the sum
/// stays within 1 ± 2^-4), hence `|o| <= (1 + 2^-4) · amax(v)`; its scale is
/// `448 / (ATTENTION_OUTPUT_MARGIN · amax(v))`, chosen before the attention runs
/// (cuDNN's output is e4m3 on Hopper), and its codes times `descale_o` feed the
/// out-projection's FP8 GEMM as they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionScales {
    /// Multiply q by `inv.0`, k by `inv.1`, v by `inv.2` before encoding.
    pub inv: (f32, f32, f32),
    /// Decoded q, k, v values times these are the values: `amax / 448` each
    /// (1 where an amax is zero or not finite, as [`row_factors`]).
    pub descale: (f32, f32, f32),
    /// The probabilities' scale (448) and its inverse.
    pub scale_s: f32,
    /// The inverse of [`AttentionScales::scale_s`].
    pub descale_s: f32,
    /// The output's scale: cuDNN multiplies o by it before encoding.
    pub scale_o: f32,
    /// `1 / scale_o`: the output codes' row scale in the out-projection.
    pub descale_o: f32,
}

impl AttentionScales {
    /// The scales of q, k and v whose largest magnitudes are `amax` (q, k, v).
    pub fn from_amax(amax: (f32, f32, f32)) -> AttentionScales {
        let (q, k, v) = (
            row_factors(amax.0),
            row_factors(amax.1),
            row_factors(amax.2),
        );
        let scale_o = if amax.2 > 0.0 && amax.2.is_finite() {
            E4M3_MAX / (ATTENTION_OUTPUT_MARGIN * amax.2)
        } else {
            1.0
        };
        AttentionScales {
            inv: (q.0, k.0, v.0),
            descale: (q.1, k.1, v.1),
            scale_s: E4M3_MAX,
            descale_s: 1.0 / E4M3_MAX,
            scale_o,
            descale_o: 1.0 / scale_o,
        }
    }
}

/// The largest magnitude of `x` (NaN ignored, as `f32::max` does).
pub fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// The e4m3 codes of `x · inv` (one scale for the whole tensor).
pub fn encode_scaled(x: &[f32], inv: f32) -> Vec<u8> {
    x.par_iter().map(|v| encode(v * inv)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Gaussian;

    /// Every e4m3 value by the format's own definition (sign, 4 exponent bits of
    /// bias 7, 3 mantissa bits, subnormals at exponent 0, only S.1111.111 NaN):
    /// written here independently of the crate that encodes.
    fn by_definition(c: u8) -> f32 {
        let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((c >> 3) & 0xF) as i32;
        let m = (c & 7) as f32;
        if e == 15 && c & 7 == 7 {
            return f32::NAN;
        }
        if e == 0 {
            sign * m / 8.0 * 2f32.powi(-6)
        } else {
            sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
        }
    }

    /// Red on: the output scale taken from q's or k's amax, the margin dropped
    /// (an output at the bound would then saturate), or a zero amax dividing.
    #[test]
    fn attention_scales_bound_the_output_and_survive_a_zero_tensor() {
        let s = AttentionScales::from_amax((2.0, 8.0, 3.5));
        assert_eq!(s.inv, (224.0, 56.0, 128.0));
        assert_eq!(s.descale, (2.0 / 448.0, 8.0 / 448.0, 3.5 / 448.0));
        assert_eq!((s.scale_s, s.descale_s), (448.0, 1.0 / 448.0));
        // The largest output the bound allows, (1 + 2^-4) · amax(v), encodes
        // below 448: it does not saturate.
        let o = (1.0 + 1.0 / 16.0) * 3.5 * s.scale_o;
        assert!(o < 448.0 && o > 400.0, "{o}");
        assert!((s.scale_o * s.descale_o - 1.0).abs() < 1e-6);
        let z = AttentionScales::from_amax((0.0, f32::INFINITY, 0.0));
        assert_eq!((z.inv, z.descale), ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)));
        assert_eq!((z.scale_o, z.descale_o), (1.0, 1.0));
        assert_eq!(amax(&[0.5, -3.0, f32::NAN, 2.0]), 3.0);
        assert_eq!(
            encode_scaled(&[1.0, -0.5], 448.0),
            vec![encode(448.0), encode(-224.0)]
        );
    }

    #[test]
    fn every_code_decodes_to_the_formats_value_and_encodes_back() {
        for c in 0..=255u8 {
            let v = by_definition(c);
            if v.is_nan() {
                assert!(decode(c).is_nan(), "code {c:#04x}");
                continue;
            }
            assert_eq!(decode(c), v, "code {c:#04x}");
            // -0 encodes to 0x80, +0 to 0x00: every finite code round-trips.
            assert_eq!(encode(v), c, "value {v}");
        }
        assert_eq!(decode(0x7E), E4M3_MAX);
    }

    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        // Between 1 (0x38) and 1.125 (0x39): the midpoint goes to the even code.
        assert_eq!(encode(1.0625), 0x38);
        assert_eq!(encode(1.0625f32.next_up()), 0x39);
        // Between 1.125 (0x39) and 1.25 (0x3A): the midpoint goes up, to even.
        assert_eq!(encode(1.1875), 0x3A);
        // Subnormals: 2^-9 is the smallest; half of it ties to zero.
        assert_eq!(encode(2f32.powi(-9)), 0x01);
        assert_eq!(encode(2f32.powi(-10)), 0x00);
        assert_eq!(encode(2f32.powi(-10).next_up()), 0x01);
        // Past the largest finite value: saturate, never NaN.
        assert_eq!(encode(464.0), 0x7E);
        assert_eq!(encode(1e30), 0x7E);
        assert_eq!(encode(f32::INFINITY), 0x7E);
        assert_eq!(encode(-1e30), 0xFE);
        assert!(decode(encode(f32::NAN)).is_nan());
    }

    #[test]
    fn a_row_quantizes_to_within_half_a_step_of_its_values() {
        let (rows, cols) = (5, 96);
        let mut x = Gaussian::new(7, "fp8 rows").vec(rows * cols);
        // Rows of very different magnitude, and a zero row.
        for (r, s) in [(1usize, 1e-4f32), (2, 3e3), (3, 0.0)] {
            for v in &mut x[r * cols..(r + 1) * cols] {
                *v *= s;
            }
        }
        let q = RowScaled::quantize(&x, rows, cols).unwrap();
        let back = q.dequantize();
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 {
                assert_eq!(q.scales[r], 1.0);
                assert!(back[r * cols..(r + 1) * cols].iter().all(|&v| v == 0.0));
                continue;
            }
            // The row's largest value maps onto 448 exactly (up to the rounding
            // of x · inv), so the scale is amax / 448.
            assert_eq!(q.scales[r], amax / E4M3_MAX);
            let codes = &q.codes[r * cols..(r + 1) * cols];
            assert!(
                codes.iter().any(|&c| c & 0x7F == 0x7E),
                "row {r} never reaches 448"
            );
            for (i, (&v, &b)) in row.iter().zip(&back[r * cols..]).enumerate() {
                // Half a step of 3 mantissa bits (2^-4 relative) for normals; an
                // absolute half subnormal step (2^-10 · scale) below 2^-6 · scale.
                let tol = (v.abs() / 16.0).max(2f32.powi(-10) * q.scales[r]) * 1.0001;
                assert!(
                    (v - b).abs() <= tol,
                    "row {r} col {i}: {v} came back as {b}"
                );
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        assert_eq!(
            RowScaled::quantize(&[1.0; 5], 2, 3),
            Err(ShapeError {
                rows: 2,
                cols: 3,
                len: 5
            })
        );
        let a = RowScaled::quantize(&[1.0; 6], 2, 3).unwrap();
        let b = RowScaled::quantize(&[1.0; 8], 2, 4).unwrap();
        assert!(linear_reference(&a, &b, None).is_err());
        assert!(linear_reference(&a, &a, Some(&[0.0; 3])).is_err());
    }

    #[test]
    fn the_reference_linear_is_the_product_of_the_dequantized_matrices() {
        let (m, n, k) = (7, 9, 64);
        let g = |name: &str, len: usize, s: f32| -> Vec<f32> {
            Gaussian::new(11, name)
                .vec(len)
                .iter()
                .map(|v| v * s)
                .collect()
        };
        let (x, w, b) = (g("x", m * k, 3.0), g("w", n * k, 0.02), g("b", n, 1.0));
        let (qx, qw) = (
            RowScaled::quantize(&x, m, k).unwrap(),
            RowScaled::quantize(&w, n, k).unwrap(),
        );
        let y = linear_reference(&qx, &qw, Some(&b)).unwrap();
        let (dx, dw) = (qx.dequantize(), qw.dequantize());
        let mut worst_vs_f32 = 0f64;
        for t in 0..m {
            for o in 0..n {
                let deq: f64 = (0..k)
                    .map(|i| dx[t * k + i] as f64 * dw[o * k + i] as f64)
                    .sum::<f64>()
                    + b[o] as f64;
                let y_to = y[t * n + o];
                // decode(c)·s is one f32 rounding per operand away from exact.
                assert!(
                    (y_to - deq).abs() <= 1e-5 * (1.0 + deq.abs()),
                    "{y_to} vs {deq}"
                );
                let full: f64 = (0..k)
                    .map(|i| x[t * k + i] as f64 * w[o * k + i] as f64)
                    .sum::<f64>()
                    + b[o] as f64;
                worst_vs_f32 = worst_vs_f32.max((y_to - full).abs());
            }
        }
        // And it is an approximation of the unquantized product, not that
        // product: e4m3 keeps 3 mantissa bits, so the two differ, but by less
        // than a few percent of the output's scale (|y| ~ 3 · 0.02 · √64 ≈ 0.5).
        assert!(
            worst_vs_f32 > 1e-4,
            "FP8 made no difference: {worst_vs_f32}"
        );
        assert!(worst_vs_f32 < 0.1, "FP8 error too large: {worst_vs_f32}");
    }
}
