//! `harness show ID`: a bundle's manifest summary and its phase table.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::exit;
use crate::store_arg::{find_verified_bundle, StoreArg};
use crate::summary::{dash, verdicts, BundleSummary};
use evidence::fragments::{
    Completion, Contention, Controls, Engine, Gates, Gpu, Host, Profile, Sampler,
    SensorsUnavailable, Weights, WeightsCache,
};

/// Print a bundle's manifest summary and phase table.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
    /// Print one JSON object: {id, dir, manifest: <manifest.json>, phases: [one
    /// object per row of phases.parquet, its columns as keys]}. Exit 0; 2 for an
    /// unknown or ambiguous id.
    #[arg(long)]
    pub json: bool,
}

/// `harness show --json`: one bundle's manifest and phase rows. Fields are stable;
/// new ones may be added (`specs/bundle.md`). They are declared in name order, the
/// order in which the document has always printed its keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShowRecord {
    /// The bundle directory (absolute when found through the store).
    pub dir: PathBuf,
    /// The bundle id (the directory's name; 64 hex for a sealed bundle).
    pub id: String,
    /// `manifest.json` as it is, parsed: every section and fragment, with the
    /// units its field names and `specs/bundle.md` give.
    pub manifest: Value,
    /// One object per row of `phases.parquet`, in row order, keyed by column name;
    /// units are in the names (`_ns` CLOCK_MONOTONIC nanoseconds, `_s` seconds,
    /// `_ms` milliseconds, `_bytes` bytes, `_pct` percent, `_cores` cores,
    /// `_share` 0..1) and in the table's schema metadata. Nulls stay null,
    /// `attrs_json` is parsed into JSON.
    pub phases: Vec<Value>,
}

/// Other work per top-level phase (`contention.during.phases`) in one line: each
/// judged phase's mean cores, `!` where it was over the limit; None for bundles
/// without per-phase figures or with no phase long enough to judge.
fn contention_phases_line(c: Option<&Contention>) -> Option<String> {
    let phases = &c?.during.as_ref()?.phases;
    let parts: Vec<String> = phases
        .iter()
        .filter(|p| p.judged)
        .filter_map(|p| {
            let flag = if p.flagged { "!" } else { "" };
            Some(format!("{} {:.2}{flag}", p.phase, p.other_busy_cores?))
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "by phase (cores of other work, ! over the limit): {}",
            parts.join(", ")
        )
    })
}

/// The `contention` fragment in one line: `quiet` or `FLAGGED: why`, then what the
/// run saw while the engine ran (`during`, absent from bundles sealed before it
/// was recorded).
fn contention_line(c: Option<&Contention>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let detail = c.detail.as_deref().unwrap_or("?");
    let head = if c.flagged == Some(true) {
        format!("FLAGGED: {detail}")
    } else {
        detail.to_string()
    };
    match &c.during {
        Some(d) => format!("{head} | during the run: {}", d.detail),
        None => format!("{head} | during the run: not recorded"),
    }
}

/// The sampler's own cost in one line: a tick's work (median, p99) and each timed
/// part's p99; None for bundles sealed before the sampler reported it.
fn sampler_cost_line(v: Option<&Sampler>) -> Option<String> {
    let v = v?;
    let tick = v.tick_cost_us.as_ref()?;
    let mut line = format!(
        "sampler work per tick: median {:.2} ms, p99 {:.2} ms",
        tick.median_us / 1e3,
        tick.p99_us / 1e3
    );
    // Which parts ran off the tick: the bundle says; older bundles ran only the
    // page-cache pass on a thread of its own.
    let off_tick: Vec<&str> = match &v.off_tick_parts {
        Some(a) => a.iter().map(String::as_str).collect(),
        None => vec!["pagecache"],
    };
    if let Some(parts) = &v.tick_cost_parts_us {
        let p: Vec<String> = parts
            .iter()
            .map(|(k, c)| {
                let off = if off_tick.contains(&k.as_str()) {
                    ", own thread"
                } else {
                    ""
                };
                format!("{k} p99 {:.2} ms (x{}{off})", c.p99_us / 1e3, c.ticks)
            })
            .collect();
        if !p.is_empty() {
            line += &format!("; {}", p.join(", "));
        }
    }
    Some(line)
}

