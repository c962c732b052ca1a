//! The decision rule: a lever's paired effect judged against its hypothesis.
//!
//! With `s` the fractional saving (`1 - ratio` for a hypothesised decrease, `ratio - 1`
//! for an increase) and `[s_lo, s_hi]` its 95% interval:
//! * `confirmed` when `s_lo >= min_effect` (the whole interval clears the minimum);
//! * `refuted` when `s_hi < min_effect` (a null or opposite effect, or one too small
//!   to matter), naming the lever's next hypothesis;
//! * `insufficient` when the interval straddles `min_effect` or fewer than
//!   [`MIN_PAIRS`] pairs exist, naming the evidence that is missing.
//!
//! A numerics-changing lever (`numerics = "changing"` in `specs/levers.toml`) must
//! also pass its fidelity rule ([`crate::rank::fidelity`]) to stay confirmed
//! ([`with_fidelity`]): a `confirmed` saving whose median-PSNR interval lies wholly
//! below the threshold becomes `refuted-fidelity` (the saving is real, the frames
//! are not faithful enough), and one whose interval straddles it, or with fewer than
//! [`MIN_PAIRS`] pairs of comparable frames, `insufficient` naming the fidelity
//! evidence missing. Refuted and insufficient savings stay as they are: fidelity
//! cannot rescue a saving that is not there. A numerics-preserving lever's verdict
//! is never changed by fidelity; differing frames are flagged beside it.

use serde::Serialize;

use crate::levers_spec::{Direction, Hypothesis};
use crate::rank::stats::{Interval, PairedEffect};

/// Fewest pairs on which a verdict other than `insufficient` is given.
pub const MIN_PAIRS: usize = 3;

/// The outcome for one lever at one rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    /// The effect clears the minimum with 95% confidence.
    Confirmed,
    /// The effect is below the minimum with 95% confidence.
    Refuted {
        /// The hypothesis to test next (from the spec).
        next_hypothesis: String,
    },
    /// The evidence cannot decide.
    Insufficient {
        /// What evidence is missing.
        missing: String,
    },
    /// The saving clears the minimum but the treatment's frames fail the lever's
    /// fidelity rule (a numerics-changing lever only).
    #[serde(rename = "refuted-fidelity")]
    RefutedFidelity {
        /// The fidelity figures against the threshold, in words.
        why: String,
    },
    /// The lever does not apply where the rung runs (its arms do not differ on
    /// that device), so there is nothing to measure there.
    NotApplicable {
        /// Why: the lever's devices and the rung's.
        why: String,
    },
    /// The verdict over every pair and the verdict without the pairs of flagged
    /// runs ([`crate::rank::outliers`]) differ: the flagged runs decide it, so
    /// neither is given as the verdict.
    Sensitive {
        /// The flagged runs' bundle ids, sorted.
        runs: Vec<String>,
        /// The verdict over every pair.
        with_flagged: Box<Verdict>,
        /// The verdict without the pairs of flagged runs.
        without_flagged: Box<Verdict>,
    },
    /// The pairs come from two or more hosts whose effects differ beyond their
    /// pairs' spread ([`crate::rank::hosts`], `specs/hosts.md`): no pooled effect
    /// or verdict is given, only each host's.
    #[serde(rename = "hosts-disagree")]
    HostsDisagree {
        /// The heterogeneity figure and each host's saving, in words.
        why: String,
    },
}

impl Verdict {
    /// The verdict's name: `confirmed`, `refuted`, `refuted-fidelity`,
    /// `insufficient`, `n/a`, `sensitive` or `hosts-disagree`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Confirmed => "confirmed",
            Verdict::Refuted { .. } => "refuted",
            Verdict::RefutedFidelity { .. } => "refuted-fidelity",
            Verdict::Insufficient { .. } => "insufficient",
            Verdict::NotApplicable { .. } => "n/a",
            Verdict::Sensitive { .. } => "sensitive",
            Verdict::HostsDisagree { .. } => "hosts-disagree",
        }
    }

    /// The verdict as the tables print it: [`Verdict::name`], and for a
    /// sensitive one the runs that decide it, `sensitive (run 0123456789ab)`.
    pub fn label(&self) -> String {
        match self {
            Verdict::Sensitive { runs, .. } => format!(
                "sensitive (run {})",
                runs.iter()
                    .map(|id| crate::short_id::short(id))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            v => v.name().to_string(),
        }
    }
}

