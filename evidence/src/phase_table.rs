//! The phase table a person reads at the end of a run and in `harness show`.
//!
//! One line per phase path (`denoise/denoise.step`): instances of the same path
//! are merged (count, summed duration, max peaks, sample-weighted means), in the
//! order they first opened, indented by depth. Below it the coverage line (leaf
//! sum over wall, unaccounted seconds) and the containment and exclusivity
//! verdicts.
//!
//! Where the bundle's samples carry GPM windows (`specs/bundle.md`, "GPM
//! windows"), two more columns give each phase's median tensor-pipe and SM
//! activity over the windows wholly inside one of its instances, with a dash for
//! a phase no whole window fits in (shorter than a window, or no GPM there).
//! Without any window (no GPM on that machine, a bundle from before it) the
//! table is as it was.

use crate::parquet_tables::columns::phases;
use crate::sample::column as scol;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use arrow_array::{Array, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};

use crate::bundle_files::{self, MANIFEST};
use crate::error::VerifyError;
use crate::manifest::{CheckSummary, Manifest, Verdict};
use crate::marker::human_bytes;
use crate::parquet_tables;

/// One merged line of the table.
#[derive(Debug, Clone, Default, PartialEq)]
struct Line {
    name: String,
    depth: usize,
    count: u64,
    open: u64,
    seconds: f64,
    peak_rss: Option<i64>,
    peak_dev: Option<i64>,
    samples: i64,
    busy_w: f64,
    busy_n: i64,
    util_w: f64,
    util_n: i64,
    cores_w: f64,
    cores_n: i64,
    /// Every instance's [open, close] in ns (an open instance: close = open).
    spans: Vec<(i64, i64)>,
}

/// One GPM window of a bundle's samples: bounds (ns) and its activity figures,
/// each in percent (0..100) and `None` where the GPU did not report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpmFigure {
    /// CLOCK_MONOTONIC ns at the window's first GPM sample.
    pub start_ns: i64,
    /// At its second.
    pub end_ns: i64,
    /// Tensor-pipe activity, percent (`gpm_tensor_active_pct`).
    pub tensor_pct: Option<f64>,
    /// SM activity, percent (`gpm_sm_active_pct`).
    pub sm_pct: Option<f64>,
    /// SM occupancy (resident warps against the maximum), percent
    /// (`gpm_sm_occupancy_pct`).
    pub occupancy_pct: Option<f64>,
    /// DRAM bandwidth used against the peak, percent (`gpm_dram_bw_pct`).
    pub dram_pct: Option<f64>,
}

/// The GPM windows in a bundle's `samples.parquet` batches: the rows whose
/// `gpm_window_end_ns` is set. None for samples of a layout before GPM.
pub fn gpm_figures(batches: &[RecordBatch]) -> Vec<GpmFigure> {
    let mut out = Vec::new();
    for b in batches {
        let (Ok(start), Ok(end)) = (
            col::<Int64Array>(b, scol::GPM_WINDOW_START_NS),
            col::<Int64Array>(b, scol::GPM_WINDOW_END_NS),
        ) else {
            continue;
        };
        let f = |name: &str, i: usize| col::<Float64Array>(b, name).ok().and_then(|a| opt_f(a, i));
        for i in 0..b.num_rows() {
            if let (Some(s), Some(e)) = (opt_i(start, i), opt_i(end, i)) {
                out.push(GpmFigure {
                    start_ns: s,
                    end_ns: e,
                    tensor_pct: f(scol::GPM_TENSOR_ACTIVE_PCT, i),
                    sm_pct: f(scol::GPM_SM_ACTIVE_PCT, i),
                    occupancy_pct: f(scol::GPM_SM_OCCUPANCY_PCT, i),
                    dram_pct: f(scol::GPM_DRAM_BW_PCT, i),
                });
            }
        }
    }
    out
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The median of `pick` over the windows wholly inside one of `spans` (each
/// `[open_ns, close_ns]`); `None` when no window with a figure is inside.
pub fn inside_median(
    spans: &[(i64, i64)],
    windows: &[GpmFigure],
    pick: impl Fn(&GpmFigure) -> Option<f64>,
) -> Option<f64> {
    median(
        windows
            .iter()
            .filter(|w| spans.iter().any(|&(o, c)| w.start_ns >= o && w.end_ns <= c))
            .filter_map(pick)
            .collect(),
    )
}

fn col<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, String> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| format!("column {name} missing or of the wrong type"))
}

