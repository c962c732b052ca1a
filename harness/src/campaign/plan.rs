//! A campaign's schedule: which lever, arm and rung runs at each position, the
//! campaign id, which positions are already done, and the page-cache warnings of
//! its plan (see [`crate::campaign`] for the rules).

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

impl Order {
    /// The flag value (`abba`, `random`), as messages print it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Order::Abba => "abba",
            Order::Random => "random",
        }
    }
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
    /// Other levers' arms this run sets too: the lever's `with` (empty for most).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub with: BTreeMap<String, String>,
    /// A warm-up run (round 0, before the rung's first round; never paired).
    pub warmup: bool,
}

impl Entry {
    /// Every lever arm this run passes (`--lever ID=ARM`): the lever's `with`
    /// settings and the lever's own arm, which wins should `with` name the lever.
    pub fn levers(&self) -> BTreeMap<String, String> {
        let mut l = self.with.clone();
        l.insert(self.lever.clone(), self.arm.clone());
        l
    }

    /// The lever's `with` settings as messages print them: ` with a=x,b=y`, or
    /// nothing when it has none.
    pub fn with_label(&self) -> String {
        with_label(&self.with)
    }

    /// `round 3`, or `warm-up` for a warm-up run, as messages print it.
    pub fn round_label(&self) -> String {
        if self.warmup {
            "warm-up".to_string()
        } else {
            format!("round {}", self.round)
        }
    }
}

/// ` with a=x,b=y` for a lever's `with` settings; empty when there are none.
pub fn with_label(with: &BTreeMap<String, String>) -> String {
    if with.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = with.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(" with {}", pairs.join(","))
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
    pub fn fragment(&self, e: &Entry) -> evidence::fragments::Schedule {
        evidence::fragments::Schedule {
            campaign: self.id.clone(),
            round: e.round,
            position: e.position,
            arm: e.arm.clone(),
            lever: e.lever.clone(),
            seed: self.seed,
            warmup: e.warmup,
        }
    }
}

/// Warm-up runs at `rung`: `n` when given (`--warmup N`), else 1 on a CUDA rung
/// (its first run pays the machine's first device initialization: 20 s of
/// `device_open_s` in the committed observer campaign at rung 3) and 0 on a CPU
/// one.
pub fn warmups_for(rung: &RungRef, n: Option<u32>) -> u32 {
    n.unwrap_or(match rung.device {
        DeviceKind::Cuda => 1,
        DeviceKind::Cpu => 0,
    })
}

/// `plan` with `warmup` runs per rung ([`warmups_for`]) placed right before the
/// rung's first entry of round 1: the same rung, lever and arm as that entry,
/// round 0, marked `warmup`; positions are renumbered. The campaign id mixes in
/// each rung's count when any is non-zero (a plan without warm-ups keeps its id
/// and positions, so campaigns sealed before `--warmup` resume as they were).
pub fn with_warmups(mut plan: Plan, rungs: &[RungRef], warmup: Option<u32>) -> Plan {
    let counts: Vec<(&str, u32)> = rungs
        .iter()
        .map(|r| (r.name.as_str(), warmups_for(r, warmup)))
        .collect();
    if counts.iter().all(|(_, n)| *n == 0) {
        return plan;
    }
    let mut h = Sha256::new();
    h.update(format!("{}\n", plan.id));
    for (r, n) in &counts {
        h.update(format!("warmup {r} {n}\n"));
    }
    plan.id = format!("{:x}", h.finalize()).chars().take(16).collect();
    let mut entries = Vec::with_capacity(plan.entries.len());
    let mut warmed: BTreeSet<String> = BTreeSet::new();
    for e in std::mem::take(&mut plan.entries) {
        if e.round == 1 && warmed.insert(e.rung.clone()) {
            let n = counts
                .iter()
                .find(|(r, _)| *r == e.rung)
                .map_or(0, |(_, n)| *n);
            for _ in 0..n {
                entries.push(Entry {
                    round: 0,
                    warmup: true,
                    ..e.clone()
                });
            }
        }
        entries.push(e);
    }
    for (i, e) in entries.iter_mut().enumerate() {
        e.position = i as u32;
    }
    plan.entries = entries;
    plan
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
        // Added after the first campaigns: a lever without `with` leaves the id as
        // it was; one with it hashes each setting (ids and arms are [a-z0-9-]).
        for (k, v) in &l.with {
            h.update(format!("lever-with {} {k} {v}\n", l.id));
        }
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
                        with: l.with.clone(),
                        warmup: false,
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
            if e.round == s.round
                && e.lever == s.lever
                && e.arm == s.arm
                && e.rung == b.rung
                && e.warmup == s.warmup
            {
                done.insert(s.position);
            }
        }
    }
    done
}

