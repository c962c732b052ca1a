//! The memory watchdog (hazard H1) and its positive control.
//!
//! The watchdog runs inside the sampler: every row is checked against a floor on
//! `MemAvailable` and, on unified-memory machines or when asked, a budget on the
//! modelled unified footprint (`unified_bytes` = engine RSS + weights page cache +
//! engine GPU memory). The first crossing kills the engine's process group with
//! SIGKILL on the spot and is kept as the [`Trip`].
//!
//! The control proves the watchdog fires before any engine is trusted to it: a child
//! (this binary in its hidden `__alloc-probe` mode) allocates past a synthetic limit
//! just below the current reading, and must be killed by the watchdog within two
//! ticks of crossing it. The crossing is judged on the reading the watchdog itself
//! uses: for the floor, the probe re-reads `MemAvailable` after every step (on a
//! virtual machine `MemAvailable` can lag an allocation by hundreds of
//! milliseconds, so the probe's own byte count is not the crossing); for the
//! unified budget, its own RSS, which its byte count is. Controls are serialized
//! machine-wide through a lock file, since two probes at once move each other's
//! `MemAvailable`.

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use evidence::clock::monotonic_ns;
use evidence::sample::Sample;

use crate::sampler::{NullSink, Sampler, SamplerConfig, Target};

/// The floor used when `--mem-floor` is not given: the smaller of this and
/// [`DEFAULT_FLOOR_SHARE`] of MemTotal, in bytes.
///
/// 4 GiB leaves the kernel, the page cache of the harness's own journal and a
/// shell room to work when the engine is killed; on small boxes an eighth of RAM
/// is kept instead so the floor does not forbid every run.
pub const DEFAULT_FLOOR_BYTES: u64 = 4 << 30;
/// See [`DEFAULT_FLOOR_BYTES`].
pub const DEFAULT_FLOOR_SHARE: f64 = 1.0 / 8.0;

/// How far past the current reading the control's synthetic limit lies, in bytes.
pub const CONTROL_MARGIN_BYTES: u64 = 256 << 20;
/// The control probe stops allocating here and holds, in bytes.
pub const CONTROL_MAX_BYTES: u64 = 1 << 30;
/// The probe allocates this much per step, touching every page, in bytes.
pub const CONTROL_STEP_BYTES: u64 = 8 << 20;
/// Pause between the probe's steps, milliseconds (about 1.6 GB/s in all).
pub const CONTROL_STEP_MS: u64 = 5;
/// How long the probe holds its peak before giving up, milliseconds.
pub const CONTROL_HOLD_MS: u64 = 3_000;
/// The control must kill the probe within this many ticks of its crossing.
pub const CONTROL_MAX_TICKS: u64 = 2;

/// The watchdog's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Kill when MemAvailable falls below this, bytes.
    pub mem_floor_bytes: u64,
    /// Kill when `unified_bytes` rises above this, bytes.
    pub unified_budget_bytes: Option<u64>,
}

/// The reading that tripped the watchdog.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Trip {
    /// The column that crossed its limit.
    pub column: String,
    /// Its value, bytes.
    pub value: u64,
    /// The limit, bytes.
    pub limit: u64,
    /// The sample's CLOCK_MONOTONIC time, nanoseconds.
    pub t_ns: u64,
}

/// The default floor for a machine with `mem_total` bytes.
pub fn default_floor(mem_total: u64) -> u64 {
    DEFAULT_FLOOR_BYTES.min((mem_total as f64 * DEFAULT_FLOOR_SHARE) as u64)
}

impl Limits {
    /// The first limit `s` crosses, if any. A missing reading crosses nothing.
    pub fn check(&self, s: &Sample) -> Option<Trip> {
        if let Some(v) = s.get("mem_available_bytes") {
            if (v as u64) < self.mem_floor_bytes {
                return Some(Trip {
                    column: "mem_available_bytes".into(),
                    value: v as u64,
                    limit: self.mem_floor_bytes,
                    t_ns: s.t_ns,
                });
            }
        }
        if let (Some(budget), Some(v)) = (self.unified_budget_bytes, s.get("unified_bytes")) {
            if v as u64 > budget {
                return Some(Trip {
                    column: "unified_bytes".into(),
                    value: v as u64,
                    limit: budget,
                    t_ns: s.t_ns,
                });
            }
        }
        None
    }

