//! The GPU control's verdict from what was observed: which readings lie inside the
//! load, and whether the result says something about the GPU (`pass`, `fail`) or
//! only about the instrument (`instrument-error`). Pure: every time is given.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use serde_json::{json, Map, Value};

use crate::control::burn::{LoadMarks, LOAD_PHASE};
use crate::control::watchdog::{ControlResult, INSTRUMENT_ERROR};

/// The control's name in manifests and tables.
pub const NAME: &str = "gpu-util";

/// The control's fixed settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How long the burn's load runs, seconds (`--seconds`).
    pub seconds: f64,
    /// How long the burn may take from its start to announcing its load, seconds.
    pub load_deadline_s: f64,
    /// Readings in the first part of the load are left out, seconds.
    pub settle_s: f64,
    /// The median utilization the load must reach, percent.
    pub min_util_pct: f64,
}

/// Why sampling stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The burn ended by itself.
    Ended,
    /// The burn did not announce its load within the deadline and was stopped.
    LoadDeadline,
    /// The burn's load did not close in time (its seconds plus a grace) and was stopped.
    LoadOverrun,
}

/// Everything the control saw. Times are CLOCK_MONOTONIC ns.
#[derive(Debug, Clone)]
pub struct Observation {
    /// What the readings came from (`NVML GPU 0`, a fake).
    pub source: String,
    /// A reading before the burn started, percent.
    pub idle_pct: Option<u32>,
    /// When the burn was started.
    pub started_ns: u64,
    /// When sampling stopped (the burn seen ended, or stopped by a deadline).
    pub stopped_ns: u64,
    /// Why sampling stopped.
    pub stop: Stop,
    /// What the burn's markers said.
    pub marks: LoadMarks,
    /// Every reading from the start to the stop: (when, percent).
    pub readings: Vec<(u64, u32)>,
    /// Readings that failed, and the last failure.
    pub read_errors: (u64, Option<String>),
    /// The burn's exit status (None: not reaped).
    pub status: Option<ExitStatus>,
    /// The burn's last non-empty stderr line.
    pub last_stderr: Option<String>,
}

/// An exit status in words: `exit 0`, `signal 9`, `not reaped`.
pub fn exit_words(status: Option<ExitStatus>) -> String {
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => format!("{s}"),
        },
        None => "not reaped".into(),
    }
}

/// The readings that count: inside `burn.load`, from its open plus the settling
/// margin to its close (or, without a close, to the stop).
pub fn in_load(obs: &Observation, settle_s: f64) -> Vec<(u64, u32)> {
    let Some(open) = obs.marks.open_ns else {
        return Vec::new();
    };
    let from = open + (settle_s * 1e9) as u64;
    let to = obs.marks.close_ns.unwrap_or(obs.stopped_ns);
    obs.readings
        .iter()
        .copied()
        .filter(|&(t, _)| t >= from && t <= to)
        .collect()
}

/// The median of the intervals between consecutive readings, milliseconds.
pub fn median_interval_ms(readings: &[(u64, u32)]) -> Option<f64> {
    let mut gaps: Vec<f64> = readings
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].0) as f64 / 1e6)
        .collect();
    gaps.sort_by(f64::total_cmp);
    gaps.get(gaps.len() / 2).copied()
}

