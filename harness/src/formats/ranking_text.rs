//! The words and numbers every format of a [`crate::rank::Ranking`] prints alike
//! (the markdown table, the forest plot, the HTML page, `harness diff`): values in
//! their units, the rank cells, the method's sentences. Fixed formats: seconds to 3
//! decimals, bytes as MiB or GiB to 3 decimals, shares to 3 decimals, percentages
//! to 1, and `-0` is never printed.

use crate::levers_spec::Unit;
use crate::rank::heterogeneity::ALPHA;
use crate::rank::hosts::{self, Agreement};
use crate::rank::outliers::{
    FIRST_INIT_FACTOR, FIRST_INIT_MIN_EXCESS_S, MOD_Z_MAX, MOD_Z_MIN_RUNS, RATIO_MAX,
};
use crate::rank::pairing::PairedRound;
use crate::rank::stats::CONFIDENCE;
use crate::rank::verdict::{Verdict, MIN_PAIRS};
use crate::rank::{LeverResult, Ranking, RungResult};
use crate::short_id::short;

/// Bytes in a GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

pub use crate::rank::verdict::{fixed, pct};

/// The fidelity floors, one sentence per rung (or why there is none).
pub fn floor_lines(r: &Ranking) -> Vec<String> {
    use crate::rank::fidelity::{db, PRECISION_LEVER, REFERENCE_ENGINE};
    if r.floors.is_empty() {
        return vec![format!(
            "Floor: no floor measured (no reference bundles of {REFERENCE_ENGINE} with --lever {PRECISION_LEVER}=bf16 and =f32); changing levers are judged by min_psnr_db alone."
        )];
    }
    r.floors
        .iter()
        .map(|f| {
            format!(
                "Floor at rung {}: {} bf16-vs-f32 pair(s) of {REFERENCE_ENGINE}, median PSNR {} dB, min {} dB.",
                f.rung,
                f.pairs.len(),
                db(f.median_psnr_db),
                db(f.min_psnr_db)
            )
        })
        .collect()
}

/// What the distance-from-the-reference table says before its rows.
pub fn reference_intro() -> String {
    format!(
        "Distance from the reference: each arm's runs against the f32 run of {} from the engine's own noise with the same rung file and weights (PSNR of the first, middle and last frames; the floor above is the reference's own bf16 against the same run).",
        crate::rank::fidelity::REFERENCE_ENGINE
    )
}

/// The distance-from-the-reference table's columns.
pub const REFERENCE_HEAD: [&str; 5] = [
    "lever",
    "rung",
    "reference",
    "baseline arm",
    "treatment arm",
];

/// One row per changing lever and rung whose arms were measured against the
/// reference ([`crate::rank::fidelity::VsReference`]): lever, rung, reference
/// ids, each arm's figure (`bf16: 20.43 dB (3 runs)`, or the median and range).
pub fn reference_rows(r: &Ranking) -> Vec<[String; 5]> {
    use crate::rank::fidelity::{db, ArmDistance};
    let arm = |name: &str, a: &Option<ArmDistance>| match a {
        None => format!("{name}: no run with a reference"),
        Some(a) if a.min_psnr_db == a.max_psnr_db => {
            format!("{name}: {} dB ({} runs)", db(a.median_psnr_db), a.runs)
        }
        Some(a) => format!(
            "{name}: median {} dB, {}-{} ({} runs)",
            db(a.median_psnr_db),
            db(a.min_psnr_db),
            db(a.max_psnr_db),
            a.runs
        ),
    };
    r.levers
        .iter()
        .flat_map(|l| {
            std::iter::once(&l.reference)
                .chain(&l.other_rungs)
                .filter_map(move |x| {
                    let v = x.fidelity.vs_reference.as_ref()?;
                    let refs: Vec<&str> = v.reference_ids.iter().map(|i| short(i)).collect();
                    Some([
                        l.id.clone(),
                        x.rung.clone(),
                        refs.join(", "),
                        arm(&l.baseline, &v.baseline),
                        arm(&l.treatment, &v.treatment),
                    ])
                })
        })
        .collect()
}

