//! The lever ranking as a pure function of named bundles: arithmetic only; the
//! command is [`crate::cmd::rank`], its formats live in [`crate::formats`].
//!
//! It works on [`Bundle`]s as [`crate::bundle`] reads them: [`metric`] reads a
//! lever's metric off one bundle; [`pairing`] forms baseline/treatment pairs;
//! [`stats`] computes each lever's paired effect with a [`bootstrap`] interval;
//! [`fidelity`] compares each pair's frames ([`pixels`]: PSNR and max abs error)
//! and checks them against the lever's numerics; [`verdict`] judges both against
//! the hypothesis and fidelity rule in `specs/levers.toml`; [`outliers`] names the
//! runs far from their arm's median (or first-initialization ones), and the
//! verdict is given with and without their pairs (`sensitive` where the two
//! differ, `specs/outliers.md`); [`hosts`] blocks the pairs by host where two or
//! more hosts contributed, estimates each host's effect and pools only when
//! [`heterogeneity`] finds no disagreement (`specs/hosts.md`); [`fit`] fits
//! each phase as fixed + per-voxel cost; [`second`] describes a lever's second
//! metric over the same pairs. [`rank`] ties them together.
//!
//! Promise: the same set of bundles gives the same [`Ranking`] (and the same report
//! bytes) in any order: bundles are sorted by id, maps are ordered, the bootstrap is
//! seeded per lever and rung, and no clock is read.

pub mod bootstrap;
pub mod fidelity;
pub mod fit;
pub mod heterogeneity;
pub mod hosts;
pub mod metric;
pub mod outliers;
pub mod pairing;
pub mod pixels;
pub mod second;
pub mod stats;
pub mod verdict;

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

use crate::bundle::facts::{Bundle, Exclusion};
use crate::levers_spec::{Direction, Lever, LeverSpec, Numerics, Unit};
use fidelity::{Floor, RungFidelity};
use fit::{NoFit, ScalingFit};
use hosts::{Agreement, HostBlocks};
use outliers::RunFlag;
use pairing::{LeverRungPairs, PairedRound};
use stats::{Interval, PairedEffect};
use verdict::Verdict;

/// One lever at one rung.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RungResult {
    /// Rung name.
    pub rung: String,
    /// Output voxels of the rung (0 when no bundle of it was seen).
    pub voxels: u64,
    /// Usable baseline runs.
    pub baseline_runs: usize,
    /// Usable treatment runs.
    pub treatment_runs: usize,
    /// The paired effect, when at least one pair exists and its values are
    /// defined, and the hosts do not disagree (pooled over every host's pairs).
    pub effect: Option<PairedEffect>,
    /// Fractional saving in the hypothesised direction, and its interval.
    pub saving_fraction: Option<(f64, Interval)>,
    /// The verdict.
    pub verdict: Verdict,
    /// The pairs, with their bundle ids.
    pub rounds: Vec<PairedRound>,
    /// The pairs' frames compared: PSNR, max abs error, flags and the fidelity rule.
    pub fidelity: RungFidelity,
    /// Runs flagged as outliers or first-init ([`outliers`]), baseline arm first.
    pub flagged: Vec<RunFlag>,
    /// The judgement without the pairs of flagged runs; `None` when no run is
    /// flagged.
    pub without_flagged: Option<WithoutFlagged>,
    /// The lever's second metric over the same pairs, described and not judged
    /// ([`second`]); `None` when the lever names none.
    pub second: Option<second::SecondResult>,
    /// The pairs blocked by host, each host's effect and whether the hosts agree;
    /// `None` when every pair ran on one host.
    pub hosts: Option<HostBlocks>,
}

/// A lever at a rung judged without the pairs that hold a flagged run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WithoutFlagged {
    /// The pairs left.
    pub pairs: usize,
    /// Fractional saving and its interval over those pairs, when defined.
    pub saving_fraction: Option<(f64, Interval)>,
    /// The verdict over those pairs.
    pub verdict: Verdict,
}

