//! Sealing: a staging directory's journal becomes a content-addressed bundle.
//!
//! [`build_bundle`] is pure: the same journal (and frames) always gives the same
//! bytes, because it reads no clock, orders every table deterministically
//! (samples by `t_ns` then arrival, phases in open order, markers in arrival
//! order, frames by index) and writes Parquet and zstd with fixed settings.
//! [`seal`] adds the file system: it writes the bundle inside the staging
//! directory, fsyncs it, reads it back through [`crate::verify`], and only then
//! renames it atomically to `store/bundles/<id>` (never replacing a bundle; the
//! same content twice is a no-op). Then it moves `video.y4m` to
//! `store/renders/<id>.y4m` and removes the staging directory.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::ArrayRef;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::bundle_files::{self, FRAME_IMAGES, LOG, MANIFEST, VIDEO};
use crate::error::{io_at, IoAt, SealError};
use crate::fragments::{
    read_lenient, Exit, Fragment, Run, Sampler, SensorsUnavailable, StoreFragment,
};
use crate::journal::{read_journal, FrameRow, JournalContents, Record};
use crate::manifest::{
    canonical_json, sha256_hex, Cadence, FileEntry, JournalSummary, Manifest, MarkersSummary,
    VideoEntry, COMPUTED_KEYS, SCHEMA_VERSION,
};
use crate::marker::{parse_marker_line, Marker};
use crate::parquet_tables;
use crate::phases::build_tree;
use crate::sample::{ColumnType, Sample, SAMPLE_COLUMNS};
use crate::store::{fsync_dir, rename_noreplace, Store, JOURNAL_FILE, SEALED_FILE};

/// zstd level of `log.zst`.
pub const LOG_ZSTD_LEVEL: i32 = 9;
/// Reason recorded for a sensor that has no value in any sample and no reason
/// from the harness.
pub const NEVER_REPORTED: &str = "no value in any sample (no reason recorded by the harness)";

/// A sealed bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The bundle id: sha256 of `manifest.json`.
    pub id: String,
    /// `store/bundles/<id>`.
    pub path: PathBuf,
    /// False when an identical bundle already existed (sealing was a no-op).
    pub fresh: bool,
}

/// What goes into a bundle besides the journal.
#[derive(Debug, Clone, Default)]
pub struct SealInputs {
    /// Fragments that override the journal's (recover's `exit`), applied last.
    pub extra_fragments: Vec<(String, Value)>,
    /// Frame images by file name (`first.png`, ...).
    pub images: Vec<(String, Vec<u8>)>,
    /// The video's hash and size.
    pub video: Option<VideoEntry>,
    /// The store was opened past the durability gate.
    pub volatile_override: bool,
}

/// A bundle built in memory.
#[derive(Debug, Clone)]
pub struct BuiltBundle {
    /// The id (sha256 of `manifest_bytes`).
    pub id: String,
    /// The manifest.
    pub manifest: Manifest,
    /// Every file by name, `manifest.json` included.
    pub files: BTreeMap<String, Vec<u8>>,
}

fn table_err(file: &str) -> impl FnOnce(String) -> SealError + '_ {
    move |why| SealError::Table {
        file: file.to_string(),
        why,
    }
}

fn cadence(samples: &[Sample], expected_ms: Option<f64>) -> Cadence {
    let mut iv: Vec<u64> = samples.windows(2).map(|w| w[1].t_ns - w[0].t_ns).collect();
    iv.sort_unstable();
    let ms = |ns: u64| ns as f64 / 1e6;
    let pick = |q: f64| {
        // Nearest rank: the smallest interval with at least q of them at or below.
        (!iv.is_empty()).then(|| {
            let rank = ((q * iv.len() as f64).ceil() as usize).clamp(1, iv.len());
            ms(iv[rank - 1])
        })
    };
    let median = (!iv.is_empty()).then(|| {
        let n = iv.len();
        if n % 2 == 1 {
            ms(iv[n / 2])
        } else {
            (ms(iv[n / 2 - 1]) + ms(iv[n / 2])) / 2.0
        }
    });
    let mut c = Cadence {
        samples: samples.len() as u64,
        expected_ms,
        median_interval_ms: median,
        p99_interval_ms: pick(0.99),
        max_interval_ms: iv.last().map(|&n| ms(n)),
        missed_ticks: None,
        first_t_ns: samples.first().map(|s| s.t_ns),
        last_t_ns: samples.last().map(|s| s.t_ns),
    };
    // Deadlines with no sample: the slots the recording spans at the expected
    // period, less the samples taken. (Summing round(interval / expected) - 1 per
    // interval counted a tick that fired late, say at 160 ms, and the on-time tick
    // after it as a miss, which overcounted on the device runs: see
    // reports/device-notes.md.)
    c.missed_ticks = expected_ms
        .filter(|e| *e > 0.0)
        .map(|_| c.deadlines_without_sample().map_or(0, |(missed, _)| missed));
    c
}

