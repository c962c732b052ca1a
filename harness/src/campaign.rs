//! `harness campaign`: every selected lever's baseline and treatment arms, interleaved
//! round by round on one engine binary, resumable after an interruption.
//!
//! The schedule is a pure function of the campaign's arguments: rounds are the outer
//! loop (so drift spreads over every lever and an interruption leaves whole rounds
//! behind), then rungs, then levers, then the two arms in an order that is either
//! ABBA (baseline first in odd rounds, treatment first in even ones) or drawn per
//! (round, rung, lever) from a ChaCha8 stream seeded with `--seed`. A lever is
//! scheduled only on rungs whose device it applies to. Each run carries its place in
//! the `schedule` manifest fragment `{campaign, round, position, arm, lever, seed}`.
//!
//! The campaign id is a hash of everything that shapes the schedule (engine sha256,
//! rung files' sha256, levers, repeat, order, seed), so the same command on the same
//! binary names the same campaign. Resuming skips every position that already has a
//! sealed, complete bundle of that campaign; an incomplete one is run again.
//!
//! A run refused by a gate stops the campaign cleanly: nothing further is started and
//! the outcome says where it stopped and why.

use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::bundle::facts::Bundle;
use crate::levers_spec::{DeviceKind, Lever};
use crate::weights_cache::Policy as WeightsCache;

/// How the two arms of a lever are ordered within a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Baseline first in odd rounds, treatment first in even rounds.
    Abba,
    /// A seeded coin flip per round, rung and lever.
    Random,
}

/// A rung the campaign runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RungRef {
    /// The rung's name as bundles record it (`rung.name`).
    pub name: String,
    /// Its file.
    pub path: PathBuf,
    /// sha256 of the file's bytes (hex).
    pub sha256: String,
    /// Its device.
    pub device: DeviceKind,
}

/// One run of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// 0-based position in the whole schedule.
    pub position: u32,
    /// 1-based round.
    pub round: u32,
    /// Rung name.
    pub rung: String,
    /// Lever id.
    pub lever: String,
    /// Arm of the lever for this run.
    pub arm: String,
}

/// A lever left out at a rung, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skip {
    /// Lever id.
    pub lever: String,
    /// Rung name.
    pub rung: String,
    /// Why.
    pub why: String,
}

/// A campaign's whole schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Campaign id (hex, 16 characters).
    pub id: String,
    /// Seed of the arm order (recorded even under ABBA).
    pub seed: u64,
    /// Arm order.
    pub order: Order,
    /// Rounds.
    pub repeat: u32,
    /// The entries, by position.
    pub entries: Vec<Entry>,
    /// Levers left out at a rung.
    pub skipped: Vec<Skip>,
}

impl Plan {
    /// The `schedule` manifest fragment of `e`.
    pub fn fragment(&self, e: &Entry) -> serde_json::Value {
        serde_json::json!({
            "campaign": self.id,
            "round": e.round,
            "position": e.position,
            "arm": e.arm,
            "lever": e.lever,
            "seed": self.seed,
        })
    }
}