/// One lever's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeverResult {
    /// Lever id.
    pub id: String,
    /// Seed issue.
    pub seed_issue: String,
    /// Metric label (`wall(load.dit)`).
    pub metric: String,
    /// The metric's unit.
    pub unit: Unit,
    /// Baseline arm.
    pub baseline: String,
    /// Treatment arm.
    pub treatment: String,
    /// The other levers' arms it is measured with (the spec's `with`; only runs
    /// that recorded them pair). Absent from the JSON when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub with: BTreeMap<String, String>,
    /// Hypothesised direction.
    pub direction: Direction,
    /// Minimum effect (fraction of baseline).
    pub min_effect: f64,
    /// Whether the arms compute the same frames.
    pub numerics: Numerics,
    /// Prior rank from the seed, where one exists.
    pub prior_rank: Option<u32>,
    /// Measured rank at the reference rung, when a verdict-grade estimate exists.
    pub measured_rank: Option<u32>,
    /// The result at the reference rung.
    pub reference: RungResult,
    /// Results at other rungs, by rung name.
    pub other_rungs: Vec<RungResult>,
}

/// The phase-scaling section: the fits, or what is missing for one.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FitOutcome {
    /// One fit per model (weights and device) that has a group to fit, the
    /// smallest voxel count first; never empty ([`fit::fit`]).
    Fit(Vec<ScalingFit>),
    /// No fit could be made.
    Missing(NoFit),
}

/// The whole ranking.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranking {
    /// The command that regenerates this report.
    pub command: String,
    /// The reference rung.
    pub reference_rung: String,
    /// Where the prior ranks come from.
    pub prior_rank_source: String,
    /// Levers: ranked ones by measured rank, then the rest in spec order.
    pub levers: Vec<LeverResult>,
    /// Phase scaling.
    pub fit: FitOutcome,
    /// Bundles seen (readable or not).
    pub bundles_seen: usize,
    /// `sha256:` over the sorted ids of the bundles that verified, one per line:
    /// each id is the sha256 of a manifest that lists every file's sha256, so the
    /// digest covers the content read. A bundle that does not verify counts as
    /// seen and excluded, never in the digest.
    pub input_digest: String,
    /// Ids of the bundles used in a pair, sorted.
    pub used: Vec<String>,
    /// Pairs of a numerics-preserving lever whose frames differ, one line each
    /// (a bug detector), in lever and rung order.
    pub fidelity_flags: Vec<String>,
    /// The fidelity floors measured (the reference's bf16 vs f32 frames), by rung.
    pub floors: Vec<Floor>,
    /// Bundles not used, with the reason, sorted by id.
    pub excluded: Vec<Exclusion>,
    /// Bootstrap resamples per interval.
    pub bootstrap_resamples: usize,
    /// Base bootstrap seed.
    pub bootstrap_seed: u64,
}