fn i64_of(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

fn samples_table(samples: &[Sample], phase: &[Option<String>]) -> Result<Vec<u8>, SealError> {
    let n = samples.len();
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(SAMPLE_COLUMNS.len() + 2);
    let mut t = Int64Builder::with_capacity(n);
    let mut ph = StringBuilder::with_capacity(n, n * 8);
    for (s, p) in samples.iter().zip(phase) {
        t.append_value(i64_of(s.t_ns));
        ph.append_option(p.as_deref());
    }
    cols.push(Arc::new(t.finish()));
    cols.push(Arc::new(ph.finish()));
    for (i, c) in SAMPLE_COLUMNS.iter().enumerate() {
        // Non-finite readings are not measurements: stored as null.
        let get = |s: &Sample| s.values.get(i).copied().flatten().filter(|v| v.is_finite());
        match c.ty {
            ColumnType::I64 => {
                let mut b = Int64Builder::with_capacity(n);
                for s in samples {
                    b.append_option(get(s).map(|v| v.round() as i64));
                }
                cols.push(Arc::new(b.finish()));
            }
            ColumnType::F64 => {
                let mut b = Float64Builder::with_capacity(n);
                for s in samples {
                    b.append_option(get(s));
                }
                cols.push(Arc::new(b.finish()));
            }
        }
    }
    parquet_tables::write_table(parquet_tables::samples_schema(), cols)
        .map_err(table_err(bundle_files::SAMPLES))
}

fn phases_table(rows: &[crate::phases::PhaseRow]) -> Result<Vec<u8>, SealError> {
    let n = rows.len();
    let mut seq = Int64Builder::with_capacity(n);
    let mut name = StringBuilder::new();
    let mut depth = Int64Builder::with_capacity(n);
    let mut parent = Int64Builder::with_capacity(n);
    let mut open = Int64Builder::with_capacity(n);
    let mut close = Int64Builder::with_capacity(n);
    let mut dur = Float64Builder::with_capacity(n);
    let mut leaf = BooleanBuilder::with_capacity(n);
    let mut attrs = StringBuilder::new();
    let mut rss = Int64Builder::with_capacity(n);
    let mut gmem = Int64Builder::with_capacity(n);
    let mut dev = Int64Builder::with_capacity(n);
    let mut dms = Float64Builder::with_capacity(n);
    let mut busy = Float64Builder::with_capacity(n);
    let mut util = Float64Builder::with_capacity(n);
    let mut cores = Float64Builder::with_capacity(n);
    let mut ns = Int64Builder::with_capacity(n);
    for r in rows {
        let p = &r.phase;
        seq.append_value(p.seq as i64);
        name.append_value(&p.name);
        depth.append_value(p.depth as i64);
        parent.append_option(p.parent.map(|x| x as i64));
        open.append_value(i64_of(p.open_ns));
        close.append_option(p.close_ns.map(i64_of));
        dur.append_value(r.duration_s);
        leaf.append_value(r.is_leaf);
        attrs.append_value(&r.attrs_json);
        rss.append_option(r.peak_rss_bytes);
        gmem.append_option(r.peak_engine_gpu_mem_bytes);
        dev.append_option(r.peak_device_bytes);
        dms.append_option(r.device_ms);
        busy.append_option(r.gpu_busy_share);
        util.append_option(r.mean_gpu_util_pct);
        cores.append_option(r.mean_cpu_cores);
        ns.append_value(r.samples);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(seq.finish()),
        Arc::new(name.finish()),
        Arc::new(depth.finish()),
        Arc::new(parent.finish()),
        Arc::new(open.finish()),
        Arc::new(close.finish()),
        Arc::new(dur.finish()),
        Arc::new(leaf.finish()),
        Arc::new(attrs.finish()),
        Arc::new(rss.finish()),
        Arc::new(gmem.finish()),
        Arc::new(dev.finish()),
        Arc::new(dms.finish()),
        Arc::new(busy.finish()),
        Arc::new(util.finish()),
        Arc::new(cores.finish()),
        Arc::new(ns.finish()),
    ];
    parquet_tables::write_table(parquet_tables::phases_schema(), cols)
        .map_err(table_err(bundle_files::PHASES))
}

/// A marker line as received and what parsing it gave.
struct MarkerLine<'a> {
    recv_ns: u64,
    line: &'a str,
    parsed: Result<Marker, String>,
    /// Why a line that parsed was rejected by the clock check; such a marker is
    /// kept in `markers.parquet` but builds no phase.
    clock: Option<String>,
}

