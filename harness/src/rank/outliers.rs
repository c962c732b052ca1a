//! Runs that would decide a verdict on their own, named (issue 34): per lever arm
//! and rung, each paired run's metric value against its arm's median, and its
//! first-initialization seconds (`device_open_s`) against the arm's median of
//! those. The rule and its thresholds are argued in `specs/outliers.md`:
//!
//! * `outlier`: `|ln(x / median(arm))| > ln(1 + `[`RATIO_MAX`]`)`, and with at least
//!   [`MOD_Z_MIN_RUNS`] runs in the arm also a modified Z-score
//!   `|0.6745 (x - median) / MAD| > `[`MOD_Z_MAX`]. The arm's median is over every
//!   run of the arm, the run itself included: with 3 runs it is the middle one,
//!   which one slow run cannot move (the median of the *other* two is their mean,
//!   which the slow run drags along).
//!   For a metric in seconds the run must also lie at least [`MIN_ABS_S`] from
//!   the median (scheduling jitter of a phase of milliseconds is not an outlier).
//! * `first-init`: the run's `device_open_s` exceeds its arm's median by more than
//!   a factor [`FIRST_INIT_FACTOR`] and by at least [`FIRST_INIT_MIN_EXCESS_S`].
//!
//! Fewer than 3 runs in an arm flag nothing: with two runs nothing says which one
//! is odd. What rank does with the flags (the verdict with and without them)
//! is [`crate::rank`]'s business; this module only names runs.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::bundle::facts::Bundle;
use crate::rank::pairing::PairedRound;
use crate::rank::verdict::fixed;

/// The largest fractional distance of a run's value from its arm's median that
/// is still ordinary run-to-run spread (see `specs/outliers.md`).
pub const RATIO_MAX: f64 = 0.20;
/// The modified Z-score above which a run of a large enough arm is an outlier
/// (Iglewicz and Hoaglin's 3.5, hyperfine's rule).
pub const MOD_Z_MAX: f64 = 3.5;
/// Runs an arm needs before the modified Z-score is consulted as well.
pub const MOD_Z_MIN_RUNS: usize = 5;
/// The least distance from its arm's median, seconds, at which a run of a metric
/// in seconds is an outlier.
pub const MIN_ABS_S: f64 = 0.05;
/// Runs an arm needs before any run of it is flagged.
pub const MIN_RUNS: usize = 3;
/// How many times its arm's median a run's device-open seconds must exceed to
/// be `first-init`.
pub const FIRST_INIT_FACTOR: f64 = 2.0;
/// How many seconds above its arm's median a run's device-open seconds must be
/// to be `first-init`.
pub const FIRST_INIT_MIN_EXCESS_S: f64 = 0.5;

/// Why a run is flagged.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FlagKind {
    /// The metric value sits far from the arm's median.
    Outlier {
        /// The run's value, in the metric's unit.
        value: f64,
        /// The arm's median, in the metric's unit.
        arm_median: f64,
    },
    /// The run's device-open seconds sit far above the arm's median.
    FirstInit {
        /// The run's device-open seconds.
        device_open_s: f64,
        /// The arm's median device-open seconds.
        arm_median_s: f64,
    },
}

impl FlagKind {
    /// `outlier` or `first-init`.
    pub fn name(&self) -> &'static str {
        match self {
            FlagKind::Outlier { .. } => "outlier",
            FlagKind::FirstInit { .. } => "first-init",
        }
    }
}

/// One flagged run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFlag {
    /// The run's bundle id.
    pub id: String,
    /// The arm it ran (the lever's baseline or treatment arm name).
    pub arm: String,
    /// Why.
    pub kind: FlagKind,
}

impl RunFlag {
    /// The flag in words, without the run's id, metric values written by
    /// `value`: `outlier: 4.537 s against its arm's median 3.595 s (+26.2%)`,
    /// `first-init: device open 20.02 s against its arm's median 0.46 s`.
    pub fn describe(&self, value_text: &dyn Fn(f64) -> String) -> String {
        match &self.kind {
            FlagKind::Outlier { value, arm_median } => format!(
                "{}: {} against its arm's median {} ({}{}%)",
                self.kind.name(),
                value_text(*value),
                value_text(*arm_median),
                if value >= arm_median { "+" } else { "" },
                fixed(100.0 * (value / arm_median - 1.0), 1)
            ),
            FlagKind::FirstInit {
                device_open_s,
                arm_median_s,
            } => format!(
                "{}: device open {} s against its arm's median {} s",
                self.kind.name(),
                fixed(*device_open_s, 2),
                fixed(*arm_median_s, 2)
            ),
        }
    }
}

/// The median of `xs` (`None` when empty or any value is not finite).
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Some(crate::rank::stats::median(&mut xs.to_vec()))
}

