//! LTX-Video's rotary position embedding (interleaved pairs, fp32).
//!
//! Each token's latent position `(f, h, w)` is scaled to pixel-ish units
//! `(f * 8 / fps, h * 32, w * 32)` (the VAE compressions; patch 1) and divided
//! by the base extents `(20, 2048, 2048)`, giving fractions `c`. With
//! `n = dim / 6` frequencies `freq_i = 10000^(i / (n - 1)) * pi / 2`, the angle
//! of frequency `i` on axis `a` is `freq_i * (2 c_a - 1)`; slots are ordered
//! frequency-major, axis-minor, each angle filling a `(x0, x1)` pair, after
//! `dim mod 6` leading padding slots (cos 1, sin 0). A pair `(a, b)` becomes
//! `(a cos - b sin, b cos + a sin)`.

/// Per-token cosines and sines, `[tokens, dim]` each, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTables {
    /// Cosines.
    pub cos: Vec<f32>,
    /// Sines.
    pub sin: Vec<f32>,
    /// Width of a row.
    pub dim: usize,
}

/// The base extents RoPE divides positions by: frames, height, width.
pub const ROPE_BASE: (f32, f32, f32) = (20.0, 2048.0, 2048.0);
/// RoPE's theta.
pub const ROPE_THETA: f32 = 10000.0;

/// The tables for a latent grid `(f, h, w)` in raster order (`f` slowest),
/// for a video at `fps` frames per second decoded with `temporal` x `spatial`
/// compression, at width `dim`.
pub fn ltx_rope(
    grid: (usize, usize, usize),
    fps: f32,
    temporal: usize,
    spatial: usize,
    dim: usize,
) -> RopeTables {
    let (nf, nh, nw) = grid;
    let pad = dim % 6;
    let freqs = rope_freqs(dim);
    let s_t = (temporal as f64 / fps as f64) as f32;
    let s_s = spatial as f32;
    let tokens = nf * nh * nw;
    let mut cos = vec![0.0f32; tokens * dim];
    let mut sin = vec![0.0f32; tokens * dim];
    for f in 0..nf {
        for y in 0..nh {
            for x in 0..nw {
                let tok = (f * nh + y) * nw + x;
                let frac = [
                    f as f32 * s_t / ROPE_BASE.0,
                    y as f32 * s_s / ROPE_BASE.1,
                    x as f32 * s_s / ROPE_BASE.2,
                ];
                let (c, s) = (
                    &mut cos[tok * dim..(tok + 1) * dim],
                    &mut sin[tok * dim..(tok + 1) * dim],
                );
                c[..pad].iter_mut().for_each(|v| *v = 1.0);
                for (i, fr) in freqs.iter().enumerate() {
                    for (a, fa) in frac.iter().enumerate() {
                        let angle = fr * (fa * 2.0 - 1.0);
                        let slot = pad + (i * 3 + a) * 2;
                        let (cv, sv) = (angle.cos(), angle.sin());
                        c[slot] = cv;
                        c[slot + 1] = cv;
                        s[slot] = sv;
                        s[slot + 1] = sv;
                    }
                }
            }
        }
    }
    RopeTables { cos, sin, dim }
}

/// The `dim / 6` frequency factors `theta^linspace(0, 1, dim / 6) * pi / 2`,
/// in f32 as the reference computes them: torch.linspace(0, 1, n) as its CPU
/// kernel does it (`start + step * i` below the halfway index, `end - step *
/// (n - 1 - i)` from there on, each a fused multiply-add: torch's vectorised CPU
/// builds contract them; for n = 10 the unfused form lands on a rounding tie at
/// i = 6 and moves that frequency by 2.6e-4), then `theta ** x` and `* pi / 2`
/// (two f32 ops). The device arm's RoPE kernel reads this same table.
pub fn rope_freqs(dim: usize) -> Vec<f32> {
    let n = dim / 6;
    (0..n)
        .map(|i| {
            let x = if n <= 1 {
                0.0
            } else {
                let step = 1.0f32 / (n - 1) as f32;
                if i < n / 2 {
                    step.mul_add(i as f32, 0.0)
                } else {
                    (-step).mul_add((n - 1 - i) as f32, 1.0)
                }
            };
            ROPE_THETA.powf(x) * std::f32::consts::PI / 2.0
        })
        .collect()
}

