//! Contention during the run: how many cores other work kept busy while the
//! engine ran, from the whole host's CPU time minus the engine's and the
//! harness's own.
//!
//! The `contention` gate judges the host in a 500 ms window before the engine
//! starts; a job that starts later (a neighbour's build, a second render) was
//! invisible to it. Two [`CpuMark`]s, one just before the engine is spawned and one
//! just after it is reaped, bound the engine's lifetime: `/proc/stat`'s aggregate
//! busy jiffies give the host's busy cores over that window, `getrusage` gives the
//! harness's own CPU (`RUSAGE_SELF`) and the engine's with every descendant it reaped
//! (`RUSAGE_CHILDREN`, which counts a child once it is waited for). What is left is
//! other work. It is a mean over the engine's lifetime: a burst shorter than the
//! run is diluted, which is why the start window stays as a second judge, and why
//! each top-level phase is judged too ([`TickOthers`], [`by_phase`]): every
//! journaled sampler row adds the host's busy cores over its tick (`/proc/stat`)
//! less that row's `cpu_cores` (the engine's tree) and `harness_cpu_cores`, and
//! the rows inside a phase give its mean. A lever's metric is usually one phase
//! (load.dit, decode.video): other work inside a 2 s phase of a 40 s run moves
//! the metric while barely moving the lifetime mean.
//!
//! What it cannot attribute counts as other work: kernel threads and interrupts
//! serving the engine's I/O (small beside the limit of half the cores), and any
//! descendant the engine leaves running unreaped (the harness kills the group at
//! the end, but an orphan's CPU never reaches `RUSAGE_CHILDREN`): an engine that
//! forks workers should wait for them.

use evidence::fragments::Contention;

use super::gate_checks::{parse_cpu_line, CONTENTION_LOAD_PER_CORE};
use crate::sampler::system::rusage_cpu_seconds;

/// Windows shorter than this are recorded but not judged, seconds: `/proc/stat`
/// counts in jiffies (10 ms per core), too coarse for a shorter window.
pub const MIN_WINDOW_S: f64 = 1.0;

/// CPU accounting at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuMark {
    /// CLOCK_MONOTONIC nanoseconds.
    pub t_ns: u64,
    /// (busy, total) jiffies of `/proc/stat`'s `cpu` line; None when unreadable.
    pub host_jiffies: Option<(u64, u64)>,
    /// This process's user + system CPU, seconds, all threads.
    pub harness_cpu_s: Option<f64>,
    /// User + system CPU of this process's reaped children and their reaped
    /// descendants, seconds.
    pub children_cpu_s: Option<f64>,
}

impl CpuMark {
    /// Read every counter now.
    pub fn now() -> CpuMark {
        let host_jiffies = TickOthers::host_jiffies();
        CpuMark {
            t_ns: evidence::clock::monotonic_ns(),
            host_jiffies,
            harness_cpu_s: rusage_cpu_seconds(libc::RUSAGE_SELF),
            children_cpu_s: rusage_cpu_seconds(libc::RUSAGE_CHILDREN),
        }
    }
}

/// Phases shorter than this many sampler rows are recorded but not judged.
pub const MIN_PHASE_TICKS: usize = 5;

/// Other work per sampler row, kept in memory by the run's sample sink.
#[derive(Debug, Clone, Default)]
pub struct TickOthers {
    cores: usize,
    prev: Option<(u64, u64)>,
    /// (row `t_ns`, cores of other work over the tick ending at the row).
    pub values: Vec<(u64, f64)>,
}

impl TickOthers {
    /// For a host of `cores` cores.
    pub fn new(cores: usize) -> TickOthers {
        TickOthers {
            cores,
            ..Default::default()
        }
    }

    /// `/proc/stat`'s aggregate (busy, total) jiffies now.
    pub fn host_jiffies() -> Option<(u64, u64)> {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| t.lines().next().and_then(parse_cpu_line))
    }

    /// Fold in one row at `t_ns` with the host's jiffies read for it and the row's
    /// engine and harness cores. A row missing any reading adds nothing (and the
    /// next row's host delta starts from this one's jiffies when they were read).
    pub fn on_row(
        &mut self,
        t_ns: u64,
        host: Option<(u64, u64)>,
        engine_cores: Option<f64>,
        harness_cores: Option<f64>,
    ) {
        let prev = self.prev;
        if host.is_some() {
            self.prev = host;
        }
        let (Some((b0, t0)), Some((b1, t1)), Some(e), Some(h)) =
            (prev, host, engine_cores, harness_cores)
        else {
            return;
        };
        let Some(dt) = t1.checked_sub(t0).filter(|d| *d > 0) else {
            return;
        };
        let busy = b1.saturating_sub(b0) as f64 / dt as f64 * self.cores as f64;
        self.values.push((t_ns, (busy - e - h).max(0.0)));
    }
}