/// How far a marker's `t_ns` may lie outside the harness's own readings of the
/// same clock (CLOCK_MONOTONIC), ns: after the moment the harness read its line,
/// before the run started, or behind a marker accepted earlier. 100 ms covers an
/// engine whose threads stamp and write in a slightly different order; a stamp
/// further out is not a time this run could have measured.
pub const MARKER_CLOCK_SLACK_NS: u64 = 100_000_000;

/// Judge each parsed marker's `t_ns` against the harness's clock: it must lie
/// in `[run_start - slack, recv_ns + slack]` and not more than the slack behind
/// the latest marker accepted before it (arrival order). Sets `clock` on each
/// rejected line.
fn check_marker_clock(lines: &mut [MarkerLine<'_>], run_start: Option<u64>) {
    let slack = MARKER_CLOCK_SLACK_NS;
    let mut latest: Option<u64> = None;
    for (seq, l) in lines.iter_mut().enumerate() {
        let Ok(m) = &l.parsed else { continue };
        let t = m.t_ns();
        let why = if t > l.recv_ns.saturating_add(slack) {
            Some(format!(
                "t_ns {t} is {:.3} s after the harness read the line (recv_ns {})",
                (t - l.recv_ns) as f64 / 1e9,
                l.recv_ns
            ))
        } else if let Some(start) = run_start.filter(|s| t < s.saturating_sub(slack)) {
            Some(format!(
                "t_ns {t} is {:.3} s before the run started (run.start_ns {start})",
                (start - t) as f64 / 1e9
            ))
        } else {
            latest
                .filter(|last| t < last.saturating_sub(slack))
                .map(|last| {
                    format!(
                        "t_ns {t} goes {:.3} s back from an earlier marker's {last}",
                        (last - t) as f64 / 1e9
                    )
                })
        };
        match why {
            Some(w) => {
                l.clock = Some(format!(
                    "clock: marker line {seq}: {w} (slack {} ms); kept, not used for phases",
                    slack / 1_000_000
                ))
            }
            None => latest = Some(latest.map_or(t, |x| x.max(t))),
        }
    }
}

fn ev_name(m: &Marker) -> &'static str {
    match m {
        Marker::Hello { .. } => "hello",
        Marker::Open { .. } => "open",
        Marker::Close { .. } => "close",
        Marker::Tick { .. } => "tick",
        Marker::Info { .. } => "info",
    }
}

