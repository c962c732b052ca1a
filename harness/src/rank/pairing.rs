//! Which bundles are usable, and which baseline and treatment runs form a pair.
//!
//! A campaign's warm-up run (`schedule.warmup`, `harness campaign --warmup`) is
//! never usable: it is listed as a warm-up. Any other bundle is usable for a
//! lever when it is complete, not contended, carries a
//! `schedule` fragment naming a lever of the spec and one of its baseline or treatment
//! arms, recorded every arm of the lever's `with` (the other levers' arms it is
//! measured with: `precision=fp8` for `fp8-accum`), and has a value for the
//! lever's metric. Two usable bundles pair when they
//! share a cell: the same lever, rung, campaign, round, engine sha256, host, boot
//! (one sitting of one machine), weights digest, profile, and arm of every OTHER
//! lever. A cell with more than one run of an
//! arm keeps the lowest id and excludes the rest as duplicates; a cell with one arm
//! only leaves its run unpaired. For a metric that reads the weights (a load phase,
//! the render wall, the page-cache footprint: [`Metric::reads_weights`]) a pair whose
//! runs started with the page cache holding shares of the weights more than
//! [`CACHE_SHARE_MAX_GAP`] apart is not a pair: both runs are excluded, naming the
//! shares (an `as-is` campaign's first run inherits the previous step's warm cache,
//! the rest start cold). Where several campaigns measured a lever at a rung,
//! the newest one with a pair decides and the others' runs are superseded (a later
//! campaign re-measures: a fixed binary, another machine), except the campaigns of
//! the decider's own sitting (the same boot, host, engine, weights, profile and
//! other arms), whose pairs pool with its own (more pairs of one
//! experiment, e.g. a second campaign run to narrow an interval). Every bundle not
//! used in a pair is listed with the reason.
//!
//! Promise: the result depends on the set of bundles, not on their order.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::bundle::facts::{Bundle, Exclusion};
#[cfg(doc)]
use crate::levers_spec::Metric;
use crate::levers_spec::{Lever, LeverSpec};
use crate::rank::metric;
use crate::rank::stats::Pair;
use crate::short_id::short;

/// Everything that must match for two runs to pair, besides the lever and rung.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Cell {
    /// Campaign id.
    pub campaign: String,
    /// Round, 1-based.
    pub round: u32,
    /// Engine binary sha256.
    pub engine_sha256: String,
    /// Host key.
    pub host: String,
    /// The machine's boot: a pair's two runs come from one sitting. A campaign's
    /// id is its plan's, so the same plan run again on a fresh lent machine (same
    /// hostname, empty store) repeats its rounds; without the boot its runs would
    /// pair with the first sitting's (2026-12-06: campaign a78e49a44f9e paired a
    /// run of one machine with a run of the next).
    pub boot: String,
    /// Weights digest.
    pub weights_digest: String,
    /// Profile.
    pub profile: String,
    /// Every other lever's arm, `a=x,b=y`.
    pub other_levers: String,
}

/// The largest gap between two runs' shares (0..1) of the weight bytes in the page
/// cache at engine start that still pairs them on a metric that reads the weights.
/// A quarter of the weights read from disk instead of memory is seconds of load at
/// rung 3: the as-is host-threads campaign 7f0605dedf9a8064 paired a fully cached
/// baseline with an uncached treatment (its figures: reports/device-notes.md). Runs
/// under `--weights-cache warm` (at least 98%) or `cold` (at most 2%) always pair.
pub const CACHE_SHARE_MAX_GAP: f64 = 0.25;

type Cells<'a> = BTreeMap<Cell, (Vec<&'a Bundle>, Vec<&'a Bundle>)>;

/// The part of a [`Cell`] that names one experiment in one sitting: the cell
/// with its campaign and round blanked, so every other key (a key added to
/// [`Cell`] later included) must match. Campaigns whose cells share it measure
/// the same thing on the same machine in one boot, with the same binary and
/// weights.
fn sitting(c: &Cell) -> Cell {
    Cell {
        campaign: String::new(),
        round: 0,
        ..c.clone()
    }
}

