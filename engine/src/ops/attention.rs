//! Multi-head scaled dot-product attention with additive biases.

use rayon::prelude::*;

use crate::ops::linear::{gemm_serial, MatRef};

/// Query rows per parallel task.
const Q_BLOCK: usize = 64;

/// Additive terms on the attention logits.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnBias<'a> {
    /// One value per key, broadcast over heads and queries (a text mask as
    /// `(1 - mask) * -10000`). Length `nk`.
    pub per_key: Option<&'a [f32]>,
    /// One value per head, query and key (T5's relative position bias),
    /// `[heads, nq, nk]` row-major.
    pub per_head: Option<&'a [f32]>,
}

/// `softmax(scale * q k^T + bias) v` per head. `q` is `[nq, heads * hd]`, `k`
/// and `v` are `[nk, heads * hd]` (heads side by side in a row, head `h` in
/// columns `h*hd .. (h+1)*hd`); the result is `[nq, heads * hd]`.
///
/// # Panics
/// If lengths do not match the sizes given (a bug in the calling model).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    nq: usize,
    nk: usize,
    heads: usize,
    hd: usize,
    scale: f32,
    bias: AttnBias,
) -> Vec<f32> {
    let d = heads * hd;
    assert_eq!(q.len(), nq * d, "attention: q");
    assert_eq!(k.len(), nk * d, "attention: k");
    assert_eq!(v.len(), nk * d, "attention: v");
    if let Some(b) = bias.per_key {
        assert_eq!(b.len(), nk, "attention: per-key bias");
    }
    if let Some(b) = bias.per_head {
        assert_eq!(b.len(), heads * nq * nk, "attention: per-head bias");
    }
    let mut out = vec![0.0f32; nq * d];
    if nq == 0 || d == 0 {
        return out;
    }
    out.par_chunks_mut(Q_BLOCK * d)
        .enumerate()
        .for_each(|(blk, o)| {
            let q0 = blk * Q_BLOCK;
            let rows = o.len() / d;
            let mut s = vec![0.0f32; rows * nk];
            for h in 0..heads {
                let qv = MatRef::new(&q[q0 * d + h * hd..], rows, hd, d, 1);
                let kt = MatRef::new(&k[h * hd..], nk, hd, d, 1).t();
                gemm_serial(qv, kt, &mut s, nk, false);
                for (r, row) in s.chunks_mut(nk).enumerate() {
                    let hb = bias
                        .per_head
                        .map(|b| &b[(h * nq + q0 + r) * nk..(h * nq + q0 + r + 1) * nk]);
                    let mut mx = f32::NEG_INFINITY;
                    for (j, x) in row.iter_mut().enumerate() {
                        let mut y = *x * scale;
                        if let Some(b) = bias.per_key {
                            y += b[j];
                        }
                        if let Some(b) = hb {
                            y += b[j];
                        }
                        *x = y;
                        mx = mx.max(y);
                    }
                    // The denominator in f64 (rows of up to ~10^4 keys).
                    let mut sum = 0.0f64;
                    for x in row.iter_mut() {
                        *x = (*x - mx).exp();
                        sum += *x as f64;
                    }
                    let inv = (1.0 / sum) as f32;
                    row.iter_mut().for_each(|x| *x *= inv);
                }
                let vv = MatRef::new(&v[h * hd..], nk, hd, d, 1);
                gemm_serial(
                    MatRef::row_major(&s, rows, nk),
                    vv,
                    &mut o[h * hd..],
                    d,
                    false,
                );
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Gaussian;

    #[test]
    fn one_head_by_hand() {
        // q = [1, 0]; keys [1, 0], [0, 1]; logits [1, 0] -> weights [0.7310586, 0.2689414];
        // values [1, 2], [3, 4] -> [1.5378828, 2.5378828].
        let o = attention(
            &[1., 0.],
            &[1., 0., 0., 1.],
            &[1., 2., 3., 4.],
            1,
            2,
            1,
            2,
            1.0,
            AttnBias::default(),
        );
        assert!(
            (o[0] - 1.537_882_8).abs() < 1e-6 && (o[1] - 2.537_882_8).abs() < 1e-6,
            "{o:?}"
        );
        // A -10000 bias on key 1 masks it out.
        let mask = [0.0, -10000.0];
        let b = AttnBias {
            per_key: Some(&mask),
            per_head: None,
        };
        let o = attention(
            &[1., 0.],
            &[1., 0., 0., 1.],
            &[1., 2., 3., 4.],
            1,
            2,
            1,
            2,
            1.0,
            b,
        );
        assert_eq!(o, vec![1.0, 2.0]);
        // scale 0 gives the plain mean of the values.
        let o = attention(
            &[1., 0.],
            &[1., 0., 0., 1.],
            &[1., 2., 3., 4.],
            1,
            2,
            1,
            2,
            0.0,
            AttnBias::default(),
        );
        assert_eq!(o, vec![2.0, 3.0]);
    }

    #[test]
    fn heads_are_independent_column_groups() {
        // Head 0 sees columns 0..1 (logits equal: mean of values), head 1 columns 1..2
        // (key 0 wins with a per-head bias of +ln 3: weights 3/4, 1/4).
        let q = [0.0, 0.0];
        let k = [5.0, 0.0, -5.0, 0.0];
        let v = [1.0, 10.0, 3.0, 30.0];
        let hb = [0.0, 0.0, 3f32.ln(), 0.0];
        let o = attention(
            &q,
            &k,
            &v,
            1,
            2,
            2,
            1,
            1.0,
            AttnBias {
                per_key: None,
                per_head: Some(&hb),
            },
        );
        assert!(
            (o[0] - 2.0).abs() < 1e-6 && (o[1] - 15.0).abs() < 1e-5,
            "{o:?}"
        );
    }

    #[test]
    fn matches_a_naive_implementation_on_random_inputs() {
        let (nq, nk, heads, hd) = (150, 37, 3, 8);
        let d = heads * hd;
        let g = |s: &str, n| Gaussian::new(9, s).vec(n);
        let (q, k, v) = (g("q", nq * d), g("k", nk * d), g("v", nk * d));
        let kb = g("kb", nk);
        let hb = g("hb", heads * nq * nk);
        let got = attention(
            &q,
            &k,
            &v,
            nq,
            nk,
            heads,
            hd,
            0.3,
            AttnBias {
                per_key: Some(&kb),
                per_head: Some(&hb),
            },
        );
        for h in 0..heads {
            for i in 0..nq {
                let logits: Vec<f64> = (0..nk)
                    .map(|j| {
                        let dot: f64 = (0..hd)
                            .map(|c| (q[i * d + h * hd + c] * k[j * d + h * hd + c]) as f64)
                            .sum();
                        0.3 * dot + kb[j] as f64 + hb[(h * nq + i) * nk + j] as f64
                    })
                    .collect();
                let m = logits.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..hd {
                    let want: f64 = (0..nk)
                        .map(|j| e[j] / z * v[j * d + h * hd + c] as f64)
                        .sum();
                    let g = got[i * d + h * hd + c] as f64;
                    assert!((g - want).abs() < 1e-5, "h{h} q{i} c{c}: {g} vs {want}");
                }
            }
        }
    }
}