/// The verdict given both judgements: `with_flagged` over every pair and
/// `without_flagged` without the pairs of `runs` (flagged runs). The same
/// verdict (by name) stands as `with_flagged`; differing ones are
/// [`Verdict::Sensitive`]. No flagged run: `with_flagged`.
pub fn with_outliers(
    with_flagged: Verdict,
    without_flagged: Option<Verdict>,
    runs: &[String],
) -> Verdict {
    match without_flagged {
        Some(w) if !runs.is_empty() && w.name() != with_flagged.name() => Verdict::Sensitive {
            runs: runs.to_vec(),
            with_flagged: Box::new(with_flagged),
            without_flagged: Box::new(w),
        },
        _ => with_flagged,
    }
}

/// The fractional saving and its interval for a paired effect under `direction`.
pub fn saving_fraction(direction: Direction, e: &PairedEffect) -> (f64, Interval) {
    match direction {
        Direction::Decrease => (
            1.0 - e.ratio,
            Interval {
                lo: 1.0 - e.ratio_ci.hi,
                hi: 1.0 - e.ratio_ci.lo,
            },
        ),
        Direction::Increase => (
            e.ratio - 1.0,
            Interval {
                lo: e.ratio_ci.lo - 1.0,
                hi: e.ratio_ci.hi - 1.0,
            },
        ),
    }
}

/// Judge `effect` against `h`. `pairs_missing` describes what is absent when there is
/// no effect to judge (no pairs, one arm missing, a value undefined).
pub fn judge(h: &Hypothesis, effect: Result<&PairedEffect, &str>) -> Verdict {
    let e = match effect {
        Ok(e) => e,
        Err(missing) => {
            return Verdict::Insufficient {
                missing: missing.to_string(),
            }
        }
    };
    if e.n < MIN_PAIRS {
        return Verdict::Insufficient {
            missing: format!(
                "{} more paired round(s): {} pair(s) found, a verdict needs at least {MIN_PAIRS}",
                MIN_PAIRS - e.n,
                e.n
            ),
        };
    }
    let (s, ci) = saving_fraction(h.direction, e);
    let m = h.min_effect;
    if ci.lo >= m {
        Verdict::Confirmed
    } else if ci.hi < m {
        Verdict::Refuted {
            next_hypothesis: h.next_hypothesis.clone(),
        }
    } else {
        Verdict::Insufficient {
            missing: format!(
                "more paired rounds: the saving's interval [{}, {}] straddles the minimum effect {}{}",
                pct(ci.lo),
                pct(ci.hi),
                pct(m),
                rounds_hint(e.n, s, ci, m)
            ),
        }
    }
}

/// The verdict of a lever whose saving was judged `saving`, given its fidelity rule's
/// check (`None` for a numerics-preserving lever): see the module doc.
pub fn with_fidelity(saving: Verdict, rule: Option<&RuleCheck>) -> Verdict {
    match (saving, rule) {
        (Verdict::Confirmed, Some(RuleCheck::Fails { why })) => {
            Verdict::RefutedFidelity { why: why.clone() }
        }
        (Verdict::Confirmed, Some(RuleCheck::Undecided { why })) => Verdict::Insufficient {
            missing: format!("fidelity: {why}"),
        },
        (v, _) => v,
    }
}

/// A rough count of rounds after which the interval would clear `m`, assuming its
/// half-width shrinks as `1/sqrt(n)` and the point estimate holds.
fn rounds_hint(n: usize, s: f64, ci: Interval, m: f64) -> String {
    let half = (ci.hi - ci.lo) / 2.0;
    let gap = (s - m).abs();
    if gap <= 1e-9 || half <= 0.0 {
        return String::from(" (the estimate sits on the minimum itself)");
    }
    let need = (n as f64 * (half / gap).powi(2)).ceil();
    if need.is_finite() && need > n as f64 && need < 1e6 {
        format!(
            " (about {} pairs in all if the estimate holds)",
            need as u64
        )
    } else {
        String::new()
    }
}

/// `x` with `dp` decimals, never `-0`.
pub fn fixed(x: f64, dp: usize) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let s = format!("{x:.dp$}");
    if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
        s[1..].to_string()
    } else {
        s
    }
}

/// A changing lever's fidelity rule, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum RuleCheck {
    /// The interval's lower end is at or above the threshold.
    Passes,
    /// The whole interval is below the threshold.
    Fails {
        /// The figures, in words.
        why: String,
    },
    /// The interval straddles the threshold, or too few pairs were compared.
    Undecided {
        /// What is missing, in words.
        why: String,
    },
}

