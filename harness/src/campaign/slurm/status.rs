//! `harness campaign --scheduler slurm --status`: per round, what Slurm says of
//! the tasks that ran it (every submission's, newest first) and what the bucket
//! holds of its positions, in one table a reviewer reads, and whether the
//! campaign is complete. The node of each task is Slurm's word where it still
//! has one, else the node its runs recorded in their lease; a task Slurm no
//! longer reports (no accounting, finished longer ago than `MinJobAge`) whose
//! runs sealed bundles is shown from those bundles as [`FORGOTTEN`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use crate::campaign::plan::Plan;
use crate::campaign::sealed::{Leased, Unfinished};
use crate::campaign::slurm::commands::TaskState;
use crate::campaign::slurm::task::parse_lease_id;

/// The state shown for a task Slurm no longer reports, known from the leases
/// its runs recorded.
pub const FORGOTTEN: &str = "forgotten";

/// One round of a campaign as `--status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundStatus {
    /// The round (the array index of its task).
    pub round: u32,
    /// Positions in the round (its warm-ups included for round 1).
    pub positions: usize,
    /// Of those, sealed complete.
    pub sealed: usize,
    /// Incomplete bundles of the round's positions (dead or interrupted runs,
    /// `harness recover`ed or sealed as they stopped).
    pub incomplete: usize,
    /// Slurm's word on every task that ran the round, newest job first.
    pub tasks: Vec<TaskState>,
}

/// The rounds of `plan`: its positions in `done`, the incomplete bundles of the
/// campaign among `unfinished`, the `tasks` Slurm reports (one row per job and
/// index: a squeue row wins over a sacct row of the same task), and the
/// campaign's bundles' `leases` (`slurm:<job>_<round>`, with the node the run
/// recorded): a node Slurm does not give is taken from them, and a task Slurm
/// does not report at all is shown from them ([`FORGOTTEN`]).
pub fn rounds(
    plan: &Plan,
    done: &BTreeSet<u32>,
    unfinished: &[Unfinished],
    tasks: &[TaskState],
    leases: &[Leased],
) -> Vec<RoundStatus> {
    let round_of = |position: u32| {
        plan.entries
            .get(position as usize)
            .map(|e| if e.warmup { 1 } else { e.round })
    };
    let mut incomplete: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for u in unfinished.iter().filter(|u| u.campaign == plan.id) {
        if let Some(r) = round_of(u.position) {
            incomplete.entry(r).or_default().insert(u.id.as_str());
        }
    }
    let mut by_task: BTreeMap<(u32, std::cmp::Reverse<u64>), TaskState> = BTreeMap::new();
    for t in tasks {
        let key = (t.task, std::cmp::Reverse(t.job));
        match by_task.get(&key) {
            Some(have) if have.source == "squeue" => {}
            _ => {
                by_task.insert(key, t.clone());
            }
        }
    }
    // The tasks the bundles' leases name, with the node their runs recorded (the
    // first run that recorded one).
    let mut leased: BTreeMap<(u64, u32), Option<&str>> = BTreeMap::new();
    for l in leases.iter().filter(|l| l.campaign == plan.id) {
        if let Some(k) = parse_lease_id(&l.lease) {
            let node = leased.entry(k).or_default();
            if node.is_none() {
                *node = l.node.as_deref();
            }
        }
    }
    for ((job, round), node) in leased {
        let node = node.unwrap_or_default();
        match by_task.get_mut(&(round, std::cmp::Reverse(job))) {
            Some(t) if t.node.is_empty() => t.node = node.to_string(),
            Some(_) => {}
            None => {
                by_task.insert(
                    (round, std::cmp::Reverse(job)),
                    TaskState {
                        job,
                        task: round,
                        state: FORGOTTEN.into(),
                        node: node.to_string(),
                        source: "bundle",
                    },
                );
            }
        }
    }
    (1..=plan.repeat)
        .map(|round| {
            let positions: Vec<u32> = plan
                .entries
                .iter()
                .filter(|e| round_of(e.position) == Some(round))
                .map(|e| e.position)
                .collect();
            RoundStatus {
                round,
                positions: positions.len(),
                sealed: positions.iter().filter(|p| done.contains(p)).count(),
                incomplete: incomplete.get(&round).map_or(0, BTreeSet::len),
                tasks: by_task
                    .iter()
                    .filter(|((r, _), _)| *r == round)
                    .map(|(_, t)| t.clone())
                    .collect(),
            }
        })
        .collect()
}