/// Rank `bundles` (any order) against `spec`. `unreadable` lists bundles that
/// verified but could not be loaded, `unverified` those that do not verify (both
/// listed as excluded; only the first count in the input digest); `command` is
/// printed as the regenerating command.
pub fn rank(
    spec: &LeverSpec,
    bundles: &[Bundle],
    unreadable: &[Exclusion],
    unverified: &[Exclusion],
    command: &str,
) -> Ranking {
    let pairing = pairing::pair(bundles, spec);
    let devices = rung_devices(bundles);
    let floors = fidelity::floors(bundles);
    let references = fidelity::references(bundles);
    let by_id: BTreeMap<&str, &Bundle> = bundles.iter().map(|b| (b.id.as_str(), b)).collect();
    let ctx = Context {
        pairing: &pairing,
        devices: &devices,
        floors: &floors,
        references: &references,
        by_id: &by_id,
    };
    let mut levers: Vec<LeverResult> = spec
        .levers
        .iter()
        .map(|l| lever_result(spec, l, &ctx))
        .collect();
    let fidelity_flags: Vec<String> = levers
        .iter()
        .flat_map(|l| std::iter::once(&l.reference).chain(&l.other_rungs))
        .flat_map(|x| x.fidelity.flagged.iter().cloned())
        .collect();
    // Measured rank: verdict-grade estimates at the reference rung, by fractional
    // saving (largest first), ties by id.
    let mut ranked: Vec<(f64, String)> = levers
        .iter()
        .filter(|l| {
            l.reference
                .effect
                .as_ref()
                .is_some_and(|e| e.n >= verdict::MIN_PAIRS)
        })
        .filter_map(|l| l.reference.saving_fraction.map(|(s, _)| (s, l.id.clone())))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    for (i, (_, id)) in ranked.iter().enumerate() {
        if let Some(l) = levers.iter_mut().find(|l| &l.id == id) {
            l.measured_rank = Some(i as u32 + 1);
        }
    }
    let spec_pos = |id: &str| {
        spec.levers
            .iter()
            .position(|l| l.id == id)
            .unwrap_or(usize::MAX)
    };
    levers.sort_by_key(|l| (l.measured_rank.unwrap_or(u32::MAX), spec_pos(&l.id)));

    let mut excluded = pairing.excluded.clone();
    excluded.extend(unreadable.iter().cloned());
    excluded.extend(unverified.iter().cloned());
    excluded.sort();
    let mut read: Vec<&str> = bundles
        .iter()
        .map(|b| b.id.as_str())
        .chain(unreadable.iter().map(|e| e.id.as_str()))
        .collect();
    read.sort_unstable();
    read.dedup();
    let mut seen = read.clone();
    seen.extend(unverified.iter().map(|e| e.id.as_str()));
    seen.sort_unstable();
    seen.dedup();
    let mut h = Sha256::new();
    for id in &read {
        h.update(id.as_bytes());
        h.update(b"\n");
    }
    let input_digest = format!("sha256:{:x}", h.finalize());
    Ranking {
        command: command.to_string(),
        reference_rung: spec.reference_rung.clone(),
        prior_rank_source: spec.prior_rank_source.clone(),
        levers,
        fit: match fit::fit(bundles) {
            Ok(f) => FitOutcome::Fit(f),
            Err(m) => FitOutcome::Missing(m),
        },
        bundles_seen: seen.len(),
        input_digest,
        used: pairing.used_ids(),
        fidelity_flags,
        floors: floors.into_values().collect(),
        excluded,
        bootstrap_resamples: stats::BOOTSTRAP_RESAMPLES,
        bootstrap_seed: stats::BOOTSTRAP_SEED,
    }
}

/// The devices each rung's bundles ran on (`rung.config.device`), by rung name;
/// bundles that do not record one are left out.
fn rung_devices(bundles: &[Bundle]) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for b in bundles {
        if let Some(d) = &b.device {
            m.entry(b.rung.clone()).or_default().insert(d.clone());
        }
    }
    m
}

/// Why `l` does not apply at `rung`: every bundle of the rung ran on a device the
/// lever's arms do not differ on. `None` when it applies, or when no bundle says
/// where the rung runs.
fn not_applicable(
    l: &Lever,
    rung: &str,
    devices: &BTreeMap<String, BTreeSet<String>>,
) -> Option<String> {
    let ds = devices.get(rung).filter(|d| !d.is_empty())?;
    let applies: Vec<&str> = l.applies_to.iter().map(|d| d.as_str()).collect();
    if ds.iter().any(|d| applies.contains(&d.as_str())) {
        return None;
    }
    Some(format!(
        "{} applies to {} and rung {rung} runs on {}",
        l.id,
        applies.join(", "),
        ds.iter().cloned().collect::<Vec<_>>().join(", ")
    ))
}

/// What every lever's result is computed from.
struct Context<'a> {
    pairing: &'a pairing::Pairing,
    devices: &'a BTreeMap<String, BTreeSet<String>>,
    floors: &'a BTreeMap<String, Floor>,
    references: &'a fidelity::References<'a>,
    by_id: &'a BTreeMap<&'a str, &'a Bundle>,
}