/// Other work inside one top-level phase: the `contention` fragment's record.
pub use evidence::fragments::PhaseDuring;

/// Judge each top-level phase `(name, open_ns, close_ns)` (a phase still open
/// ends at `end_ns`) by the rows of `values` whose tick ends inside it.
pub fn by_phase(
    values: &[(u64, f64)],
    phases: &[(String, u64, Option<u64>)],
    end_ns: u64,
    limit_cores: f64,
) -> Vec<PhaseDuring> {
    phases
        .iter()
        .map(|(name, open, close)| {
            let close = close.unwrap_or(end_ns).max(*open);
            let inside: Vec<f64> = values
                .iter()
                .filter(|(t, _)| *t > *open && *t <= close)
                .map(|(_, v)| *v)
                .collect();
            let seconds = (close - open) as f64 / 1e9;
            let other =
                (!inside.is_empty()).then(|| inside.iter().sum::<f64>() / inside.len() as f64);
            let judged = seconds >= MIN_WINDOW_S && inside.len() >= MIN_PHASE_TICKS;
            PhaseDuring {
                phase: name.clone(),
                seconds,
                ticks: inside.len(),
                other_busy_cores: other,
                judged,
                flagged: judged && other.is_some_and(|o| o > limit_cores),
            }
        })
        .collect()
}

/// `d` with its per-phase judgements: a phase over the limit flags the run (when
/// the lifetime mean did not already), and the detail names it.
pub fn with_phases(mut d: During, phases: Vec<PhaseDuring>) -> During {
    let over: Vec<String> = phases
        .iter()
        .filter(|p| p.flagged)
        .map(|p| {
            format!(
                "{} ({:.2} cores over {:.1} s)",
                p.phase,
                p.other_busy_cores.unwrap_or(0.0),
                p.seconds
            )
        })
        .collect();
    if !over.is_empty() {
        let what = format!(
            "other work above {:.2} cores inside {}",
            d.limit_cores,
            over.join(", ")
        );
        d.detail = if d.flagged {
            format!("{}; {what}", d.detail)
        } else {
            format!("{what}; over the whole run {}", d.detail)
        };
        d.flagged = true;
        d.judged = true;
    }
    d.phases = phases;
    d
}

/// Other work's CPU over the engine's lifetime (the manifest's `contention.during`):
/// the `contention` fragment's record.
pub use evidence::fragments::During;

/// Judge the window between `start` (before the engine was spawned) and `end`
/// (after it was reaped) on a host of `cores` cores.
pub fn during(start: &CpuMark, end: &CpuMark, cores: usize) -> During {
    let window_s = end.t_ns.saturating_sub(start.t_ns) as f64 / 1e9;
    let limit_cores = super::gate_checks::contention_limit(cores);
    let per_s = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if window_s > 0.0 => Some((b - a).max(0.0) / window_s),
        _ => None,
    };
    let host_busy_cores = match (start.host_jiffies, end.host_jiffies) {
        (Some((b0, t0)), Some((b1, t1))) => t1
            .checked_sub(t0)
            .filter(|dt| *dt > 0)
            .map(|dt| b1.saturating_sub(b0) as f64 / dt as f64 * cores as f64),
        _ => None,
    };
    let engine_cores = per_s(start.children_cpu_s, end.children_cpu_s);
    let harness_cores = per_s(start.harness_cpu_s, end.harness_cpu_s);
    let other_busy_cores = match (host_busy_cores, engine_cores, harness_cores) {
        (Some(h), Some(e), Some(s)) => Some((h - e - s).max(0.0)),
        _ => None,
    };
    let (judged, flagged, detail) = match other_busy_cores {
        None => (
            false,
            false,
            "not judged: /proc/stat or getrusage unreadable".to_string(),
        ),
        Some(_) if window_s < MIN_WINDOW_S => (
            false,
            false,
            format!("not judged: the engine ran {window_s:.2} s, under {MIN_WINDOW_S} s"),
        ),
        Some(o) if o > limit_cores => (
            true,
            true,
            format!(
                "{o:.2} cores busy with other work during the run, above {limit_cores:.2} \
                 ({CONTENTION_LOAD_PER_CORE} per core on {cores} cores, mean over {window_s:.1} s)"
            ),
        ),
        Some(o) => (
            true,
            false,
            format!("quiet: {o:.2} cores of other work, mean over {window_s:.1} s"),
        ),
    };
    During {
        window_s,
        host_busy_cores,
        engine_cores,
        harness_cores,
        other_busy_cores,
        limit_cores,
        judged,
        flagged,
        detail,
        phases: Vec::new(),
    }
}