/// Build the schedule. `engine_sha256` is the binary every run uses.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    engine_sha256: &str,
    rungs: &[RungRef],
    levers: &[&Lever],
    repeat: u32,
    order: Order,
    seed: u64,
    weights_cache: WeightsCache,
) -> Plan {
    let mut h = Sha256::new();
    h.update(format!("harness campaign v1\nengine {engine_sha256}\n"));
    for r in rungs {
        h.update(format!("rung {} {}\n", r.name, r.sha256));
    }
    for l in levers {
        h.update(format!("lever {} {} {}\n", l.id, l.baseline, l.treatment));
    }
    h.update(format!("repeat {repeat}\norder {order:?}\nseed {seed}\n"));
    // Added after the first campaigns: `as-is` (their state) leaves the id as it was.
    if weights_cache != WeightsCache::AsIs {
        h.update(format!("weights-cache {}\n", weights_cache.as_str()));
    }
    let id: String = format!("{:x}", h.finalize()).chars().take(16).collect();

    let mut skipped = Vec::new();
    for r in rungs {
        for l in levers {
            if !l.applies_to.contains(&r.device) {
                skipped.push(Skip {
                    lever: l.id.clone(),
                    rung: r.name.clone(),
                    why: format!(
                        "lever applies to {:?}; rung {} runs on {:?}",
                        l.applies_to, r.name, r.device
                    ),
                });
            }
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut entries = Vec::new();
    for round in 1..=repeat {
        for r in rungs {
            for l in levers.iter().filter(|l| l.applies_to.contains(&r.device)) {
                let baseline_first = match order {
                    Order::Abba => round % 2 == 1,
                    Order::Random => rng.next_u64() >> 63 == 0,
                };
                let arms = if baseline_first {
                    [&l.baseline, &l.treatment]
                } else {
                    [&l.treatment, &l.baseline]
                };
                for arm in arms {
                    entries.push(Entry {
                        position: entries.len() as u32,
                        round,
                        rung: r.name.clone(),
                        lever: l.id.clone(),
                        arm: arm.clone(),
                    });
                }
            }
        }
    }
    Plan {
        id,
        seed,
        order,
        repeat,
        entries,
        skipped,
    }
}

/// Positions of `plan` already done: a sealed, complete bundle of this campaign whose
/// schedule fragment matches the entry at its position.
pub fn done_positions(plan: &Plan, bundles: &[Bundle]) -> BTreeSet<u32> {
    let mut done = BTreeSet::new();
    for b in bundles {
        let Some(s) = &b.schedule else { continue };
        if s.campaign != plan.id || b.incomplete.is_some() {
            continue;
        }
        if let Some(e) = plan.entries.get(s.position as usize) {
            if e.round == s.round && e.lever == s.lever && e.arm == s.arm && e.rung == b.rung {
                done.insert(s.position);
            }
        }
    }
    done
}

/// What the campaign asks the run machinery to do for one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The rung file.
    pub rung_path: PathBuf,
    /// Lever arms to pass (`--lever ID=ARM`): only the lever under test.
    pub levers: BTreeMap<String, String>,
    /// The `schedule` fragment to record in the bundle.
    pub schedule: serde_json::Value,
}

/// A run that ended with a sealed bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The sealed bundle's id.
    pub bundle_id: String,
    /// Whether the run completed (exit `completed` and completion `pass`).
    pub complete: bool,
    /// The exit reason recorded (`completed`, `interrupted`, ...).
    pub exit_reason: String,
    /// The run's wall (`phases.run_wall_s`), seconds, when recorded.
    pub run_wall_s: Option<f64>,
}

