//! The watchdog's positive control: a probe allocates past a synthetic limit under
//! a sampler armed with it, and the watchdog must kill the probe within
//! [`CONTROL_MAX_TICKS`] ticks of the crossing.
//!
//! The memory watchdog (hazard H1 of `specs/device-residency.md`) runs inside the
//! sampler: every row is checked against a floor on
//! `MemAvailable` and, on unified-memory machines or when asked, a budget on the
//! modelled unified footprint (`unified_bytes` = engine RSS + weights page cache +
//! engine GPU memory). The first crossing kills the engine's process group with
//! SIGKILL on the spot and is kept as the [`crate::sampler::limits::Trip`].
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
//!
//! The limits and their check on one row are [`crate::sampler::limits`] (what the
//! sampler runs); the probe itself is `harness __alloc-probe`
//! ([`crate::cmd::alloc_probe`]).

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::sampler::limits::{Limits, Trip};
use crate::sampler::{NullSink, Sampler, SamplerConfig, Target};

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

/// One control's outcome (an entry of the `controls` fragment).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlResult {
    /// The control's name.
    pub name: String,
    /// `pass`, `fail`, `not-applicable`, or `instrument-error` (the control could
    /// not measure what it exists to measure: no verdict on the thing under test).
    pub verdict: String,
    /// What was measured, in words.
    pub detail: String,
    /// What was measured, as numbers and names whose keys carry their units
    /// (`to_load_s`, `interval_median_ms`, ...); absent when empty.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub figures: serde_json::Map<String, serde_json::Value>,
}

/// The verdict of a control that could not measure (see [`ControlResult::verdict`]).
pub const INSTRUMENT_ERROR: &str = "instrument-error";

impl ControlResult {
    /// The result as the `controls` fragment's record holds it (`figures` only
    /// when there are any).
    pub fn verdicted(&self) -> evidence::fragments::Verdicted {
        let mut rest = serde_json::Map::new();
        if !self.figures.is_empty() {
            rest.insert(
                "figures".into(),
                serde_json::Value::Object(self.figures.clone()),
            );
        }
        evidence::fragments::Verdicted {
            name: Some(self.name.clone()),
            verdict: Some(self.verdict.clone()),
            detail: Some(self.detail.clone()),
            rest,
        }
    }

    /// A result with no figures.
    pub fn new(name: &str, verdict: &str, detail: String) -> ControlResult {
        ControlResult {
            name: name.into(),
            verdict: verdict.into(),
            detail,
            figures: serde_json::Map::new(),
        }
    }

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
        Err(e) => return ControlResult::new(kind.name(), "fail", e),
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

/// What the probe said on its stdout.
#[derive(Debug, Default)]
struct ProbeReport {
    /// It reached its maximum and held it.
    held: bool,
    /// The longest stretch MemAvailable stayed below the floor, ms (floor only).
    longest_below_ms: Option<u64>,
    /// Every crossing's start, CLOCK_MONOTONIC ns, in order (floor: one per
    /// stretch below the floor).
    crossings: Vec<u64>,
}

/// The synthetic limits the control arms the watchdog with, `avail` bytes being
/// MemAvailable now: a floor just below it, or a budget just above nothing.
fn control_limits(kind: ControlKind, avail: u64) -> Limits {
    match kind {
        ControlKind::Floor => Limits {
            mem_floor_bytes: avail - CONTROL_MARGIN_BYTES,
            unified_budget_bytes: None,
        },
        ControlKind::UnifiedBudget => Limits {
            mem_floor_bytes: 0,
            unified_budget_bytes: Some(CONTROL_MARGIN_BYTES),
        },
    }
}

/// Start the probe (`probe_exe __alloc-probe ...`) in a process group of its own.
/// It reports its crossing on the watchdog's own reading: MemAvailable under the
/// floor, or (budget) its own bytes past the budget.
fn spawn_probe(probe_exe: &Path, kind: ControlKind, limits: &Limits) -> std::io::Result<Child> {
    let (report_at, floor_arg) = match kind {
        ControlKind::Floor => (CONTROL_MAX_BYTES, limits.mem_floor_bytes),
        ControlKind::UnifiedBudget => (CONTROL_MARGIN_BYTES, 0),
    };
    Command::new(probe_exe)
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
}

/// Read the probe's report lines until its stdout closes (it exits or is killed).
fn read_report(child: &mut Child) -> ProbeReport {
    let mut r = ProbeReport::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(t) = line.strip_prefix("crossed ") {
                if let Ok(t) = t.trim().parse::<u64>() {
                    r.crossings.push(t);
                }
            } else if let Some(t) = line.strip_prefix("longest-below-ms ") {
                r.longest_below_ms = t.trim().parse::<u64>().ok();
            } else if line == "held" {
                r.held = true;
            }
        }
    }
    r
}