    /// The `watchdog` manifest fragment.
    pub fn fragment(&self, trip: Option<&Trip>) -> serde_json::Value {
        serde_json::json!({
            "mem_floor_bytes": self.mem_floor_bytes,
            "unified_budget_bytes": self.unified_budget_bytes,
            "tripped": trip,
        })
    }
}

/// One control's outcome (an entry of the `controls` fragment).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlResult {
    /// The control's name.
    pub name: String,
    /// `pass`, `fail` or `not-applicable`.
    pub verdict: String,
    /// What was measured.
    pub detail: String,
}

impl ControlResult {
    /// Whether the control passed.
    pub fn passed(&self) -> bool {
        self.verdict == "pass"
    }
}

/// Which limit the control exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// The MemAvailable floor.
    Floor,
    /// The unified-memory budget.
    UnifiedBudget,
}

impl ControlKind {
    /// The control's name in manifests and tables.
    pub fn name(self) -> &'static str {
        match self {
            ControlKind::Floor => "watchdog-floor",
            ControlKind::UnifiedBudget => "watchdog-unified-budget",
        }
    }
}

/// How many times the control is tried when the probe's reading never crossed the
/// synthetic limit (other processes freed memory meanwhile: the condition under
/// test never arose). A late or wrong kill is never retried.
pub const CONTROL_ATTEMPTS: u32 = 3;