fn opt_i(a: &Int64Array, i: usize) -> Option<i64> {
    (!a.is_null(i)).then(|| a.value(i))
}
fn opt_f(a: &Float64Array, i: usize) -> Option<f64> {
    (!a.is_null(i)).then(|| a.value(i))
}
fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn lines_from(batches: &[RecordBatch]) -> Result<Vec<Line>, String> {
    let mut path_of: HashMap<i64, String> = HashMap::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<Line> = Vec::new();
    for b in batches {
        let seq = col::<Int64Array>(b, phases::SEQ)?;
        let name = col::<StringArray>(b, phases::NAME)?;
        let depth = col::<Int64Array>(b, phases::DEPTH)?;
        let parent = col::<Int64Array>(b, phases::PARENT_SEQ)?;
        let open_ns = col::<Int64Array>(b, phases::OPEN_NS)?;
        let close = col::<Int64Array>(b, phases::CLOSE_NS)?;
        let dur = col::<Float64Array>(b, phases::DURATION_S)?;
        let _leaf = col::<BooleanArray>(b, phases::IS_LEAF)?;
        let rss = col::<Int64Array>(b, phases::PEAK_RSS_BYTES)?;
        let gmem = col::<Int64Array>(b, phases::PEAK_ENGINE_GPU_MEM_BYTES)?;
        let dev = col::<Int64Array>(b, phases::PEAK_DEVICE_BYTES)?;
        let busy = col::<Float64Array>(b, phases::GPU_BUSY_SHARE)?;
        let util = col::<Float64Array>(b, phases::MEAN_GPU_UTIL_PCT)?;
        let cores = col::<Float64Array>(b, phases::MEAN_CPU_CORES)?;
        let samples = col::<Int64Array>(b, phases::SAMPLES)?;
        for i in 0..b.num_rows() {
            let parent_path = opt_i(parent, i)
                .and_then(|p| path_of.get(&p).cloned())
                .unwrap_or_default();
            let path = format!("{parent_path}/{}", name.value(i));
            path_of.insert(seq.value(i), path.clone());
            let k = *index.entry(path).or_insert_with(|| {
                out.push(Line {
                    name: name.value(i).to_string(),
                    depth: depth.value(i).max(0) as usize,
                    ..Default::default()
                });
                out.len() - 1
            });
            let l = &mut out[k];
            l.count += 1;
            if close.is_null(i) {
                l.open += 1;
            }
            let o = open_ns.value(i);
            l.spans.push((o, opt_i(close, i).unwrap_or(o)));
            l.seconds += dur.value(i);
            l.peak_rss = max_opt(l.peak_rss, opt_i(rss, i));
            l.peak_dev = max_opt(l.peak_dev, max_opt(opt_i(dev, i), opt_i(gmem, i)));
            let n = samples.value(i);
            l.samples += n;
            if let Some(v) = opt_f(busy, i) {
                l.busy_w += v * n as f64;
                l.busy_n += n;
            }
            if let Some(v) = opt_f(util, i) {
                l.util_w += v * n as f64;
                l.util_n += n;
            }
            if let Some(v) = opt_f(cores, i) {
                l.cores_w += v * n as f64;
                l.cores_n += n;
            }
        }
    }
    Ok(out)
}

fn mean(w: f64, n: i64) -> Option<f64> {
    (n > 0).then(|| w / n as f64)
}