/// The probe's exit status, killing it if it outlives its hold by 5 s.
fn wait_probe(child: &mut Child) -> Option<ExitStatus> {
    let deadline = Instant::now() + Duration::from_millis(CONTROL_HOLD_MS + 5_000);
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                return child.wait().ok();
            }
        }
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
    // Failures before or without a crossing are retryable only where noted below;
    // set-up failures are reported as crossed so they are not retried.
    let no_cross = |detail: String| (fail(name, detail), true);
    let avail = match crate::sampler::system::mem_available_bytes() {
        Ok(a) => a,
        Err(e) => return no_cross(format!("cannot read MemAvailable: {e}")),
    };
    if avail < real_floor + 2 * CONTROL_MAX_BYTES {
        return no_cross(format!(
            "MemAvailable {avail} B leaves no room for the {CONTROL_MAX_BYTES} B probe above the {real_floor} B floor"
        ));
    }
    let limits = control_limits(kind, avail);
    let started_ns = evidence::clock::monotonic_ns();
    let mut child = match spawn_probe(probe_exe, kind, &limits) {
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
    let report = read_report(&mut child);
    let status = wait_probe(&mut child);
    let trip = sampler.stop().trip;
    judge(kind, cadence_ms, &limits, &report, status, trip, started_ns)
}

/// A failed control named `name`.
fn fail(name: &str, detail: String) -> ControlResult {
    ControlResult::new(name, "fail", detail)
}

/// The limit's name in words: what the probe must reach.
fn limit_word(kind: ControlKind) -> &'static str {
    match kind {
        ControlKind::Floor => "the floor",
        ControlKind::UnifiedBudget => "the budget",
    }
}

/// The verdict of one attempt from what the probe reported, how it ended and the
/// watchdog's trip, with the retry flag of [`control_once`]. `started_ns` is when
/// the probe was started (CLOCK_MONOTONIC): the result says how long it took to
/// reach the limit, so a slow control reads as slow and not as a late watchdog.
fn judge(
    kind: ControlKind,
    cadence_ms: u64,
    limits: &Limits,
    report: &ProbeReport,
    status: Option<ExitStatus>,
    trip: Option<Trip>,
    started_ns: u64,
) -> (ControlResult, bool) {
    let name = kind.name();
    let no_cross = |detail: String| (fail(name, detail), true);
    let signal = status.and_then(|s| s.signal());
    let ProbeReport {
        held,
        longest_below_ms,
        crossings,
    } = report;
    let Some(trip) = trip else {
        // Retryable only when the condition under test never arose: the probe's
        // reading never crossed, or (floor) it stayed below the floor for less than
        // the watchdog's promise of two ticks (other processes freed memory: seen
        // when tests that allocate and free gigabytes run beside the control).
        let sustained =
            sustained_crossing(kind, !crossings.is_empty(), *longest_below_ms, cadence_ms);
        return (
            fail(
                name,
                format!(
                    "the watchdog never fired: the probe {} {}{} (limits: floor {} B, unified budget {}; probe {})",
                    if *held {
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
                    limits.mem_floor_bytes,
                    limits
                        .unified_budget_bytes
                        .map_or("none".to_string(), |b| format!("{b} B")),
                    status_text(status)
                ),
            ),
            sustained,
        );
    };
    if signal != Some(libc::SIGKILL) {
        return no_cross(format!(
            "the watchdog fired ({} = {} vs {}) but the probe {}, not by SIGKILL",
            trip.column,
            trip.value,
            trip.limit,
            status_text(status)
        ));
    }
    let tick_ns = cadence_ms * 1_000_000;
    let since_start_s = |t_ns: u64| t_ns.saturating_sub(started_ns) as f64 / 1e9;
    let mut figures = serde_json::Map::new();
    figures.insert("cadence_ms".into(), cadence_ms.into());
    let detail = match acted_on(crossings, trip.t_ns) {
        Some(c) => {
            let latency = trip.t_ns as i128 - c as i128;
            let reached = format!(
                "the probe reached {} {:.2} s after it started",
                limit_word(kind),
                since_start_s(c)
            );
            if latency > (CONTROL_MAX_TICKS * tick_ns) as i128 {
                return no_cross(format!(
                    "{reached}; the watchdog fired {:.1} ms after the probe crossed, more than {CONTROL_MAX_TICKS} ticks of {cadence_ms} ms",
                    latency as f64 / 1e6
                ));
            }
            figures.insert("probe_to_limit_s".into(), since_start_s(c).into());
            figures.insert(
                "kill_latency_ms".into(),
                (latency.max(0) as f64 / 1e6).into(),
            );
            format!(
                "{reached}; killed by SIGKILL {:.1} ms after crossing ({} = {} B vs limit {} B, cadence {cadence_ms} ms)",
                latency.max(0) as f64 / 1e6,
                trip.column,
                trip.value,
                trip.limit
            )
        }
        None => format!(
            "probe killed by SIGKILL {:.2} s after it started, before it reported crossing (other memory use moved {} first: {} B vs {} B)",
            since_start_s(trip.t_ns),
            trip.column,
            trip.value,
            trip.limit
        ),
    };
    figures.insert("probe_to_kill_s".into(), since_start_s(trip.t_ns).into());
    (
        ControlResult {
            name: name.into(),
            verdict: "pass".into(),
            detail,
            figures,
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

/// How the probe ended, in words (`exited with exit status: 1`, `ended by signal:
/// 9 (SIGKILL)`), or that it was not seen to end.
fn status_text(status: Option<ExitStatus>) -> String {
    match status {
        Some(s) if s.code().is_some() => format!("exited with {s}"),
        Some(s) => format!("ended by {s}"),
        None => "was not seen to end".to_string(),
    }
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
}