/// The weights' page-cache state at engine start in one line: the resident share
/// and the policy (from the `weights_cache` fragment, or the `weights-cache` gate of
/// bundles sealed before it), and after a cold start the disk's own read rate
/// (or why there is none).
fn cache_line(fragment: Option<&WeightsCache>, gates: Option<&Gates>) -> String {
    let Some(c) = crate::bundle::manifest::cache_at_start(fragment, gates) else {
        return "weights' page-cache state at start not recorded".into();
    };
    let mut line = format!(
        "{:.1}% of the weights in the page cache at engine start ({})",
        100.0 * c.share,
        c.policy.as_deref().unwrap_or("?")
    );
    if let Some(gbps) = fragment.and_then(disk_gbps) {
        line.push_str(&format!(
            "; the disk read {gbps:.2} GB/s cold (O_DIRECT, {} readers, {:.3} GiB)",
            dash(fragment.and_then(|f| f.disk_readers).map(|r| r.to_string())),
            fragment.and_then(|f| f.disk_read_bytes).unwrap_or(0) as f64 / (1u64 << 30) as f64
        ));
    } else if let Some(why) = fragment.and_then(|f| f.disk_read_note.as_deref()) {
        line.push_str(&format!("; disk rate not measured: {why}"));
    }
    line
}

/// A cold start's disk read rate, GB/s (10^9 bytes a second).
fn disk_gbps(f: &WeightsCache) -> Option<f64> {
    match (f.disk_read_bytes, f.disk_read_s) {
        (Some(b), Some(s)) if s > 0.0 => Some(b as f64 / s / 1e9),
        _ => None,
    }
}

/// The engine's staging rate of each top-level load phase (its `staging_gbps`
/// close attribute, GB/s) in one line, each with the seconds of its staging
/// spent tearing the host side down after the last copy where the engine says
/// so (`staging_teardown_s`, over 0), and after a cold start the disk's rate
/// beside them with each load's share of it: what the device could have read
/// against what it did. `None` when no load phase says a rate.
fn staging_line(phases: &[Value], fragment: Option<&WeightsCache>) -> Option<String> {
    use evidence::parquet_tables::columns::phases as col;
    let disk = fragment.and_then(disk_gbps);
    let parts: Vec<String> = phases
        .iter()
        .filter(|r| r[col::DEPTH].as_i64() == Some(0))
        .filter_map(|r| {
            let name = r[col::NAME].as_str()?;
            if !name.starts_with("load.") {
                return None;
            }
            let attrs: Value = serde_json::from_str(r[col::ATTRS_JSON].as_str()?).ok()?;
            let gbps = attrs["staging_gbps"].as_f64()?;
            let mut notes = Vec::new();
            if let Some(t) = attrs["staging_teardown_s"].as_f64().filter(|t| *t > 0.0) {
                notes.push(format!("teardown {t:.3} s"));
            }
            if let Some(d) = disk.filter(|d| *d > 0.0) {
                notes.push(format!("{:.0}% of the disk's", 100.0 * gbps / d));
            }
            Some(match notes.is_empty() {
                true => format!("{name} {gbps:.2} GB/s"),
                false => format!("{name} {gbps:.2} GB/s ({})", notes.join(", ")),
            })
        })
        .collect();
    if parts.is_empty() {
        return None;
    }
    Some(match disk {
        Some(d) => format!("{}; the disk read {d:.2} GB/s cold", parts.join(", ")),
        None => parts.join(", "),
    })
}