/// Run the watchdog control for `kind` at `cadence_ms`, with `probe_exe` being this
/// binary. `real_floor` is the run's floor, which the probe must stay well above.
/// Retried (up to [`CONTROL_ATTEMPTS`]) only when the limit was never crossed.
pub fn control(
    probe_exe: &Path,
    kind: ControlKind,
    cadence_ms: u64,
    real_floor: u64,
) -> ControlResult {
    let _lock = match ControlLock::acquire() {
        Ok(l) => l,
        Err(e) => {
            return ControlResult {
                name: kind.name().into(),
                verdict: "fail".into(),
                detail: e,
            }
        }
    };
    let mut attempt = 1;
    loop {
        let (result, crossed) = control_once(probe_exe, kind, cadence_ms, real_floor);
        if crossed || attempt >= CONTROL_ATTEMPTS {
            return ControlResult {
                detail: if attempt > 1 {
                    format!(
                        "{} (attempt {attempt} of {CONTROL_ATTEMPTS}; earlier ones never crossed)",
                        result.detail
                    )
                } else {
                    result.detail
                },
                ..result
            };
        }
        attempt += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The start of the crossing the watchdog acted on: the last one reported at or
/// before its trip at `trip_ns`, else the first (a trip before any report).
pub fn acted_on(crossings: &[u64], trip_ns: u64) -> Option<u64> {
    crossings
        .iter()
        .copied()
        .filter(|&c| c <= trip_ns)
        .max()
        .or_else(|| crossings.first().copied())
}

/// Whether the probe's report shows the condition the watchdog must act on: for the
/// floor, MemAvailable below it for at least [`CONTROL_MAX_TICKS`] ticks plus one
/// (a shorter dip may fall between two readings); for the budget, any crossing
/// (the probe's own bytes only grow). An unknown stretch counts as sustained, so a
/// probe that cannot say is never a reason to retry.
pub fn sustained_crossing(
    kind: ControlKind,
    crossed: bool,
    longest_below_ms: Option<u64>,
    cadence_ms: u64,
) -> bool {
    match (kind, longest_below_ms) {
        _ if !crossed => false,
        (ControlKind::Floor, Some(ms)) => ms >= (CONTROL_MAX_TICKS + 1) * cadence_ms,
        _ => true,
    }
}

/// One attempt; the flag says whether the condition under test arose (see
/// [`sustained_crossing`]): only a failure without it is retried.
fn control_once(
    probe_exe: &Path,
    kind: ControlKind,
    cadence_ms: u64,
    real_floor: u64,
) -> (ControlResult, bool) {
    let name = kind.name();
    let fail = |detail: String| ControlResult {
        name: name.into(),
        verdict: "fail".into(),
        detail,
    };
    // Failures before or without a crossing are retryable only where noted below;
    // set-up failures are reported as crossed so they are not retried.
    let no_cross = |detail: String| (fail(detail), true);
    let avail = match crate::sampler::system::mem_available_bytes() {
        Ok(a) => a,
        Err(e) => return no_cross(format!("cannot read MemAvailable: {e}")),
    };
    if avail < real_floor + 2 * CONTROL_MAX_BYTES {
        return no_cross(format!(
            "MemAvailable {avail} B leaves no room for the {CONTROL_MAX_BYTES} B probe above the {real_floor} B floor"
        ));
    }
    let limits = match kind {
        ControlKind::Floor => Limits {
            mem_floor_bytes: avail - CONTROL_MARGIN_BYTES,
            unified_budget_bytes: None,
        },
        ControlKind::UnifiedBudget => Limits {
            mem_floor_bytes: 0,
            unified_budget_bytes: Some(CONTROL_MARGIN_BYTES),
        },
    };
    // The probe reports its crossing on the watchdog's own reading: MemAvailable
    // under the floor, or (budget) its own bytes past the budget.
    let (report_at, floor_arg) = match kind {
        ControlKind::Floor => (CONTROL_MAX_BYTES, limits.mem_floor_bytes),
        ControlKind::UnifiedBudget => (CONTROL_MARGIN_BYTES, 0),
    };
    let mut child = match Command::new(probe_exe)
        .args([
            "__alloc-probe",
            &CONTROL_STEP_BYTES.to_string(),
            &CONTROL_STEP_MS.to_string(),
            &report_at.to_string(),
            &CONTROL_MAX_BYTES.to_string(),
            &CONTROL_HOLD_MS.to_string(),
            &floor_arg.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return no_cross(format!(
                "cannot start the probe {}: {e}",
                probe_exe.display()
            ))
        }
    };
    let pid = child.id() as i32;
    let config = SamplerConfig {
        cadence_ms,
        observer: false,
        limits: Some(limits.clone()),
        weights: vec![],
    };
    let sampler = match Sampler::spawn(
        config,
        Target { pid, pgid: pid },
        None,
        Some("not read by the control".into()),
        Box::new(NullSink),
    ) {
        Ok(s) => s,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return no_cross(format!("cannot start the sampler: {e}"));
        }
    };
    let mut held = false;
    let mut longest_below_ms: Option<u64> = None;
    // Every crossing's start, in order (floor: one per stretch below the floor).
    let mut crossings: Vec<u64> = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(t) = line.strip_prefix("crossed ") {
                if let Ok(t) = t.trim().parse::<u64>() {
                    crossings.push(t);
                }
            } else if let Some(t) = line.strip_prefix("longest-below-ms ") {
                longest_below_ms = t.trim().parse::<u64>().ok();
            } else if line == "held" {
                held = true;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_millis(CONTROL_HOLD_MS + 5_000);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                break child.wait().ok();
            }
        }
    };
    let report = sampler.stop();
    let signal = status.and_then(|s| s.signal());
    let Some(trip) = report.trip else {
        // Retryable only when the condition under test never arose: the probe's
        // reading never crossed, or (floor) it stayed below the floor for less than
        // the watchdog's promise of two ticks (other processes freed memory: seen
        // when tests that allocate and free gigabytes run beside the control).
        let sustained =
            sustained_crossing(kind, !crossings.is_empty(), longest_below_ms, cadence_ms);
        return (
            fail(format!(
                "the watchdog never fired: the probe {} {}{} (limits {:?}, probe exit {status:?})",
                if held {
                    "allocated and held 1 GiB"
                } else {
                    "ran"
                },
                if !crossings.is_empty() {
                    "and saw its reading cross the limit"
                } else {
                    "but its reading never crossed the limit (other memory moved?)"
                },
                match longest_below_ms {
                    Some(ms) => format!(", below the floor for at most {ms} ms in one stretch"),
                    None => String::new(),
                },
                limits
            )),
            sustained,
        );
    };
    if signal != Some(libc::SIGKILL) {
        return no_cross(format!(
            "the watchdog fired ({} = {} vs {}) but the probe ended with {status:?}, not SIGKILL",
            trip.column, trip.value, trip.limit
        ));
    }
    let tick_ns = cadence_ms * 1_000_000;
    let detail = match acted_on(&crossings, trip.t_ns) {
        Some(c) => {
            let latency = trip.t_ns as i128 - c as i128;
            if latency > (CONTROL_MAX_TICKS * tick_ns) as i128 {
                return no_cross(format!(
                    "the watchdog fired {:.1} ms after the probe crossed, more than {CONTROL_MAX_TICKS} ticks of {cadence_ms} ms",
                    latency as f64 / 1e6
                ));
            }
            format!(
                "probe killed by SIGKILL {:.1} ms after crossing ({} = {} B vs limit {} B, cadence {cadence_ms} ms)",
                latency.max(0) as f64 / 1e6,
                trip.column,
                trip.value,
                trip.limit
            )
        }
        None => format!(
            "probe killed by SIGKILL before it reported crossing (other memory use moved {} first: {} B vs {} B)",
            trip.column, trip.value, trip.limit
        ),
    };
    (
        ControlResult {
            name: name.into(),
            verdict: "pass".into(),
            detail,
        },
        true,
    )
}

