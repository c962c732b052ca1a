//! Normalisations and adaptive modulation.
//!
//! Row forms work on token-major `[rows, d]` slices (transformer, T5); channel
//! forms on channel-first `[C, S]` planes where each of the `S` voxels is
//! normalised over its `C` channels (the VAE's per-pixel norms).

use rayon::prelude::*;

/// Rows above which the row-wise ops go parallel.
const PAR_ROWS: usize = 64;

/// RMS norm of every row of `x` (`[rows, d]`) in place:
/// `x / sqrt(mean(x^2) + eps)`, times `weight` when given. Values stay f32;
/// the sum of squares is accumulated in f64: a sequential f32 sum over a
/// 4096-wide row was the largest source of the host arm's drift from an f64
/// reference (twice the reference's own f32 drift at T5-XXL width, with it
/// 1.1x; `specs/fidelity.md`).
pub fn rms_norm_rows(x: &mut [f32], d: usize, weight: Option<&[f32]>, eps: f32) {
    let f = |row: &mut [f32]| {
        let ms = row.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / d as f64;
        let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
        match weight {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * r * w),
            None => row.iter_mut().for_each(|v| *v *= r),
        }
    };
    if x.len() / d.max(1) >= PAR_ROWS {
        x.par_chunks_mut(d).for_each(f);
    } else {
        x.chunks_mut(d).for_each(f);
    }
}

/// LayerNorm of every row of `x` (`[rows, d]`) in place: `(x - mean) /
/// sqrt(var + eps)` (biased variance), then `* weight + bias` when given.
pub fn layer_norm_rows(
    x: &mut [f32],
    d: usize,
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
) {
    let f = |row: &mut [f32]| {
        // Sums in f64, as in `rms_norm_rows`.
        let mean64 = row.iter().map(|v| *v as f64).sum::<f64>() / d as f64;
        let var = row
            .iter()
            .map(|v| (*v as f64 - mean64) * (*v as f64 - mean64))
            .sum::<f64>()
            / d as f64;
        let mean = mean64 as f32;
        let r = (1.0 / (var + eps as f64).sqrt()) as f32;
        for (i, v) in row.iter_mut().enumerate() {
            let mut y = (*v - mean) * r;
            if let Some(w) = weight {
                y *= w[i];
            }
            if let Some(b) = bias {
                y += b[i];
            }
            *v = y;
        }
    };
    if x.len() / d.max(1) >= PAR_ROWS {
        x.par_chunks_mut(d).for_each(f);
    } else {
        x.chunks_mut(d).for_each(f);
    }
}

/// Adaptive modulation of every row of `x` (`[rows, d]`) in place:
/// `x * (1 + scale) + shift` with per-channel `scale`, `shift` of length `d`.
pub fn modulate_rows(x: &mut [f32], scale: &[f32], shift: &[f32]) {
    let d = scale.len();
    x.chunks_mut(d).for_each(|row| {
        for ((v, s), t) in row.iter_mut().zip(scale).zip(shift) {
            *v = *v * (1.0 + s) + t;
        }
    });
}

/// Per-voxel RMS norm over channels of a channel-first `[c, s]` plane, in
/// place: each voxel's `c` values are divided by `sqrt(mean over c of x^2 + eps)`.
pub fn rms_norm_channels(x: &mut [f32], c: usize, eps: f32) {
    let s = x.len() / c.max(1);
    let mut ms = vec![0.0f32; s];
    for ch in 0..c {
        for (m, v) in ms.iter_mut().zip(&x[ch * s..(ch + 1) * s]) {
            *m += v * v;
        }
    }
    let r: Vec<f32> = ms
        .iter()
        .map(|m| 1.0 / (m / c as f32 + eps).sqrt())
        .collect();
    x.par_chunks_mut(s.max(1))
        .for_each(|plane| plane.iter_mut().zip(&r).for_each(|(v, r)| *v *= r));
}

/// Per-voxel LayerNorm over channels of a `[c, s]` plane with a per-channel
/// affine (`weight`, `bias` of length `c`), in place.
pub fn layer_norm_channels(x: &mut [f32], c: usize, eps: f32, weight: &[f32], bias: &[f32]) {
    let s = x.len() / c.max(1);
    let mut mean = vec![0.0f32; s];
    for ch in 0..c {
        mean.iter_mut()
            .zip(&x[ch * s..(ch + 1) * s])
            .for_each(|(m, v)| *m += v);
    }
    mean.iter_mut().for_each(|m| *m /= c as f32);
    let mut var = vec![0.0f32; s];
    for ch in 0..c {
        for ((q, v), m) in var.iter_mut().zip(&x[ch * s..(ch + 1) * s]).zip(&mean) {
            *q += (v - m) * (v - m);
        }
    }
    let r: Vec<f32> = var
        .iter()
        .map(|q| 1.0 / (q / c as f32 + eps).sqrt())
        .collect();
    x.par_chunks_mut(s.max(1))
        .enumerate()
        .for_each(|(ch, plane)| {
            for ((v, m), r) in plane.iter_mut().zip(&mean).zip(&r) {
                *v = (*v - m) * r * weight[ch] + bias[ch];
            }
        });
}