/// Drop the first baseline and treatment of each cell (the runs that would pair)
/// while `lever`'s metric reads the weights and their recorded cache shares at start
/// differ by more than [`CACHE_SHARE_MAX_GAP`]: a duplicate run next in line is
/// checked in turn, never paired unchecked. Runs without a recorded share keep
/// pairing (bundles from before the `weights-cache` gate).
fn drop_cache_mismatched<'a>(
    by_cell: Cells<'a>,
    lever: &Lever,
    rung: &str,
    excluded: &mut Vec<Exclusion>,
) -> Cells<'a> {
    if !lever.metric.reads_weights() {
        return by_cell;
    }
    let mut kept = BTreeMap::new();
    for (cell, (mut base, mut treat)) in by_cell {
        while let (Some(&b), Some(&t)) = (base.first(), treat.first()) {
            let (Some(sb), Some(st)) = (b.cache_share_at_start, t.cache_share_at_start) else {
                break;
            };
            if (sb - st).abs() <= CACHE_SHARE_MAX_GAP {
                break;
            }
            for (run, role, other, share, other_share) in
                [(b, "baseline", t, sb, st), (t, "treatment", b, st, sb)]
            {
                excluded.push(Exclusion {
                    id: run.id.clone(),
                    reason: format!(
                        "cache state differs: in round {} of campaign {} ({} at rung {rung}) \
                         this {role} run started with {:.1}% of the weights in the page cache \
                         and {} with {:.1}%, more than {:.0} points apart, and {} reads the \
                         weights (rerun with --weights-cache warm or cold)",
                        cell.round,
                        short(&cell.campaign),
                        lever.id,
                        100.0 * share,
                        other.short_id(),
                        100.0 * other_share,
                        100.0 * CACHE_SHARE_MAX_GAP,
                        lever.metric.label()
                    ),
                });
            }
            base.remove(0);
            treat.remove(0);
        }
        kept.insert(cell, (base, treat));
    }
    kept
}

/// One paired round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairedRound {
    /// The cell both runs share.
    pub cell: Cell,
    /// The baseline run's bundle id.
    pub baseline_id: String,
    /// The treatment run's bundle id.
    pub treatment_id: String,
    /// Both runs' metric values.
    pub pair: Pair,
}

/// The pairs of one lever at one rung.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LeverRungPairs {
    /// Paired rounds, ordered by cell.
    pub rounds: Vec<PairedRound>,
    /// Usable baseline runs (paired or not).
    pub baseline_runs: usize,
    /// Usable treatment runs (paired or not).
    pub treatment_runs: usize,
    /// Output voxels of the rung (from its bundles).
    pub voxels: u64,
}

/// The pairing of a set of bundles against a spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Pairing {
    /// Pairs per (lever id, rung name).
    pub by_lever_rung: BTreeMap<(String, String), LeverRungPairs>,
    /// Bundles not used, sorted by id.
    pub excluded: Vec<Exclusion>,
}