fn markers_table(lines: &[MarkerLine<'_>]) -> Result<Vec<u8>, SealError> {
    let n = lines.len();
    let mut seq = Int64Builder::with_capacity(n);
    let mut recv = Int64Builder::with_capacity(n);
    let mut t = Int64Builder::with_capacity(n);
    let mut ev = StringBuilder::new();
    let mut name = StringBuilder::new();
    let mut attrs = StringBuilder::new();
    let mut line = StringBuilder::new();
    let mut err = StringBuilder::new();
    for (i, m) in lines.iter().enumerate() {
        seq.append_value(i as i64);
        recv.append_value(i64_of(m.recv_ns));
        line.append_value(m.line);
        match &m.parsed {
            Ok(mk) => {
                t.append_value(i64_of(mk.t_ns()));
                ev.append_value(ev_name(mk));
                name.append_option(mk.name());
                let a: serde_json::Map<String, Value> = mk.attrs().clone().into_iter().collect();
                attrs.append_value(canonical_json(&Value::Object(a)));
                err.append_option(m.clock.as_deref());
            }
            Err(e) => {
                t.append_null();
                ev.append_null();
                name.append_null();
                attrs.append_null();
                err.append_value(e);
            }
        }
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(seq.finish()),
        Arc::new(recv.finish()),
        Arc::new(t.finish()),
        Arc::new(ev.finish()),
        Arc::new(name.finish()),
        Arc::new(attrs.finish()),
        Arc::new(line.finish()),
        Arc::new(err.finish()),
    ];
    parquet_tables::write_table(parquet_tables::markers_schema(), cols)
        .map_err(table_err(bundle_files::MARKERS))
}

fn frames_table(frames: &[&FrameRow]) -> Result<Vec<u8>, SealError> {
    let mut idx = Int64Builder::new();
    let mut sha = StringBuilder::new();
    let mut st: [Float64Builder; 4] = Default::default();
    let mut motion = Float64Builder::new();
    let mut black = BooleanBuilder::new();
    let mut uniform = BooleanBuilder::new();
    let mut dup = Int64Builder::new();
    for f in frames {
        idx.append_value(i64::from(f.index));
        sha.append_value(&f.sha256);
        for (b, v) in st
            .iter_mut()
            .zip([f.mean_luma, f.std_luma, f.min_luma, f.max_luma])
        {
            b.append_value(v);
        }
        motion.append_option(f.motion_vs_prev);
        black.append_value(f.near_black);
        uniform.append_value(f.near_uniform);
        dup.append_option(f.duplicate_of.map(i64::from));
    }
    let [mut a, mut b, mut c, mut d] = st;
    let cols: Vec<ArrayRef> = vec![
        Arc::new(idx.finish()),
        Arc::new(sha.finish()),
        Arc::new(a.finish()),
        Arc::new(b.finish()),
        Arc::new(c.finish()),
        Arc::new(d.finish()),
        Arc::new(motion.finish()),
        Arc::new(black.finish()),
        Arc::new(uniform.finish()),
        Arc::new(dup.finish()),
    ];
    parquet_tables::write_table(parquet_tables::frames_schema(), cols)
        .map_err(table_err(bundle_files::FRAMES))
}

/// The text of `log.zst` before compression: one line per output record,
/// `t_ns<TAB>stdout|stderr<TAB>line`, with `\`, newline and carriage return
/// escaped as `\\`, `\n`, `\r`.
pub fn log_text<'a>(
    lines: impl Iterator<Item = (u64, crate::journal::Stream, &'a str)>,
) -> (String, u64) {
    let mut out = String::new();
    let mut n = 0u64;
    for (t, s, l) in lines {
        out.push_str(&t.to_string());
        out.push('\t');
        out.push_str(s.as_str());
        out.push('\t');
        for ch in l.chars() {
            match ch {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c => out.push(c),
            }
        }
        out.push('\n');
        n += 1;
    }
    (out, n)
}

fn entry(bytes: &[u8], rows: Option<u64>) -> FileEntry {
    FileEntry {
        sha256: sha256_hex(bytes),
        bytes: bytes.len() as u64,
        rows,
    }
}

/// The journal's records sorted by kind, in the order a bundle needs them.
struct Gathered<'a> {
    /// Sampler rows, in time order (ties keep arrival order).
    samples: Vec<Sample>,
    /// Marker lines with their receive time (CLOCK_MONOTONIC ns), in arrival order.
    raw_markers: Vec<(u64, &'a str)>,
    /// Engine output lines: time (ns), stream, text.
    outputs: Vec<(u64, crate::journal::Stream, &'a str)>,
    /// Fragments by key (the last one written wins), computed keys left out.
    fragments: BTreeMap<String, Value>,
    /// Frame rows by index.
    frames: BTreeMap<u32, &'a FrameRow>,
    /// Records per kind (`sample`, `marker`, ...).
    counts: BTreeMap<String, u64>,
    /// Fragment keys ignored because the seal computes them, sorted, unique.
    ignored: Vec<String>,
    /// The latest time any record carries, CLOCK_MONOTONIC ns.
    end_ns: u64,
}

/// Sort the journal's records (and the inputs' extra fragments) by kind.
fn gather<'a>(c: &'a JournalContents, inputs: &SealInputs) -> Gathered<'a> {
    let mut g = Gathered {
        samples: Vec::new(),
        raw_markers: Vec::new(),
        outputs: Vec::new(),
        fragments: BTreeMap::new(),
        frames: BTreeMap::new(),
        counts: ["sample", "marker", "output", "fragment", "frame"]
            .iter()
            .map(|k| (k.to_string(), 0))
            .collect(),
        ignored: Vec::new(),
        end_ns: 0,
    };
    for r in &c.records {
        *g.counts.entry(r.kind().to_string()).or_default() += 1;
        match r {
            Record::Sample(s) => {
                g.end_ns = g.end_ns.max(s.t_ns);
                g.samples.push(s.clone());
            }
            Record::Marker { recv_ns, line } => {
                g.end_ns = g.end_ns.max(*recv_ns);
                g.raw_markers.push((*recv_ns, line));
            }
            Record::Output { t_ns, stream, line } => {
                g.end_ns = g.end_ns.max(*t_ns);
                g.outputs.push((*t_ns, *stream, line.as_str()));
            }
            Record::Fragment { key, value } => {
                if COMPUTED_KEYS.contains(&key.as_str()) {
                    g.ignored.push(key.clone());
                } else {
                    g.fragments.insert(key.clone(), value.clone());
                }
            }
            Record::Frame(f) => {
                g.frames.insert(f.index, f);
            }
        }
    }
    for (k, v) in &inputs.extra_fragments {
        if COMPUTED_KEYS.contains(&k.as_str()) {
            g.ignored.push(k.clone());
        } else {
            g.fragments.insert(k.clone(), v.clone());
        }
    }
    g.ignored.sort();
    g.ignored.dedup();
    if inputs.volatile_override {
        let mut st = g
            .fragments
            .get(StoreFragment::KEY)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        // Set on whatever the harness wrote, every other field kept as it was.
        st.insert("volatile_override".into(), Value::Bool(true));
        g.fragments
            .insert(StoreFragment::KEY.into(), Value::Object(st));
    }
    // Samples in time order (stable: ties keep arrival order).
    g.samples.sort_by_key(|s| s.t_ns);
    g
}