/// A value in `unit` for people: `12.345 s`, `3.210 GiB`, `0.850`. Bytes under
/// 1 GiB in magnitude print in MiB (`18.234 MiB`), so that a rung-0 peak keeps
/// its digits instead of reading `0.018 GiB`.
pub fn value(x: f64, unit: Unit) -> String {
    match unit {
        Unit::Seconds => format!("{} s", fixed(x, 3)),
        Unit::Bytes if x.abs() < GIB => format!("{} MiB", fixed(x / (GIB / 1024.0), 3)),
        Unit::Bytes => format!("{} GiB", fixed(x / GIB, 3)),
        Unit::Share => fixed(x, 3),
    }
}

/// A lever's arms as the tables print them: `serial→batched`, and for a lever
/// measured with other levers' arms (the spec's `with`) the condition after
/// them: `exact→fast (precision=fp8)`.
pub fn arms_text(l: &LeverResult) -> String {
    let arms = format!("{}→{}", l.baseline, l.treatment);
    if l.with.is_empty() {
        return arms;
    }
    let with: Vec<String> = l.with.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{arms} ({})", with.join(", "))
}

/// The second-metrics table's header cells ([`second_rows`]).
pub const SECOND_HEAD: [&str; 9] = [
    "lever",
    "rung",
    "second metric",
    "pairs",
    "baseline median",
    "treatment median",
    "ratio [95%]",
    "lower / higher (sign p)",
    "left out",
];

/// One row per lever and rung whose lever names a second metric, reference rung
/// first then the others, cells as [`SECOND_HEAD`] names them: the pairs with
/// both values of the first metric's pairs, the arms' medians, the ratio with its
/// interval, the sign counts, and the pairs left out with why (`—` for none).
/// Empty when no lever names a second metric.
pub fn second_rows(r: &Ranking) -> Vec<[String; 9]> {
    let mut out = Vec::new();
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            let Some(s) = &x.second else { continue };
            let pairs = format!("{} of {}", s.pairs.len(), x.rounds.len());
            let left_out = if s.missing.is_empty() {
                "—".to_string()
            } else {
                s.missing.join("; ")
            };
            let row = match &s.effect {
                Ok(e) => [
                    l.id.clone(),
                    x.rung.clone(),
                    s.metric.clone(),
                    pairs,
                    value(e.baseline_median, s.unit),
                    value(e.treatment_median, s.unit),
                    format!(
                        "{} [{}, {}]",
                        fixed(e.ratio, 3),
                        fixed(e.ratio_ci.lo, 3),
                        fixed(e.ratio_ci.hi, 3)
                    ),
                    format!("{} / {} (p {})", e.lower, e.higher, fixed(e.sign_p, 3)),
                    left_out,
                ],
                Err(why) => [
                    l.id.clone(),
                    x.rung.clone(),
                    s.metric.clone(),
                    pairs,
                    "—".to_string(),
                    "—".to_string(),
                    "—".to_string(),
                    "—".to_string(),
                    why.clone(),
                ],
            };
            out.push(row);
        }
    }
    out
}