/// The containment check's rule as the table states it: the share, and the
/// uncovered-time floor where a group passed by it (a bundle sealed before the
/// floor existed never shows one, so its rule reads as it was sealed).
fn containment_rule(c: &CheckSummary) -> String {
    let min_share = c.min_share.unwrap_or(0.0);
    let share = min_share * 100.0;
    let floor = c
        .groups
        .iter()
        .any(|g| g.verdict == Verdict::Pass && g.worst_share.is_some_and(|w| w < min_share));
    if floor {
        format!(
            "containment (sub-scopes inside, >= {share:.0}% cover or <= {} ms uncovered)",
            crate::phases::MAX_UNCOVERED_NS / 1_000_000
        )
    } else {
        format!("containment (sub-scopes inside, >= {share:.0}% cover)")
    }
}

fn check_line(label: &str, c: &CheckSummary) -> String {
    let mut s = format!("{label}: {}", c.verdict.as_str());
    for g in &c.groups {
        let _ = write!(s, "\n  {} x{}: {}", g.name, g.instances, g.verdict.as_str());
        if let Some(w) = g.worst_share {
            let _ = write!(s, ", worst cover {:.1}%", w * 100.0);
        }
        if let Some(d) = &g.detail {
            let _ = write!(s, " ({} failed; first: {d})", g.failed);
        }
    }
    s
}

/// Render the table for a bundle from its manifest and phases rows.
pub fn render(manifest: &Manifest, phases: &[RecordBatch]) -> Result<String, String> {
    render_with(manifest, phases, &[])
}

/// [`render`] with the bundle's GPM windows ([`gpm_figures`]): with any, the
/// `tensor %` and `SM %` columns (medians over the windows wholly inside each
/// phase) follow `cores`.
pub fn render_with(
    manifest: &Manifest,
    phases: &[RecordBatch],
    gpm: &[GpmFigure],
) -> Result<String, String> {
    let lines = lines_from(phases)?;
    let p = &manifest.phases;
    let wall = p.wall_s.filter(|w| *w > 0.0);
    let dash = || "-".to_string();
    let mut out = String::new();
    let _ = write!(
        out,
        "{:<34} {:>5} {:>10} {:>7} {:>11} {:>11} {:>8} {:>7} {:>6}",
        "phase", "n", "seconds", "% wall", "peak RSS", "peak device", "GPU busy", "util %", "cores"
    );
    if !gpm.is_empty() {
        let _ = write!(out, " {:>8} {:>6}", "tensor %", "SM %");
    }
    out.push('\n');
    for l in &lines {
        let mut name = format!("{}{}", "  ".repeat(l.depth), l.name);
        if l.open > 0 {
            name.push_str(" (open)");
        }
        let _ = write!(
            out,
            "{:<34} {:>5} {:>10.3} {:>7} {:>11} {:>11} {:>8} {:>7} {:>6}",
            name,
            l.count,
            l.seconds,
            wall.map_or_else(dash, |w| format!("{:.1}%", l.seconds / w * 100.0)),
            l.peak_rss
                .map_or_else(dash, |b| human_bytes(b.max(0) as u64)),
            l.peak_dev
                .map_or_else(dash, |b| human_bytes(b.max(0) as u64)),
            mean(l.busy_w, l.busy_n).map_or_else(dash, |v| format!("{:.1}%", v * 100.0)),
            mean(l.util_w, l.util_n).map_or_else(dash, |v| format!("{v:.1}")),
            mean(l.cores_w, l.cores_n).map_or_else(dash, |v| format!("{v:.2}")),
        );
        if !gpm.is_empty() {
            let pct = |v: Option<f64>| v.map_or_else(dash, |v| format!("{v:.1}"));
            let _ = write!(
                out,
                " {:>8} {:>6}",
                pct(inside_median(&l.spans, gpm, |w| w.tensor_pct)),
                pct(inside_median(&l.spans, gpm, |w| w.sm_pct)),
            );
        }
        out.push('\n');
    }
    match (p.wall_s, p.coverage, p.unaccounted_s) {
        (Some(w), Some(c), Some(u)) => {
            let _ = writeln!(
                out,
                "coverage: leaves sum {:.3} s of {:.3} s engine wall ({:.1}%), unaccounted {:.3} s",
                p.leaf_sum_s,
                w,
                c * 100.0,
                u
            );
        }
        _ => {
            let _ = writeln!(out, "coverage: no engine wall (no markers)");
        }
    }
    if let Some(r) = p.run_wall_s {
        let _ = writeln!(out, "run wall: {r:.3} s");
    }
    if !p.open_at_end.is_empty() {
        let _ = writeln!(out, "still open at the end: {}", p.open_at_end.join(", "));
    }
    if p.unmatched_closes > 0 {
        let _ = writeln!(out, "unmatched close markers: {}", p.unmatched_closes);
    }
    let rule = containment_rule(&p.containment);
    let _ = writeln!(out, "{}", check_line(&rule, &p.containment));
    let _ = writeln!(
        out,
        "{}",
        check_line(
            "exclusivity (no other leaf inside the sub-scopes' window)",
            &p.exclusivity
        )
    );
    Ok(out)
}