impl Pairing {
    /// Ids of every bundle used in a pair, sorted.
    pub fn used_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .by_lever_rung
            .values()
            .flat_map(|p| p.rounds.iter())
            .flat_map(|r| [r.baseline_id.clone(), r.treatment_id.clone()])
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Why `b` cannot be used in any pair, if it cannot.
pub fn unusable(b: &Bundle, spec: &LeverSpec) -> Option<String> {
    // A warm-up is listed as one, complete or not.
    if let Some(s) = b.schedule.as_ref().filter(|s| s.warmup) {
        return Some(format!(
            "warm-up: a throw-away run of campaign {} ({}={} at rung {}) before its first round, never paired",
            short(&s.campaign),
            s.lever,
            s.arm,
            b.rung
        ));
    }
    if let Some(why) = &b.incomplete {
        return Some(format!("incomplete: {why}"));
    }
    if let Some(why) = &b.contended {
        return Some(format!("contended: {why}"));
    }
    let s = match &b.schedule {
        Some(s) => s,
        None => return Some("no schedule fragment: not a campaign run".into()),
    };
    let lever = match spec.lever(&s.lever) {
        Some(l) => l,
        None => return Some(format!("lever {:?} is not in the lever spec", s.lever)),
    };
    if s.arm != lever.baseline && s.arm != lever.treatment {
        return Some(format!(
            "arm {:?} of {} is neither the baseline {:?} nor the treatment {:?}",
            s.arm, lever.id, lever.baseline, lever.treatment
        ));
    }
    if let Some(a) = b.levers.get(&lever.id) {
        if a != &s.arm {
            return Some(format!(
                "schedule says {}={} but the levers fragment says {}={}",
                lever.id, s.arm, lever.id, a
            ));
        }
    }
    if let Some(why) = with_unmet(b, lever) {
        return Some(why);
    }
    if let Err(why) = metric::value(b, &lever.metric) {
        return Some(format!(
            "metric {} unavailable: {why}",
            lever.metric.label()
        ));
    }
    None
}

/// Why `b` was not run under `lever`'s `with` settings, if it was not: each
/// setting must be the arm `b` records for that lever ([`Bundle::assignment`]: the
/// arm passed, else the one the engine reported running). A run that records no
/// arm for the lever at all does not meet it either.
fn with_unmet(b: &Bundle, lever: &Lever) -> Option<String> {
    if lever.with.is_empty() {
        return None;
    }
    let ran = b.assignment();
    let unmet: Vec<String> = lever
        .with
        .iter()
        .filter(|(k, v)| ran.get(*k) != Some(*v))
        .map(|(k, v)| match ran.get(k) {
            Some(got) => format!("{k}={v} (it ran {k}={got})"),
            None => format!("{k}={v} (it records no arm of {k})"),
        })
        .collect();
    (!unmet.is_empty()).then(|| {
        format!(
            "not under the lever's with: {} is measured with {} in both arms, and this run \
             lacks {}",
            lever.id,
            lever
                .with
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            unmet.join(", ")
        )
    })
}

fn cell_of(b: &Bundle, lever: &Lever) -> Option<Cell> {
    let s = b.schedule.as_ref()?;
    let other_levers = b
        .levers
        .iter()
        .filter(|(k, _)| **k != lever.id)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Some(Cell {
        campaign: s.campaign.clone(),
        round: s.round,
        engine_sha256: b.engine_sha256.clone(),
        host: b.host.clone(),
        boot: b.boot_id.clone(),
        weights_digest: b.weights_digest.clone(),
        profile: b.profile.clone(),
        other_levers,
    })
}

/// Pair `bundles` (in any order) against `spec`.
pub fn pair(bundles: &[Bundle], spec: &LeverSpec) -> Pairing {
    let mut sorted: Vec<&Bundle> = bundles.iter().collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = Pairing::default();
    // (lever, rung) -> cell -> (baselines, treatments), each in id order.
    type Arms<'a> = (Vec<&'a Bundle>, Vec<&'a Bundle>);
    let mut cells: BTreeMap<(String, String), BTreeMap<Cell, Arms>> = BTreeMap::new();
    let mut prev: Option<&str> = None;
    for b in sorted {
        if prev == Some(b.id.as_str()) {
            out.excluded.push(Exclusion {
                id: b.id.clone(),
                reason: "listed twice; counted once".into(),
            });
            continue;
        }
        prev = Some(b.id.as_str());
        if let Some(reason) = unusable(b, spec) {
            out.excluded.push(Exclusion {
                id: b.id.clone(),
                reason,
            });
            continue;
        }
        // `unusable` returned None, so the schedule and lever exist.
        let (Some(s), Some(lever)) = (
            b.schedule.as_ref(),
            b.schedule.as_ref().and_then(|s| spec.lever(&s.lever)),
        ) else {
            continue;
        };
        let Some(cell) = cell_of(b, lever) else {
            continue;
        };
        let arms = cells
            .entry((lever.id.clone(), b.rung.clone()))
            .or_default()
            .entry(cell)
            .or_default();
        if s.arm == lever.baseline {
            arms.0.push(b);
        } else {
            arms.1.push(b);
        }
    }
    for ((lever_id, rung), by_cell) in cells {
        let Some(lever) = spec.lever(&lever_id) else {
            continue;
        };
        let mut lr = LeverRungPairs::default();
        let by_cell = drop_cache_mismatched(by_cell, lever, &rung, &mut out.excluded);
        let by_cell = drop_superseded(by_cell, &lever.id, &rung, &mut out.excluded);
        for (cell, (base, treat)) in by_cell {
            lr.baseline_runs += base.len();
            lr.treatment_runs += treat.len();
            for (kept, rest) in [
                (base.first(), &base[base.len().min(1)..]),
                (treat.first(), &treat[treat.len().min(1)..]),
            ] {
                for d in rest {
                    out.excluded.push(Exclusion {
                        id: d.id.clone(),
                        reason: format!(
                            "duplicate of {} in round {} of campaign {} ({} at rung {rung})",
                            kept.map_or("?", |k| k.short_id()),
                            cell.round,
                            short(&cell.campaign),
                            lever.id
                        ),
                    });
                }
            }
            match (base.first(), treat.first()) {
                (Some(b), Some(t)) => {
                    // Both values exist: `unusable` checked the metric.
                    let (Ok(bv), Ok(tv)) = (
                        metric::value(b, &lever.metric),
                        metric::value(t, &lever.metric),
                    ) else {
                        continue;
                    };
                    lr.voxels = b.voxels;
                    lr.rounds.push(PairedRound {
                        cell,
                        baseline_id: b.id.clone(),
                        treatment_id: t.id.clone(),
                        pair: Pair {
                            baseline: bv,
                            treatment: tv,
                        },
                    });
                }
                (Some(only), None) | (None, Some(only)) => {
                    let (missing_arm, role) = if treat.is_empty() {
                        (&lever.treatment, "treatment")
                    } else {
                        (&lever.baseline, "baseline")
                    };
                    lr.voxels = only.voxels;
                    out.excluded.push(Exclusion {
                        id: only.id.clone(),
                        reason: format!(
                            "unpaired: round {} of campaign {} ({} at rung {rung}) has no {role} run ({}={missing_arm})",
                            cell.round,
                            short(&cell.campaign),
                            lever.id,
                            lever.id
                        ),
                    });
                }
                (None, None) => {}
            }
        }
        out.by_lever_rung.insert((lever_id, rung), lr);
    }
    out.excluded.sort();
    out
}

/// Keep only the cells of the campaign that decides a lever at a rung, the newest
/// campaign (by the latest `run.start_unix_ns` of its usable runs; ties by campaign
/// id) among those with at least one pair, and the cells of any campaign that share
/// a sitting ([`sitting`]) with one of the decider's. Every other usable run is excluded as
/// superseded: a campaign of another sitting is a re-measurement (a fixed binary,
/// another machine or boot), and pooling it with the one that replaces it would
/// average two different experiments. Within one sitting the runs are the same
/// experiment, and each pair is still two runs of one round (the cache shares of a
/// pair are checked before this). With no paired campaign at all nothing is dropped.
fn drop_superseded<'a>(
    by_cell: BTreeMap<Cell, (Vec<&'a Bundle>, Vec<&'a Bundle>)>,
    lever: &str,
    rung: &str,
    excluded: &mut Vec<Exclusion>,
) -> BTreeMap<Cell, (Vec<&'a Bundle>, Vec<&'a Bundle>)> {
    // campaign -> (has a pair, newest start).
    let mut campaigns: BTreeMap<&str, (bool, u64)> = BTreeMap::new();
    for (cell, (base, treat)) in &by_cell {
        let e = campaigns.entry(cell.campaign.as_str()).or_default();
        e.0 |= !base.is_empty() && !treat.is_empty();
        for b in base.iter().chain(treat.iter()) {
            e.1 = e.1.max(b.start_unix_ns.unwrap_or(0));
        }
    }
    let decider = campaigns
        .iter()
        .filter(|(_, (paired, _))| *paired)
        .max_by_key(|(id, (_, newest))| (*newest, *id))
        .map(|(id, _)| id.to_string());
    let Some(decider) = decider else {
        return by_cell;
    };
    let paired_campaigns: std::collections::BTreeSet<String> = campaigns
        .iter()
        .filter(|(_, (paired, _))| *paired)
        .map(|(id, _)| id.to_string())
        .collect();
    let decider_sittings: std::collections::BTreeSet<Cell> = by_cell
        .keys()
        .filter(|c| c.campaign == decider)
        .map(sitting)
        .collect();
    let mut kept = BTreeMap::new();
    for (cell, arms) in by_cell {
        if cell.campaign == decider || decider_sittings.contains(&sitting(&cell)) {
            kept.insert(cell, arms);
            continue;
        }
        let paired = paired_campaigns.contains(&cell.campaign);
        for b in arms.0.iter().chain(arms.1.iter()) {
            let reason = if paired {
                format!(
                    "superseded: campaign {} measured {lever} at rung {rung} later; \
                     the newest campaign with a pair (with the other campaigns of its sitting) \
                     decides (this run is campaign {}, round {}, of another sitting)",
                    short(&decider),
                    short(&cell.campaign),
                    cell.round
                )
            } else {
                format!(
                    "superseded: campaign {} (this run's, round {}) has no complete pair \
                     for {lever} at rung {rung}, so campaign {}, the newest with a pair, decides",
                    short(&cell.campaign),
                    cell.round,
                    short(&decider)
                )
            };
            excluded.push(Exclusion {
                id: b.id.clone(),
                reason,
            });
        }
    }
    kept
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::bundle::facts::Schedule;
    use crate::levers_spec::LeverSpec;
    use std::path::Path;

    pub(crate) fn spec() -> LeverSpec {
        LeverSpec::parse(
            r##"
schema = 1
reference_rung = "2"
prior_rank_source = "test"
[[lever]]
id = "staging"
seed_issue = "#1"
title = "t"
arms = ["serial", "batched", "other"]
baseline = "serial"
treatment = "batched"
applies_to = ["cpu"]
metric = { kind = "phase-wall", phase = "load.dit" }
numerics = "preserving"
[lever.hypothesis]
direction = "decrease"
min_effect = 0.3
statement = "s"
refutation = "r"
next_hypothesis = "n"
"##,
            Path::new("t.toml"),
        )
        .unwrap()
    }

    /// Why `id` was excluded (empty when it was not).
    fn reason_of(p: &Pairing, id: &str) -> String {
        p.excluded
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.reason.clone())
            .unwrap_or_default()
    }

    fn run(id: &str, round: u32, arm: &str, load_s: f64) -> Bundle {
        let mut b = sample_bundle(id);
        b.schedule = Some(Schedule {
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

    /// The staging lever's pairs at rung 2, as (baseline id, treatment id).
    fn staging_pairs(p: &Pairing) -> Vec<(&str, &str)> {
        p.by_lever_rung[&("staging".to_string(), "2".to_string())]
            .rounds
            .iter()
            .map(|r| (r.baseline_id.as_str(), r.treatment_id.as_str()))
            .collect()
    }

    /// The same campaign plan run on two lent machines (one hostname, two boots):
    /// each sitting's runs pair only with their own sitting's. Dropping `boot`
    /// from the cell pairs the first sitting's lone baseline with the second's
    /// treatment (and calls the second's baseline a duplicate) and turns this red.
    #[test]
    fn runs_of_two_sittings_of_one_campaign_never_pair() {
        let in_boot = |id: &str, round: u32, arm: &str, s: f64, boot: &str| {
            let mut b = run(id, round, arm, s);
            b.boot_id = boot.into();
            b
        };
        let bundles = vec![
            // Sitting 1 lost its round-1 treatment (a pack over the tool's limit).
            in_boot("a1", 1, "serial", 10.0, "boot1"),
            in_boot("b1", 1, "serial", 12.0, "boot2"),
            in_boot("b2", 1, "batched", 11.0, "boot2"),
        ];
        let p = pair(&bundles, &spec());
        let got = staging_pairs(&p);
        assert_eq!(got, [("b1", "b2")]);
        let reason = reason_of(&p, "a1");
        assert!(
            reason.starts_with("unpaired: round 1 of campaign camp")
                && reason.contains("no treatment"),
            "{reason}"
        );
    }

    /// A warm-up of round 1's cell would pair by every other key; it never does,
    /// and is listed as a warm-up (incomplete or not).
    #[test]
    fn a_warm_up_is_never_paired_and_is_listed_as_one() {
        let mut w = run("w", 1, "serial", 30.0);
        if let Some(s) = w.schedule.as_mut() {
            s.warmup = true;
        }
        let mut wi = w.clone();
        wi.id = "wi".into();
        wi.incomplete = Some("exit killed".into());
        let bundles = vec![
            w,
            wi,
            run("a1", 1, "serial", 10.0),
            run("b1", 1, "batched", 7.0),
        ];
        let p = pair(&bundles, &spec());
        let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
        assert_eq!(lr.rounds.len(), 1);
        assert_eq!(lr.rounds[0].baseline_id, "a1");
        for id in ["w", "wi"] {
            let why = reason_of(&p, id);
            assert!(
                why.starts_with(
                    "warm-up: a throw-away run of campaign camp (staging=serial at rung 2)"
                ),
                "{id}: {why}"
            );
        }
    }

    #[test]
    fn pairs_by_round_and_excludes_with_reasons() {
        let mut bundles = vec![
            run("a1", 1, "serial", 10.0),
            run("b1", 1, "batched", 7.0),
            run("a2", 2, "serial", 11.0),
            run("b2", 2, "batched", 8.0),
            run("a3", 3, "serial", 12.0), // unpaired
            run("a2dup", 2, "serial", 99.0),
            run("x", 1, "other", 1.0),
        ];
        let mut c = run("c", 4, "serial", 1.0);
        c.contended = Some("load1 9.0".into());
        bundles.push(c);
        let mut i = run("i", 4, "batched", 1.0);
        i.incomplete = Some("exit killed".into());
        bundles.push(i);
        let mut o = run("o", 5, "batched", 1.0);
        o.host = "other-host".into(); // a different cell than a5
        bundles.push(o);
        bundles.push(run("a5", 5, "serial", 1.0));
        let mut n = sample_bundle("nosched");
        n.schedule = None;
        bundles.push(n);

        let p = pair(&bundles, &spec());
        let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
        let got: Vec<(&str, &str, f64, f64)> = lr
            .rounds
            .iter()
            .map(|r| {
                (
                    r.baseline_id.as_str(),
                    r.treatment_id.as_str(),
                    r.pair.baseline,
                    r.pair.treatment,
                )
            })
            .collect();
        assert_eq!(got, [("a1", "b1", 10.0, 7.0), ("a2", "b2", 11.0, 8.0)]);
        assert_eq!(p.used_ids(), ["a1", "a2", "b1", "b2"]);
        let reason = |id: &str| reason_of(&p, id);
        assert!(
            reason("a3").contains("no treatment run (staging=batched)"),
            "{}",
            reason("a3")
        );
        assert!(
            reason("a2dup").starts_with("duplicate of a2"),
            "{}",
            reason("a2dup")
        );
        assert!(
            reason("x").contains("neither the baseline"),
            "{}",
            reason("x")
        );
        assert!(reason("c").starts_with("contended: load1"));
        assert!(reason("i").starts_with("incomplete: exit killed"));
        assert!(reason("o").contains("no baseline run"), "{}", reason("o"));
        assert!(reason("a5").contains("no treatment run"));
        assert!(reason("nosched").contains("not a campaign run"));
        assert_eq!(p.excluded.len(), 8);
    }

    /// A run of campaign `camp`, round `round`, started at `t` seconds.
    fn run_in(camp: &str, id: &str, round: u32, arm: &str, load_s: f64, t: u64) -> Bundle {
        let mut b = run(id, round, arm, load_s);
        if let Some(s) = b.schedule.as_mut() {
            s.campaign = camp.into();
        }
        b.start_unix_ns = Some(t * 1_000_000_000);
        b
    }

    /// [`run_in`] in another boot (another sitting of the machine).
    fn run_in_boot(
        camp: &str,
        id: &str,
        round: u32,
        arm: &str,
        load_s: f64,
        t: u64,
        boot: &str,
    ) -> Bundle {
        let mut b = run_in(camp, id, round, arm, load_s, t);
        b.boot_id = boot.into();
        b
    }

    #[test]
    fn the_newest_paired_campaign_decides_and_older_ones_are_superseded() {
        // "old" (two pairs, started at t=100..103, an earlier boot) was re-measured
        // by "new" (one pair, t=200..201); "late" started last, in a later boot, but
        // has no pair, so it cannot decide.
        // Mutations that turn this red: pooling every campaign (4 pairs), picking the
        // oldest campaign, or letting an unpaired campaign decide (no pairs at all).
        let bundles = vec![
            run_in_boot("old", "o1", 1, "serial", 10.0, 100, "b-old"),
            run_in_boot("old", "o2", 1, "batched", 5.0, 101, "b-old"),
            run_in_boot("old", "o3", 2, "serial", 10.0, 102, "b-old"),
            run_in_boot("old", "o4", 2, "batched", 5.0, 103, "b-old"),
            run_in("new", "n1", 1, "serial", 10.0, 201),
            run_in("new", "n2", 1, "batched", 9.0, 200),
            run_in_boot("late", "l1", 1, "serial", 10.0, 300, "b-late"),
        ];
        let p = pair(&bundles, &spec());
        let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
        let got = staging_pairs(&p);
        assert_eq!(got, [("n1", "n2")]);
        assert_eq!((lr.baseline_runs, lr.treatment_runs), (1, 1));
        let reason = |id: &str| reason_of(&p, id);
        for id in ["o1", "o2", "o3", "o4"] {
            assert!(
                reason(id).starts_with("superseded: campaign new measured staging at rung 2"),
                "{id}: {}",
                reason(id)
            );
        }
        // "late" ran after "new": its runs must not say "new" measured later.
        assert!(
            reason("l1").starts_with(
                "superseded: campaign late (this run's, round 1) has no complete pair \
                 for staging at rung 2, so campaign new, the newest with a pair, decides"
            ),
            "{}",
            reason("l1")
        );
        assert!(
            reason("o3").contains("campaign old, round 2"),
            "{}",
            reason("o3")
        );
        // Equal start times: the campaign id breaks the tie, in any input order.
        // (Two sittings: campaigns of one sitting would pool.)
        let tie = vec![
            run_in_boot("a", "a1", 1, "serial", 10.0, 5, "boot-a"),
            run_in_boot("a", "a2", 1, "batched", 5.0, 5, "boot-a"),
            run_in_boot("b", "b1", 1, "serial", 10.0, 5, "boot-b"),
            run_in_boot("b", "b2", 1, "batched", 9.0, 5, "boot-b"),
        ];
        let mut rev = tie.clone();
        rev.reverse();
        for set in [tie, rev] {
            let p = pair(&set, &spec());
            let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
            assert_eq!(lr.rounds.len(), 1);
            assert_eq!(lr.rounds[0].baseline_id, "b1");
        }
    }

    /// Two campaigns of one sitting (same boot, host, engine, weights, profile)
    /// pool: a second campaign run to narrow the interval adds its pairs to the
    /// decider's. A campaign of the same boot with another engine binary, and one
    /// of an earlier boot, are superseded. Mutations that turn this red: dropping
    /// the sitting rule (only "b" decides: 1 pair), keying the sitting on the boot
    /// alone (the other binary's pair pools: 4 pairs), or pooling every campaign.
    #[test]
    fn campaigns_of_the_deciders_sitting_pool_and_others_are_superseded() {
        let mut other_bin = vec![
            run_in("bin", "x1", 1, "serial", 10.0, 150),
            run_in("bin", "x2", 1, "batched", 5.0, 151),
        ];
        for b in &mut other_bin {
            b.engine_sha256 = "another-binary".into();
        }
        let mut bundles = vec![
            run_in_boot("old", "o1", 1, "serial", 10.0, 50, "b-old"),
            run_in_boot("old", "o2", 1, "batched", 5.0, 51, "b-old"),
            run_in("a", "a1", 1, "serial", 10.0, 100),
            run_in("a", "a2", 1, "batched", 9.0, 101),
            run_in("a", "a3", 2, "serial", 10.0, 102),
            run_in("a", "a4", 2, "batched", 9.5, 103),
            run_in("b", "b1", 1, "serial", 10.0, 200),
            run_in("b", "b2", 1, "batched", 8.0, 201),
        ];
        bundles.extend(other_bin);
        let p = pair(&bundles, &spec());
        let got = staging_pairs(&p);
        assert_eq!(got, [("a1", "a2"), ("a3", "a4"), ("b1", "b2")]);
        for id in ["o1", "o2", "x1", "x2"] {
            let r = reason_of(&p, id);
            assert!(
                r.starts_with("superseded: campaign b measured staging at rung 2")
                    && r.contains("of another sitting"),
                "{id}: {r}"
            );
        }
    }

    #[test]
    fn order_of_bundles_does_not_matter() {
        let mut bundles: Vec<Bundle> = (1..=6)
            .flat_map(|r| {
                [
                    run(&format!("s{r}"), r, "serial", 10.0 + r as f64),
                    run(&format!("t{r}"), r, "batched", 7.0 + r as f64),
                ]
            })
            .collect();
        bundles.push(run("dup", 3, "batched", 1.0));
        let a = pair(&bundles, &spec());
        bundles.reverse();
        bundles.swap(1, 5);
        let b = pair(&bundles, &spec());
        assert_eq!(a, b);
        assert_eq!(a.by_lever_rung.values().next().unwrap().rounds.len(), 6);
    }

    /// The as-is host-threads campaign at rung 3, in miniature: round 1's baseline
    /// inherited a warm cache, its treatment started cold. Mutations that turn this
    /// red: no check (3 pairs), a check on every metric (the denoise pair goes), a
    /// gap compared without abs (only one direction caught).
    #[test]
    fn a_pair_started_in_different_cache_states_is_not_a_pair_for_a_weights_metric() {
        let with = |id: &str, round: u32, arm: &str, share: Option<f64>| {
            let mut b = run(id, round, arm, 10.0);
            b.cache_share_at_start = share;
            b
        };
        let bundles = vec![
            with("a1", 1, "serial", Some(1.0)),
            with("b1", 1, "batched", Some(0.0)),
            with("a2", 2, "serial", Some(0.0)),
            with("b2", 2, "batched", Some(0.9)),
            with("a3", 3, "serial", Some(0.037)),
            with("b3", 3, "batched", Some(0.0)),
            with("a4", 4, "serial", None),
            with("b4", 4, "batched", Some(1.0)),
        ];
        let p = pair(&bundles, &spec());
        let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
        let rounds: Vec<u32> = lr.rounds.iter().map(|r| r.cell.round).collect();
        assert_eq!(
            rounds,
            [3, 4],
            "3.7% vs 0% pairs; an unrecorded share pairs"
        );
        let r = reason_of(&p, "a1");
        assert!(
            r.starts_with("cache state differs: in round 1 of campaign camp")
                && r.contains("this baseline run started with 100.0%")
                && r.contains("b1 with 0.0%")
                && r.contains("wall(load.dit) reads the weights"),
            "{r}"
        );
        assert!(reason_of(&p, "b2").contains("this treatment run started with 90.0%"));
        assert_eq!(p.excluded.len(), 4, "{:?}", p.excluded);

        // Duplicates next in line are checked in turn, never paired unchecked: a1/b1
        // are 100 points apart, then a1b/b1b too, so round 1 has no pair at all.
        let mut dup = bundles.clone();
        dup.push(with("a1b", 1, "serial", Some(0.0)));
        dup.push(with("b1b", 1, "batched", Some(1.0)));
        let p = pair(&dup, &spec());
        let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
        assert!(
            lr.rounds.iter().all(|r| r.cell.round != 1),
            "{:?}",
            lr.rounds
        );
        assert!(
            reason_of(&p, "a1b").starts_with("cache state differs"),
            "{}",
            reason_of(&p, "a1b")
        );
        assert!(reason_of(&p, "b1b").starts_with("cache state differs"));
        // ...and one that matches its partner pairs once the mismatched pair is gone.
        let mut dup = bundles.clone();
        dup.push(with("a1b", 1, "serial", Some(0.0)));
        let p = pair(&dup, &spec());
        let lr = &p.by_lever_rung[&("staging".to_string(), "2".to_string())];
        let r1: Vec<_> = lr.rounds.iter().filter(|r| r.cell.round == 1).collect();
        assert_eq!(
            r1.len(),
            0,
            "b1 was dropped with a1; a1b has no treatment left"
        );
        assert!(
            reason_of(&p, "a1b").contains("no treatment run"),
            "{}",
            reason_of(&p, "a1b")
        );

        // A metric that does not read the weights keeps every pair.
        let mut s = spec();
        s.levers[0].metric = crate::levers_spec::Metric::PhaseWall {
            phase: "denoise".into(),
        };
        let p = pair(&bundles, &s);
        assert_eq!(p.by_lever_rung.values().next().unwrap().rounds.len(), 4);
        assert!(p.excluded.is_empty(), "{:?}", p.excluded);
    }

    /// A lever measured `with` another lever's arm pairs only runs that recorded
    /// that arm, passed or reported by the engine; the others are excluded naming
    /// the setting and what the run had. Mutations that turn this red: the check
    /// dropped (round 4's runs, which record no vae arm, pair; b2 is merely
    /// unpaired), reading only the passed arms (`b.levers`: round 3's runs, whose
    /// engine reported vae=device, are excluded).
    #[test]
    fn a_lever_with_a_with_pairs_only_runs_that_recorded_it() {
        let mut s = spec();
        s.levers[0].with = BTreeMap::from([("vae".to_string(), "device".to_string())]);
        let passed = |id: &str, round: u32, arm: &str, vae: &str| {
            let mut b = run(id, round, arm, 10.0);
            b.levers.insert("vae".into(), vae.into());
            b
        };
        let reported = |id: &str, round: u32, arm: &str| {
            let mut b = run(id, round, arm, 10.0);
            b.arms.insert("vae".into(), "device".into());
            b
        };
        let bundles = vec![
            passed("a1", 1, "serial", "device"),
            passed("b1", 1, "batched", "device"),
            passed("a2", 2, "serial", "device"),
            passed("b2", 2, "batched", "host"),
            reported("a3", 3, "serial"),
            reported("b3", 3, "batched"),
            run("a4", 4, "serial", 10.0),
            run("b4", 4, "batched", 10.0),
        ];
        let p = pair(&bundles, &s);
        assert_eq!(staging_pairs(&p), [("a1", "b1"), ("a3", "b3")]);
        assert_eq!(
            reason_of(&p, "b2"),
            "not under the lever's with: staging is measured with vae=device in both arms, \
             and this run lacks vae=device (it ran vae=host)"
        );
        assert!(
            reason_of(&p, "a2").starts_with("unpaired: round 2"),
            "{}",
            reason_of(&p, "a2")
        );
        for id in ["a4", "b4"] {
            let r = reason_of(&p, id);
            assert!(
                r.starts_with("not under the lever's with: staging")
                    && r.ends_with("lacks vae=device (it records no arm of vae)"),
                "{id}: {r}"
            );
        }
        assert_eq!(p.excluded.len(), 4, "{:?}", p.excluded);
        // Without a `with`, round 4 pairs as any round does.
        let plain = pair(&bundles[6..], &spec());
        assert_eq!(staging_pairs(&plain), [("a4", "b4")]);
    }

    #[test]
    fn other_levers_and_metric_gaps_split_or_exclude() {
        let a = run("a", 1, "serial", 10.0);
        let mut b = run("b", 1, "batched", 7.0);
        b.levers.insert("vae".into(), "device".into());
        let mut m = run("m", 2, "serial", 10.0);
        m.phases.retain(|p| p.name != "load.dit");
        let p = pair(&[a, b, m], &spec());
        assert!(p.by_lever_rung.values().all(|l| l.rounds.is_empty()));
        assert!(p
            .excluded
            .iter()
            .any(|e| e.id == "m" && e.reason.contains("metric wall(load.dit) unavailable")));
        assert_eq!(p.excluded.len(), 3);
    }
}