/// A fraction as a percentage with one decimal (`0.305` -> `30.5%`); `-0.0%` never
/// appears.
pub fn pct(x: f64) -> String {
    let v = (x * 1000.0).round() / 10.0;
    let v = if v == 0.0 { 0.0 } else { v };
    format!("{v:.1}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyp(direction: Direction, min_effect: f64) -> Hypothesis {
        Hypothesis {
            direction,
            min_effect,
            statement: "s".into(),
            refutation: "r".into(),
            next_hypothesis: "look elsewhere".into(),
        }
    }

    fn effect(n: usize, ratio: f64, lo: f64, hi: f64) -> PairedEffect {
        PairedEffect {
            n,
            ratio,
            ratio_ci: Interval { lo, hi },
            saving: 0.0,
            saving_ci: Interval { lo: 0.0, hi: 0.0 },
            baseline_median: 1.0,
            treatment_median: ratio,
            lower: n,
            higher: 0,
            sign_p: 0.1,
        }
    }

    #[test]
    fn decrease_rule_confirms_refutes_and_abstains_at_the_edges() {
        let h = hyp(Direction::Decrease, 0.3);
        // Saving interval [0.3, 0.35]: the lower bound equals the minimum -> confirmed.
        assert_eq!(
            judge(&h, Ok(&effect(5, 0.68, 0.65, 0.70))),
            Verdict::Confirmed
        );
        // Saving interval [0.29, 0.35] straddles 0.3.
        let v = judge(&h, Ok(&effect(5, 0.68, 0.65, 0.71)));
        assert_eq!(v.name(), "insufficient");
        // Saving interval [-0.1, 0.299]: below the minimum -> refuted, naming the next.
        assert_eq!(
            judge(&h, Ok(&effect(5, 0.9, 0.701, 1.1))),
            Verdict::Refuted {
                next_hypothesis: "look elsewhere".into()
            }
        );
        // Opposite effect.
        assert_eq!(judge(&h, Ok(&effect(5, 1.3, 1.2, 1.4))).name(), "refuted");
    }

    #[test]
    fn increase_rule_uses_ratio_minus_one() {
        let h = hyp(Direction::Increase, 0.2);
        assert_eq!(judge(&h, Ok(&effect(4, 1.5, 1.3, 1.7))), Verdict::Confirmed);
        assert_eq!(judge(&h, Ok(&effect(4, 0.7, 0.6, 0.8))).name(), "refuted");
        assert_eq!(
            judge(&h, Ok(&effect(4, 1.2, 1.1, 1.3))).name(),
            "insufficient"
        );
    }

    #[test]
    fn too_few_pairs_or_no_effect_is_insufficient_and_says_why() {
        let h = hyp(Direction::Decrease, 0.3);
        match judge(&h, Ok(&effect(2, 0.5, 0.45, 0.55))) {
            Verdict::Insufficient { missing } => {
                assert!(missing.contains("2 pair(s)") && missing.contains("at least 3"))
            }
            v => panic!("{v:?}"),
        }
        match judge(&h, Err("treatment arm missing in every round")) {
            Verdict::Insufficient { missing } => assert!(missing.contains("treatment arm")),
            v => panic!("{v:?}"),
        }
        match judge(&h, Ok(&effect(5, 0.72, 0.6, 0.8))) {
            Verdict::Insufficient { missing } => {
                assert!(missing.contains("[20.0%, 40.0%]"), "{missing}");
                assert!(missing.contains("30.0%") && missing.contains("pairs in all"));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn fidelity_only_demotes_a_confirmed_saving() {
        let fails = RuleCheck::Fails {
            why: "below 30 dB".into(),
        };
        let open = RuleCheck::Undecided {
            why: "2 pairs".into(),
        };
        assert_eq!(
            with_fidelity(Verdict::Confirmed, Some(&fails)),
            Verdict::RefutedFidelity {
                why: "below 30 dB".into()
            }
        );
        assert_eq!(
            with_fidelity(Verdict::Confirmed, Some(&fails)).name(),
            "refuted-fidelity"
        );
        match with_fidelity(Verdict::Confirmed, Some(&open)) {
            Verdict::Insufficient { missing } => assert_eq!(missing, "fidelity: 2 pairs"),
            v => panic!("{v:?}"),
        }
        assert_eq!(
            with_fidelity(Verdict::Confirmed, Some(&RuleCheck::Passes)),
            Verdict::Confirmed
        );
        assert_eq!(with_fidelity(Verdict::Confirmed, None), Verdict::Confirmed);
        let refuted = Verdict::Refuted {
            next_hypothesis: "n".into(),
        };
        assert_eq!(with_fidelity(refuted.clone(), Some(&fails)), refuted);
        let v = serde_json::to_value(Verdict::RefutedFidelity { why: "w".into() }).unwrap();
        assert_eq!(v["verdict"], "refuted-fidelity");
    }

    #[test]
    fn pct_is_fixed_format_without_negative_zero() {
        assert_eq!(pct(0.305), "30.5%");
        assert_eq!(pct(-0.00001), "0.0%");
        assert_eq!(pct(-0.25), "-25.0%");
    }
}