/// The `contention` fragment completed with `during`: `flagged` becomes "at start
/// or during the run" and `detail` names every reason.
pub fn with_during(start_fragment: &Contention, d: &During) -> Contention {
    let mut c = start_fragment.clone();
    let at_start = c.flagged.unwrap_or(false);
    let start_detail = c.detail.clone().unwrap_or_default();
    c.during = Some(d.clone());
    c.flagged = Some(at_start || d.flagged);
    c.detail = Some(match (at_start, d.flagged) {
        (_, false) => start_detail,
        (false, true) => d.detail.clone(),
        (true, true) => format!("{start_detail}; {}", d.detail),
    });
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows every 100 ms on a 2-core host (20 jiffies a tick): the engine uses 0.5
    /// core, the harness 0.1; the host is busy 0.6 cores for 10 rows, then 1.9.
    #[test]
    fn other_work_per_row_is_the_host_tick_less_the_rows_engine_and_harness() {
        let mut t = TickOthers::new(2);
        let (mut busy, mut total) = (1000u64, 5000u64);
        for i in 0..20u64 {
            busy += if i < 10 { 6 } else { 19 };
            total += 20;
            t.on_row(i * 100_000_000, Some((busy, total)), Some(0.5), Some(0.1));
        }
        // The first row only sets the origin.
        assert_eq!(t.values.len(), 19);
        assert!(
            t.values[..9].iter().all(|(_, v)| v.abs() < 1e-9),
            "{:?}",
            t.values
        );
        assert!(
            t.values[9..].iter().all(|(_, v)| (v - 1.3).abs() < 1e-9),
            "{:?}",
            t.values
        );
        // A row without the engine's reading adds nothing but keeps the origin.
        t.on_row(
            2_000_000_000,
            Some((busy + 19, total + 20)),
            None,
            Some(0.1),
        );
        t.on_row(
            2_100_000_000,
            Some((busy + 38, total + 40)),
            Some(0.5),
            Some(0.1),
        );
        assert_eq!(t.values.len(), 20);
        assert!((t.values[19].1 - 1.3).abs() < 1e-9);
    }

    /// The case the lifetime mean misses: 1.8 cores of other work inside a 2 s
    /// phase of a 20 s run is 0.18 over the run, under a 1.0 limit.
    #[test]
    fn a_burst_inside_one_phase_flags_that_phase_and_the_run() {
        let ms = |x: u64| x * 1_000_000;
        let values: Vec<(u64, f64)> = (1..=200)
            .map(|i| {
                (
                    ms(i * 100),
                    if (181..=200).contains(&i) { 1.8 } else { 0.0 },
                )
            })
            .collect();
        let phases = vec![
            ("load.dit".to_string(), 0, Some(ms(18_000))),
            ("decode.video".to_string(), ms(18_000), Some(ms(20_000))),
            ("artifacts".to_string(), ms(20_000), Some(ms(20_300))),
        ];
        let p = by_phase(&values, &phases, ms(20_300), 1.0);
        assert_eq!(p[0].ticks, 180);
        assert!(p[0].judged && !p[0].flagged, "{:?}", p[0]);
        assert_eq!(p[1].ticks, 20);
        assert!((p[1].other_busy_cores.unwrap() - 1.8).abs() < 1e-9);
        assert!(p[1].judged && p[1].flagged, "{:?}", p[1]);
        // 0.3 s and no rows: recorded, not judged.
        assert!(!p[2].judged && !p[2].flagged && p[2].other_busy_cores.is_none());

        let quiet = during(
            &CpuMark {
                t_ns: 0,
                host_jiffies: Some((0, 0)),
                harness_cpu_s: Some(0.0),
                children_cpu_s: Some(0.0),
            },
            &CpuMark {
                t_ns: ms(20_000),
                host_jiffies: Some((720, 4000)), // 0.36 of 2 cores busy
                harness_cpu_s: Some(0.0),
                children_cpu_s: Some(3.6), // the engine: 0.18 core
            },
            2,
        );
        assert!(quiet.judged && !quiet.flagged, "{quiet:?}");
        let d = with_phases(quiet, p);
        assert!(d.flagged);
        assert!(
            d.detail.starts_with("other work above 1.00 cores inside decode.video (1.80 cores over 2.0 s); over the whole run quiet"),
            "{}",
            d.detail
        );
        assert_eq!(d.phases.len(), 3);
    }

    fn mark(t_s: f64, busy: u64, total: u64, harness: f64, children: f64) -> CpuMark {
        CpuMark {
            t_ns: (t_s * 1e9) as u64,
            host_jiffies: Some((busy, total)),
            harness_cpu_s: Some(harness),
            children_cpu_s: Some(children),
        }
    }

    #[test]
    fn other_work_is_the_host_minus_the_engine_and_the_harness() {
        // 10 s on 4 cores: 4000 jiffies in all, 3000 busy = 3.0 cores busy. The
        // engine used 15 s of CPU (1.5 cores), the harness 1 s (0.1 core): 1.4
        // cores of other work, under the 2.0-core limit (0.5 per core): quiet.
        let d = during(
            &mark(5.0, 100, 1000, 2.0, 7.0),
            &mark(15.0, 3100, 5000, 3.0, 22.0),
            4,
        );
        assert!((d.window_s - 10.0).abs() < 1e-9);
        assert!((d.host_busy_cores.unwrap() - 3.0).abs() < 1e-9);
        assert!((d.engine_cores.unwrap() - 1.5).abs() < 1e-9);
        assert!((d.harness_cores.unwrap() - 0.1).abs() < 1e-9);
        assert!((d.other_busy_cores.unwrap() - 1.4).abs() < 1e-9);
        assert_eq!(d.limit_cores, 2.0);
        assert!(d.judged && !d.flagged, "{d:?}");
        // The same host fully busy (4.0 cores) while the engine used 1.5: flagged.
        let d = during(
            &mark(5.0, 100, 1000, 2.0, 7.0),
            &mark(15.0, 4100, 5000, 3.0, 22.0),
            4,
        );
        assert!((d.other_busy_cores.unwrap() - 2.4).abs() < 1e-9);
        assert!(d.flagged, "{d:?}");
        assert!(d.detail.contains("2.40 cores"), "{}", d.detail);
    }

    #[test]
    fn short_windows_and_missing_counters_are_recorded_not_judged() {
        let d = during(
            &mark(0.0, 0, 0, 0.0, 0.0),
            &mark(0.5, 200, 200, 0.0, 0.0),
            2,
        );
        assert_eq!(d.other_busy_cores, Some(2.0));
        assert!(!d.judged && !d.flagged, "{d:?}");
        assert!(d.detail.contains("0.50 s"), "{}", d.detail);
        let mut end = mark(10.0, 2000, 2000, 0.0, 0.0);
        end.children_cpu_s = None;
        let d = during(&mark(0.0, 0, 0, 0.0, 0.0), &end, 2);
        assert_eq!(d.other_busy_cores, None);
        assert!(!d.judged && !d.flagged);
        // Accounting jitter never reports negative other work.
        let d = during(
            &mark(0.0, 0, 1000, 0.0, 0.0),
            &mark(10.0, 500, 2000, 0.0, 20.0),
            1,
        );
        assert_eq!(d.other_busy_cores, Some(0.0));
    }

    #[test]
    fn the_fragment_is_flagged_at_start_or_during_and_names_both() {
        let quiet =
            serde_json::json!({"flagged": false, "detail": "quiet", "busy_cores_at_start": 0.1});
        let busy_start = serde_json::json!({"flagged": true, "detail": "3.00 cores busy"});
        let d_busy = during(
            &mark(0.0, 0, 1000, 0.0, 0.0),
            &mark(10.0, 1000, 2000, 0.0, 0.0),
            1,
        );
        let d_quiet = during(
            &mark(0.0, 0, 1000, 0.0, 0.0),
            &mark(10.0, 0, 2000, 0.0, 0.0),
            1,
        );
        assert!(d_busy.flagged && !d_quiet.flagged);
        let with_during = |start: &serde_json::Value, d: &During| {
            let start: Contention = serde_json::from_value(start.clone()).unwrap();
            serde_json::to_value(with_during(&start, d)).unwrap()
        };
        let c = with_during(&quiet, &d_quiet);
        assert_eq!(c["flagged"], false);
        assert_eq!(c["detail"], "quiet");
        assert_eq!(c["busy_cores_at_start"], 0.1);
        assert_eq!(c["during"]["judged"], true);
        let c = with_during(&quiet, &d_busy);
        assert_eq!(c["flagged"], true);
        assert!(c["detail"].as_str().unwrap().contains("during the run"));
        let c = with_during(&busy_start, &d_busy);
        assert!(c["detail"]
            .as_str()
            .unwrap()
            .starts_with("3.00 cores busy; "));
        let c = with_during(&busy_start, &d_quiet);
        assert_eq!(c["flagged"], true);
        assert_eq!(c["detail"], "3.00 cores busy");
    }

    #[test]
    fn a_real_mark_reads_every_counter_here() {
        let m = CpuMark::now();
        assert!(m.host_jiffies.is_some());
        assert!(m.harness_cpu_s.unwrap() > 0.0);
        assert!(m.children_cpu_s.is_some());
    }
}
