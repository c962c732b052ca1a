//! Paired statistics for a lever: the paired ratio, the absolute saving, a percentile
//! bootstrap interval for both, and an exact sign test.
//!
//! Method (fixed, so that a report can be regenerated to the byte):
//! * each pair is one round's baseline and treatment values of the same metric;
//! * the effect is the geometric mean of the per-pair ratios `treatment / baseline`
//!   (the mean of log ratios, exponentiated), and the saving is the arithmetic mean of
//!   `baseline - treatment` in the metric's unit;
//! * the 95% interval of both comes from one percentile bootstrap over pairs:
//!   [`BOOTSTRAP_RESAMPLES`] resamples with replacement ([`crate::rank::bootstrap`]),
//!   the stream seeded by the caller (see [`seed_for`]);
//! * the sign test counts pairs where the treatment is lower and gives the exact
//!   two-sided binomial p-value (ties dropped).

use serde::Serialize;

use crate::rank::bootstrap;
pub use crate::rank::bootstrap::CONFIDENCE;

/// Bootstrap resamples per interval.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// The base seed of every bootstrap stream; [`seed_for`] mixes in the lever and rung.
pub const BOOTSTRAP_SEED: u64 = 0x1ee7_5eed_0000_0005;

/// One round's measurement of both arms, in the metric's unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair {
    /// The baseline arm's value.
    pub baseline: f64,
    /// The treatment arm's value.
    pub treatment: f64,
}

/// A two-sided interval `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

impl Interval {
    /// Whether `x` lies inside the closed interval.
    pub fn contains(&self, x: f64) -> bool {
        self.lo <= x && x <= self.hi
    }
}

/// The paired effect of a treatment over its baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairedEffect {
    /// Number of pairs.
    pub n: usize,
    /// Geometric mean of `treatment / baseline` over the pairs.
    pub ratio: f64,
    /// 95% bootstrap interval of `ratio`.
    pub ratio_ci: Interval,
    /// Mean of `baseline - treatment`, in the metric's unit (positive = treatment lower).
    pub saving: f64,
    /// 95% bootstrap interval of `saving`.
    pub saving_ci: Interval,
    /// Median of the baseline values.
    pub baseline_median: f64,
    /// Median of the treatment values.
    pub treatment_median: f64,
    /// Pairs where the treatment is lower than the baseline.
    pub lower: usize,
    /// Pairs where the treatment is higher than the baseline.
    pub higher: usize,
    /// Exact two-sided sign-test p-value over the non-tied pairs.
    pub sign_p: f64,
}

/// Why an effect cannot be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    /// There are no pairs.
    #[error("no pairs")]
    Empty,
    /// A value is zero, negative or not finite, so its ratio is undefined.
    #[error("pair {index}: {which} value {value} is not a positive finite number, so the ratio is undefined")]
    NonPositive {
        /// Index of the pair.
        index: usize,
        /// `baseline` or `treatment`.
        which: &'static str,
        /// The value.
        value: f64,
    },
}

