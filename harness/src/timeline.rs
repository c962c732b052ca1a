//! A sealed bundle read onto one time axis: its manifest, its phase instances, its
//! tick markers and its sampler columns. `harness plot` and `harness export` draw
//! and write from this; nothing here interprets the numbers.
//!
//! Times stay in the bundle's clock (CLOCK_MONOTONIC nanoseconds of the host the
//! run ran on). [`Timeline::origin_ns`] is the zero of every picture and trace: the
//! run's start when the harness recorded one, else the earliest marker or sample.

use evidence::parquet_tables::columns::{markers, phases, samples};

use evidence::fragments::{Fragment, SensorsUnavailable};
use std::path::{Path, PathBuf};

use anyhow::Context;
use arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use evidence::bundle_files;
use evidence::manifest::Manifest;
use evidence::sample::SAMPLE_COLUMNS;
use serde_json::Value;

use crate::bundle::{self, error::ManifestError};
use crate::exit::UsageError;

/// One phase instance (a row of `phases.parquet`).
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSpan {
    /// Open order, 0-based (`seq`).
    pub seq: i64,
    /// Marker name (`denoise.step`).
    pub name: String,
    /// Nesting depth, 0 at top.
    pub depth: i64,
    /// `seq` of the enclosing phase, `None` at top.
    pub parent_seq: Option<i64>,
    /// CLOCK_MONOTONIC ns of the open marker.
    pub open_ns: i64,
    /// CLOCK_MONOTONIC ns of the close marker; `None` when still open at the end.
    pub close_ns: Option<i64>,
    /// Duration in seconds (to the end of the recording when still open).
    pub duration_s: f64,
    /// The open and close marker attributes: `{"open":{..},"close":{..}}`.
    pub attrs: Value,
}

impl PhaseSpan {
    /// The end of the window in ns: the close, or open + duration when still open.
    pub fn end_ns(&self) -> i64 {
        self.close_ns
            .unwrap_or(self.open_ns + (self.duration_s * 1e9).round() as i64)
    }
}

/// One `tick` marker (e.g. `dit.forward`), from `markers.parquet`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// Marker timestamp, CLOCK_MONOTONIC ns (the engine's clock reading).
    pub t_ns: i64,
    /// Marker name.
    pub name: String,
    /// Its attributes (canonical JSON object).
    pub attrs: Value,
}

/// One sampler column over the whole run.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Column name from `evidence::sample::SAMPLE_COLUMNS` (`rss_bytes`).
    pub name: &'static str,
    /// Its unit (`bytes`, `percent`, `milliwatts`, ...).
    pub unit: &'static str,
    /// One value per sample row; `None` where the sensor had no reading.
    pub values: Vec<Option<f64>>,
}

impl Series {
    /// True when at least one sample has a value.
    pub fn any(&self) -> bool {
        self.values.iter().any(Option::is_some)
    }
}

/// A bundle's contents on one time axis.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// The bundle id (its directory name).
    pub id: String,
    /// The bundle directory.
    pub dir: PathBuf,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Phase instances in open order.
    pub phases: Vec<PhaseSpan>,
    /// Tick markers in arrival order.
    pub ticks: Vec<Tick>,
    /// Sample times, CLOCK_MONOTONIC ns, ascending.
    pub sample_t_ns: Vec<i64>,
    /// Every sampler column, in `SAMPLE_COLUMNS` order, aligned with `sample_t_ns`.
    pub series: Vec<Series>,
}

fn col<'a, T: 'static>(b: &'a RecordBatch, file: &str, name: &str) -> anyhow::Result<&'a T> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| anyhow::anyhow!("{file}: column {name} missing or of the wrong type"))
}

fn opt_i(a: &Int64Array, i: usize) -> Option<i64> {
    (!a.is_null(i)).then(|| a.value(i))
}

fn opt_f(a: &Float64Array, i: usize) -> Option<f64> {
    (!a.is_null(i)).then(|| a.value(i))
}

fn json_attrs(file: &str, seq: i64, text: Option<&str>) -> anyhow::Result<Value> {
    match text {
        None => Ok(Value::Object(Default::default())),
        Some(t) => serde_json::from_str(t)
            .with_context(|| format!("{file}: row seq {seq}: attrs_json is not JSON")),
    }
}