/// Why a run did not produce a usable outcome.
#[derive(Debug, thiserror::Error)]
pub enum RunFailure {
    /// A gate refused the run: the campaign stops cleanly.
    #[error("refused by gate '{gate}': {why}")]
    Refused {
        /// The gate.
        gate: String,
        /// What it found.
        why: String,
    },
    /// The run machinery failed.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// The run machinery, as the campaign sees it.
pub trait Runner {
    /// Run one job to a sealed bundle.
    fn run(&mut self, job: &Job) -> Result<RunOutcome, RunFailure>;
}

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CampaignOutcome {
    /// Campaign id.
    pub campaign: String,
    /// Positions skipped because they were already done.
    pub skipped_done: usize,
    /// Runs started and sealed complete in this invocation: (position, bundle id).
    pub completed: Vec<(u32, String)>,
    /// Runs sealed incomplete in this invocation (they run again on resume).
    pub incomplete: Vec<(u32, String)>,
    /// Positions not yet done when the campaign stopped.
    pub remaining: usize,
    /// Why it stopped early, if it did.
    pub stopped: Option<String>,
}

/// Run every entry of `plan` not in `done`, in order, through `runner`.
///
/// Stops cleanly (returns `Ok` with `stopped` set) on a gate refusal, an
/// interrupted run, or, with a `budget`, before a position expected to end past
/// its deadline (every complete run sealed here teaches the budget its wall);
/// returns `Err` when the run machinery itself fails.
pub fn execute(
    plan: &Plan,
    rungs: &[RungRef],
    done: &BTreeSet<u32>,
    runner: &mut dyn Runner,
    mut budget: Option<&mut crate::campaign_budget::Budget>,
    mut progress: impl FnMut(&Entry, &str),
) -> Result<CampaignOutcome, anyhow::Error> {
    let mut out = CampaignOutcome {
        campaign: plan.id.clone(),
        skipped_done: 0,
        completed: Vec::new(),
        incomplete: Vec::new(),
        remaining: 0,
        stopped: None,
    };
    let todo: Vec<&Entry> = plan
        .entries
        .iter()
        .filter(|e| {
            let d = done.contains(&e.position);
            if d {
                out.skipped_done += 1;
            }
            !d
        })
        .collect();
    out.remaining = todo.len();
    for (i, e) in todo.iter().copied().enumerate() {
        let Some(rung) = rungs.iter().find(|r| r.name == e.rung) else {
            anyhow::bail!(
                "schedule position {} names rung {} that is not in the campaign",
                e.position,
                e.rung
            );
        };
        let job = Job {
            rung_path: rung.path.clone(),
            levers: BTreeMap::from([(e.lever.clone(), e.arm.clone())]),
            schedule: plan.fragment(e),
        };
        if let Some(why) = budget.as_deref_mut().and_then(|b| b.refuse(e)) {
            out.stopped = Some(why);
            return Ok(out);
        }
        let eta = budget
            .as_deref()
            .map(|b| format!(": {}", b.history.eta(&todo[i..])))
            .unwrap_or_default();
        progress(e, &format!("start{eta}"));
        match runner.run(&job) {
            Ok(r) if r.complete => {
                if let (Some(b), Some(w)) = (budget.as_deref_mut(), r.run_wall_s) {
                    b.history.record(&e.rung, &e.lever, &e.arm, w);
                }
                progress(e, &format!("sealed {} (complete)", r.bundle_id));
                out.remaining -= 1;
                out.completed.push((e.position, r.bundle_id));
            }
            Ok(r) => {
                // Not done: it stays in `remaining` and runs again on resume.
                progress(
                    e,
                    &format!("sealed {} (incomplete: {})", r.bundle_id, r.exit_reason),
                );
                out.incomplete.push((e.position, r.bundle_id));
                if r.exit_reason == "interrupted" {
                    out.stopped = Some(format!(
                        "run at position {} was interrupted; rerun the same command to resume",
                        e.position
                    ));
                    return Ok(out);
                }
            }
            Err(RunFailure::Refused { gate, why }) => {
                out.stopped = Some(format!(
                    "position {} (round {}, rung {}, {}={}) refused by gate '{gate}': {why}",
                    e.position, e.round, e.rung, e.lever, e.arm
                ));
                return Ok(out);
            }
            Err(RunFailure::Failed(err)) => {
                return Err(err.context(format!(
                    "campaign {} at position {} ({}={} on rung {})",
                    plan.id, e.position, e.lever, e.arm, e.rung
                )))
            }
        }
    }
    Ok(out)
}

/// A warning per lever whose metric reads the weights when the campaign leaves the
/// page cache as it finds it: each run then inherits what the previous one left
/// (the rung-3 host-threads campaign 7f0605dedf9a8064 paired a warm baseline with a
/// cold treatment), and rank drops such pairs. Empty under `cold` or `warm`.
pub fn cache_warnings(levers: &[&Lever], policy: WeightsCache) -> Vec<String> {
    if policy != WeightsCache::AsIs {
        return Vec::new();
    }
    levers
        .iter()
        .filter(|l| l.metric.reads_weights())
        .map(|l| {
            format!(
                "{}: its metric {} reads the weights and this campaign leaves the page cache \
                 as-is, so each run starts in the state the previous one left; rank drops \
                 pairs whose start states differ by more than {:.0} points. Give \
                 --weights-cache warm (or cold) to fix the state.",
                l.id,
                l.metric.label(),
                100.0 * crate::rank::pairing::CACHE_SHARE_MAX_GAP
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::bundle::facts::Schedule;
    use crate::levers_spec::LeverSpec;
    use std::path::Path;

    #[test]
    fn an_as_is_campaign_warns_for_the_levers_whose_metric_reads_the_weights() {
        let s = spec();
        let levers: Vec<&Lever> = s.select("staging,vae,host-threads").unwrap();
        let w = cache_warnings(&levers, WeightsCache::AsIs);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("staging: its metric wall(load.dit) reads the weights"));
        assert!(w[1].starts_with("host-threads: its metric render_wall"));
        assert!(w[1].contains("--weights-cache warm"));
        assert!(cache_warnings(&levers, WeightsCache::Warm).is_empty());
        assert!(cache_warnings(&levers, WeightsCache::Cold).is_empty());
    }

    fn spec() -> LeverSpec {
        LeverSpec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/levers.toml"))
            .unwrap()
    }

    fn rungs() -> Vec<RungRef> {
        vec![
            RungRef {
                name: "0".into(),
                path: "rungs/0.toml".into(),
                sha256: "r0".into(),
                device: DeviceKind::Cpu,
            },
            RungRef {
                name: "2".into(),
                path: "rungs/2.toml".into(),
                sha256: "r2".into(),
                device: DeviceKind::Cuda,
            },
        ]
    }

    /// The id of a committed campaign recomputes from its inputs: adding the cache
    /// state to the identity left `as-is` campaigns' ids as they were (campaign
    /// 223c8a9b01c34e09's bundles are in reports/evidence/).
    #[test]
    fn an_as_is_campaign_keeps_the_id_it_had() {
        let s = spec();
        let levers: Vec<&Lever> = s
            .select("staging,release-pages,denoise-graph,host-threads")
            .unwrap();
        let rung2 = RungRef {
            name: "2".into(),
            path: "rungs/2.toml".into(),
            sha256: "79901375eee7cc42e55a68b330a6e94da8897e4339eecea32b70bb60d1008d6c".into(),
            device: DeviceKind::Cuda,
        };
        let engine = "651450a4a391b17845adf9d666cd812cf5f8f0db4f32216c08070154543bb6b5";
        let p = plan(
            engine,
            &[rung2],
            &levers,
            3,
            Order::Random,
            1,
            WeightsCache::AsIs,
        );
        assert_eq!(p.id, "223c8a9b01c34e09");
    }

    fn all_plan(order: Order, seed: u64) -> Plan {
        let s = spec();
        let levers: Vec<&Lever> = s.select("all").unwrap();
        plan(
            "engine-sha",
            &rungs(),
            &levers,
            5,
            order,
            seed,
            WeightsCache::AsIs,
        )
    }

    #[test]
    fn every_round_runs_both_arms_of_every_applicable_lever_once() {
        let s = spec();
        let p = all_plan(Order::Random, 7);
        let cpu = s
            .levers
            .iter()
            .filter(|l| l.applies_to.contains(&DeviceKind::Cpu))
            .count();
        let cuda = s
            .levers
            .iter()
            .filter(|l| l.applies_to.contains(&DeviceKind::Cuda))
            .count();
        assert_eq!(p.entries.len(), 5 * 2 * (cpu + cuda));
        assert_eq!(p.skipped.len(), 2 * s.levers.len() - cpu - cuda);
        for (i, e) in p.entries.iter().enumerate() {
            assert_eq!(e.position as usize, i);
        }
        let mut seen = BTreeMap::new();
        for e in &p.entries {
            *seen
                .entry((e.round, e.rung.clone(), e.lever.clone(), e.arm.clone()))
                .or_insert(0) += 1;
        }
        assert!(seen.values().all(|&n| n == 1));
        // The two arms of a (round, rung, lever) are adjacent.
        for w in p.entries.chunks(2) {
            assert_eq!(
                (w[0].round, &w[0].rung, &w[0].lever),
                (w[1].round, &w[1].rung, &w[1].lever)
            );
            assert_ne!(w[0].arm, w[1].arm);
        }
        // Rounds are the outer loop.
        assert!(p.entries.windows(2).all(|w| w[0].round <= w[1].round));
    }

    #[test]
    fn abba_alternates_and_random_is_seeded() {
        let s = spec();
        let p = all_plan(Order::Abba, 0);
        for w in p.entries.chunks(2) {
            let l = s.lever(&w[0].lever).unwrap();
            let first = if w[0].round % 2 == 1 {
                &l.baseline
            } else {
                &l.treatment
            };
            assert_eq!(&w[0].arm, first);
        }
        let a = all_plan(Order::Random, 7);
        assert_eq!(a, all_plan(Order::Random, 7));
        // A controlled cache state is part of the campaign's identity; the schedule
        // is the same.
        let s = spec();
        let levers: Vec<&Lever> = s.select("all").unwrap();
        let cold = plan(
            "engine-sha",
            &rungs(),
            &levers,
            5,
            Order::Random,
            7,
            WeightsCache::Cold,
        );
        let warm = plan(
            "engine-sha",
            &rungs(),
            &levers,
            5,
            Order::Random,
            7,
            WeightsCache::Warm,
        );
        assert_ne!(cold.id, a.id);
        assert_ne!(cold.id, warm.id);
        assert_eq!(cold.entries, a.entries);
        let b = all_plan(Order::Random, 8);
        assert_ne!(a.id, b.id);
        assert_ne!(
            a.entries.iter().map(|e| &e.arm).collect::<Vec<_>>(),
            b.entries.iter().map(|e| &e.arm).collect::<Vec<_>>()
        );
        // Random order puts the baseline first in some rounds and second in others.
        let firsts: BTreeSet<bool> = a
            .entries
            .chunks(2)
            .map(|w| w[0].arm == s.lever(&w[0].lever).unwrap().baseline)
            .collect();
        assert_eq!(firsts.len(), 2);
        assert_ne!(a.id, all_plan(Order::Abba, 7).id);
    }

    fn sealed(p: &Plan, e: &Entry, id: &str, complete: bool) -> Bundle {
        let mut b = sample_bundle(id);
        b.rung = e.rung.clone();
        b.schedule = Some(Schedule {
            campaign: p.id.clone(),
            round: e.round,
            position: e.position,
            arm: e.arm.clone(),
            lever: e.lever.clone(),
            seed: p.seed,
        });
        if !complete {
            b.incomplete = Some("exit killed".into());
        }
        b
    }

    /// A runner that seals what it is asked, refusing at one position.
    struct Fake {
        calls: Vec<Job>,
        refuse_at: Option<u64>,
        incomplete_at: Option<u64>,
        /// The wall every run reports, seconds; each run advances `clock` by it.
        wall_s: f64,
        clock: std::rc::Rc<std::cell::Cell<u64>>,
    }

    impl Runner for Fake {
        fn run(&mut self, job: &Job) -> Result<RunOutcome, RunFailure> {
            let pos = job.schedule["position"].as_u64().unwrap();
            if self.refuse_at == Some(pos) {
                return Err(RunFailure::Refused {
                    gate: "headroom".into(),
                    why: "MemAvailable 1 GiB below the 8 GiB floor".into(),
                });
            }
            self.calls.push(job.clone());
            self.clock
                .set(self.clock.get() + (self.wall_s * 1e9) as u64);
            Ok(RunOutcome {
                bundle_id: format!("b{pos}"),
                complete: self.incomplete_at != Some(pos),
                exit_reason: "completed".into(),
                run_wall_s: Some(self.wall_s),
            })
        }
    }

    #[test]
    fn resume_skips_sealed_complete_positions_and_reruns_incomplete_ones() {
        let p = all_plan(Order::Random, 3);
        let mut bundles: Vec<Bundle> = p.entries[..10]
            .iter()
            .map(|e| sealed(&p, e, &format!("x{}", e.position), true))
            .collect();
        bundles[4].incomplete = Some("exit killed".into());
        // Another campaign's bundle at position 11 does not count.
        let mut other = sealed(&p, &p.entries[11], "y", true);
        other.schedule.as_mut().unwrap().campaign = "other".into();
        bundles.push(other);
        // A bundle whose arm does not match its position does not count.
        let mut wrong = sealed(&p, &p.entries[12], "z", true);
        wrong.schedule.as_mut().unwrap().arm = "nope".into();
        bundles.push(wrong);
        let done = done_positions(&p, &bundles);
        let expect: BTreeSet<u32> = (0..10).filter(|&i| i != 4).collect();
        assert_eq!(done, expect);

        let mut f = Fake {
            calls: vec![],
            refuse_at: None,
            incomplete_at: None,
            wall_s: 10.0,
            clock: Default::default(),
        };
        let out = execute(&p, &rungs(), &done, &mut f, None, |_, _| {}).unwrap();
        assert_eq!(out.skipped_done, 9);
        assert_eq!(out.completed.len(), p.entries.len() - 9);
        assert_eq!(out.remaining, 0);
        assert_eq!(out.stopped, None);
        let first = &f.calls[0];
        assert_eq!(first.schedule["position"], 4);
        assert_eq!(first.schedule["campaign"], p.id.as_str());
        assert_eq!(first.schedule["seed"], 3);
        let e4 = &p.entries[4];
        assert_eq!(
            first.levers,
            BTreeMap::from([(e4.lever.clone(), e4.arm.clone())])
        );
        assert_eq!(
            first.rung_path,
            PathBuf::from(format!("rungs/{}.toml", e4.rung))
        );
    }

    #[test]
    fn a_gate_refusal_stops_cleanly_and_says_where() {
        let p = all_plan(Order::Abba, 0);
        let mut f = Fake {
            calls: vec![],
            refuse_at: Some(6),
            incomplete_at: Some(2),
            wall_s: 10.0,
            clock: Default::default(),
        };
        let out = execute(&p, &rungs(), &BTreeSet::new(), &mut f, None, |_, _| {}).unwrap();
        assert_eq!(f.calls.len(), 6, "nothing runs after the refusal");
        assert_eq!(out.completed.len(), 5);
        assert_eq!(out.incomplete, vec![(2, "b2".to_string())]);
        assert_eq!(out.remaining, p.entries.len() - 5);
        let why = out.stopped.unwrap();
        assert!(
            why.contains("position 6") && why.contains("'headroom'") && why.contains("8 GiB floor"),
            "{why}"
        );
    }

    #[test]
    fn a_budget_stops_before_the_first_position_that_would_overrun_it() {
        let p = all_plan(Order::Random, 3);
        let clock: std::rc::Rc<std::cell::Cell<u64>> = Default::default();
        clock.set(5_000_000_000);
        let mut f = Fake {
            calls: vec![],
            refuse_at: None,
            incomplete_at: None,
            wall_s: 10.0,
            clock: clock.clone(),
        };
        let c = clock.clone();
        let mut budget = crate::campaign_budget::Budget {
            deadline_ns: clock.get() + 35_000_000_000,
            now_ns: Box::new(move || c.get()),
            history: Default::default(),
        };
        let out = execute(
            &p,
            &rungs(),
            &BTreeSet::new(),
            &mut f,
            Some(&mut budget),
            |_, _| {},
        )
        .unwrap();
        // Nothing known: the first run starts and teaches 10 s. Then 25 s and 15 s
        // are left: two more fit; with 5 s left the fourth does not start.
        assert_eq!(f.calls.len(), 3);
        assert_eq!(out.completed.len(), 3);
        assert_eq!(out.remaining, p.entries.len() - 3);
        let why = out.stopped.unwrap();
        assert!(why.starts_with("budget: position "), "{why}");
        assert!(
            why.contains("10.0 s") && why.contains("5.0 s of the budget"),
            "{why}"
        );
    }

    #[test]
    fn sealed_runs_of_this_campaign_seed_the_expected_walls() {
        let p = all_plan(Order::Random, 3);
        let e = &p.entries[0];
        let mut mine = sealed(&p, e, "a", true);
        mine.run_wall_s = Some(42.0);
        let mut cut = sealed(&p, e, "b", false);
        cut.run_wall_s = Some(500.0);
        let mut other = sealed(&p, e, "c", true);
        other.run_wall_s = Some(900.0);
        other.schedule.as_mut().unwrap().campaign = "other".into();
        let h = crate::campaign_budget::WallHistory::from_bundles(&p, &[mine, cut, other]);
        assert_eq!(h.expected(e).map(|x| x.wall_s), Some(42.0));
    }
}