/// How pairs, effects, intervals and verdicts are formed, one sentence per item
/// (the report's Method list; `harness report` prints the same). The sentence on
/// hosts is there only when some lever's pairs at a rung ran on two or more hosts
/// (a single-host ranking reads as it always did).
pub fn method_lines(r: &Ranking) -> Vec<String> {
    let mut lines = vec![
        "Pairs: same campaign, round, rung, engine sha256, host, boot (one sitting of one machine), weights digest, profile and arm of every other lever; complete, uncontended runs only.".to_string(),
        format!(
            "Cache state: for a metric that reads the weights (a load phase, render wall, page-cache or unified footprint) the two runs of a pair must have started with shares of the weights in the page cache at most {:.0} points apart; other pairs are excluded, naming both shares.",
            100.0 * crate::rank::pairing::CACHE_SHARE_MAX_GAP
        ),
        "Campaigns: where several campaigns measured a lever at a rung, the newest with a pair (latest run start) decides, pooled with the campaigns of its own sitting (same boot, host, engine, weights, profile and other arms); the runs of other sittings are listed as superseded, never pooled.".to_string(),
        "Effect: geometric mean of per-pair ratios treatment/baseline; absolute saving: mean of baseline - treatment.".to_string(),
        format!(
            "Interval: {:.0}% percentile bootstrap over pairs, {} resamples, ChaCha8 seeded with {:#018x} mixed with the lever and rung.",
            CONFIDENCE * 100.0,
            r.bootstrap_resamples,
            r.bootstrap_seed
        ),
        format!("Verdict: confirmed when the saving's whole interval is at or above the minimum effect; refuted when it is wholly below; otherwise, or with fewer than {MIN_PAIRS} pairs, insufficient."),
        format!("Fidelity: a numerics-changing lever stays confirmed only when the lower end of its median PSNR's {:.0}% bootstrap interval is at or above its threshold (the measured floor minus the rule's margin, else min_psnr_db); refuted-fidelity when the whole interval is below; insufficient when it straddles or fewer than {MIN_PAIRS} pairs have comparable frames. A numerics-preserving lever whose frames differ in any pair is flagged; its verdict is unchanged.", CONFIDENCE * 100.0),
        "Sign: pairs where the treatment is lower / higher, with the exact two-sided sign-test p-value.".to_string(),
        "Second metrics: a lever's second_metric is read off the same pairs as its first and given the same effect, interval and sign test (its own bootstrap seed), described and never judged: the verdict is the first metric's.".to_string(),
        format!(
            "Flagged runs (specs/outliers.md): per lever arm and rung, a paired run is an outlier when its value is more than {:.0}% above or below its arm's median (with {MOD_Z_MIN_RUNS} or more runs in the arm, also a modified Z-score above {MOD_Z_MAX}), and first-init when its device-open seconds exceed its arm's median by more than {FIRST_INIT_FACTOR}x and {FIRST_INIT_MIN_EXCESS_S} s; arms of fewer than 3 runs flag nothing. The verdict is given with and without the pairs of flagged runs; where the two differ it is sensitive, naming the runs.",
            100.0 * RATIO_MAX
        ),
    ];
    if multi_host(r) {
        lines.push(format!(
            "Hosts (specs/hosts.md): a pair is formed within one host; where a lever's pairs at a rung ran on two or more hosts, each host's effect is estimated from its own pairs, and the pairs are pooled only when the hosts agree: the one-way F test of the hosts' mean log ratios against the within-host spread pooled over every host (Q = (k - 1) F, I² = max(0, (Q - (k - 1)) / Q)) gives p >= {}; below that the verdict is hosts-disagree and nothing is pooled; with no host holding two pairs the agreement cannot be judged and the verdict is insufficient.",
            fixed(ALPHA, 2)
        ));
    }
    lines
}

/// Whether some lever at some rung has pairs from two or more hosts.
pub fn multi_host(r: &Ranking) -> bool {
    r.levers
        .iter()
        .flat_map(|l| std::iter::once(&l.reference).chain(&l.other_rungs))
        .any(|x| x.hosts.is_some())
}

/// A result's verdict as a table cell: its label, followed where two or more hosts
/// contributed pairs by the hosts and `I²`, `confirmed (2 hosts, I² 0.0%)`.
pub fn verdict_text(x: &RungResult) -> String {
    match &x.hosts {
        Some(b) => format!("{} ({})", x.verdict.label(), hosts::short_figure(b)),
        None => x.verdict.label(),
    }
}