/// Which of `values` (one arm's runs) are outliers by the module's rule, none
/// closer than `min_abs` to the median: their indices.
pub fn outlier_indices(values: &[f64], min_abs: f64) -> Vec<usize> {
    if values.len() < MIN_RUNS {
        return Vec::new();
    }
    let Some(m) = median(values).filter(|m| *m > 0.0) else {
        return Vec::new();
    };
    let mad = median(&values.iter().map(|x| (x - m).abs()).collect::<Vec<_>>());
    values
        .iter()
        .enumerate()
        .filter(|(_, &x)| {
            x > 0.0 && (x / m).ln().abs() > RATIO_MAX.ln_1p() && (x - m).abs() >= min_abs
        })
        .filter(|(_, &x)| {
            values.len() < MOD_Z_MIN_RUNS
                || match mad {
                    Some(d) if d > 0.0 => (0.6745 * (x - m) / d).abs() > MOD_Z_MAX,
                    // Half the arm or more equal to the median: any other value
                    // is infinitely many MADs away.
                    _ => true,
                }
        })
        .map(|(i, _)| i)
        .collect()
}

/// The runs of one arm: (bundle id, metric value).
fn flag_arm(
    arm: &str,
    runs: &[(&str, f64)],
    min_abs: f64,
    by_id: &BTreeMap<&str, &Bundle>,
) -> Vec<RunFlag> {
    let values: Vec<f64> = runs.iter().map(|r| r.1).collect();
    let m = median(&values).unwrap_or(f64::NAN);
    let mut out: Vec<RunFlag> = outlier_indices(&values, min_abs)
        .into_iter()
        .map(|i| RunFlag {
            id: runs[i].0.to_string(),
            arm: arm.to_string(),
            kind: FlagKind::Outlier {
                value: runs[i].1,
                arm_median: m,
            },
        })
        .collect();
    let opens: Vec<(&str, f64)> = runs
        .iter()
        .filter_map(|(id, _)| Some((*id, by_id.get(id)?.device_open_s()?)))
        .collect();
    if opens.len() >= MIN_RUNS {
        let o: Vec<f64> = opens.iter().map(|x| x.1).collect();
        if let Some(om) = median(&o) {
            for (id, s) in opens {
                if s > FIRST_INIT_FACTOR * om && s - om >= FIRST_INIT_MIN_EXCESS_S {
                    out.push(RunFlag {
                        id: id.to_string(),
                        arm: arm.to_string(),
                        kind: FlagKind::FirstInit {
                            device_open_s: s,
                            arm_median_s: om,
                        },
                    });
                }
            }
        }
    }
    out
}

/// The flagged runs among `rounds`' runs (one lever at one rung), baseline arm
/// first, in round order within each arm and flag kind. `seconds`: the metric
/// is in seconds ([`MIN_ABS_S`] applies).
pub fn flag(
    rounds: &[PairedRound],
    (baseline_arm, treatment_arm): (&str, &str),
    seconds: bool,
    by_id: &BTreeMap<&str, &Bundle>,
) -> Vec<RunFlag> {
    let min_abs = if seconds { MIN_ABS_S } else { 0.0 };
    let base: Vec<(&str, f64)> = rounds
        .iter()
        .map(|r| (r.baseline_id.as_str(), r.pair.baseline))
        .collect();
    let treat: Vec<(&str, f64)> = rounds
        .iter()
        .map(|r| (r.treatment_id.as_str(), r.pair.treatment))
        .collect();
    let mut out = flag_arm(baseline_arm, &base, min_abs, by_id);
    out.extend(flag_arm(treatment_arm, &treat, min_abs, by_id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_first_runs_are_outliers_and_ordinary_spread_is_not() {
        // Attention at rung 2: the cudnn arm's first run (4.537 s) against 3.568
        // and 3.595 s.
        assert_eq!(outlier_indices(&[4.537, 3.568, 3.595], MIN_ABS_S), vec![0]);
        // Observer at rung 3 (baseline) and rung 1 (baseline, 4 runs).
        assert_eq!(
            outlier_indices(&[44.851, 22.376, 22.673], MIN_ABS_S),
            vec![0]
        );
        assert_eq!(
            outlier_indices(&[2.748, 1.499, 1.524, 1.681], MIN_ABS_S),
            vec![0]
        );
        // The widest ordinary spread in the committed evidence: +13.3%, -12.5%.
        assert!(outlier_indices(&[1.133, 1.0, 0.933], 0.0).is_empty());
        assert!(outlier_indices(&[0.875, 1.0, 1.1], 0.0).is_empty());
        // Two runs: nothing says which one is odd.
        assert!(outlier_indices(&[1.0, 3.0], 0.0).is_empty());
        // A phase of milliseconds: 23% off is 4 ms, scheduling jitter
        // (conditioning on the device at rung 3, 0.020 s against 0.016 s).
        assert!(outlier_indices(&[0.0197, 0.016, 0.0155], MIN_ABS_S).is_empty());
        // A fast run is named too.
        assert_eq!(outlier_indices(&[1.018, 0.427, 1.0], 0.0), vec![1]);
    }

    #[test]
    fn a_large_arm_also_needs_the_modified_z_score() {
        // 6 runs spread +-25%: every run is within 3.5 MADs, nothing flagged
        // although 1.3 is 30% off the median.
        let v = [0.75, 0.9, 1.0, 1.05, 1.15, 1.3];
        assert!(outlier_indices(&v, 0.0).is_empty(), "{v:?}");
        // A tight arm with one run 40% slow: flagged by both.
        assert_eq!(
            outlier_indices(&[1.0, 1.01, 0.99, 1.02, 0.98, 1.4], 0.0),
            vec![5]
        );
    }
}