/// The `markers` section: line counts, events by kind, the hello, the first
/// error, and the markers the clock check rejected. `parsed` and `by_ev` count
/// every line that parsed, rejected or not.
fn markers_summary(lines: &[MarkerLine<'_>]) -> MarkersSummary {
    let parsed: Vec<&Marker> = lines
        .iter()
        .filter_map(|m| m.parsed.as_ref().ok())
        .collect();
    let mut by_ev: BTreeMap<String, u64> = BTreeMap::new();
    for m in &parsed {
        *by_ev.entry(ev_name(m).to_string()).or_default() += 1;
    }
    let hello = parsed.iter().find_map(|m| match m {
        Marker::Hello { .. } => serde_json::to_value(m).ok(),
        _ => None,
    });
    let first_error = lines.iter().enumerate().find_map(|(i, m)| {
        m.parsed
            .as_ref()
            .err()
            .map(|e| format!("marker line {i}: {e}"))
    });
    MarkersSummary {
        lines: lines.len() as u64,
        parsed: parsed.len() as u64,
        unparsed: (lines.len() - parsed.len()) as u64,
        by_ev,
        hello,
        first_error,
        clock_rejected: lines.iter().filter(|m| m.clock.is_some()).count() as u64,
        first_clock_error: lines.iter().find_map(|m| m.clock.clone()),
    }
}

/// Give every sampler column with no value in any sample a reason in
/// `sensors_unavailable`, unless the harness already gave one.
fn mark_never_reported(fragments: &mut BTreeMap<String, Value>, samples: &[Sample]) {
    if samples.is_empty() {
        return;
    }
    let SensorsUnavailable(mut su) = read_lenient(fragments).unwrap_or_default();
    let before = su.len();
    for (i, col) in SAMPLE_COLUMNS.iter().enumerate() {
        let any = samples.iter().any(|s| {
            s.values
                .get(i)
                .copied()
                .flatten()
                .is_some_and(f64::is_finite)
        });
        if !any && !su.contains_key(col.name) {
            su.insert(col.name.to_string(), Value::from(NEVER_REPORTED));
        }
    }
    if su.len() != before || fragments.contains_key(SensorsUnavailable::KEY) {
        fragments.insert(
            SensorsUnavailable::KEY.into(),
            Value::Object(su.into_iter().collect()),
        );
    }
}

/// A bundle's files by name (every one but `manifest.json`) and their entries.
#[derive(Default)]
struct Files {
    bytes: BTreeMap<String, Vec<u8>>,
    entries: BTreeMap<String, FileEntry>,
}

impl Files {
    fn put(&mut self, name: &str, bytes: Vec<u8>, rows: Option<u64>) {
        self.entries.insert(name.to_string(), entry(&bytes, rows));
        self.bytes.insert(name.to_string(), bytes);
    }
}

/// Build a bundle in memory from journal contents. Pure and deterministic.
pub fn build_bundle(c: &JournalContents, inputs: &SealInputs) -> Result<BuiltBundle, SealError> {
    let Gathered {
        samples,
        raw_markers,
        outputs,
        mut fragments,
        frames,
        counts,
        ignored,
        mut end_ns,
    } = gather(c, inputs);

    // Markers: parse each line; the parsed ones build the phase tree.
    let lines: Vec<MarkerLine<'_>> = raw_markers
        .iter()
        .map(|&(recv_ns, line)| MarkerLine {
            recv_ns,
            line,
            parsed: parse_marker_line(line).map_err(|e| e.to_string()),
            clock: None,
        })
        .collect();
    let (run_start, run_end) =
        read_lenient::<Run>(&fragments).map_or((None, None), |r| (r.start_ns, r.end_ns));
    let mut lines = lines;
    check_marker_clock(&mut lines, run_start);
    // Phases are built from the markers that parsed and whose time is believable.
    let parsed: Vec<Marker> = lines
        .iter()
        .filter(|m| m.clock.is_none())
        .filter_map(|m| m.parsed.as_ref().ok().cloned())
        .collect();
    if let Some(e) = run_end {
        end_ns = end_ns.max(e);
    }
    let tree = build_tree(&parsed, end_ns);
    let rows = tree.rows(&samples);
    let sample_phase: Vec<Option<String>> = tree
        .phase_of_samples(&samples)
        .into_iter()
        .map(|p| p.map(|i| tree.phases[i].name.clone()))
        .collect();
    let phases_summary = tree.summary((run_start, run_end));
    let markers_summary = markers_summary(&lines);
    mark_never_reported(&mut fragments, &samples);
    let expected_ms = read_lenient::<Sampler>(&fragments)
        .and_then(|s| s.cadence_ms)
        .and_then(|ms| ms.as_f64());
    let cadence = cadence(&samples, expected_ms);

    let mut files = Files::default();
    files.put(
        bundle_files::SAMPLES,
        samples_table(&samples, &sample_phase)?,
        Some(samples.len() as u64),
    );
    files.put(
        bundle_files::PHASES,
        phases_table(&rows)?,
        Some(rows.len() as u64),
    );
    files.put(
        bundle_files::MARKERS,
        markers_table(&lines)?,
        Some(lines.len() as u64),
    );
    if !frames.is_empty() {
        let fr: Vec<&FrameRow> = frames.values().copied().collect();
        files.put(
            bundle_files::FRAMES,
            frames_table(&fr)?,
            Some(fr.len() as u64),
        );
    }
    let (text, nlines) = log_text(outputs.into_iter());
    let log = zstd::bulk::compress(text.as_bytes(), LOG_ZSTD_LEVEL)
        .map_err(|e| table_err(LOG)(e.to_string()))?;
    files.put(LOG, log, Some(nlines));
    for (name, bytes) in &inputs.images {
        files.put(name, bytes.clone(), None);
    }

    let complete = c.bytes_dropped == 0
        && read_lenient::<Exit>(&fragments)
            .and_then(|e| e.reason)
            .as_deref()
            == Some("completed");
    let manifest = Manifest {
        schema: SCHEMA_VERSION,
        complete,
        cadence,
        phases: phases_summary,
        markers: markers_summary,
        journal: JournalSummary {
            bytes_total: c.bytes_total,
            bytes_good: c.bytes_good,
            bytes_dropped: c.bytes_dropped,
            stop_reason: c.stop_reason.clone(),
            records: counts,
            ignored_fragments: ignored,
        },
        files: files.entries,
        video: inputs.video.clone(),
        fragments,
    };
    let mbytes = manifest.canonical_bytes();
    let id = sha256_hex(&mbytes);
    let mut files = files.bytes;
    files.insert(MANIFEST.to_string(), mbytes);
    Ok(BuiltBundle {
        id,
        manifest,
        files,
    })
}

/// sha256 and size of a file, streamed.
pub fn hash_file(path: &Path) -> Result<VideoEntry, IoAt> {
    let mut f = std::fs::File::open(path).map_err(io_at(path, "open"))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(io_at(path, "read"))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok(VideoEntry {
        sha256: crate::manifest::hex(&h.finalize()),
        bytes: n,
    })
}

/// Read a staging directory's journal; a missing journal is an empty one (a run
/// that died before creating it).
pub fn read_staging_journal(staging: &Path) -> Result<JournalContents, SealError> {
    let p = staging.join(JOURNAL_FILE);
    if !p.exists() {
        return Ok(JournalContents {
            stop_reason: Some("no journal file in the staging directory".into()),
            ..Default::default()
        });
    }
    Ok(read_journal(&p)?)
}

/// Seal staging directory `staging` into `store`; see the module docs.
pub fn seal(staging: &Path, store: &Store) -> Result<Sealed, SealError> {
    let contents = read_staging_journal(staging)?;
    seal_contents(staging, store, &contents, Vec::new())
}

/// Seal with journal contents already read and fragments that override the
/// journal's (used by `recover` to add the exit reason).
pub fn seal_contents(
    staging: &Path,
    store: &Store,
    contents: &JournalContents,
    extra_fragments: Vec<(String, Value)>,
) -> Result<Sealed, SealError> {
    let frames_dir = staging.join("frames");
    let mut images = Vec::new();
    for name in FRAME_IMAGES {
        let p = frames_dir.join(name);
        if p.is_file() {
            images.push((
                name.to_string(),
                std::fs::read(&p).map_err(io_at(&p, "read frame image"))?,
            ));
        }
    }
    let video_path = frames_dir.join(VIDEO);
    let video = if video_path.is_file() {
        Some(hash_file(&video_path)?)
    } else {
        None
    };
    let built = build_bundle(
        contents,
        &SealInputs {
            extra_fragments,
            images,
            video,
            volatile_override: store.volatile_override(),
        },
    )?;

    // Write the bundle inside the staging directory, durably.
    let tmp = staging.join("bundle.tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_at(&tmp, "remove stale bundle.tmp"))?;
    }
    std::fs::create_dir(&tmp).map_err(io_at(&tmp, "create"))?;
    for (name, bytes) in &built.files {
        let p = tmp.join(name);
        write_durably(&p, bytes)?;
        // Sealed files are read-only: editing one takes a chmod first, which
        // changes its change time (what the interactive readers' stamp cache
        // watches); evidence readers hash every byte regardless.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))
            .map_err(io_at(&p, "make read-only"))?;
    }
    fsync_dir(&tmp)?;

    // Read it back from disk before publishing.
    let report = crate::verify::verify_dir_as(&tmp, &built.id);
    if let Some(e) = report.errors.into_iter().next() {
        return Err(SealError::ReadBack(e));
    }

    let fresh = store.publish(&tmp, &built.id)?;
    if !fresh {
        std::fs::remove_dir_all(&tmp).map_err(io_at(&tmp, "remove duplicate bundle"))?;
    }
    let path = store.bundles_dir().join(&built.id);
    finish_staging(store, staging, &built.id)?;
    Ok(Sealed {
        id: built.id,
        path,
        fresh,
    })
}

fn write_durably(p: &Path, bytes: &[u8]) -> Result<(), IoAt> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p)
        .map_err(io_at(p, "create"))?;
    f.write_all(bytes).map_err(io_at(p, "write"))?;
    f.sync_all().map_err(io_at(p, "fsync"))
}