/// Rotates every row of `x` (`[tokens, dim]`) in place by the tables.
///
/// # Panics
/// If `x` does not hold as many rows as the tables (a bug in the caller).
pub fn apply_rope(x: &mut [f32], t: &RopeTables) {
    assert_eq!(
        x.len(),
        t.cos.len(),
        "apply_rope: {} values for tables of {}",
        x.len(),
        t.cos.len()
    );
    for ((pair, c), s) in x
        .chunks_exact_mut(2)
        .zip(t.cos.chunks_exact(2))
        .zip(t.sin.chunks_exact(2))
    {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c[0] - b * s[0];
        pair[1] = b * c[1] + a * s[1];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_by_hand_with_padding() {
        // dim 8: one frequency (pi/2), 2 padding slots. Token (f=1, h=2, w=3) at 25 fps:
        // fractions (1*0.32/20, 2*32/2048, 3*32/2048) = (0.016, 0.03125, 0.046875),
        // angles pi/2 * (2c - 1) = (-1.5205308, -1.4726216, -1.4235342).
        let t = ltx_rope((2, 3, 4), 25.0, 8, 32, 8);
        assert_eq!(t.cos.len(), 24 * 8);
        let tok = (3 + 2) * 4 + 3;
        let c = &t.cos[tok * 8..tok * 8 + 8];
        let s = &t.sin[tok * 8..tok * 8 + 8];
        let wc = [
            1.0,
            1.0,
            0.050_244_32,
            0.050_244_32,
            0.098_017_14,
            0.098_017_14,
            0.146_730_47,
            0.146_730_47,
        ];
        let ws = [
            0.0,
            0.0,
            -0.998_737,
            -0.998_737,
            -0.995_184_7,
            -0.995_184_7,
            -0.989_176_5,
            -0.989_176_5,
        ];
        for i in 0..8 {
            assert!(
                (c[i] - wc[i]).abs() < 2e-6 && (s[i] - ws[i]).abs() < 2e-6,
                "{i}: {c:?} {s:?}"
            );
        }
        // Token 0 sits at fraction 0 on every axis: angle -pi/2.
        assert!((t.cos[2] - 0.0).abs() < 1e-6 && (t.sin[2] + 1.0).abs() < 1e-6);
    }

    #[test]
    fn frequencies_span_one_to_theta_frequency_major() {
        // dim 12: frequencies pi/2 * (1, 10000), no padding; slot order
        // (f0, h0, w0, f1, h1, w1), each twice. Token (0, 0, 1) at w fraction 1/64.
        let t = ltx_rope((1, 1, 2), 25.0, 8, 32, 12);
        let row = &t.sin[12..24];
        let a_w0 = std::f64::consts::FRAC_PI_2 * (2.0 / 64.0 - 1.0);
        let a_w1 = 10000.0 * std::f64::consts::FRAC_PI_2 * (2.0 / 64.0 - 1.0);
        assert!((row[4] as f64 - a_w0.sin()).abs() < 1e-6);
        assert!((row[5] as f64 - a_w0.sin()).abs() < 1e-6);
        // The high frequency's angle is ~-15217; f32 rounding of it moves the sine by ~1e-3.
        assert!(
            (row[10] as f64 - a_w1.sin()).abs() < 5e-3,
            "{} vs {}",
            row[10],
            a_w1.sin()
        );
        assert!(
            (row[0] as f64 + 1.0).abs() < 1e-6,
            "f axis at fraction 0 -> sin(-pi/2)"
        );
    }

    #[test]
    fn freqs_span_pi_half_to_theta_pi_half() {
        let f = rope_freqs(2048);
        assert_eq!(f.len(), 341);
        assert!((f[0] - std::f32::consts::FRAC_PI_2).abs() < 1e-6);
        assert!((f[340] / (ROPE_THETA * std::f32::consts::FRAC_PI_2) - 1.0).abs() < 1e-6);
        assert!(f.windows(2).all(|w| w[1] > w[0]));
        assert!(rope_freqs(5).is_empty());
        assert_eq!(rope_freqs(6), vec![std::f32::consts::FRAC_PI_2]);
    }

    #[test]
    fn apply_rotates_pairs_and_leaves_padding() {
        let t = RopeTables {
            cos: vec![1.0, 1.0, 0.6, 0.6],
            sin: vec![0.0, 0.0, 0.8, 0.8],
            dim: 4,
        };
        let mut x = vec![5.0, 7.0, 1.0, 2.0];
        apply_rope(&mut x, &t);
        // (1, 2) -> (1*0.6 - 2*0.8, 2*0.6 + 1*0.8) = (-1, 2).
        let want = [5.0, 7.0, -1.0, 2.0];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{x:?}");
        }
    }
}
