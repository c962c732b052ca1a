//! The one percentile bootstrap of the ranking, used by the paired effects
//! ([`crate::rank::stats`]) and the fidelity medians ([`crate::rank::fidelity`]).
//!
//! Method (fixed, so that a report can be regenerated to the byte): `resamples`
//! resamples of `n` items with replacement, indices drawn from a ChaCha8 stream
//! seeded by the caller ([`draw_index`]: one 64-bit draw each), every resample
//! reduced to its statistic; the interval's ends are quantiles by linear
//! interpolation between order statistics (Hyndman-Fan type 7) at
//! `(1 - CONFIDENCE) / 2` and `1 - (1 - CONFIDENCE) / 2`.

use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Coverage of the reported intervals.
pub const CONFIDENCE: f64 = 0.95;

/// `resamples` bootstrap resamples of `n` items drawn from a ChaCha8 stream seeded
/// with `seed`: each resample's `n` indices (in draw order) go to `statistic`, and
/// its values come back in resample order.
pub fn resample<T>(
    n: usize,
    seed: u64,
    resamples: usize,
    mut statistic: impl FnMut(&[usize]) -> T,
) -> Vec<T> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(resamples);
    let mut indices = vec![0; n];
    for _ in 0..resamples {
        for i in indices.iter_mut() {
            *i = draw_index(&mut rng, n);
        }
        out.push(statistic(&indices));
    }
    out
}

/// The [`CONFIDENCE`] interval `(lo, hi)` of the bootstrap values `boot` (sorted
/// here); `None` when there are none.
pub fn interval(mut boot: Vec<f64>) -> Option<(f64, f64)> {
    if boot.is_empty() {
        return None;
    }
    boot.sort_by(f64::total_cmp);
    let a = (1.0 - CONFIDENCE) / 2.0;
    Some((quantile(&boot, a), quantile(&boot, 1.0 - a)))
}

/// A uniform index below `n` from one 64-bit draw (multiply-shift; the bias is at most
/// `n / 2^64`). Written out rather than taken from `rand`'s range sampling, whose
/// exact value sequence is not promised stable across versions.
pub fn draw_index(rng: &mut ChaCha8Rng, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// Quantile `q` of ascending `sorted` by linear interpolation (type 7), where
/// values may be `+inf`: equal neighbours give themselves (no `inf - inf`).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let f = h - lo as f64;
    if sorted[lo] == sorted[hi] || f == 0.0 {
        sorted[lo]
    } else {
        sorted[lo] + f * (sorted[hi] - sorted[lo])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_hand_values_and_survive_infinity() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert_eq!(quantile(&s, 1.0), 5.0);
        assert_eq!(quantile(&s, 0.5), 3.0);
        assert!((quantile(&s, 0.1) - 1.4).abs() < 1e-12);
        let inf = [1.0, f64::INFINITY, f64::INFINITY];
        assert_eq!(quantile(&inf, 0.9), f64::INFINITY);
    }

    #[test]
    fn the_same_seed_draws_the_same_resamples() {
        let a = resample(7, 3, 50, |i| i.to_vec());
        assert_eq!(a, resample(7, 3, 50, |i| i.to_vec()));
        assert_ne!(a, resample(7, 4, 50, |i| i.to_vec()));
        assert!(a.iter().flatten().all(|&i| i < 7));
        assert_eq!(interval(vec![]), None);
    }
}