fn lever_result(spec: &LeverSpec, l: &Lever, ctx: &Context) -> LeverResult {
    let (p, devices) = (ctx.pairing, ctx.devices);
    let at = |rung: &str| {
        let mut r = rung_result(
            l,
            rung,
            p.by_lever_rung.get(&(l.id.clone(), rung.into())),
            ctx,
        );
        if r.baseline_runs + r.treatment_runs == 0 {
            if let Some(why) = not_applicable(l, rung, devices) {
                r.verdict = Verdict::NotApplicable { why };
            }
        }
        r
    };
    let reference = at(spec.reference_rung.as_str());
    let other_rungs = p
        .by_lever_rung
        .keys()
        .filter(|(id, r)| id == &l.id && r != &spec.reference_rung)
        .map(|(_, r)| at(r.as_str()))
        .collect();
    LeverResult {
        id: l.id.clone(),
        seed_issue: l.seed_issue.clone(),
        metric: l.metric.label(),
        unit: l.metric.unit(),
        baseline: l.baseline.clone(),
        treatment: l.treatment.clone(),
        with: l.with.clone(),
        direction: l.hypothesis.direction,
        min_effect: l.hypothesis.min_effect,
        numerics: l.numerics,
        prior_rank: l.prior_rank,
        measured_rank: None,
        reference,
        other_rungs,
    }
}

fn rung_result(l: &Lever, rung: &str, lr: Option<&LeverRungPairs>, ctx: &Context) -> RungResult {
    let empty = LeverRungPairs::default();
    let lr = lr.unwrap_or(&empty);
    let pairs: Vec<stats::Pair> = lr.rounds.iter().map(|r| r.pair).collect();
    let computed = if pairs.is_empty() {
        Err(missing_pairs(l, rung, lr))
    } else {
        stats::paired_effect(
            &pairs,
            stats::seed_for(&l.id, rung),
            stats::BOOTSTRAP_RESAMPLES,
        )
        .map_err(|e| format!("a defined ratio for every pair ({e})"))
    };
    let frames: Vec<(&Bundle, &Bundle)> = lr
        .rounds
        .iter()
        .filter_map(|r| {
            Some((
                *ctx.by_id.get(r.baseline_id.as_str())?,
                *ctx.by_id.get(r.treatment_id.as_str())?,
            ))
        })
        .collect();
    let fidelity = fidelity::rung_fidelity(l, rung, &frames, ctx.floors.get(rung), ctx.references);
    let with_flagged = verdict::with_fidelity(
        verdict::judge(&l.hypothesis, computed.as_ref().map_err(String::as_str)),
        fidelity.rule.as_ref(),
    );
    let hosts = hosts::blocks(l, rung, &lr.rounds);
    // A run is far from its arm's median on its own host: one host slower than
    // another is what the host blocks judge, not an outlier.
    let mut by_host: BTreeMap<&str, Vec<PairedRound>> = BTreeMap::new();
    for r in &lr.rounds {
        by_host
            .entry(r.cell.host.as_str())
            .or_default()
            .push(r.clone());
    }
    let flagged: Vec<RunFlag> = by_host
        .values()
        .flat_map(|rounds| {
            outliers::flag(
                rounds,
                (&l.baseline, &l.treatment),
                l.metric.unit() == Unit::Seconds,
                ctx.by_id,
            )
        })
        .collect();
    let mut runs: Vec<String> = flagged.iter().map(|f| f.id.clone()).collect();
    runs.sort();
    runs.dedup();
    let without_flagged = (!runs.is_empty()).then(|| {
        let kept: Vec<stats::Pair> = lr
            .rounds
            .iter()
            .filter(|r| !runs.contains(&r.baseline_id) && !runs.contains(&r.treatment_id))
            .map(|r| r.pair)
            .collect();
        let e = if kept.is_empty() {
            Err("a pair without a flagged run: every pair holds one".to_string())
        } else {
            stats::paired_effect(
                &kept,
                stats::seed_for(&l.id, rung),
                stats::BOOTSTRAP_RESAMPLES,
            )
            .map_err(|e| format!("a defined ratio for every pair ({e})"))
        };
        WithoutFlagged {
            pairs: kept.len(),
            saving_fraction: e
                .as_ref()
                .ok()
                .map(|e| verdict::saving_fraction(l.hypothesis.direction, e)),
            verdict: verdict::with_fidelity(
                verdict::judge(&l.hypothesis, e.as_ref().map_err(String::as_str)),
                fidelity.rule.as_ref(),
            ),
        }
    });
    let verdict = verdict::with_outliers(
        with_flagged,
        without_flagged.as_ref().map(|w| w.verdict.clone()),
        &runs,
    );
    let mut effect = computed.ok();
    // Pooled only when the hosts agree (module [`hosts`]).
    let verdict = match hosts.as_ref() {
        Some(b) if b.agreement == Agreement::Disagree => {
            effect = None;
            hosts::disagreement(b)
        }
        Some(HostBlocks {
            agreement: Agreement::Untestable { why },
            ..
        }) => Verdict::Insufficient {
            missing: why.clone(),
        },
        _ => verdict,
    };
    RungResult {
        rung: rung.to_string(),
        voxels: lr.voxels,
        baseline_runs: lr.baseline_runs,
        treatment_runs: lr.treatment_runs,
        saving_fraction: effect
            .as_ref()
            .map(|e| verdict::saving_fraction(l.hypothesis.direction, e)),
        effect,
        verdict,
        rounds: lr.rounds.clone(),
        fidelity,
        flagged,
        without_flagged,
        second: second::second(l, rung, &lr.rounds, ctx.by_id),
        hosts,
    }
}