/// One line per lever and rung whose pairs ran on two or more hosts: the
/// heterogeneity figure and what rank did with it.
pub fn host_lines(r: &Ranking) -> Vec<String> {
    let mut out = Vec::new();
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            let Some(b) = &x.hosts else { continue };
            let what = match &b.agreement {
                Agreement::Agree => format!(
                    "the hosts agree (p >= {}): pooled over {} pair(s), verdict {}",
                    fixed(ALPHA, 2),
                    x.rounds.len(),
                    x.verdict.label()
                ),
                Agreement::Disagree => format!(
                    "the hosts disagree (p < {}): no pooled effect or verdict",
                    fixed(ALPHA, 2)
                ),
                Agreement::Untestable { why } => {
                    format!("agreement not testable: missing {why}; verdict insufficient")
                }
            };
            out.push(format!(
                "{} at rung {}: {} hosts, {} pair(s); {}; {}.",
                l.id,
                x.rung,
                b.hosts.len(),
                x.rounds.len(),
                hosts::figure(&b.heterogeneity),
                what
            ));
        }
    }
    out
}

/// What a pair's flagged runs are, `baseline 0123456789ab: outlier: ...`, `; `
/// between them; `—` when neither run is flagged.
pub fn pair_flags(x: &RungResult, p: &PairedRound, unit: Unit) -> String {
    let v: Vec<String> = x
        .flagged
        .iter()
        .filter(|f| f.id == p.baseline_id || f.id == p.treatment_id)
        .map(|f| {
            let role = if f.id == p.baseline_id {
                "baseline"
            } else {
                "treatment"
            };
            format!("{role} {}", f.describe(&|v| value(v, unit)))
        })
        .collect();
    if v.is_empty() {
        "—".to_string()
    } else {
        v.join("; ")
    }
}

/// A verdict judged without the flagged runs' pairs, in words: `confirmed over
/// 2 pairs (saving 31.0% [25.0%, 36.0%])`.
fn judged(
    v: &Verdict,
    pairs: usize,
    saving: Option<(f64, crate::rank::stats::Interval)>,
) -> String {
    match saving {
        Some((s, ci)) => format!(
            "{} over {pairs} pair(s) (saving {} [{}, {}])",
            v.name(),
            pct(s),
            pct(ci.lo),
            pct(ci.hi)
        ),
        None => format!("{} over {pairs} pair(s)", v.name()),
    }
}

/// Why a verdict is `sensitive`, or what the flagged runs change where it is
/// not: the verdict with every pair and without the flagged runs' pairs.
pub fn sensitive_why(x: &RungResult) -> String {
    let Some(w) = &x.without_flagged else {
        return String::new();
    };
    let with = match &x.verdict {
        Verdict::Sensitive { with_flagged, .. } => with_flagged.as_ref(),
        v => v,
    };
    format!(
        "with every pair {}; without the flagged runs' pairs {}",
        judged(with, x.rounds.len(), x.saving_fraction),
        judged(&w.verdict, w.pairs, w.saving_fraction)
    )
}

/// One line per lever and rung with flagged runs: the runs, why, and the
/// verdict with and without their pairs.
pub fn flagged_lines(r: &Ranking) -> Vec<String> {
    let mut out = Vec::new();
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            if x.flagged.is_empty() {
                continue;
            }
            let runs: Vec<String> = x
                .flagged
                .iter()
                .map(|f| {
                    format!(
                        "{} ({}={}) {}",
                        short(&f.id),
                        l.id,
                        f.arm,
                        f.describe(&|v| value(v, l.unit))
                    )
                })
                .collect();
            out.push(format!(
                "{} at rung {}: {}. Verdict {}: {}.",
                l.id,
                x.rung,
                runs.join("; "),
                x.verdict.label(),
                sensitive_why(x)
            ));
        }
    }
    out
}

/// The measured rank (`—` when unranked) and the prior rank with its move
/// (`3 (=)`, `5 (+1)`: prior minus measured), as the ranking's first two cells.
pub fn rank_cells(l: &LeverResult) -> (String, String) {
    let rank = l.measured_rank.map_or("—".to_string(), |r| r.to_string());
    let prior = match (l.prior_rank, l.measured_rank) {
        (Some(p), Some(m)) if p == m => format!("{p} (=)"),
        (Some(p), Some(m)) => format!("{p} ({:+})", i64::from(p) - i64::from(m)),
        (Some(p), None) => p.to_string(),
        (None, _) => "—".to_string(),
    };
    (rank, prior)
}
