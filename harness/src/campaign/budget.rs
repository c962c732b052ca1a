//! A campaign's time budget (`harness campaign --budget-s`): no position starts
//! that is expected to end after the deadline.
//!
//! A leased machine (a device session, a queue slot) ends at a known time. A run
//! cut off by that end is sealed `interrupted`: its device time is spent and its
//! bundle is excluded by rank. Stopping *before* such a position instead leaves the
//! time for something that fits, and a rerun resumes there. The expectation is
//! learned, never guessed: the longest complete run of the same rung and arm in
//! this campaign (from bundles already sealed, and from runs this invocation
//! seals), else the longest complete run of the same rung; a position with neither
//! starts, since nothing says it will not fit.

use std::collections::BTreeMap;

use crate::bundle::facts::Bundle;
use crate::campaign::plan::{Entry, Plan};

/// The longest complete run wall seen per (rung, lever, arm) and per rung, seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WallHistory {
    by_arm: BTreeMap<(String, String, String), f64>,
    by_rung: BTreeMap<String, f64>,
}

/// What a position is expected to take, and from which runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// Seconds (a run's wall: gates, engine and sealing).
    pub wall_s: f64,
    /// Which runs it comes from, for people (`rung 3 vae=host`, `rung 3`).
    pub basis: String,
}

impl WallHistory {
    /// The complete, sealed runs of `plan`'s campaign among `bundles`.
    pub fn from_bundles(plan: &Plan, bundles: &[Bundle]) -> WallHistory {
        let mut h = WallHistory::default();
        for b in bundles {
            let (Some(s), Some(wall)) = (&b.schedule, b.run_wall_s) else {
                continue;
            };
            if s.campaign == plan.id && b.incomplete.is_none() {
                h.record(&b.rung, &s.lever, &s.arm, wall);
            }
        }
        h
    }

    /// Note a complete run of `rung` with `lever=arm` that took `wall_s` seconds.
    pub fn record(&mut self, rung: &str, lever: &str, arm: &str, wall_s: f64) {
        if !wall_s.is_finite() || wall_s < 0.0 {
            return;
        }
        let k = (rung.to_string(), lever.to_string(), arm.to_string());
        let a = self.by_arm.entry(k).or_insert(wall_s);
        *a = a.max(wall_s);
        let r = self.by_rung.entry(rung.to_string()).or_insert(wall_s);
        *r = r.max(wall_s);
    }

    /// What `e` is expected to take; None when no complete run of its rung is known.
    pub fn expected(&self, e: &Entry) -> Option<Expected> {
        let k = (e.rung.clone(), e.lever.clone(), e.arm.clone());
        if let Some(w) = self.by_arm.get(&k) {
            return Some(Expected {
                wall_s: *w,
                basis: format!("rung {} {}={}", e.rung, e.lever, e.arm),
            });
        }
        self.by_rung.get(&e.rung).map(|w| Expected {
            wall_s: *w,
            basis: format!("rung {}", e.rung),
        })
    }

    /// What the positions `left` (this one first) are expected to take, for a
    /// progress line: `expected ~45 s; 6 left ~4m35s` (positions with no history
    /// are counted apart, not guessed).
    pub fn eta(&self, left: &[&Entry]) -> String {
        let this = left
            .first()
            .and_then(|e| self.expected(e))
            .map_or("expected ~? s".to_string(), |x| {
                format!("expected ~{}", human_s(x.wall_s))
            });
        let (mut sum, mut unknown) = (0.0, 0);
        for e in left {
            match self.expected(e) {
                Some(x) => sum += x.wall_s,
                None => unknown += 1,
            }
        }
        let rest = if unknown == 0 {
            String::new()
        } else {
            format!(" + {unknown} with no history yet")
        };
        format!("{this}; {} left ~{}{rest}", left.len(), human_s(sum))
    }
}

