//! The GPU control: start `engine burn` with a marker channel, read utilization
//! at a fixed cadence from its start until it ends, and judge only the readings
//! inside its `burn.load` phase ([`crate::control::judge`]).
//!
//! The burn must announce its load within a deadline (context creation, module
//! load and warm-up on a cold machine); one that does not is an instrument error,
//! stopped and reported with its last stderr line, never a GPU failure.

use std::path::Path;
use std::time::{Duration, Instant};

use evidence::clock::monotonic_ns;

use crate::control::burn::Burn;
use crate::control::gpm::{self as gpm_control, GpmInput, GpmSeen};
use crate::control::judge::{self, Observation, Settings, Stop};
use crate::control::util::UtilSource;
use crate::control::watchdog::{ControlResult, INSTRUMENT_ERROR};

/// How often utilization is read, milliseconds (fixed deadlines, not sleeps
/// after each read, so the cadence does not stretch with NVML's latency).
pub const CADENCE_MS: u64 = 100;
/// How long the load may overrun its `--seconds` before the burn is stopped,
/// seconds (the engine checks its clock every 16 GEMMs, milliseconds apart).
pub const LOAD_GRACE_S: f64 = 30.0;
/// How long a burn may take after its load closed to exit, seconds.
pub const EXIT_GRACE_S: f64 = 10.0;

/// The GPU controls over one burn: `gpu-util` from `source` and `gpu-gpm` from
/// `gpm` (a GPM window per tick of the control's cadence, which is NVML's
/// shortest window). Without a utilization source both are `not-applicable`
/// with `why_none`.
pub fn gpu_controls(
    engine: &Path,
    source: Option<&dyn UtilSource>,
    why_none: Option<&str>,
    gpm: GpmInput,
    settings: &Settings,
) -> (ControlResult, ControlResult) {
    let Some(source) = source else {
        let why = why_none.unwrap_or("NVML found none");
        return (
            ControlResult::new(judge::NAME, "not-applicable", format!("no GPU: {why}")),
            gpm_control::judge(&GpmSeen::NoGpu(why.to_string()), None, settings.settle_s),
        );
    };
    // The first GPM sample before the burn: each tick then closes a window.
    let mut gpm_windows = Vec::new();
    let (mut gpm, gpm_na) = match gpm {
        GpmInput::Source(g) => (Ok(g), None),
        GpmInput::Unreadable(why) => (Err(why), None),
        GpmInput::NotApplicable(why) => (Err(why.clone()), Some(why)),
    };
    if let Ok(g) = gpm.as_mut() {
        if let Err(e) = g.next_window() {
            gpm = Err(e);
        }
    }
    let idle_pct = source.utilization_pct().ok();
    let burn = match Burn::start(engine, settings.seconds) {
        Ok(b) => b,
        Err(e) => {
            let why = format!(
                "cannot start {} burn: {e}. No verdict on the GPU",
                engine.display()
            );
            return (
                ControlResult::new(judge::NAME, INSTRUMENT_ERROR, why.clone()),
                ControlResult::new(gpm_control::NAME, INSTRUMENT_ERROR, why),
            );
        }
    };
    let mut readings = Vec::new();
    let mut read_errors = (0u64, None);
    let cadence = Duration::from_millis(CADENCE_MS);
    let mut next = Instant::now();
    let stop = loop {
        let now = monotonic_ns();
        match source.utilization_pct() {
            Ok(u) => readings.push((now, u)),
            Err(e) => read_errors = (read_errors.0 + 1, Some(e)),
        }
        // GPM stops at its first error (the control then says why).
        if let Ok(g) = gpm.as_mut() {
            match g.next_window() {
                Ok(Some(w)) => gpm_windows.push(w),
                Ok(None) => {}
                Err(e) => gpm = Err(e),
            }
        }
        if burn.has_exited() {
            break Stop::Ended;
        }
        let marks = burn.marks();
        let since = |t: u64| now.saturating_sub(t) as f64 / 1e9;
        match marks.open_ns {
            None if since(burn.started_ns) > settings.load_deadline_s => break Stop::LoadDeadline,
            Some(open)
                if marks.close_ns.is_none() && since(open) > settings.seconds + LOAD_GRACE_S =>
            {
                break Stop::LoadOverrun
            }
            // Closed: one more tick sees it exit; `finish` waits for that.
            Some(_) if marks.close_ns.is_some() => break Stop::Ended,
            _ => {}
        }
        next += cadence;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            // Behind (a slow read): the next deadline from now, none skipped twice.
            next = now;
        }
    };
    let stopped_ns = monotonic_ns();
    if stop != Stop::Ended {
        burn.terminate(Duration::from_secs(3));
    }
    let started_ns = burn.started_ns;
    let ended = burn.finish(Duration::from_secs_f64(EXIT_GRACE_S));
    let load = match (ended.marks.open_ns, ended.marks.close_ns) {
        (Some(o), Some(c)) => Some((o, c)),
        _ => None,
    };
    let seen = match (gpm, gpm_na) {
        (_, Some(why)) => GpmSeen::NoGpu(why),
        (Ok(_), None) => GpmSeen::Windows(gpm_windows),
        (Err(why), None) => GpmSeen::Unreadable(why),
    };
    let gpm_result = gpm_control::judge(&seen, load, settings.settle_s);
    let util = judge::judge(
        &Observation {
            source: source.describe(),
            idle_pct,
            started_ns,
            stopped_ns,
            stop,
            marks: ended.marks,
            readings,
            read_errors,
            status: ended.status,
            last_stderr: ended.last_stderr,
        },
        settings,
    );
    (util, gpm_result)
}