/// The median of the readings, percent.
fn median_pct(readings: &[(u64, u32)]) -> Option<u32> {
    let mut v: Vec<u32> = readings.iter().map(|r| r.1).collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// A number for the figures, or null.
fn num(v: Option<f64>) -> Value {
    v.map(Value::from).unwrap_or(Value::Null)
}

/// The verdict, its detail and its figures.
pub fn judge(obs: &Observation, s: &Settings) -> ControlResult {
    let load = in_load(obs, s.settle_s);
    let exit = exit_words(obs.status);
    let to_load_s = obs
        .marks
        .open_ns
        .map(|o| o.saturating_sub(obs.started_ns) as f64 / 1e9);
    let tflops = obs.marks.close_attrs.get("tflops").and_then(Value::as_f64);
    let interval = median_interval_ms(&load);
    let median = median_pct(&load);
    let before: Vec<(u64, u32)> = obs
        .readings
        .iter()
        .copied()
        .filter(|&(t, _)| obs.marks.open_ns.is_none_or(|o| t < o))
        .collect();
    let mut f = Map::new();
    f.insert("source".into(), json!(obs.source));
    f.insert("burn_exit".into(), json!(exit));
    f.insert(
        "burn_exit_code".into(),
        json!(obs.status.and_then(|s| s.code())),
    );
    f.insert("tflops".into(), num(tflops));
    f.insert("to_load_s".into(), num(to_load_s));
    f.insert("load_deadline_s".into(), json!(s.load_deadline_s));
    f.insert("settle_s".into(), json!(s.settle_s));
    f.insert("readings".into(), json!(load.len()));
    f.insert("interval_median_ms".into(), num(interval));
    f.insert("median_util_pct".into(), json!(median));
    f.insert("readings_before_load".into(), json!(before.len()));
    f.insert(
        "median_util_before_load_pct".into(),
        json!(median_pct(&before)),
    );
    f.insert("idle_util_pct".into(), json!(obs.idle_pct));
    f.insert("read_errors".into(), json!(obs.read_errors.0));
    let stderr = match &obs.last_stderr {
        Some(l) => format!("last stderr line: {l:?}"),
        None => "no stderr".into(),
    };
    let result = |verdict: &str, detail: String| ControlResult {
        name: NAME.into(),
        verdict: verdict.into(),
        detail: format!("{detail} [{}]", obs.source),
        figures: f.clone(),
    };
    let Some(to_load_s) = to_load_s else {
        let why = match obs.stop {
            Stop::LoadDeadline => format!(
                "no `{LOAD_PHASE}` within {} s of its start; stopped it ({exit})",
                s.load_deadline_s
            ),
            _ => format!("it ended with {exit} before announcing `{LOAD_PHASE}`"),
        };
        return result(
            INSTRUMENT_ERROR,
            format!("the burn did not reach load: {why}; {stderr}. No verdict on the GPU"),
        );
    };
    let reached = format!("load reached {to_load_s:.2} s after start");
    if !obs.status.is_some_and(|st| st.success()) {
        return result(
            INSTRUMENT_ERROR,
            format!(
                "the burn ended with {exit} after it reached load ({reached}; {} readings inside it); {stderr}. No verdict on the GPU",
                load.len()
            ),
        );
    }
    if obs.stop == Stop::LoadOverrun {
        return result(
            INSTRUMENT_ERROR,
            format!(
                "the burn's `{LOAD_PHASE}` did not close within its {} s and the grace; stopped it ({reached}). No verdict on the GPU",
                s.seconds
            ),
        );
    }
    let Some(median) = median else {
        return result(
            INSTRUMENT_ERROR,
            format!(
                "no utilization reading inside `{LOAD_PHASE}` after {} s of settling ({reached}; {} failed reads{}). No verdict on the GPU",
                s.settle_s,
                obs.read_errors.0,
                obs.read_errors
                    .1
                    .as_deref()
                    .map(|e| format!(", last: {e}"))
                    .unwrap_or_default()
            ),
        );
    };
    let detail = format!(
        "median utilization {median}% over {} readings inside `{LOAD_PHASE}` (every {} median, after {} s of settling); {reached}; burn {exit} at {}; before load {}, idle before start {}; need >= {}%",
        load.len(),
        interval
            .map(|i| format!("{i:.1} ms"))
            .unwrap_or_else(|| "-".into()),
        s.settle_s,
        tflops
            .map(|t| format!("{t:.1} TFLOP/s"))
            .unwrap_or_else(|| "no TFLOP/s reported".into()),
        median_pct(&before)
            .map(|m| format!("{m}% over {} readings", before.len()))
            .unwrap_or_else(|| "no readings".into()),
        obs.idle_pct
            .map(|u| format!("{u}%"))
            .unwrap_or_else(|| "unreadable".into()),
        s.min_util_pct
    );
    if f64::from(median) >= s.min_util_pct {
        result("pass", detail)
    } else {
        result("fail", detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn settings() -> Settings {
        Settings {
            seconds: 3.0,
            load_deadline_s: 60.0,
            settle_s: 1.0,
            min_util_pct: 90.0,
        }
    }

    /// A burn started at 10 s that announced its load at 15 s and closed it at
    /// 18 s, read every 100 ms from its start: 0% before the load, 100% inside.
    fn slow_start() -> Observation {
        let readings = (0..90u64)
            .map(|i| {
                let t = 10 * S + i * S / 10;
                (t, if t >= 15 * S { 100 } else { 0 })
            })
            .collect();
        let mut close_attrs = Map::new();
        close_attrs.insert("tflops".into(), json!(642.5));
        Observation {
            source: "test".into(),
            idle_pct: Some(0),
            started_ns: 10 * S,
            stopped_ns: 19 * S,
            stop: Stop::Ended,
            marks: LoadMarks {
                open_ns: Some(15 * S),
                close_ns: Some(18 * S),
                close_attrs,
            },
            readings,
            read_errors: (0, None),
            status: Some(ExitStatus::from_raw(0)),
            last_stderr: Some("-burn.load 3.0s".into()),
        }
    }

    /// Mutation: count readings from the burn's start (`from = obs.started_ns`)
    /// and the five idle seconds before the load turn this into a `fail`.
    #[test]
    fn only_readings_inside_the_load_count() {
        let r = judge(&slow_start(), &settings());
        assert_eq!(r.verdict, "pass", "{}", r.detail);
        // 16.0 s to 18.0 s inclusive.
        assert_eq!(r.figures["readings"], 21);
        assert_eq!(r.figures["to_load_s"], 5.0);
        assert_eq!(r.figures["tflops"], 642.5);
        assert_eq!(r.figures["burn_exit"], "exit 0");
        assert_eq!(r.figures["median_util_before_load_pct"], 0);
        let ms = r.figures["interval_median_ms"].as_f64().unwrap();
        assert!((ms - 100.0).abs() < 1e-6, "{ms}");
        assert!(
            r.detail.contains("load reached 5.00 s after start")
                && r.detail.contains("642.5 TFLOP/s")
                && r.detail.contains("every 100.0 ms median"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_load_that_reads_low_fails_the_gpu() {
        let mut o = slow_start();
        for r in &mut o.readings {
            r.1 = 40;
        }
        let r = judge(&o, &settings());
        assert_eq!(r.verdict, "fail", "{}", r.detail);
        assert!(r.detail.contains("median utilization 40%"), "{}", r.detail);
    }

    /// Mutation: judge a burn without a load marker as `fail` and these turn red.
    #[test]
    fn a_burn_that_never_reached_load_is_an_instrument_error() {
        let mut o = slow_start();
        o.marks = LoadMarks::default();
        o.stop = Stop::LoadDeadline;
        o.status = Some(ExitStatus::from_raw(libc::SIGKILL));
        o.last_stderr = Some("+burn.setup".into());
        let r = judge(&o, &settings());
        assert_eq!(r.verdict, INSTRUMENT_ERROR);
        assert!(
            r.detail.contains("did not reach load")
                && r.detail.contains("within 60 s")
                && r.detail.contains("signal 9")
                && r.detail.contains("\"+burn.setup\""),
            "{}",
            r.detail
        );
        assert_eq!(r.figures["to_load_s"], Value::Null);
        o.stop = Stop::Ended;
        o.status = Some(ExitStatus::from_raw(1 << 8));
        let r = judge(&o, &settings());
        assert_eq!(r.verdict, INSTRUMENT_ERROR);
        assert!(
            r.detail.contains("ended with exit 1 before announcing"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_burn_that_failed_in_its_load_names_its_exit_status() {
        let mut o = slow_start();
        o.status = Some(ExitStatus::from_raw(3 << 8));
        let r = judge(&o, &settings());
        assert_eq!(r.verdict, INSTRUMENT_ERROR);
        assert!(r.detail.contains("ended with exit 3 after it reached load"));
        assert_eq!(r.figures["burn_exit_code"], 3);
    }

    #[test]
    fn a_load_shorter_than_the_settling_margin_has_no_verdict() {
        let mut o = slow_start();
        o.marks.close_ns = Some(15 * S + S / 2);
        let r = judge(&o, &settings());
        assert_eq!(r.verdict, INSTRUMENT_ERROR, "{}", r.detail);
        assert!(r.detail.contains("no utilization reading inside"));
    }

    #[test]
    fn intervals_are_the_median_gap_between_readings() {
        let r = [(0, 1), (100, 1), (300, 1), (400, 1)];
        let r: Vec<(u64, u32)> = r.iter().map(|&(t, p)| (t * 1_000_000, p)).collect();
        assert_eq!(median_interval_ms(&r), Some(100.0));
        assert_eq!(median_interval_ms(&r[..1]), None);
    }
}