/// Seconds for people: `45 s`, `4m35s`, `1h02m`.
fn human_s(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=99 => format!("{s} s"),
        100..=5999 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The deadline a campaign invocation works to.
pub struct Budget {
    /// CLOCK_MONOTONIC nanoseconds by which every started position should end.
    pub deadline_ns: u64,
    /// The monotonic clock, nanoseconds (a parameter so tests can drive it).
    pub now_ns: Box<dyn FnMut() -> u64>,
    /// Walls learned so far.
    pub history: WallHistory,
}

impl Budget {
    /// A budget of `seconds` from `start_ns` (CLOCK_MONOTONIC nanoseconds) on the
    /// real monotonic clock.
    pub fn new(start_ns: u64, seconds: f64, history: WallHistory) -> Budget {
        Budget {
            deadline_ns: start_ns.saturating_add((seconds.max(0.0) * 1e9) as u64),
            now_ns: Box::new(evidence::clock::monotonic_ns),
            history,
        }
    }

    /// Seconds left before the deadline (0 when past it).
    pub fn left_s(&mut self) -> f64 {
        self.deadline_ns.saturating_sub((self.now_ns)()) as f64 / 1e9
    }

    /// Why `e` must not start, if it is expected to end after the deadline.
    pub fn refuse(&mut self, e: &Entry) -> Option<String> {
        let x = self.history.expected(e)?;
        let left = self.left_s();
        (x.wall_s > left).then(|| {
            format!(
                "budget: position {} (round {}, rung {}, {}={}) not started: it is expected to take \
                 {:.1} s (the longest complete run of {} in this campaign) and {left:.1} s of the \
                 budget are left",
                e.position, e.round, e.rung, e.lever, e.arm, x.wall_s, x.basis
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::plan::tests::{all_plan, sealed};
    use crate::campaign::plan::Order;

    fn entry(pos: u32, rung: &str, arm: &str) -> Entry {
        Entry {
            position: pos,
            round: 1,
            rung: rung.into(),
            lever: "vae".into(),
            arm: arm.into(),
            with: Default::default(),
            warmup: false,
        }
    }

    #[test]
    fn the_arm_decides_before_the_rung_and_unknown_rungs_start() {
        let mut h = WallHistory::default();
        h.record("3", "vae", "host", 170.0);
        h.record("3", "vae", "host", 189.4);
        h.record("3", "vae", "device", 45.5);
        let x = h.expected(&entry(0, "3", "host")).unwrap();
        assert_eq!(x.wall_s, 189.4);
        assert_eq!(x.basis, "rung 3 vae=host");
        assert_eq!(h.expected(&entry(0, "3", "device")).unwrap().wall_s, 45.5);
        // An arm not yet seen at a known rung: the rung's longest run.
        let x = h.expected(&entry(0, "3", "other")).unwrap();
        assert_eq!((x.wall_s, x.basis.as_str()), (189.4, "rung 3"));
        assert_eq!(h.expected(&entry(0, "2", "host")), None);
        h.record("2", "vae", "host", f64::NAN);
        assert_eq!(h.expected(&entry(0, "2", "host")), None);
    }

    #[test]
    fn a_position_that_would_overrun_is_refused_and_one_that_fits_is_not() {
        let mut h = WallHistory::default();
        h.record("3", "vae", "host", 180.0);
        h.record("3", "vae", "device", 45.0);
        let t = std::rc::Rc::new(std::cell::Cell::new(1_000_000_000_000u64));
        let clock = t.clone();
        let mut b = Budget {
            deadline_ns: t.get() + 100_000_000_000, // 100 s
            now_ns: Box::new(move || clock.get()),
            history: h,
        };
        assert_eq!(b.left_s(), 100.0);
        let why = b.refuse(&entry(7, "3", "host")).unwrap();
        assert!(
            why.contains("position 7") && why.contains("180.0 s"),
            "{why}"
        );
        assert!(why.contains("100.0 s of the budget"), "{why}");
        assert_eq!(b.refuse(&entry(8, "3", "device")), None);
        assert_eq!(
            b.refuse(&entry(9, "1", "host")),
            None,
            "nothing known: start"
        );
        t.set(t.get() + 60_000_000_000);
        assert!(
            b.refuse(&entry(8, "3", "device")).is_some(),
            "45 s no longer fit in the 40 s left"
        );
        t.set(t.get() + 100_000_000_000);
        assert_eq!(b.left_s(), 0.0);
    }

    #[test]
    fn the_progress_line_counts_what_is_left_by_sealed_walls() {
        let mut h = WallHistory::default();
        h.record("3", "vae", "host", 180.0);
        h.record("3", "vae", "device", 45.0);
        let (a, b, c) = (
            entry(1, "3", "host"),
            entry(2, "3", "device"),
            entry(3, "1", "host"),
        );
        assert_eq!(h.eta(&[&a, &b]), "expected ~3m00s; 2 left ~3m45s");
        assert_eq!(
            h.eta(&[&c, &a]),
            "expected ~? s; 2 left ~3m00s + 1 with no history yet"
        );
        assert_eq!(human_s(45.4), "45 s");
        assert_eq!(human_s(7300.0), "2h01m");
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
        let h = WallHistory::from_bundles(&p, &[mine, cut, other]);
        assert_eq!(h.expected(e).map(|x| x.wall_s), Some(42.0));
    }
}