/// What evidence is missing when a lever has no pair at a rung.
fn missing_pairs(l: &Lever, rung: &str, lr: &LeverRungPairs) -> String {
    let regen = format!("harness campaign --rungs {rung} --levers {}", l.id);
    match (lr.baseline_runs, lr.treatment_runs) {
        (0, 0) => format!(
            "usable campaign runs of {} at rung {rung}: none found (run `{regen}`)",
            l.id
        ),
        (b, 0) => format!(
            "the treatment arm {}={} at rung {rung}: {b} baseline run(s), no treatment run",
            l.id, l.treatment
        ),
        (0, t) => format!(
            "the baseline arm {}={} at rung {rung}: {t} treatment run(s), no baseline run",
            l.id, l.baseline
        ),
        (b, t) => format!(
            "pairs at rung {rung}: {b} baseline and {t} treatment run(s) share no round, engine, host and weights"
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::rank::pairing::tests::spec;

    fn verdict_at_reference(device: Option<&str>) -> Verdict {
        // The test spec's lever `staging` applies to the CPU arm only; the bundle
        // is not a campaign run, so it never pairs.
        let mut b = sample_bundle("x");
        b.device = device.map(str::to_string);
        let r = rank(&spec(), &[b], &[], &[], "t");
        r.levers[0].reference.verdict.clone()
    }

    /// A campaign run of the test spec's `staging` lever on `host`, round `round`,
    /// with `load_s` seconds of `load.dit`.
    pub(crate) fn on_host(host: &str, round: u32, arm: &str, load_s: f64) -> Bundle {
        let mut b = sample_bundle(&format!("{host}-{round}-{arm}"));
        b.host = format!("{host}|cpu|gpu");
        b.schedule = Some(crate::bundle::facts::Schedule {
            campaign: "camp".into(),
            round,
            position: 0,
            arm: arm.into(),
            lever: "staging".into(),
            seed: 1,
            warmup: false,
        });
        b.levers.insert("staging".into(), arm.into());
        b.phases[0].duration_s = Some(load_s);
        b
    }

    /// Three rounds on each of two hosts: host `a` with the treatment's load.dit
    /// at `a_ratio` of the baseline's, `b` at `b_ratio`, each with +-1% noise.
    pub(crate) fn two_hosts(a_ratio: f64, b_ratio: f64) -> LeverResult {
        let mut bundles = Vec::new();
        for (host, ratio) in [("a", a_ratio), ("b", b_ratio)] {
            for (round, noise) in [(1, 1.0), (2, 1.01), (3, 0.99)] {
                bundles.push(on_host(host, round, "serial", 10.0));
                bundles.push(on_host(host, round, "batched", 10.0 * ratio * noise));
            }
        }
        let r = rank(&spec(), &bundles, &[], &[], "t");
        r.levers[0].clone()
    }

    /// Issue 38: host `a` saves 50%, host `b` nothing. Pooled, the six pairs
    /// would give a saving near 29% whose interval straddles the 30% minimum; the
    /// hosts are judged apart instead, and rank says they disagree. Mutation that
    /// turns this red: pooling regardless of the agreement (the `Disagree` arm
    /// in `rung_result` falling through to the pooled verdict: `insufficient`,
    /// tried).
    #[test]
    fn hosts_whose_effects_disagree_get_no_pooled_verdict() {
        let l = two_hosts(0.5, 1.0);
        let x = &l.reference;
        let b = x.hosts.as_ref().expect("two hosts are blocked");
        assert_eq!(b.agreement, Agreement::Disagree);
        let Verdict::HostsDisagree { why } = &x.verdict else {
            panic!("want hosts-disagree, got {:?}", x.verdict);
        };
        assert!(
            why.contains("a 50.0% [") && why.contains("b 0.0% ["),
            "{why}"
        );
        assert_eq!(x.verdict.name(), "hosts-disagree");
        assert_eq!((x.effect.as_ref(), x.saving_fraction), (None, None));
        let per_host: Vec<(&str, &str)> = b
            .hosts
            .iter()
            .map(|h| (h.label.as_str(), h.verdict.name()))
            .collect();
        assert_eq!(per_host, [("a", "confirmed"), ("b", "refuted")]);
        assert!(b.heterogeneity.i2.is_some_and(|i2| i2 > 0.99));
        assert_eq!(x.rounds.len(), 6, "every pair kept, each within its host");
        assert!(x.rounds.iter().all(|r| r.cell.host.starts_with(
            if r.baseline_id.starts_with('a') {
                "a|"
            } else {
                "b|"
            }
        )));
        // Unranked: there is no pooled estimate to rank by.
        assert_eq!(l.measured_rank, None);
    }

    /// Both hosts save 50% with their own noise: the hosts agree, the six pairs
    /// are pooled and judged as one effect, and the figure says so.
    #[test]
    fn hosts_that_agree_are_pooled() {
        let l = two_hosts(0.5, 0.5);
        let x = &l.reference;
        let b = x.hosts.as_ref().expect("two hosts are blocked");
        assert_eq!(b.agreement, Agreement::Agree);
        assert_eq!(x.verdict, Verdict::Confirmed);
        let e = x.effect.as_ref().expect("a pooled effect");
        assert_eq!(e.n, 6);
        assert!((e.ratio - 0.5).abs() < 0.01, "{}", e.ratio);
        assert_eq!(b.heterogeneity.i2, Some(0.0));
        assert!(b.heterogeneity.p.is_some_and(|p| p > 0.9), "{b:?}");
        assert_eq!(l.measured_rank, Some(1));
        // The same pairs on one host rank exactly as before hosts were blocked.
        let mut one = Vec::new();
        for (round, noise) in [(1, 1.0), (2, 1.01), (3, 0.99)] {
            one.push(on_host("a", round, "serial", 10.0));
            one.push(on_host("a", round, "batched", 5.0 * noise));
        }
        let r = rank(&spec(), &one, &[], &[], "t");
        assert_eq!(r.levers[0].reference.hosts, None);
        assert_eq!(r.levers[0].reference.verdict, Verdict::Confirmed);
    }

    #[test]
    fn a_lever_for_another_device_is_not_applicable_at_the_rung() {
        match verdict_at_reference(Some("cuda")) {
            Verdict::NotApplicable { why } => {
                assert_eq!(why, "staging applies to cpu and rung 2 runs on cuda")
            }
            v => panic!("want n/a, got {v:?}"),
        }
        // Where it applies, or where no bundle says the device, evidence is missing.
        for d in [Some("cpu"), None] {
            assert!(
                matches!(verdict_at_reference(d), Verdict::Insufficient { .. }),
                "{d:?}"
            );
        }
    }
}