/// Per-channel modulation of a `[c, s]` plane in place:
/// `x[ch, :] * (1 + scale[ch]) + shift[ch]`.
pub fn modulate_channels(x: &mut [f32], scale: &[f32], shift: &[f32]) {
    let s = x.len() / scale.len().max(1);
    x.par_chunks_mut(s.max(1))
        .enumerate()
        .for_each(|(ch, plane)| {
            let (a, b) = (1.0 + scale[ch], shift[ch]);
            plane.iter_mut().for_each(|v| *v = *v * a + b);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn rms_norm_by_hand() {
        // Row [3, 4]: mean square 12.5, rms 3.5355339 -> [0.8485281, 1.1313709].
        let mut x = vec![3.0, 4.0, 1.0, -1.0];
        rms_norm_rows(&mut x, 2, None, 0.0);
        close(&x, &[0.848_528_1, 1.131_370_9, 1.0, -1.0], 1e-6);
        let mut x = vec![3.0, 4.0];
        rms_norm_rows(&mut x, 2, Some(&[2.0, -1.0]), 0.0);
        close(&x, &[1.697_056_3, -1.131_370_9], 1e-6);
        // eps matters on small rows: [0.001, 0] with eps 1e-6 -> 0.001 / sqrt(5e-7 + 1e-6).
        let mut x = vec![0.001, 0.0];
        rms_norm_rows(&mut x, 2, None, 1e-6);
        close(&x, &[0.816_496_6, 0.0], 1e-5);
    }

    #[test]
    fn layer_norm_by_hand() {
        // [1, 2, 3, 6]: mean 3, var (4+1+0+9)/4 = 3.5, std 1.8708287.
        let mut x = vec![1.0, 2.0, 3.0, 6.0];
        layer_norm_rows(&mut x, 4, 0.0, None, None);
        close(&x, &[-1.069_045, -0.534_522_5, 0.0, 1.603_567_5], 1e-6);
        let mut x = vec![1.0, 2.0, 3.0, 6.0];
        layer_norm_rows(
            &mut x,
            4,
            0.0,
            Some(&[1.0, 2.0, 1.0, 0.5]),
            Some(&[0.0, 1.0, 0.0, -1.0]),
        );
        close(&x, &[-1.069_045, -0.069_045, 0.0, -0.198_216_2], 1e-6);
    }

    #[test]
    fn modulation_by_hand() {
        let mut x = vec![1.0, 2.0, -1.0, 0.5];
        modulate_rows(&mut x, &[0.5, -1.0], &[1.0, 2.0]);
        assert_eq!(x, vec![2.5, 2.0, -0.5, 2.0]);
        // Channel-first: channel 0 = [1, -1], channel 1 = [2, 4].
        let mut x = vec![1.0, -1.0, 2.0, 4.0];
        modulate_channels(&mut x, &[1.0, -0.5], &[0.0, 1.0]);
        assert_eq!(x, vec![2.0, -2.0, 2.0, 3.0]);
    }

    #[test]
    fn channel_norms_equal_row_norms_of_the_transpose() {
        // [c=3, s=2]; voxel 0 = (1, 2, 2) rms sqrt(3); voxel 1 = (0, 3, -4).
        let mut x = vec![1.0, 0.0, 2.0, 3.0, 2.0, -4.0];
        rms_norm_channels(&mut x, 3, 0.0);
        let r3 = 3f32.sqrt();
        let r1 = (25.0f32 / 3.0).sqrt();
        close(
            &x,
            &[1.0 / r3, 0.0, 2.0 / r3, 3.0 / r1, 2.0 / r3, -4.0 / r1],
            1e-6,
        );
        // LayerNorm over channels with affine w = (1, 1, 2), b = (0, 0.5, 0):
        // voxel 0 = (1, 2, 3): mean 2, std sqrt(2/3) -> (-1.2247449, 0, 1.2247449);
        // voxel 1 = (4, 4, 4) is constant: eps keeps 0/0 away -> (0, 0, 0).
        let mut x = vec![1.0, 4.0, 2.0, 4.0, 3.0, 4.0];
        layer_norm_channels(&mut x, 3, 1e-6, &[1.0, 1.0, 2.0], &[0.0, 0.5, 0.0]);
        close(&x, &[-1.224_744_9, 0.0, 0.5, 0.5, 2.449_489_8, 0.0], 1e-5);
    }
}