/// After publishing bundle `id` from `staging`: record the id in the staging
/// directory, move the video to `renders/<id>.y4m` (keeping an existing one,
/// which has the same hash), and remove the staging directory. Idempotent, so
/// `recover` can finish a seal interrupted after its publish.
pub fn finish_staging(store: &Store, staging: &Path, id: &str) -> Result<(), SealError> {
    let marker = staging.join(SEALED_FILE);
    if !marker.exists() {
        write_durably(&marker, id.as_bytes())?;
        fsync_dir(staging)?;
    }
    let video = staging.join("frames").join(VIDEO);
    if video.is_file() {
        let to = store.renders_dir().join(format!("{id}.y4m"));
        rename_noreplace(&video, &to)?;
        fsync_dir(&store.renders_dir())?;
    }
    std::fs::remove_dir_all(staging).map_err(io_at(staging, "remove sealed staging directory"))?;
    if let Some(parent) = staging.parent() {
        fsync_dir(parent)?;
    }
    Ok(())
}

/// The exit fragment `recover` writes: reason, no code or signal, and why.
pub fn recovered_exit(reason: &str, detail: String) -> Value {
    json!({"reason": reason, "code": null, "signal": null, "detail": detail})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Stream;

    fn s(t: u64) -> Sample {
        Sample::empty(t)
    }

    #[test]
    fn marker_clock_rejects_the_future_the_past_and_going_back_within_a_stated_slack() {
        const MS: u64 = 1_000_000;
        let start = 1_000 * MS;
        // (recv_ns, t_ns) in arrival order, and whether the check accepts it.
        let cases: [(u64, u64, bool); 7] = [
            (1_100 * MS, 1_050 * MS, true),
            (1_200 * MS, 1_150 * MS, true),
            (1_300 * MS, 1_099 * MS, true), // 51 ms behind the latest: within slack
            (1_400 * MS, 1_049 * MS, false), // 101 ms behind 1_150: goes back
            (1_500 * MS, 1_601 * MS, false), // 101 ms after it was read
            (1_600 * MS, 899 * MS, false),  // 101 ms before the run started
            (1_700 * MS, 1_700 * MS, true),
        ];
        let texts: Vec<String> = cases
            .iter()
            .map(|(_, t, _)| format!(r#"{{"ev":"tick","t_ns":{t},"name":"x"}}"#))
            .collect();
        let mut lines: Vec<MarkerLine<'_>> = cases
            .iter()
            .zip(&texts)
            .map(|(&(recv_ns, _, _), line)| MarkerLine {
                recv_ns,
                line,
                parsed: parse_marker_line(line).map_err(|e| e.to_string()),
                clock: None,
            })
            .collect();
        check_marker_clock(&mut lines, Some(start));
        for (i, (l, &(_, _, ok))) in lines.iter().zip(&cases).enumerate() {
            assert_eq!(l.clock.is_none(), ok, "line {i}: {:?}", l.clock);
        }
        let why: Vec<&str> = lines.iter().filter_map(|l| l.clock.as_deref()).collect();
        assert!(
            why[0].contains("marker line 3") && why[0].contains("goes 0.101 s back"),
            "{}",
            why[0]
        );
        assert!(why[1].contains("after the harness read"), "{}", why[1]);
        assert!(why[2].contains("before the run started"), "{}", why[2]);
        let summary = markers_summary(&lines);
        assert_eq!((summary.parsed, summary.clock_rejected), (7, 3));
    }

    #[test]
    fn cadence_median_p99_and_missed_ticks() {
        // Intervals: 100 x 98, then one of 300 (two missed ticks at 100 ms).
        let mut v: Vec<Sample> = (0..99).map(|i| s(i * 100_000_000)).collect();
        v.push(s(98 * 100_000_000 + 300_000_000));
        let c = cadence(&v, Some(100.0));
        assert_eq!(c.samples, 100);
        assert_eq!(c.median_interval_ms, Some(100.0));
        assert_eq!(c.p99_interval_ms, Some(300.0));
        assert_eq!(c.max_interval_ms, Some(300.0));
        assert_eq!(c.missed_ticks, Some(2));
        assert_eq!(c.slots(), Some(102));
        assert_eq!(c.deadlines_without_sample(), Some((2, 102)));
        assert_eq!(cadence(&v, None).missed_ticks, None);
        assert_eq!(cadence(&v, None).slots(), None);
        // A late tick (160 ms) followed by an on-time one (40 ms) skipped no
        // deadline: 10 such pairs over 2 s hold 21 samples in 21 slots.
        let late: Vec<Sample> = (0..21u64)
            .map(|i| s((i / 2) * 200_000_000 + (i % 2) * 160_000_000))
            .collect();
        assert_eq!(cadence(&late, Some(100.0)).missed_ticks, Some(0));
        assert_eq!(cadence(&late, Some(100.0)).max_interval_ms, Some(160.0));
        assert_eq!(cadence(&[], Some(100.0)).missed_ticks, Some(0));
        assert_eq!(cadence(&[], Some(100.0)).median_interval_ms, None);
    }

    #[test]
    fn log_lines_escape_and_count() {
        let (t, n) = log_text(
            vec![
                (5u64, Stream::Stderr, "a\\b"),
                (6, Stream::Stdout, "x\ny\r"),
            ]
            .into_iter(),
        );
        assert_eq!(n, 2);
        assert_eq!(t, "5\tstderr\ta\\\\b\n6\tstdout\tx\\ny\\r\n");
    }

    #[test]
    fn computed_keys_cannot_be_forged_by_fragments_and_override_is_recorded() {
        let c = JournalContents {
            records: vec![
                Record::Fragment {
                    key: "complete".into(),
                    value: Value::Bool(true),
                },
                Record::Fragment {
                    key: "exit".into(),
                    value: json!({"reason": "completed"}),
                },
            ],
            ..Default::default()
        };
        let b = build_bundle(
            &c,
            &SealInputs {
                volatile_override: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(b.manifest.complete, "exit completed + clean journal");
        assert_eq!(b.manifest.journal.ignored_fragments, vec!["complete"]);
        assert_eq!(
            b.manifest.fragments["store"],
            json!({"volatile_override": true})
        );
        let mut torn = c.clone();
        torn.bytes_dropped = 1;
        assert!(
            !build_bundle(&torn, &SealInputs::default())
                .unwrap()
                .manifest
                .complete
        );
    }
}