impl Timeline {
    /// Read the bundle at `dir` (its manifest, phases, markers and samples).
    /// A file that is missing or does not match its schema is an error naming it.
    pub fn load(dir: &Path) -> anyhow::Result<Timeline> {
        // A manifest that does not parse is an input error here (exit 2).
        let manifest = bundle::manifest::read_typed(dir).map_err(|e| match e {
            ManifestError::Malformed { .. } => anyhow::Error::from(UsageError(e.to_string())),
            other => anyhow::Error::from(other),
        })?;
        let id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();

        let mut phases = Vec::new();
        for b in bundle::tables::read(dir, bundle_files::PHASES)? {
            let f = bundle_files::PHASES;
            let seq = col::<Int64Array>(&b, f, phases::SEQ)?;
            let name = col::<StringArray>(&b, f, phases::NAME)?;
            let depth = col::<Int64Array>(&b, f, phases::DEPTH)?;
            let parent = col::<Int64Array>(&b, f, phases::PARENT_SEQ)?;
            let open = col::<Int64Array>(&b, f, phases::OPEN_NS)?;
            let close = col::<Int64Array>(&b, f, phases::CLOSE_NS)?;
            let dur = col::<Float64Array>(&b, f, phases::DURATION_S)?;
            let attrs = col::<StringArray>(&b, f, phases::ATTRS_JSON)?;
            for i in 0..b.num_rows() {
                let s = seq.value(i);
                phases.push(PhaseSpan {
                    seq: s,
                    name: name.value(i).to_string(),
                    depth: depth.value(i),
                    parent_seq: opt_i(parent, i),
                    open_ns: open.value(i),
                    close_ns: opt_i(close, i),
                    duration_s: dur.value(i),
                    attrs: json_attrs(f, s, (!attrs.is_null(i)).then(|| attrs.value(i)))?,
                });
            }
        }

        let mut ticks = Vec::new();
        for b in bundle::tables::read(dir, bundle_files::MARKERS)? {
            let f = bundle_files::MARKERS;
            let seq = col::<Int64Array>(&b, f, markers::SEQ)?;
            let ev = col::<StringArray>(&b, f, markers::EV)?;
            let t = col::<Int64Array>(&b, f, markers::T_NS)?;
            let name = col::<StringArray>(&b, f, markers::NAME)?;
            let attrs = col::<StringArray>(&b, f, markers::ATTRS_JSON)?;
            for i in 0..b.num_rows() {
                if ev.is_null(i) || ev.value(i) != "tick" || t.is_null(i) || name.is_null(i) {
                    continue;
                }
                ticks.push(Tick {
                    t_ns: t.value(i),
                    name: name.value(i).to_string(),
                    attrs: json_attrs(
                        f,
                        seq.value(i),
                        (!attrs.is_null(i)).then(|| attrs.value(i)),
                    )?,
                });
            }
        }

        let mut sample_t_ns = Vec::new();
        let mut series: Vec<Series> = SAMPLE_COLUMNS
            .iter()
            .map(|c| Series {
                name: c.name,
                unit: c.unit,
                values: Vec::new(),
            })
            .collect();
        for b in bundle::tables::read(dir, bundle_files::SAMPLES)? {
            let f = bundle_files::SAMPLES;
            let t = col::<Int64Array>(&b, f, samples::T_NS)?;
            sample_t_ns.extend((0..b.num_rows()).map(|i| t.value(i)));
            for (s, spec) in series.iter_mut().zip(SAMPLE_COLUMNS) {
                let Some(c) = b.column_by_name(spec.name) else {
                    // Columns appended after a bundle was sealed (GPM) are null
                    // in it; any other missing column is a damaged table.
                    if evidence::sample::column_index(spec.name)
                        .is_some_and(|i| evidence::sample::PREFIX_LAYOUTS.iter().any(|&n| i >= n))
                    {
                        s.values.extend(std::iter::repeat_n(None, b.num_rows()));
                        continue;
                    }
                    anyhow::bail!("{f}: column {} missing", spec.name);
                };
                if let Some(a) = c.as_any().downcast_ref::<Int64Array>() {
                    s.values
                        .extend((0..b.num_rows()).map(|i| opt_i(a, i).map(|v| v as f64)));
                } else if let Some(a) = c.as_any().downcast_ref::<Float64Array>() {
                    s.values.extend((0..b.num_rows()).map(|i| opt_f(a, i)));
                } else {
                    anyhow::bail!("{f}: column {} is neither int64 nor float64", spec.name);
                }
            }
        }

        Ok(Timeline {
            id,
            dir: dir.to_path_buf(),
            manifest,
            phases,
            ticks,
            sample_t_ns,
            series,
        })
    }