/// The table: one line per round (its newest task's id, state and node, the
/// positions sealed, incomplete bundles, earlier tasks with their state and
/// node), then the totals.
pub fn render(plan: &Plan, rounds: &[RoundStatus], accounting_note: Option<&str>) -> String {
    let mut o = String::new();
    let sealed: usize = rounds.iter().map(|r| r.sealed).sum();
    let total: usize = rounds.iter().map(|r| r.positions).sum();
    let _ = writeln!(
        o,
        "campaign {}: {sealed} of {total} position(s) sealed complete over {} round(s)",
        plan.id, plan.repeat
    );
    let _ = writeln!(
        o,
        "{:>5}  {:<14} {:<12} {:<16} {:>7}  {:>10}  earlier tasks",
        "round", "task", "state", "node", "sealed", "incomplete"
    );
    for r in rounds {
        let (task, state, node) = match r.tasks.first() {
            Some(t) => (
                format!("{}_{}", t.job, t.task),
                t.state.clone(),
                t.node.clone(),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let earlier: Vec<String> = r
            .tasks
            .iter()
            .skip(1)
            .map(|t| {
                if t.node.is_empty() {
                    format!("{}_{} {}", t.job, t.task, t.state)
                } else {
                    format!(
                        "{}_{} {} on {}",
                        t.job,
                        t.task,
                        t.state,
                        crate::escape::terminal(&t.node)
                    )
                }
            })
            .collect();
        let _ = writeln!(
            o,
            "{:>5}  {:<14} {:<12} {:<16} {:>7}  {:>10}  {}",
            r.round,
            task,
            state,
            crate::escape::terminal(&node),
            format!("{}/{}", r.sealed, r.positions),
            r.incomplete,
            if earlier.is_empty() {
                "-".to_string()
            } else {
                earlier.join(", ")
            }
        );
    }
    if let Some(note) = accounting_note {
        let _ = writeln!(o, "sacct: {note}");
    }
    if rounds
        .iter()
        .any(|r| r.tasks.iter().any(|t| t.source == "bundle"))
    {
        let _ = writeln!(
            o,
            "{FORGOTTEN}: a task Slurm no longer reports; its job, round and node are those \
             its runs recorded in their bundles' lease"
        );
    }
    let open: Vec<String> = rounds
        .iter()
        .filter(|r| r.sealed < r.positions)
        .map(|r| r.round.to_string())
        .collect();
    if open.is_empty() {
        let _ = writeln!(o, "complete: every position is sealed");
    } else {
        let _ = writeln!(
            o,
            "not complete: round(s) {} have positions not sealed; while no task of theirs is \
             PENDING or RUNNING, rerun the submitting command (sealed positions are skipped)",
            open.join(", ")
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::plan::tests::{all_plan, sealed};
    use crate::campaign::plan::{done_positions, Order};

    fn task(job: u64, round: u32, state: &str, source: &'static str) -> TaskState {
        TaskState {
            job,
            task: round,
            state: state.into(),
            node: "n1".into(),
            source,
        }
    }

    #[test]
    fn each_round_shows_its_newest_task_its_sealed_positions_and_its_dead_runs() {
        let p = all_plan(Order::Abba, 1);
        let r1: Vec<_> = p.entries.iter().filter(|e| e.round == 1).collect();
        let bundles: Vec<crate::bundle::facts::Bundle> = r1
            .iter()
            .map(|e| sealed(&p, e, &format!("c{}", e.position), true))
            .collect();
        let e2 = p.entries.iter().find(|e| e.round == 2).unwrap();
        // Round 2's first run died (listed twice: the local store and the
        // bucket hold it); another campaign's dead run does not count.
        let dead = |id: &str, campaign: &str| Unfinished {
            id: id.into(),
            campaign: campaign.into(),
            position: e2.position,
        };
        let unfinished = vec![dead("d", &p.id), dead("d", &p.id), dead("x", "other")];
        let done = done_positions(&p, &bundles);
        let tasks = vec![
            task(5, 2, "CANCELLED", "sacct"),
            task(5, 1, "COMPLETED", "squeue"),
            task(5, 1, "COMPLETED", "sacct"),
            task(9, 2, "RUNNING", "squeue"),
        ];
        let rs = rounds(&p, &done, &unfinished, &tasks, &[]);
        assert_eq!(rs.len(), 5);
        assert_eq!(
            (rs[0].sealed, rs[0].positions, rs[0].incomplete),
            (r1.len(), r1.len(), 0)
        );
        assert_eq!(rs[0].tasks.len(), 1, "one row per task: {:?}", rs[0].tasks);
        assert_eq!(rs[0].tasks[0].source, "squeue");
        assert_eq!((rs[1].sealed, rs[1].incomplete), (0, 1));
        let t2: Vec<(u64, &str)> = rs[1]
            .tasks
            .iter()
            .map(|t| (t.job, t.state.as_str()))
            .collect();
        assert_eq!(t2, [(9, "RUNNING"), (5, "CANCELLED")], "newest first");
        let text = render(&p, &rs, Some("accounting storage is disabled"));
        let line2 = text
            .lines()
            .find(|l| l.trim_start().starts_with("2  "))
            .unwrap();
        assert!(
            line2.contains("9_2")
                && line2.contains("RUNNING")
                && line2.ends_with("5_2 CANCELLED on n1"),
            "{line2}"
        );
        assert!(!text.contains(FORGOTTEN), "{text}");
        assert!(text.contains("not complete: round(s) 2, 3, 4, 5"), "{text}");
        assert!(text.contains("sacct: accounting storage is disabled"));
        assert!(text.starts_with(&format!(
            "campaign {}: {} of {} position(s)",
            p.id,
            r1.len(),
            p.entries.len()
        )));
    }

    /// The node of each task: Slurm's where it gives one, else the one its runs
    /// recorded in their lease; a task Slurm forgot is shown from its bundles'
    /// leases (mutation: drop the lease rows and round 2 shows no task).
    #[test]
    fn the_node_comes_from_the_leases_where_slurm_does_not_say() {
        let p = all_plan(Order::Abba, 1);
        let lease = |lease: &str, node: Option<&str>, campaign: &str| Leased {
            campaign: campaign.into(),
            lease: lease.into(),
            node: node.map(str::to_string),
        };
        let mut pending = task(7, 1, "COMPLETING", "squeue");
        pending.node = String::new();
        let leases = vec![
            // Round 1: squeue knows the task but gives no node; a run says n2.
            lease("slurm:7_1", None, &p.id),
            lease("slurm:7_1", Some("n2"), &p.id),
            // Round 2: Slurm forgot job 6; its runs say n1.
            lease("slurm:6_2", Some("n1"), &p.id),
            // Round 3: an old bundle without a node.
            lease("slurm:6_3", None, &p.id),
            // Another campaign's task and a lease that is not Slurm's: ignored.
            lease("slurm:6_4", Some("n9"), "other"),
            lease("L-42", Some("n9"), &p.id),
        ];
        let rs = rounds(&p, &BTreeSet::new(), &[], &[pending], &leases);
        let first = |r: usize| {
            rs[r]
                .tasks
                .iter()
                .map(|t| (t.job, t.state.as_str(), t.node.as_str()))
                .collect::<Vec<_>>()
        };
        assert_eq!(first(0), [(7, "COMPLETING", "n2")]);
        assert_eq!(first(1), [(6, FORGOTTEN, "n1")]);
        assert_eq!(first(2), [(6, FORGOTTEN, "")]);
        assert!(rs[3].tasks.is_empty() && rs[4].tasks.is_empty(), "{rs:?}");
        let text = render(&p, &rs, None);
        let line = |round: u32| {
            text.lines()
                .find(|l| l.trim_start().starts_with(&format!("{round}  ")))
                .unwrap()
                .to_string()
        };
        assert!(
            line(1).contains("7_1") && line(1).contains(" n2 "),
            "{text}"
        );
        assert!(
            line(2).contains("6_2") && line(2).contains(FORGOTTEN) && line(2).contains(" n1 "),
            "{text}"
        );
        assert!(
            text.contains("forgotten: a task Slurm no longer reports"),
            "{text}"
        );
    }
}
