//! Running a campaign's schedule: every position not yet done, in order, through
//! a [`Runner`], stopping cleanly on a gate refusal, an interruption or the budget.

use anyhow::Context;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::campaign::budget::Budget;
use crate::campaign::plan::{Entry, Plan, RungRef};

/// What the campaign asks the run machinery to do for one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The rung file.
    pub rung_path: PathBuf,
    /// Lever arms to pass (`--lever ID=ARM`): the lever under test and its
    /// `with` settings ([`Entry::levers`]).
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
    mut budget: Option<&mut Budget>,
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
            levers: e.levers(),
            schedule: serde_json::to_value(plan.fragment(e))
                .context("writing the schedule fragment")?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::facts::Bundle;
    use crate::campaign::plan::tests::{all_plan, rungs, sealed};
    use crate::campaign::plan::{done_positions, Order};

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

    /// `--warmup`: the warm-ups run first on each rung and are sealed marked;
    /// resuming after them (their bundles sealed) runs none again.
    #[test]
    fn warm_ups_run_before_the_first_round_and_resuming_does_not_repeat_them() {
        use crate::campaign::plan::with_warmups;
        let p = with_warmups(all_plan(Order::Abba, 2), &rungs(), Some(1));
        let fake = || Fake {
            calls: vec![],
            refuse_at: None,
            incomplete_at: None,
            wall_s: 1.0,
            clock: Default::default(),
        };
        let mut f = fake();
        let out = execute(&p, &rungs(), &BTreeSet::new(), &mut f, None, |_, _| {}).unwrap();
        assert_eq!(out.completed.len(), p.entries.len());
        assert_eq!(
            f.calls[0].schedule["warmup"], true,
            "{}",
            f.calls[0].schedule
        );
        assert_eq!(f.calls[0].schedule["round"], 0);
        let first_measured = &f.calls[1].schedule;
        assert_eq!(first_measured.get("warmup"), None, "{first_measured}");
        assert_eq!(
            (&f.calls[0].levers, &f.calls[0].rung_path),
            (&f.calls[1].levers, &f.calls[1].rung_path),
            "the same lever arm and rung as the run it warms"
        );
        let warm: Vec<u32> = p
            .entries
            .iter()
            .filter(|e| e.warmup)
            .map(|e| e.position)
            .collect();
        assert_eq!(warm.len(), 2);
        // Interrupted after the warm-ups and the first measured run: resume.
        let sealed_now: Vec<Bundle> = p.entries[..3]
            .iter()
            .chain(p.entries.iter().filter(|e| e.warmup))
            .map(|e| sealed(&p, e, &format!("s{}", e.position), true))
            .collect();
        let done = done_positions(&p, &sealed_now);
        let mut g = fake();
        execute(&p, &rungs(), &done, &mut g, None, |_, _| {}).unwrap();
        assert!(
            g.calls.iter().all(|j| j.schedule.get("warmup").is_none()),
            "no warm-up runs again"
        );
        assert_eq!(g.calls.len(), p.entries.len() - done.len());
    }

    /// Every job of a lever with a `with`, warm-ups included, passes the `with`
    /// arms beside the lever's own. Mutation that turns this red: the job's levers
    /// built from the lever's own arm only (as before `with`).
    #[test]
    fn every_job_of_a_lever_with_a_with_sets_it_in_both_arms() {
        use crate::campaign::plan::tests::attention_with;
        use crate::campaign::plan::{plan, with_warmups};
        let l = attention_with("fp8");
        let p = with_warmups(
            plan(
                "engine-sha",
                &rungs(),
                &[&l],
                2,
                Order::Abba,
                1,
                crate::weights_cache::Policy::AsIs,
            ),
            &rungs(),
            Some(1),
        );
        let mut f = Fake {
            calls: vec![],
            refuse_at: None,
            incomplete_at: None,
            wall_s: 1.0,
            clock: Default::default(),
        };
        execute(&p, &rungs(), &BTreeSet::new(), &mut f, None, |_, _| {}).unwrap();
        assert_eq!(f.calls.len(), 5, "a warm-up and two rounds of two arms");
        assert_eq!(f.calls[0].schedule["warmup"], true);
        let mut arms = BTreeSet::new();
        for j in &f.calls {
            let arm = j.schedule["arm"].as_str().unwrap().to_string();
            assert_eq!(
                j.levers,
                BTreeMap::from([
                    ("attention".to_string(), arm.clone()),
                    ("precision".to_string(), "fp8".to_string())
                ]),
                "{}",
                j.schedule
            );
            arms.insert(arm);
        }
        assert_eq!(arms, BTreeSet::from(["mma".into(), "cudnn".into()]));
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
        let mut budget = Budget {
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
}