/// The part of `plan` that one Slurm array task runs: the entries of `round`
/// (with their positions, so the `schedule` fragments are the whole campaign's),
/// and for round 1 also the warm-ups that precede it. The campaign id, seed and
/// order stay the plan's.
pub fn round_only(plan: &Plan, round: u32) -> Plan {
    Plan {
        entries: plan
            .entries
            .iter()
            .filter(|e| e.round == round || (round == 1 && e.warmup))
            .cloned()
            .collect(),
        ..plan.clone()
    }
}

/// The rounds of `plan` with a position not in `done`, ascending (a warm-up
/// counts for round 1, whose task runs it): the array indices a Slurm submission
/// asks for.
pub fn rounds_todo(plan: &Plan, done: &BTreeSet<u32>) -> Vec<u32> {
    let rounds: BTreeSet<u32> = plan
        .entries
        .iter()
        .filter(|e| !done.contains(&e.position))
        .map(|e| if e.warmup { 1 } else { e.round })
        .collect();
    rounds.into_iter().collect()
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
pub(crate) mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;
    use crate::bundle::facts::Schedule;
    use crate::levers_spec::LeverSpec;
    use std::collections::BTreeMap;
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

    pub(crate) fn spec() -> LeverSpec {
        LeverSpec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/levers.toml"))
            .unwrap()
    }

    pub(crate) fn rungs() -> Vec<RungRef> {
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

    /// The committed spec's `attention` lever measured with `precision` on `arm`.
    pub(crate) fn attention_with(arm: &str) -> Lever {
        let mut l = spec().lever("attention").unwrap().clone();
        l.with = BTreeMap::from([("precision".to_string(), arm.to_string())]);
        l
    }

    /// A lever's `with`: every entry of the lever, both arms and the warm-up,
    /// carries it; it is part of the campaign id (an edited `with` is another
    /// campaign), and an empty one leaves the id as it was (see
    /// [`an_as_is_campaign_keeps_the_id_it_had`]). Mutations that turn this red:
    /// not hashing `with` (the ids are equal), entries built without it.
    #[test]
    fn a_levers_with_is_in_every_entry_and_in_the_campaign_id() {
        let s = spec();
        let plain = s.lever("attention").unwrap();
        let (fp8, bf16) = (attention_with("fp8"), attention_with("bf16"));
        let mk = |l: &Lever| {
            with_warmups(
                plan(
                    "engine-sha",
                    &rungs(),
                    &[l],
                    3,
                    Order::Random,
                    7,
                    WeightsCache::AsIs,
                ),
                &rungs(),
                None,
            )
        };
        let (p0, p1, p2) = (mk(plain), mk(&fp8), mk(&bf16));
        assert_ne!(p1.id, p0.id, "a with is part of the campaign id");
        assert_ne!(p1.id, p2.id, "an edited with is another campaign");
        assert_eq!(
            p1.entries.len(),
            2 * 3 + 1,
            "both arms, 3 rounds, a warm-up"
        );
        assert!(p1.entries.iter().any(|e| e.warmup));
        let want = BTreeMap::from([("precision".to_string(), "fp8".to_string())]);
        for e in &p1.entries {
            assert_eq!(e.with, want, "{e:?}");
            assert_eq!(e.with_label(), " with precision=fp8");
            assert_eq!(
                e.levers(),
                BTreeMap::from([
                    ("attention".to_string(), e.arm.clone()),
                    ("precision".to_string(), "fp8".to_string())
                ])
            );
        }
        // The schedule is the same; only `with` differs.
        let strip = |p: &Plan| -> Vec<Entry> {
            p.entries
                .iter()
                .map(|e| Entry {
                    with: BTreeMap::new(),
                    ..e.clone()
                })
                .collect()
        };
        assert_eq!(strip(&p1), p0.entries);
        assert!(p0.entries.iter().all(|e| e.with_label().is_empty()));
        // The lever's own arm wins over a `with` naming it (validation forbids it).
        let mut e = p1.entries[1].clone();
        e.with.insert("attention".into(), "other".into());
        assert_eq!(e.levers()["attention"], e.arm);
    }

    pub(crate) fn all_plan(order: Order, seed: u64) -> Plan {
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

    /// Rung 0 runs on the CPU, rung 2 on CUDA (see [`rungs`]).
    #[test]
    fn warm_ups_default_to_one_per_cuda_rung_right_before_its_first_round() {
        let p = all_plan(Order::Random, 7);
        let w = with_warmups(p.clone(), &rungs(), None);
        assert_ne!(w.id, p.id, "a warm-up is part of the campaign id");
        assert_eq!(w.entries.len(), p.entries.len() + 1);
        let warm: Vec<&Entry> = w.entries.iter().filter(|e| e.warmup).collect();
        assert_eq!(warm.len(), 1);
        let first2 = p.entries.iter().find(|e| e.rung == "2").unwrap();
        // The warm-up takes the place of rung 2's first entry, with its lever and
        // arm, round 0; everything after it moves one position on.
        assert_eq!(
            *warm[0],
            Entry {
                position: first2.position,
                round: 0,
                warmup: true,
                ..first2.clone()
            }
        );
        assert_eq!(warm[0].round_label(), "warm-up");
        let next = &w.entries[first2.position as usize + 1];
        assert_eq!((next.position, next.warmup), (first2.position + 1, false));
        assert!(w
            .entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.position == i as u32));
        assert!(w.fragment(warm[0]).warmup, "the schedule fragment marks it");
        // --warmup 2: two on every rung; --warmup 0: the plan as it was.
        let two = with_warmups(p.clone(), &rungs(), Some(2));
        assert_eq!(two.entries.iter().filter(|e| e.warmup).count(), 4);
        assert!(two.entries[..2].iter().all(|e| e.warmup && e.rung == "0"));
        assert_eq!(with_warmups(p.clone(), &rungs(), Some(0)), p);
    }

    #[test]
    fn a_sealed_warm_up_counts_as_done_only_at_its_own_position() {
        let w = with_warmups(all_plan(Order::Abba, 1), &rungs(), Some(1));
        let warm = w.entries.iter().find(|e| e.warmup).unwrap();
        let done = done_positions(&w, &[sealed(&w, warm, "wu", true)]);
        assert_eq!(done, BTreeSet::from([warm.position]));
        // A run not marked warm-up, sealed at that position with everything else
        // equal, is not the warm-up.
        let mut not = sealed(&w, warm, "m", true);
        if let Some(s) = not.schedule.as_mut() {
            s.warmup = false;
        }
        assert!(done_positions(&w, &[not]).is_empty());
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

    /// One array task per round: each round's entries keep their positions and
    /// the warm-ups go with round 1; the rounds still to run are those with a
    /// position not sealed. Mutation that turns this red: a round's task also
    /// running the next round's entries (the `e.round == round` filter dropped).
    #[test]
    fn a_round_is_one_tasks_share_and_only_unsealed_rounds_are_asked_for() {
        let p = with_warmups(all_plan(Order::Abba, 1), &rungs(), Some(1));
        let r2 = round_only(&p, 2);
        assert_eq!(r2.id, p.id);
        assert!(!r2.entries.is_empty() && r2.entries.iter().all(|e| e.round == 2 && !e.warmup));
        for e in &r2.entries {
            assert_eq!(&p.entries[e.position as usize], e, "positions kept");
        }
        let r1 = round_only(&p, 1);
        assert_eq!(r1.entries.iter().filter(|e| e.warmup).count(), 2);
        let all: usize = (1..=p.repeat)
            .map(|r| round_only(&p, r).entries.len())
            .sum();
        assert_eq!(all, p.entries.len(), "every position in exactly one task");
        assert_eq!(rounds_todo(&p, &BTreeSet::new()), [1, 2, 3, 4, 5]);
        // Everything of rounds 1, 3 and 4 sealed, one position of 2 and 5 not.
        let mut done: BTreeSet<u32> = p.entries.iter().map(|e| e.position).collect();
        done.remove(&r2.entries[1].position);
        done.remove(&round_only(&p, 5).entries[0].position);
        assert_eq!(rounds_todo(&p, &done), [2, 5]);
        // A warm-up not sealed is round 1's.
        let warm = p.entries.iter().find(|e| e.warmup).unwrap().position;
        let mut done: BTreeSet<u32> = p.entries.iter().map(|e| e.position).collect();
        done.remove(&warm);
        assert_eq!(rounds_todo(&p, &done), [1]);
    }

    pub(crate) fn sealed(p: &Plan, e: &Entry, id: &str, complete: bool) -> Bundle {
        let mut b = sample_bundle(id);
        b.rung = e.rung.clone();
        b.schedule = Some(Schedule {
            campaign: p.id.clone(),
            round: e.round,
            position: e.position,
            arm: e.arm.clone(),
            lever: e.lever.clone(),
            seed: p.seed,
            warmup: e.warmup,
        });
        if !complete {
            b.incomplete = Some("exit killed".into());
        }
        b
    }
}
