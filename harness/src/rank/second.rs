//! A lever's second metric (`second_metric` in `specs/levers.toml`): read off the
//! same pairs as its first and described with the same paired statistics, never
//! judged. The first metric says whether a lever saves; the second says why it did
//! or did not (a faster attention kernel should raise the tensor pipes' activity in
//! `denoise`; if wall time fell and the tensor share did not move, the saving came
//! from elsewhere).

use serde::Serialize;
use std::collections::BTreeMap;

use crate::bundle::facts::Bundle;
use crate::levers_spec::{Lever, Metric, Unit};
use crate::rank::metric;
use crate::rank::pairing::PairedRound;
use crate::rank::stats::{self, PairedEffect};

/// The second metric of one lever at one rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecondResult {
    /// The metric's label (`gpm_tensor(denoise)`).
    pub metric: String,
    /// Its unit.
    pub unit: Unit,
    /// The pairs of the first metric for which both runs have a value, with the
    /// values (baseline, treatment), in the first metric's pair order.
    pub pairs: Vec<SecondPair>,
    /// Pairs left out: both bundle ids and why the value is missing, in pair order.
    pub missing: Vec<String>,
    /// The paired effect over `pairs`, or why there is none.
    pub effect: Result<PairedEffect, String>,
}

/// One pair's values of the second metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecondPair {
    /// The baseline run's bundle id.
    pub baseline_id: String,
    /// The treatment run's bundle id.
    pub treatment_id: String,
    /// The baseline run's value, in the metric's unit.
    pub baseline: f64,
    /// The treatment run's value.
    pub treatment: f64,
}

/// The second metric of `l` over `rounds` (the first metric's pairs at `rung`);
/// `None` when the lever names none. `by_id` holds every bundle the pairs name.
pub fn second(
    l: &Lever,
    rung: &str,
    rounds: &[PairedRound],
    by_id: &BTreeMap<&str, &Bundle>,
) -> Option<SecondResult> {
    let m = l.second_metric.as_ref()?;
    Some(describe(m, &l.id, rung, rounds, by_id))
}

fn describe(
    m: &Metric,
    lever: &str,
    rung: &str,
    rounds: &[PairedRound],
    by_id: &BTreeMap<&str, &Bundle>,
) -> SecondResult {
    let value = |id: &str| -> Result<f64, String> {
        let b = by_id
            .get(id)
            .ok_or_else(|| "the bundle is not among those read".to_string())?;
        metric::value(b, m)
    };
    let mut pairs = Vec::new();
    let mut missing = Vec::new();
    for r in rounds {
        match (value(&r.baseline_id), value(&r.treatment_id)) {
            (Ok(baseline), Ok(treatment)) => pairs.push(SecondPair {
                baseline_id: r.baseline_id.clone(),
                treatment_id: r.treatment_id.clone(),
                baseline,
                treatment,
            }),
            (Err(e), _) => missing.push(format!("{}: {e}", short(&r.baseline_id))),
            (_, Err(e)) => missing.push(format!("{}: {e}", short(&r.treatment_id))),
        }
    }
    let effect = if pairs.is_empty() {
        Err(match (rounds.is_empty(), missing.first()) {
            (true, _) => "no pair of the first metric".to_string(),
            (false, Some(why)) => format!("no pair with both values ({why})"),
            (false, None) => "no pair with both values".to_string(),
        })
    } else {
        let p: Vec<stats::Pair> = pairs
            .iter()
            .map(|p| stats::Pair {
                baseline: p.baseline,
                treatment: p.treatment,
            })
            .collect();
        // Its own seed stream, so adding a second metric leaves the first's
        // intervals byte for byte as they were.
        let seed = stats::seed_for(&format!("{lever}#second"), rung);
        stats::paired_effect(&p, seed, stats::BOOTSTRAP_RESAMPLES)
            .map_err(|e| format!("a defined ratio for every pair ({e})"))
    };
    SecondResult {
        metric: m.label(),
        unit: m.unit(),
        pairs,
        missing,
        effect,
    }
}