/// The summary text (everything above the phase table).
pub fn summary_text(s: &BundleSummary) -> String {
    let m = &s.manifest;
    let mut o = String::new();
    // One line each, its manifest text with control characters shown, never
    // acted on by the terminal, and never a second line.
    let put = |o: &mut String, line: String| {
        o.push_str(&crate::escape::terminal(&line));
        o.push('\n');
    };
    put(&mut o, format!("bundle   {}", s.id));
    put(
        &mut o,
        format!(
            "rung     {} (profile {}, levers {})",
            s.rung(),
            dash(s.fragment::<Profile>().map(|p| p.0)),
            s.levers()
        ),
    );
    let engine = s.fragment::<Engine>();
    let host = s.fragment::<Host>();
    put(
        &mut o,
        format!(
            "engine   {} sha256 {}",
            dash(engine.as_ref().and_then(|e| e.version.clone())),
            dash(engine.and_then(|e| e.sha256))
        ),
    );
    put(
        &mut o,
        format!(
            "weights  {}",
            dash(s.fragment::<Weights>().and_then(|w| w.digest))
        ),
    );
    put(
        &mut o,
        format!(
            "host     {} ({}, {} cores); gpu {}",
            s.host(),
            dash(host.as_ref().and_then(|h| h.cpu_model.clone())),
            dash(host.and_then(|h| h.cores).map(|c| c.to_string())),
            dash(s.fragment::<Gpu>().and_then(|g| g.name))
        ),
    );
    put(
        &mut o,
        format!("date     {} UTC; wall {}", s.date(), s.wall()),
    );
    match m.exit() {
        Some(e) => {
            put(
                &mut o,
                format!(
                    "exit     {} (code {}, signal {}){}",
                    e.reason.as_deref().unwrap_or_default(),
                    e.code.map_or("-".into(), |c| c.to_string()),
                    e.signal.map_or("-".into(), |c| c.to_string()),
                    e.detail.map(|d| format!(": {d}")).unwrap_or_default()
                ),
            );
        }
        None => {
            put(&mut o, "exit     - (no exit recorded)".to_string());
        }
    }
    put(
        &mut o,
        format!(
            "complete {}; completion {}",
            m.complete,
            dash(s.fragment::<Completion>().and_then(|c| c.verdict))
        ),
    );
    let gates = s.fragment::<Gates>();
    put(
        &mut o,
        format!("gates    {}", verdicts(gates.as_ref().map(|g| &g.0[..]))),
    );
    put(
        &mut o,
        format!(
            "cache    {}",
            cache_line(s.fragment::<WeightsCache>().as_ref(), gates.as_ref())
        ),
    );
    let controls = s.fragment::<Controls>();
    put(
        &mut o,
        format!("controls {}", verdicts(controls.as_ref().map(|c| &c.0[..]))),
    );
    put(
        &mut o,
        format!(
            "contention {}",
            contention_line(s.fragment::<Contention>().as_ref())
        ),
    );
    if let Some(line) = contention_phases_line(s.fragment::<Contention>().as_ref()) {
        put(&mut o, format!("           {line}"));
    }
    let c = &m.cadence;
    let f = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1}"));
    put(
        &mut o,
        format!(
            "samples  {} (cadence {} ms wanted; median {} ms, p99 {} ms, max {} ms; {})",
            c.samples,
            f(c.expected_ms),
            f(c.median_interval_ms),
            f(c.p99_interval_ms),
            f(c.max_interval_ms),
            // Recomputed from the span, so bundles sealed with the older count agree.
            c.deadlines_without_sample().map_or(
                "- deadlines without a sample".into(),
                |(missed, n)| format!("{missed} of {n} deadlines without a sample")
            )
        ),
    );
    if let Some(line) = sampler_cost_line(s.fragment::<Sampler>().as_ref()) {
        put(&mut o, format!("         {line}"));
    }
    if let Some(su) = s.fragment::<SensorsUnavailable>() {
        for (k, v) in &su.0 {
            put(
                &mut o,
                format!("         {k}: unavailable ({})", v.as_str().unwrap_or("?")),
            );
        }
    }
    put(
        &mut o,
        format!(
            "markers  {} lines ({} unparsed); journal {} bytes, {} dropped{}",
            m.markers.lines,
            m.markers.unparsed,
            m.journal.bytes_total,
            m.journal.bytes_dropped,
            m.journal
                .stop_reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
    );
    if m.markers.clock_rejected > 0 {
        put(
            &mut o,
            format!(
                "         {} rejected by the clock check, used for no phase: {}",
                m.markers.clock_rejected,
                m.markers.first_clock_error.as_deref().unwrap_or("")
            ),
        );
    }
    for (name, e) in &m.files {
        put(
            &mut o,
            format!(
                "file     {name:<16} {:>10} bytes {:>8} rows  {}",
                e.bytes,
                e.rows.map_or("-".into(), |r| r.to_string()),
                &e.sha256[..16.min(e.sha256.len())]
            ),
        );
    }
    o
}

