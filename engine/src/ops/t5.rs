//! T5-specific pieces: the relative-position buckets and the gated GELU.

use crate::ops::activation::gelu_tanh;

/// The bucket of a relative position `rel = key - query`, as T5 computes it:
/// bidirectional splits the buckets by sign (positive distances in the upper
/// half); within a half, distances below `half/2` are exact, larger ones are
/// log-spaced up to `max_distance` and clamp to the last bucket. The log is
/// evaluated in f32 as the reference does, so boundary cases round alike.
pub fn relative_position_bucket(
    rel: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut buckets = num_buckets as i64;
    let mut ret = 0i64;
    let n = if bidirectional {
        buckets /= 2;
        if rel > 0 {
            ret += buckets;
        }
        rel.abs()
    } else {
        (-rel).max(0)
    };
    let max_exact = buckets / 2;
    if n < max_exact {
        return (ret + n) as usize;
    }
    let ratio =
        (n as f32 / max_exact as f32).ln() / ((max_distance as f64 / max_exact as f64).ln() as f32);
    let large = max_exact + (ratio * (buckets - max_exact) as f32) as i64;
    (ret + large.min(buckets - 1)) as usize
}

/// The additive position bias `[heads, nq, nk]` of a bidirectional encoder
/// from the learned table `[num_buckets, heads]`.
pub fn position_bias(
    table: &[f32],
    heads: usize,
    nq: usize,
    nk: usize,
    num_buckets: usize,
    max_distance: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; heads * nq * nk];
    for i in 0..nq {
        for j in 0..nk {
            let b = relative_position_bucket(j as i64 - i as i64, true, num_buckets, max_distance);
            for h in 0..heads {
                out[(h * nq + i) * nk + j] = table[b * heads + h];
            }
        }
    }
    out
}

/// T5 v1.1's gated activation, in place: `gate = gelu_tanh(gate) * linear`.
///
/// # Panics
/// If the lengths differ (a bug in the caller).
pub fn gated_gelu(gate: &mut [f32], linear: &[f32]) {
    assert_eq!(gate.len(), linear.len(), "gated_gelu lengths");
    gelu_tanh(gate);
    gate.iter_mut().zip(linear).for_each(|(g, l)| *g *= l);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_hand() {
        let b = |r| relative_position_bucket(r, true, 32, 128);
        // Exact region: |rel| < 8; positive distances offset by 16.
        assert_eq!((b(0), b(-1), b(1), b(-7), b(7)), (0, 1, 17, 7, 23));
        // Log region: 8 + floor(ln(n/8) / ln(16) * 8): n=8 -> 8, n=12 -> 8 + floor(1.1699) = 9,
        // n=32 -> 8 + 4 = 12, n=100 -> 8 + floor(7.2877) = 15, n >= 128 clamps to 15.
        assert_eq!(
            (b(-8), b(-12), b(-32), b(-100), b(-500)),
            (8, 9, 12, 15, 15)
        );
        assert_eq!(
            (b(8), b(32), b(127), b(128), b(10_000)),
            (24, 28, 31, 31, 31)
        );
        // Unidirectional: only non-positive distances count.
        assert_eq!(relative_position_bucket(5, false, 32, 128), 0);
        assert_eq!(
            relative_position_bucket(-20, false, 32, 128),
            16 + ((20f64 / 16.0).ln() / 8f64.ln() * 16.0) as usize
        );
    }

    #[test]
    fn position_bias_gathers_the_table() {
        // 2 heads; table row b = [10 b, -b].
        let table: Vec<f32> = (0..32)
            .flat_map(|b| [10.0 * b as f32, -(b as f32)])
            .collect();
        let pb = position_bias(&table, 2, 2, 3, 32, 128);
        // query 1, key 0 -> rel -1 -> bucket 1; query 0, key 2 -> rel 2 -> bucket 18.
        assert_eq!(pb[3], 10.0); // head 0, q1, k0
        assert_eq!(pb[2], 180.0); // head 0, q0, k2
        assert_eq!(pb[6 + 3], -1.0); // head 1, q1, k0
    }

    #[test]
    fn gated_gelu_by_hand() {
        let mut g = vec![1.0, -2.0];
        gated_gelu(&mut g, &[2.0, -1.0]);
        assert!(
            (g[0] - 1.682_384).abs() < 1e-6 && (g[1] - 0.045_402_3).abs() < 1e-6,
            "{g:?}"
        );
    }
}