/// The phase table of the bundle at `bundle_dir`.
pub fn phase_table_text(bundle_dir: &Path) -> Result<String, VerifyError> {
    let read = |name: &str| {
        std::fs::read(bundle_dir.join(name)).map_err(|e| VerifyError::Unreadable {
            file: name.to_string(),
            why: e.to_string(),
        })
    };
    let mtext = read(MANIFEST)?;
    let manifest = std::str::from_utf8(&mtext)
        .map_err(|e| e.to_string())
        .and_then(Manifest::from_json)
        .map_err(|why| VerifyError::Manifest { why })?;
    let pbytes = read(bundle_files::PHASES)?;
    let t =
        parquet_tables::read_table(&pbytes, &parquet_tables::phases_schema()).map_err(|why| {
            VerifyError::Content {
                file: bundle_files::PHASES.into(),
                why,
            }
        })?;
    let sbytes = read(bundle_files::SAMPLES)?;
    let st =
        parquet_tables::read_table_as(&sbytes, &parquet_tables::schemas_for(bundle_files::SAMPLES))
            .map_err(|why| VerifyError::Content {
                file: bundle_files::SAMPLES.into(),
                why,
            })?;
    render_with(&manifest, &t.batches, &gpm_figures(&st.batches)).map_err(|why| {
        VerifyError::Content {
            file: bundle_files::PHASES.into(),
            why,
        }
    })
}

#[cfg(test)]
mod containment_rule_tests {
    use super::*;
    use crate::manifest::CheckGroup;

    fn summary(worst: f64, verdict: Verdict) -> CheckSummary {
        CheckSummary {
            min_share: Some(0.9),
            verdict,
            groups: vec![CheckGroup {
                name: "denoise".into(),
                instances: 1,
                failed: u64::from(verdict == Verdict::Fail),
                worst_share: Some(worst),
                verdict,
                detail: None,
            }],
        }
    }

    /// Red on: the floor named where no group needed it (every old bundle's
    /// line would misstate its rule), or left out where one passed by it.
    #[test]
    fn the_floor_is_named_only_where_a_group_passed_by_it() {
        let by_share = containment_rule(&summary(0.95, Verdict::Pass));
        assert_eq!(by_share, "containment (sub-scopes inside, >= 90% cover)");
        let failed = containment_rule(&summary(0.8, Verdict::Fail));
        assert_eq!(failed, by_share);
        let by_floor = containment_rule(&summary(0.883, Verdict::Pass));
        assert_eq!(
            by_floor,
            "containment (sub-scopes inside, >= 90% cover or <= 50 ms uncovered)"
        );
    }
}