    /// A sampler column by name.
    pub fn series(&self, name: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.name == name)
    }

    /// A GPM column's values over their own windows (`specs/bundle.md`, "GPM
    /// windows"): `(start_ns, end_ns, value)` per row that carries both bounds and
    /// a value, in row order. Empty for a column without windows (any non-GPM
    /// column, a bundle without GPM).
    pub fn windowed(&self, name: &str) -> Vec<(i64, i64, f64)> {
        use evidence::sample::column as c;
        let (Some(v), Some(s), Some(e)) = (
            self.series(name),
            self.series(c::GPM_WINDOW_START_NS),
            self.series(c::GPM_WINDOW_END_NS),
        ) else {
            return Vec::new();
        };
        if !name.starts_with("gpm_")
            || name == c::GPM_WINDOW_START_NS
            || name == c::GPM_WINDOW_END_NS
        {
            return Vec::new();
        }
        v.values
            .iter()
            .zip(s.values.iter().zip(&e.values))
            .filter_map(|(v, (s, e))| Some(((*s)? as i64, (*e)? as i64, (*v)?)))
            .collect()
    }

    /// Whether any GPM window is in the samples.
    pub fn has_gpm(&self) -> bool {
        self.series(evidence::sample::column::GPM_WINDOW_END_NS)
            .is_some_and(Series::any)
    }

    /// The zero of the time axis, CLOCK_MONOTONIC ns: the earliest of `run.start_ns`
    /// (when recorded), any phase open, tick or sample; 0 for an empty bundle. Every
    /// event is therefore at or after the origin.
    pub fn origin_ns(&self) -> i64 {
        let run_start = self
            .manifest
            .run()
            .and_then(|r| r.start_ns)
            .map(|s| s.min(i64::MAX as u64) as i64);
        self.phases
            .iter()
            .map(|p| p.open_ns)
            .chain(self.ticks.iter().map(|t| t.t_ns))
            .chain(self.sample_t_ns.iter().copied())
            .chain(run_start)
            .min()
            .unwrap_or(0)
    }

    /// The end of the time axis, CLOCK_MONOTONIC ns: the latest of `run.end_ns`,
    /// any phase's end, tick or sample; at least [`Timeline::origin_ns`].
    pub fn end_ns(&self) -> i64 {
        let run_end = self
            .manifest
            .run()
            .and_then(|r| r.end_ns)
            .map(|e| e.min(i64::MAX as u64) as i64);
        self.phases
            .iter()
            .map(PhaseSpan::end_ns)
            .chain(self.ticks.iter().map(|t| t.t_ns))
            .chain(self.sample_t_ns.iter().copied())
            .chain(run_end)
            .max()
            .unwrap_or(0)
            .max(self.origin_ns())
    }

    /// Seconds from the origin to `t_ns`.
    pub fn rel_s(&self, t_ns: i64) -> f64 {
        (t_ns - self.origin_ns()) as f64 / 1e9
    }

    /// The manifest's fragment `F`, if present and readable.
    pub fn fragment<F: Fragment>(&self) -> Option<F> {
        self.manifest.record()
    }

    /// Why a sampler column has no values, from `sensors_unavailable`, if recorded.
    pub fn unavailable_reason(&self, column: &str) -> Option<String> {
        self.fragment::<SensorsUnavailable>()?
            .reason(column)
            .map(str::to_string)
    }
}