/// Exit 0; 2 for an unknown id.
pub fn run(args: ShowArgs) -> anyhow::Result<u8> {
    let dir = find_verified_bundle(&args.store, &args.bundle)?;
    if args.json {
        let s = BundleSummary::load(&dir)?;
        let phases = crate::bundle::tables::rows(&dir, evidence::bundle_files::PHASES)?;
        let record = ShowRecord {
            id: s.id,
            manifest: s.manifest.to_value(),
            phases,
            dir,
        };
        println!("{}", serde_json::to_string_pretty(&record)?);
        return Ok(exit::OK);
    }
    let s = BundleSummary::load(&dir)?;
    print!("{}", summary_text(&s));
    let phases = crate::bundle::tables::rows(&dir, evidence::bundle_files::PHASES)?;
    if let Some(line) = staging_line(&phases, s.fragment::<WeightsCache>().as_ref()) {
        println!("{}", crate::escape::terminal(&format!("staging  {line}")));
    }
    println!();
    let table = crate::bundle::tables::phase_table_text(&dir)
        .with_context(|| format!("reading the phase table of {}", dir.display()))?;
    print!("{table}");
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document keeps the keys, their order and their shapes it had when it
    /// was built from a sorted JSON map.
    #[test]
    fn the_record_prints_the_keys_it_always_had() {
        let r = ShowRecord {
            dir: "/s/bundles/ab".into(),
            id: "ab".into(),
            manifest: serde_json::json!({"complete": true}),
            phases: vec![serde_json::json!({"name": "load.dit", "seq": 0})],
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"dir":"/s/bundles/ab","id":"ab","manifest":{"complete":true},"phases":[{"name":"load.dit","seq":0}]}"#
        );
    }

    #[test]
    fn the_sampler_cost_line_names_each_part() {
        let sampler_cost_line = |v: Option<&Value>| {
            let typed = v.map(|v| serde_json::from_value::<Sampler>(v.clone()).unwrap());
            sampler_cost_line(typed.as_ref())
        };
        let v = serde_json::json!({
            "tick_cost_us": {"median_us": 480.0, "p99_us": 2500.0},
            "tick_cost_parts_us": {
                "pagecache": {"p99_us": 310000.0, "ticks": 5},
                "sink": {"p99_us": 38.0, "ticks": 57}
            }
        });
        assert_eq!(
            sampler_cost_line(Some(&v)).unwrap(),
            "sampler work per tick: median 0.48 ms, p99 2.50 ms; pagecache p99 310.00 ms \
             (x5, own thread), sink p99 0.04 ms (x57)"
        );
        let old = serde_json::json!({"tick_cost_us": {"median_us": 480.0, "p99_us": 2500.0}});
        assert_eq!(
            sampler_cost_line(Some(&old)).unwrap(),
            "sampler work per tick: median 0.48 ms, p99 2.50 ms"
        );
        assert_eq!(sampler_cost_line(Some(&serde_json::json!({}))), None);
        // A bundle that records its off-tick parts is read by them; one without
        // ran gpu_slow on the tick.
        let parts = serde_json::json!({
            "gpu_slow": {"p99_us": 55620.0, "ticks": 25},
            "pagecache": {"p99_us": 320430.0, "ticks": 22}
        });
        let new = serde_json::json!({
            "tick_cost_us": {"median_us": 510.0, "p99_us": 900.0},
            "tick_cost_parts_us": parts,
            "off_tick_parts": ["gpu_slow", "pagecache"]
        });
        assert_eq!(
            sampler_cost_line(Some(&new)).unwrap(),
            "sampler work per tick: median 0.51 ms, p99 0.90 ms; gpu_slow p99 55.62 ms \
             (x25, own thread), pagecache p99 320.43 ms (x22, own thread)"
        );
        let before = serde_json::json!({
            "tick_cost_us": {"median_us": 510.0, "p99_us": 49940.0},
            "tick_cost_parts_us": parts
        });
        assert_eq!(
            sampler_cost_line(Some(&before)).unwrap(),
            "sampler work per tick: median 0.51 ms, p99 49.94 ms; gpu_slow p99 55.62 ms \
             (x25), pagecache p99 320.43 ms (x22, own thread)"
        );
    }

    #[test]
    fn the_cache_line_reads_the_fragment_or_the_old_gate() {
        let gates: Gates = serde_json::from_value(serde_json::json!([{"name": "weights-cache", "verdict": "pass",
            "detail": "as-is: 1.313 of 35.487 GiB resident before, 1.313 GiB after (3.7%), 0.00 s"}])).unwrap();
        assert_eq!(
            cache_line(None, Some(&gates)),
            "3.7% of the weights in the page cache at engine start (as-is)"
        );
        let frag: WeightsCache =
            serde_json::from_value(serde_json::json!({"policy": "warm", "total_bytes": 1000u64,
            "resident_before_bytes": 0u64, "resident_after_bytes": 1000u64, "seconds": 2.0}))
            .unwrap();
        assert_eq!(
            cache_line(Some(&frag), Some(&gates)),
            "100.0% of the weights in the page cache at engine start (warm)"
        );
        assert_eq!(
            cache_line(None, None),
            "weights' page-cache state at start not recorded"
        );
        // A cold start says the disk's rate, or why it has none.
        let cold: WeightsCache = serde_json::from_value(serde_json::json!({"policy": "cold",
            "total_bytes": 1000u64, "resident_before_bytes": 1000u64, "resident_after_bytes": 0u64,
            "seconds": 0.1, "disk_read_bytes": 2_000_000_000u64, "disk_read_s": 0.8,
            "disk_readers": 4u64}))
        .unwrap();
        assert_eq!(
            cache_line(Some(&cold), None),
            "0.0% of the weights in the page cache at engine start (cold); the disk read 2.50 \
             GB/s cold (O_DIRECT, 4 readers, 1.863 GiB)"
        );
        let refused: WeightsCache = serde_json::from_value(serde_json::json!({"policy": "cold",
            "total_bytes": 1000u64, "resident_before_bytes": 0u64, "resident_after_bytes": 0u64,
            "seconds": 0.1, "disk_read_note": "w.safetensors: open with O_DIRECT: Invalid argument"}))
        .unwrap();
        assert!(cache_line(Some(&refused), None).ends_with(
            "; disk rate not measured: w.safetensors: open with O_DIRECT: Invalid argument"
        ));
    }

    /// Red on: the disk's rate left out, a nested load phase counted, or the
    /// share computed against the wrong side.
    #[test]
    fn the_staging_line_puts_each_load_beside_the_disk() {
        let row = |name: &str, depth: i64, attrs: &str| serde_json::json!({"name": name, "depth": depth, "attrs_json": attrs});
        let phases = vec![
            row("load.text_encoder", 0, r#"{"staging_gbps": 1.25}"#),
            row("conditioning", 0, r#"{"staging_gbps": 99.0}"#),
            row(
                "load.dit",
                0,
                r#"{"staging_gbps": 2.0, "arm": "cuda", "staging_teardown_s": 0.0412}"#,
            ),
            row("load.dit.inner", 1, r#"{"staging_gbps": 7.0}"#),
            row("load.vae", 0, r#"{"arm": "cpu"}"#),
        ];
        let cold: WeightsCache = serde_json::from_value(serde_json::json!({"policy": "cold",
            "disk_read_bytes": 2_500_000_000u64, "disk_read_s": 1.0, "disk_readers": 4u64}))
        .unwrap();
        assert_eq!(
            staging_line(&phases, Some(&cold)).unwrap(),
            "load.text_encoder 1.25 GB/s (50% of the disk's), load.dit 2.00 GB/s (teardown \
             0.041 s, 80% of the disk's); the disk read 2.50 GB/s cold"
        );
        assert_eq!(
            staging_line(&phases, None).unwrap(),
            "load.text_encoder 1.25 GB/s, load.dit 2.00 GB/s (teardown 0.041 s)"
        );
        assert_eq!(staging_line(&phases[1..2], Some(&cold)), None);
    }

    #[test]
    fn the_contention_line_says_start_and_during() {
        let typed =
            |v: Option<&Value>| v.map(|v| serde_json::from_value::<Contention>(v.clone()).unwrap());
        let contention_line = |v: Option<&Value>| contention_line(typed(v).as_ref());
        let contention_phases_line = |v: Option<&Value>| contention_phases_line(typed(v).as_ref());
        let q = serde_json::json!({"flagged": false, "detail": "quiet",
            "during": {"detail": "quiet: 0.02 cores of other work, mean over 12.0 s"}});
        assert_eq!(
            contention_line(Some(&q)),
            "quiet | during the run: quiet: 0.02 cores of other work, mean over 12.0 s"
        );
        let f = serde_json::json!({"flagged": true, "detail": "1.90 cores busy with other work during the run"});
        assert_eq!(
            contention_line(Some(&f)),
            "FLAGGED: 1.90 cores busy with other work during the run | during the run: not recorded"
        );
        assert_eq!(contention_line(None), "-");
        // Per phase: the judged ones, the flagged marked; nothing without figures.
        let p = serde_json::json!({"during": {"phases": [
            {"phase": "load.dit", "judged": true, "flagged": false, "other_busy_cores": 0.02},
            {"phase": "conditioning", "judged": false, "flagged": false, "other_busy_cores": 1.5},
            {"phase": "decode.video", "judged": true, "flagged": true, "other_busy_cores": 1.8}
        ]}});
        assert_eq!(
            contention_phases_line(Some(&p)).unwrap(),
            "by phase (cores of other work, ! over the limit): load.dit 0.02, decode.video 1.80!"
        );
        assert_eq!(contention_phases_line(Some(&q)), None);
        assert_eq!(contention_phases_line(None), None);
    }
}