/// The bootstrap seed for one lever at one rung: [`BOOTSTRAP_SEED`] mixed with an
/// FNV-1a hash of the lever id, a 0xFF byte (never inside a UTF-8 string, so the
/// split is unambiguous) and the rung name: each row has its own fixed stream.
pub fn seed_for(lever: &str, rung: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in lever
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(rung.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    BOOTSTRAP_SEED ^ h
}

/// The paired effect of `pairs`, with a bootstrap of `resamples` draws from `seed`.
///
/// Promise: a pure function of `(pairs, seed, resamples)`; the order of `pairs`
/// matters only through the resampling, so callers pass pairs in a canonical order.
pub fn paired_effect(
    pairs: &[Pair],
    seed: u64,
    resamples: usize,
) -> Result<PairedEffect, StatsError> {
    if pairs.is_empty() {
        return Err(StatsError::Empty);
    }
    let mut logs = Vec::with_capacity(pairs.len());
    let mut diffs = Vec::with_capacity(pairs.len());
    for (index, p) in pairs.iter().enumerate() {
        for (which, value) in [("baseline", p.baseline), ("treatment", p.treatment)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(StatsError::NonPositive {
                    index,
                    which,
                    value,
                });
            }
        }
        logs.push((p.treatment / p.baseline).ln());
        diffs.push(p.baseline - p.treatment);
    }
    let n = pairs.len();
    let boot = bootstrap::resample(n, seed, resamples, |idx| {
        let (mut sl, mut sd) = (0.0, 0.0);
        for &i in idx {
            sl += logs[i];
            sd += diffs[i];
        }
        (sl / n as f64, sd / n as f64)
    });
    let (boot_log, boot_diff): (Vec<f64>, Vec<f64>) = boot.into_iter().unzip();
    let interval =
        |boot: Vec<f64>, f: &dyn Fn(f64) -> f64, point: f64| match bootstrap::interval(boot) {
            Some((lo, hi)) => Interval {
                lo: f(lo),
                hi: f(hi),
            },
            None => Interval {
                lo: point,
                hi: point,
            },
        };
    let mean_log = mean(&logs);
    let saving = mean(&diffs);
    let lower = pairs.iter().filter(|p| p.treatment < p.baseline).count();
    let higher = pairs.iter().filter(|p| p.treatment > p.baseline).count();
    let mut b: Vec<f64> = pairs.iter().map(|p| p.baseline).collect();
    let mut t: Vec<f64> = pairs.iter().map(|p| p.treatment).collect();
    Ok(PairedEffect {
        n,
        ratio: mean_log.exp(),
        ratio_ci: interval(boot_log, &f64::exp, mean_log.exp()),
        saving,
        saving_ci: interval(boot_diff, &|x| x, saving),
        baseline_median: median(&mut b),
        treatment_median: median(&mut t),
        lower,
        higher,
        sign_p: sign_test_p(lower, higher),
    })
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// The median of `xs` (sorted in place); the mean of the middle two for even lengths.
pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

/// Exact two-sided sign-test p-value for `k` successes among `k + m` untied pairs.
pub fn sign_test_p(k: usize, m: usize) -> f64 {
    let n = k + m;
    if n == 0 {
        return 1.0;
    }
    let tail = k.min(m);
    // ln C(n, i) built up incrementally; pmf(i) = C(n, i) / 2^n.
    let ln2n = n as f64 * std::f64::consts::LN_2;
    let mut ln_c = 0.0;
    let mut sum = 0.0;
    for i in 0..=tail {
        if i > 0 {
            ln_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        sum += (ln_c - ln2n).exp();
    }
    (2.0 * sum).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::bootstrap::quantile;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A small deterministic noise source for planted-effect tests.
    fn noisy_pairs(n: usize, true_ratio: f64, noise: f64, seed: u64) -> Vec<Pair> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut u = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        (0..n)
            .map(|_| {
                let base = 100.0 * (1.0 + 0.3 * u());
                Pair {
                    baseline: base * (1.0 + noise * u()),
                    treatment: base * true_ratio * (1.0 + noise * u()),
                }
            })
            .collect()
    }

    #[test]
    fn exact_pairs_give_exact_ratio_and_saving() {
        let pairs = [
            Pair {
                baseline: 10.0,
                treatment: 5.0,
            },
            Pair {
                baseline: 20.0,
                treatment: 10.0,
            },
            Pair {
                baseline: 40.0,
                treatment: 20.0,
            },
        ];
        let e = paired_effect(&pairs, 1, 2000).unwrap();
        assert!((e.ratio - 0.5).abs() < 1e-12, "{}", e.ratio);
        // Every resample has ratio exactly 0.5.
        assert!((e.ratio_ci.lo - 0.5).abs() < 1e-12 && (e.ratio_ci.hi - 0.5).abs() < 1e-12);
        assert!((e.saving - 35.0 / 3.0).abs() < 1e-12);
        assert!(e.saving_ci.lo >= 5.0 - 1e-12 && e.saving_ci.hi <= 20.0 + 1e-12);
        assert_eq!((e.lower, e.higher), (3, 0));
        assert_eq!(e.baseline_median, 20.0);
        assert_eq!(e.treatment_median, 10.0);
        assert!((e.sign_p - 0.25).abs() < 1e-12, "{}", e.sign_p);
    }

    #[test]
    fn planted_thirty_percent_saving_is_inside_a_narrow_interval() {
        let pairs = noisy_pairs(12, 0.7, 0.05, 7);
        let e = paired_effect(&pairs, seed_for("x", "2"), BOOTSTRAP_RESAMPLES).unwrap();
        assert!(e.ratio_ci.contains(0.7), "{:?}", e.ratio_ci);
        assert!(e.ratio_ci.hi - e.ratio_ci.lo < 0.1, "{:?}", e.ratio_ci);
        assert!(e.ratio_ci.lo < e.ratio && e.ratio < e.ratio_ci.hi);
        assert!(e.saving > 0.0 && e.saving_ci.lo > 0.0);
    }

    #[test]
    fn interval_covers_the_truth_at_roughly_the_nominal_rate() {
        // 200 independent experiments of 10 pairs: a 95% interval must cover the
        // planted ratio in most of them (percentile bootstrap under-covers a little at
        // small n; below 85% would mean a broken interval).
        let mut covered = 0;
        for s in 0..200 {
            let pairs = noisy_pairs(10, 0.8, 0.1, 1000 + s);
            let e = paired_effect(&pairs, s, 2000).unwrap();
            if e.ratio_ci.contains(0.8) {
                covered += 1;
            }
        }
        assert!((170..=200).contains(&covered), "covered {covered}/200");
    }

    #[test]
    fn same_seed_same_interval_other_seed_differs() {
        let pairs = noisy_pairs(8, 0.9, 0.1, 3);
        let a = paired_effect(&pairs, 11, 5000).unwrap();
        let b = paired_effect(&pairs, 11, 5000).unwrap();
        let c = paired_effect(&pairs, 12, 5000).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.ratio_ci, c.ratio_ci);
        assert_ne!(seed_for("vae", "2"), seed_for("vae", "0"));
        assert_ne!(seed_for("a", "b@c"), seed_for("a@b", "c"));
    }

    #[test]
    fn non_positive_values_are_refused_with_their_position() {
        let e = paired_effect(
            &[
                Pair {
                    baseline: 1.0,
                    treatment: 1.0,
                },
                Pair {
                    baseline: 0.0,
                    treatment: 1.0,
                },
            ],
            1,
            10,
        )
        .unwrap_err();
        assert_eq!(
            e,
            StatsError::NonPositive {
                index: 1,
                which: "baseline",
                value: 0.0
            }
        );
        assert_eq!(paired_effect(&[], 1, 10).unwrap_err(), StatsError::Empty);
    }

    #[test]
    fn sign_test_and_quantiles_match_hand_values() {
        // n = 10, k = 1: 2 * (1 + 10) / 1024.
        assert!((sign_test_p(1, 9) - 22.0 / 1024.0).abs() < 1e-12);
        assert!((sign_test_p(9, 1) - 22.0 / 1024.0).abs() < 1e-12);
        assert_eq!(sign_test_p(5, 5), 1.0);
        assert_eq!(sign_test_p(0, 0), 1.0);
        // Large n stays finite and tiny.
        let p = sign_test_p(0, 2000);
        assert!((0.0..1e-300).contains(&p), "{p}");
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert_eq!(quantile(&s, 1.0), 5.0);
        assert_eq!(quantile(&s, 0.5), 3.0);
        assert!((quantile(&s, 0.1) - 1.4).abs() < 1e-12);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
