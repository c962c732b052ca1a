//! Trace Event JSON (the Chrome/Perfetto JSON trace format) of a bundle, for the
//! Perfetto UI (<https://ui.perfetto.dev>, "Open trace file").
//!
//! One process (pid 1, named after the bundle) holds:
//! * thread 1 `phases`: one complete event (`ph: "X"`) per phase instance, nested by
//!   time exactly as in `phases.parquet`; args `seq`, `depth`, `open`/`close` marker
//!   attributes and `still_open` (true when the phase never closed: its slice then
//!   ends at the end of the recording);
//! * on the same thread, one thread-scoped instant (`ph: "i"`) per tick marker
//!   (`dit.forward`), its attributes as args;
//! * one counter track (`ph: "C"`) per sampler column that has values, named after
//!   the column (`rss_bytes`), with one arg named after the column's unit. A sample
//!   whose value is null (sensor unavailable) writes no counter point.
//! * a process-scoped instant `exit: <reason>` at the run's end when an exit is known.
//!
//! Timestamps (`ts`, `dur`) are microseconds from the timeline origin (see
//! [`Timeline::origin_ns`]); `metadata.origin_ns` holds that origin in the bundle's
//! CLOCK_MONOTONIC nanoseconds, so `t_ns = origin_ns + ts * 1000`.

use evidence::fragments::{Engine, Levers, Profile, Rung};
use serde_json::{json, Map, Value};

use super::Format;
use crate::timeline::Timeline;

/// Trace Event JSON for Perfetto.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceEventJson;

/// pid of the one process in the trace.
pub const PID: u64 = 1;
/// tid of the phases thread.
pub const PHASES_TID: u64 = 1;

fn us(t: &Timeline, t_ns: i64) -> f64 {
    // Integer ns difference first, then one division: exact to the ns in the text.
    (t_ns - t.origin_ns()) as f64 / 1000.0
}

/// The counter arg name for a unit: the unit with spaces and slashes made `_`.
pub fn counter_arg(unit: &str) -> String {
    unit.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The whole trace as a JSON value (see the module docs).
pub fn trace_value(t: &Timeline) -> Value {
    let mut events: Vec<Value> = Vec::new();
    let rung = t
        .fragment::<Rung>()
        .and_then(|r| r.name)
        .unwrap_or_else(|| "-".into());
    events.push(json!({
        "ph": "M", "name": "process_name", "pid": PID, "tid": 0,
        "args": {"name": format!("rung {rung} · bundle {}", crate::short_id::short(&t.id))}
    }));
    events.push(json!({
        "ph": "M", "name": "thread_name", "pid": PID, "tid": PHASES_TID,
        "args": {"name": "phases"}
    }));
    for p in &t.phases {
        let mut args = Map::new();
        args.insert("seq".into(), json!(p.seq));
        args.insert("depth".into(), json!(p.depth));
        for side in ["open", "close"] {
            if let Some(a) = p
                .attrs
                .get(side)
                .filter(|a| a.as_object().is_some_and(|o| !o.is_empty()))
            {
                args.insert(side.into(), a.clone());
            }
        }
        args.insert("still_open".into(), json!(p.close_ns.is_none()));
        events.push(json!({
            "ph": "X", "cat": "phase", "name": p.name, "pid": PID, "tid": PHASES_TID,
            "ts": us(t, p.open_ns), "dur": (p.end_ns() - p.open_ns) as f64 / 1000.0,
            "args": Value::Object(args),
        }));
    }
    for k in &t.ticks {
        events.push(json!({
            "ph": "i", "s": "t", "cat": "tick", "name": k.name, "pid": PID, "tid": PHASES_TID,
            "ts": us(t, k.t_ns), "args": k.attrs,
        }));
    }
    for s in t.series.iter().filter(|s| s.any()) {
        let arg = counter_arg(s.unit);
        if s.name.starts_with("gpm_") {
            // A GPM figure holds over its own window (consecutive windows are
            // contiguous: each starts at the previous one's second sample), so the
            // counter takes it at the window's start; the bounds are not counters.
            for (start, _, v) in t.windowed(s.name) {
                events.push(json!({
                    "ph": "C", "name": s.name, "pid": PID, "ts": us(t, start),
                    "args": {arg.as_str(): v},
                }));
            }
            continue;
        }
        for (ts, v) in t.sample_t_ns.iter().zip(&s.values) {
            if let Some(v) = v {
                events.push(json!({
                    "ph": "C", "name": s.name, "pid": PID, "ts": us(t, *ts),
                    "args": {arg.as_str(): v},
                }));
            }
        }
    }
    if let Some(e) = t.manifest.exit() {
        events.push(json!({
            "ph": "i", "s": "p", "cat": "run", "name": format!("exit: {}", e.reason.as_deref().unwrap_or_default()),
            "pid": PID, "tid": PHASES_TID, "ts": us(t, t.end_ns()),
            "args": {"code": e.code, "signal": e.signal, "detail": e.detail},
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {
            "bundle_id": t.id,
            "clock": "CLOCK_MONOTONIC",
            "origin_ns": t.origin_ns(),
            "rung": rung,
            "profile": t.fragment::<Profile>(),
            "levers": t.fragment::<Levers>(),
            "engine_sha256": t.fragment::<Engine>().and_then(|e| e.sha256),
            "complete": t.manifest.complete,
        },
    })
}

impl Format for TraceEventJson {
    fn name(&self) -> &'static str {
        "perfetto"
    }
    fn extension(&self) -> &'static str {
        "json"
    }
    fn encode(&self, t: &Timeline) -> anyhow::Result<Vec<u8>> {
        let mut out = serde_json::to_vec(&trace_value(t))?;
        out.push(b'\n');
        Ok(out)
    }
}