/// A machine-wide exclusive lock held while a watchdog control runs (an flock on a
/// file in the temporary directory: the lock is coordination, not evidence).
struct ControlLock(#[allow(dead_code)] std::fs::File);

impl ControlLock {
    /// Block until no other control on this machine runs.
    fn acquire() -> Result<ControlLock, String> {
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join("harness-watchdog-control.lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open the control lock {}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(format!(
                "cannot lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(ControlLock(f))
    }
}

/// The hidden `__alloc-probe STEP EVERY_MS REPORT_AT MAX HOLD_MS [FLOOR]` mode:
/// allocate STEP bytes (touching every page) every EVERY_MS ms up to MAX bytes;
/// print `crossed <t_ns>` when REPORT_AT bytes are held or, with a non-zero
/// FLOOR, when MemAvailable first reads below FLOOR bytes (and again at the start of
/// every later stretch below it); print `held` at MAX,
/// then hold HOLD_MS ms (still watching MemAvailable); with a FLOOR, print
/// `longest-below-ms <ms>` (the longest stretch MemAvailable stayed below it) and
/// exit 0.
pub fn alloc_probe_main(args: &[String]) -> u8 {
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (step, every_ms, report_at, max, hold_ms, floor) = match nums[..] {
        [a, b, c, d, e] if nums.len() == args.len() => (a, b, c, d, e, 0),
        [a, b, c, d, e, f] if nums.len() == args.len() => (a, b, c, d, e, f),
        _ => {
            eprintln!("__alloc-probe: expected STEP EVERY_MS REPORT_AT MAX HOLD_MS [FLOOR]");
            return crate::exit::USAGE;
        }
    };
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total = 0u64;
    let mut reported = false;
    // With a floor: the start of the current stretch below it, and the longest one.
    let mut below_since: Option<u64> = None;
    let mut longest_below_ns = 0u64;
    use std::io::Write;
    let mut out = std::io::stdout();
    let mut report = |total: u64, out: &mut std::io::Stdout| {
        let now = monotonic_ns();
        let crossed = if floor > 0 {
            let below = crate::sampler::system::mem_available_bytes().is_ok_and(|a| a < floor);
            if below {
                if below_since.is_none() {
                    // Every stretch's start is reported: the watchdog's latency
                    // runs from the stretch it acted on, not an earlier dip.
                    reported = false;
                }
                let since = *below_since.get_or_insert(now);
                longest_below_ns = longest_below_ns.max(now - since);
            } else {
                below_since = None;
            }
            below
        } else {
            total >= report_at
        };
        if crossed && !reported {
            reported = true;
            let _ = writeln!(out, "crossed {now}");
            let _ = out.flush();
        }
    };
    while total < max {
        held.push(vec![0x5a; step as usize]);
        total += step;
        report(total, &mut out);
        std::thread::sleep(Duration::from_millis(every_ms));
    }
    let _ = writeln!(out, "held");
    let _ = out.flush();
    let until = Instant::now() + Duration::from_millis(hold_ms);
    while Instant::now() < until {
        report(total, &mut out);
        std::thread::sleep(Duration::from_millis(every_ms.max(1)));
    }
    std::hint::black_box(&held);
    if floor > 0 {
        let _ = writeln!(out, "longest-below-ms {}", longest_below_ns / 1_000_000);
        let _ = out.flush();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation: make every crossing sustained and the first case turns red (a dip
    /// shorter than three ticks would fail the control instead of retrying it).
    /// Mutation: take the first crossing always and a trip after a second stretch
    /// reads as late.
    #[test]
    fn latency_runs_from_the_stretch_the_watchdog_acted_on() {
        assert_eq!(acted_on(&[100, 900], 950), Some(900));
        assert_eq!(acted_on(&[100, 900], 500), Some(100));
        assert_eq!(acted_on(&[100, 900], 50), Some(100));
        assert_eq!(acted_on(&[], 50), None);
    }

    #[test]
    fn only_a_dip_shorter_than_three_ticks_is_retryable() {
        let f = ControlKind::Floor;
        assert!(!sustained_crossing(f, true, Some(120), 100));
        assert!(sustained_crossing(f, true, Some(300), 100));
        assert!(!sustained_crossing(f, false, Some(5_000), 100));
        assert!(sustained_crossing(f, true, None, 100));
        assert!(sustained_crossing(
            ControlKind::UnifiedBudget,
            true,
            None,
            100
        ));
        assert!(!sustained_crossing(
            ControlKind::UnifiedBudget,
            false,
            None,
            100
        ));
    }

    fn row(avail: Option<f64>, unified: Option<f64>) -> Sample {
        let mut s = Sample::empty(42);
        s.set("mem_available_bytes", avail);
        s.set("unified_bytes", unified);
        s
    }

    #[test]
    fn floor_and_budget_trip_on_the_right_side() {
        let l = Limits {
            mem_floor_bytes: 1000,
            unified_budget_bytes: Some(5000),
        };
        assert_eq!(l.check(&row(Some(1000.0), Some(5000.0))), None);
        let t = l.check(&row(Some(999.0), Some(10.0))).unwrap();
        assert_eq!(
            (t.column.as_str(), t.value, t.limit, t.t_ns),
            ("mem_available_bytes", 999, 1000, 42)
        );
        let t = l.check(&row(Some(2000.0), Some(5001.0))).unwrap();
        assert_eq!(
            (t.column.as_str(), t.value, t.limit),
            ("unified_bytes", 5001, 5000)
        );
        // Unreadable sensors never trip (and never pass as 0).
        assert_eq!(l.check(&row(None, None)), None);
        let no_budget = Limits {
            mem_floor_bytes: 0,
            unified_budget_bytes: None,
        };
        assert_eq!(no_budget.check(&row(Some(0.0), Some(1e18))), None);
    }

    #[test]
    fn default_floor_is_the_smaller_of_4gib_and_an_eighth() {
        assert_eq!(default_floor(128 << 30), 4 << 30);
        assert_eq!(default_floor(16 << 30), 2 << 30);
    }

    #[test]
    fn fragment_names_the_trip() {
        let l = Limits {
            mem_floor_bytes: 7,
            unified_budget_bytes: None,
        };
        let t = l.check(&row(Some(3.0), None));
        let f = l.fragment(t.as_ref());
        assert_eq!(f["tripped"]["column"], "mem_available_bytes");
        assert_eq!(f["tripped"]["value"], 3);
        assert_eq!(f["unified_budget_bytes"], serde_json::Value::Null);
    }
}