fn short(id: &str) -> &str {
    crate::short_id::short(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::levers_spec::GpmCounter;
    use crate::rank::pairing::{Cell, PairedRound};
    use evidence::phase_table::GpmFigure;

    fn tensor_denoise() -> Metric {
        Metric::GpmActivity {
            phase: "denoise".into(),
            counter: GpmCounter::Tensor,
        }
    }

    /// A bundle whose `denoise` holds three GPM windows of tensor activity `pct`.
    fn with_tensor(id: &str, pct: [f64; 3]) -> Bundle {
        let mut b = sample_bundle(id);
        let (o, _) = b.phase_spans("denoise")[0];
        b.gpm = pct
            .iter()
            .enumerate()
            .map(|(i, &t)| GpmFigure {
                start_ns: o + (i as i64 + 1) * 200_000_000,
                end_ns: o + (i as i64 + 2) * 200_000_000,
                tensor_pct: Some(t),
                sm_pct: Some(90.0),
                occupancy_pct: None,
                dram_pct: None,
            })
            .collect();
        b
    }

    fn round(i: u32, b: &str, t: &str) -> PairedRound {
        PairedRound {
            cell: Cell {
                campaign: "c".into(),
                round: i,
                engine_sha256: "e".into(),
                host: "h".into(),
                boot: "b".into(),
                weights_digest: "w".into(),
                profile: "default".into(),
                other_levers: String::new(),
            },
            baseline_id: b.into(),
            treatment_id: t.into(),
            pair: stats::Pair {
                baseline: 20.0,
                treatment: 17.0,
            },
        }
    }

    #[test]
    fn the_second_metric_is_read_off_the_first_metrics_pairs() {
        let bundles = [
            with_tensor("b1", [60.0, 64.0, 66.0]),
            with_tensor("t1", [70.0, 72.0, 75.0]),
            with_tensor("b2", [62.0, 65.0, 68.0]),
            with_tensor("t2", [71.0, 74.0, 76.0]),
            sample_bundle("b3"),
            with_tensor("t3", [71.0, 74.0, 76.0]),
        ];
        let by_id: BTreeMap<&str, &Bundle> = bundles.iter().map(|b| (b.id.as_str(), b)).collect();
        let rounds = [
            round(0, "b1", "t1"),
            round(1, "b2", "t2"),
            round(2, "b3", "t3"),
        ];
        let r = describe(&tensor_denoise(), "attention", "3", &rounds, &by_id);
        assert_eq!(r.metric, "gpm_tensor(denoise)");
        assert_eq!(r.unit, Unit::Share);
        // b3 has no GPM windows: its pair is left out, with the reason.
        assert_eq!(r.pairs.len(), 2);
        assert_eq!(r.missing.len(), 1);
        assert!(
            r.missing[0].starts_with("b3: no GPM window recorded"),
            "{:?}",
            r.missing
        );
        let (p0, p1) = (&r.pairs[0], &r.pairs[1]);
        assert_eq!((p0.baseline, p0.treatment), (0.64, 0.72));
        assert_eq!((p1.baseline, p1.treatment), (0.65, 0.74));
        let e = r.effect.unwrap();
        assert_eq!(e.n, 2);
        assert!(
            (e.baseline_median - 0.645).abs() < 1e-12,
            "{}",
            e.baseline_median
        );
        assert!(
            (e.treatment_median - 0.73).abs() < 1e-12,
            "{}",
            e.treatment_median
        );
        assert_eq!(e.higher, 2);
    }

    #[test]
    fn without_any_value_the_second_metric_says_why() {
        let bundles = [sample_bundle("b1"), sample_bundle("t1")];
        let by_id: BTreeMap<&str, &Bundle> = bundles.iter().map(|b| (b.id.as_str(), b)).collect();
        let r = describe(
            &tensor_denoise(),
            "attention",
            "3",
            &[round(0, "b1", "t1")],
            &by_id,
        );
        assert!(r.pairs.is_empty());
        let why = r.effect.unwrap_err();
        assert!(
            why.contains("no pair with both values (b1: no GPM window"),
            "{why}"
        );
        let none = describe(&tensor_denoise(), "attention", "3", &[], &by_id);
        assert_eq!(none.effect.unwrap_err(), "no pair of the first metric");
    }
}
