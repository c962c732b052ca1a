//! Many bundles' phases and samples at once, with polars: one multi-file scan of
//! `phases.parquet` and one of `samples.parquet` over every bundle (so a thousand
//! bundles cost two queries, not two thousand), into [`Bundle`]s with their
//! manifest facts.
//!
//! A bundle that cannot be read (a missing file, a missing manifest field, a corrupt
//! Parquet file) does not stop the others: it is returned in `unreadable` with an
//! error naming the file, the field and what was expected.
//!
//! Polars is used here and nowhere else in the harness's library, so the rest
//! stays light to build.

use polars::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use evidence::parquet_tables::columns::{frames, phases, samples};
use evidence::phase_table::GpmFigure;
use evidence::sample::column;

use crate::bundle::facts::{Bundle, Exclusion, PhaseRow, SamplePeaks};
use crate::bundle::{files, manifest};
use evidence::error::BundleError;

/// Bundles read, and those that could not be.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Readable bundles, sorted by id.
    pub bundles: Vec<Bundle>,
    /// Unreadable bundles: the directory and the error.
    pub unreadable: Vec<Exclusion>,
}

/// Read every bundle directory in `dirs`.
pub fn load_dirs(dirs: &[PathBuf]) -> Loaded {
    let mut loaded = Loaded::default();
    let mut ok: Vec<(PathBuf, Bundle)> = Vec::new();
    for d in dirs {
        match manifest::read_facts(d) {
            Ok(b) => ok.push((d.clone(), b)),
            Err(e) => loaded.unreadable.push(Exclusion {
                id: d
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| d.display().to_string()),
                reason: format!("unreadable: {e}"),
            }),
        }
    }
    // All scans at once; on failure, fall back to one bundle at a time so that one
    // bad file excludes one bundle only.
    match (phases_scan(&ok), samples_scan(&ok), frames_scan(&ok)) {
        (Ok(mut phases), Ok(mut samples), Ok(mut frames)) => {
            for (d, mut b) in ok {
                let key = d.display().to_string();
                b.phases = phases.remove(&key).unwrap_or_default();
                b.samples_by_phase = samples.remove(&key).unwrap_or_default();
                b.frames.frame_sha256 = frames.remove(&key).unwrap_or_default();
                match gpm_windows(&d) {
                    Ok(w) => {
                        b.gpm = w;
                        loaded.bundles.push(b);
                    }
                    Err(e) => loaded.unreadable.push(Exclusion {
                        id: b.id.clone(),
                        reason: format!("unreadable: {e}"),
                    }),
                }
            }
        }
        _ => {
            for (d, mut b) in ok {
                let one = [(d.clone(), b.clone())];
                match (
                    phases_scan(&one),
                    samples_scan(&one),
                    frames_scan(&one),
                    gpm_windows(&d),
                ) {
                    (Ok(mut p), Ok(mut s), Ok(mut f), Ok(w)) => {
                        let key = d.display().to_string();
                        b.phases = p.remove(&key).unwrap_or_default();
                        b.samples_by_phase = s.remove(&key).unwrap_or_default();
                        b.frames.frame_sha256 = f.remove(&key).unwrap_or_default();
                        b.gpm = w;
                        loaded.bundles.push(b);
                    }
                    (Err(e), _, _, _)
                    | (_, Err(e), _, _)
                    | (_, _, Err(e), _)
                    | (_, _, _, Err(e)) => loaded.unreadable.push(Exclusion {
                        id: b.id.clone(),
                        reason: format!("unreadable: {e}"),
                    }),
                }
            }
        }
    }
    loaded.bundles.sort_by(|a, b| a.id.cmp(&b.id));
    loaded.unreadable.sort();
    loaded
}

const PATH_COL: &str = "__bundle_dir";

/// The files polars scans itself (not through [`files::read`]): only in
/// bundles that verified first ([`crate::verification::local`]).
pub const SCANNED_FILES: [&str; 3] = ["phases.parquet", "samples.parquet", "frames.parquet"];

fn scan(dirs: &[(PathBuf, Bundle)], file: &str) -> PolarsResult<LazyFrame> {
    let paths = dirs
        .iter()
        .map(|(d, _)| PlRefPath::new(files::scan_path(d, file).display().to_string().as_str()));
    let args = ScanArgsParquet {
        include_file_paths: Some(PATH_COL.into()),
        glob: false,
        cache: false,
        ..Default::default()
    };
    LazyFrame::scan_parquet_files(paths.collect(), args)
}

fn err_for(dirs: &[(PathBuf, Bundle)], file: &str, e: PolarsError) -> BundleError {
    let f = match dirs {
        [(d, _)] => d.join(file),
        _ => PathBuf::from(format!("<{} bundles>/{file}", dirs.len())),
    };
    BundleError::Parquet {
        file: f,
        message: e.to_string(),
    }
}

/// The bundle directory a scanned row came from (the file path minus its name).
fn dir_key(path: &str, file: &str) -> String {
    path.strip_suffix(file)
        .map(|p| p.trim_end_matches('/'))
        .unwrap_or(path)
        .to_string()
}

/// Phase rows per bundle directory (as displayed), in `seq` order.
fn phases_scan(dirs: &[(PathBuf, Bundle)]) -> Result<BTreeMap<String, Vec<PhaseRow>>, BundleError> {
    const FILE: &str = evidence::bundle_files::PHASES;
    let mut out: BTreeMap<String, Vec<PhaseRow>> = BTreeMap::new();
    if dirs.is_empty() {
        return Ok(out);
    }
    let run = || -> PolarsResult<DataFrame> {
        scan(dirs, FILE)?
            .select([
                col(PATH_COL).cast(DataType::String),
                col(phases::SEQ).cast(DataType::Int64),
                col(phases::NAME).cast(DataType::String),
                col(phases::DEPTH).cast(DataType::Int64),
                col(phases::OPEN_NS).cast(DataType::Int64),
                col(phases::CLOSE_NS).cast(DataType::Int64),
                col(phases::DURATION_S).cast(DataType::Float64),
                col(phases::IS_LEAF).cast(DataType::Boolean),
                col(phases::PEAK_RSS_BYTES).cast(DataType::Int64),
                col(phases::PEAK_DEVICE_BYTES).cast(DataType::Int64),
                col(phases::ATTRS_JSON).cast(DataType::String),
                col(phases::GPU_BUSY_SHARE).cast(DataType::Float64),
                col(phases::SAMPLES).cast(DataType::Int64),
            ])
            .sort([PATH_COL, phases::SEQ], Default::default())
            .collect()
    };
    let df = run().map_err(|e| err_for(dirs, FILE, e))?;
    let c = |name: &str| df.column(name).map_err(|e| err_for(dirs, FILE, e));
    let (path, name) = (c(PATH_COL)?.str().cloned(), c(phases::NAME)?.str().cloned());
    let path = path.map_err(|e| err_for(dirs, FILE, e))?;
    let name = name.map_err(|e| err_for(dirs, FILE, e))?;
    let i = |n: &str| -> Result<Int64Chunked, BundleError> {
        c(n)?.i64().cloned().map_err(|e| err_for(dirs, FILE, e))
    };
    let f = |n: &str| -> Result<Float64Chunked, BundleError> {
        c(n)?.f64().cloned().map_err(|e| err_for(dirs, FILE, e))
    };
    let (depth, open, close, rss, dev, samples) = (
        i(phases::DEPTH)?,
        i(phases::OPEN_NS)?,
        i(phases::CLOSE_NS)?,
        i(phases::PEAK_RSS_BYTES)?,
        i(phases::PEAK_DEVICE_BYTES)?,
        i(phases::SAMPLES)?,
    );
    let (dur, busy) = (f(phases::DURATION_S)?, f(phases::GPU_BUSY_SHARE)?);
    let attrs = c(phases::ATTRS_JSON)?
        .str()
        .cloned()
        .map_err(|e| err_for(dirs, FILE, e))?;
    let leaf = c(phases::IS_LEAF)?
        .bool()
        .cloned()
        .map_err(|e| err_for(dirs, FILE, e))?;
    for r in 0..df.height() {
        let key = dir_key(path.get(r).unwrap_or(""), FILE);
        out.entry(key).or_default().push(PhaseRow {
            name: name.get(r).unwrap_or("").to_string(),
            depth: depth.get(r).unwrap_or(0),
            open_ns: open.get(r).unwrap_or(0),
            close_ns: close.get(r),
            duration_s: dur.get(r),
            is_leaf: leaf.get(r).unwrap_or(false),
            peak_rss_bytes: rss.get(r),
            peak_host_bytes: attrs.get(r).and_then(close_peak_host_bytes),
            peak_device_bytes: dev.get(r),
            device_open_s: attrs.get(r).and_then(close_device_open_s),
            gpu_busy_share: busy.get(r),
            samples: samples.get(r),
            close_facts: attrs.get(r).map(close_facts).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Every frame's sha256 by index, per bundle directory, for the bundles that keep
/// `frames.parquet` (the others have none: the harness recorded no frames).
fn frames_scan(
    dirs: &[(PathBuf, Bundle)],
) -> Result<BTreeMap<String, BTreeMap<i64, String>>, BundleError> {
    const FILE: &str = evidence::bundle_files::FRAMES;
    let mut out: BTreeMap<String, BTreeMap<i64, String>> = BTreeMap::new();
    let with: Vec<(PathBuf, Bundle)> = dirs
        .iter()
        .filter(|(_, b)| b.frames.has_frames_table)
        .cloned()
        .collect();
    if with.is_empty() {
        return Ok(out);
    }
    let run = || -> PolarsResult<DataFrame> {
        scan(&with, FILE)?
            .select([
                col(PATH_COL).cast(DataType::String),
                col(frames::INDEX).cast(DataType::Int64),
                col(frames::SHA256).cast(DataType::String),
            ])
            .collect()
    };
    let df = run().map_err(|e| err_for(&with, FILE, e))?;
    let e = |x: PolarsError| err_for(&with, FILE, x);
    let path = df.column(PATH_COL).map_err(e)?.str().map_err(e)?.clone();
    let index = df
        .column(frames::INDEX)
        .map_err(e)?
        .i64()
        .map_err(e)?
        .clone();
    let sha = df
        .column(frames::SHA256)
        .map_err(e)?
        .str()
        .map_err(e)?
        .clone();
    for r in 0..df.height() {
        let (Some(i), Some(h)) = (index.get(r), sha.get(r)) else {
            continue;
        };
        let key = dir_key(path.get(r).unwrap_or(""), FILE);
        out.entry(key).or_default().insert(i, h.to_string());
    }
    Ok(out)
}

/// The GPM windows of the bundle at `dir` ([`evidence::phase_table::gpm_figures`]).
/// Read with Arrow, one bundle at a time, not in the polars scan: a store mixes
/// `samples.parquet` layouts from before and after the GPM columns, and the Arrow
/// reader knows both (`parquet_tables::read_table_as`).
fn gpm_windows(dir: &Path) -> Result<Vec<GpmFigure>, BundleError> {
    const FILE: &str = evidence::bundle_files::SAMPLES;
    let batches = crate::bundle::tables::read(dir, FILE).map_err(|e| BundleError::Parquet {
        file: dir.join(FILE),
        message: e.to_string(),
    })?;
    Ok(evidence::phase_table::gpm_figures(&batches))
}

/// The `peak_host_bytes` close attribute of a phase row's `attrs_json`
/// (`{"close":{...},"open":{...}}`); `None` when absent, not a non-negative
/// integer, or the JSON does not parse (the bundle's hashes already vouch for
/// the bytes; an engine that wrote no such attribute simply has no value).
fn close_peak_host_bytes(attrs_json: &str) -> Option<i64> {
    let v: Value = serde_json::from_str(attrs_json).ok()?;
    let n = v
        .get("close")?
        .get(evidence::marker::attr::PEAK_HOST_BYTES)?;
    n.as_u64().and_then(|b| i64::try_from(b).ok())
}

/// The close attributes of a phase row's `attrs_json` that are facts, not
/// readings ([`crate::bundle::facts::PhaseRow::close_facts`]): every value but
/// the non-integer numbers and the high-water marks (`peak_*`, bytes that move
/// from run to run; the phase table shows them); empty when absent or
/// unparsable.
pub(crate) fn close_facts(attrs_json: &str) -> BTreeMap<String, Value> {
    let Ok(v) = serde_json::from_str::<Value>(attrs_json) else {
        return BTreeMap::new();
    };
    let Some(close) = v.get("close").and_then(Value::as_object) else {
        return BTreeMap::new();
    };
    close
        .iter()
        .filter(|(k, x)| !k.starts_with("peak_") && !matches!(x, Value::Number(n) if n.is_f64()))
        .map(|(k, x)| (k.clone(), x.clone()))
        .collect()
}

/// The `device_open_s` close attribute of a phase row's `attrs_json`, seconds;
/// `None` when absent, not a finite non-negative number, or unparsable.
fn close_device_open_s(attrs_json: &str) -> Option<f64> {
    let v: Value = serde_json::from_str(attrs_json).ok()?;
    let s = v.get("close")?.get("device_open_s")?.as_f64()?;
    (s.is_finite() && s >= 0.0).then_some(s)
}

/// Sample peaks per bundle directory and innermost phase.
fn samples_scan(
    dirs: &[(PathBuf, Bundle)],
) -> Result<BTreeMap<String, BTreeMap<String, SamplePeaks>>, BundleError> {
    const FILE: &str = evidence::bundle_files::SAMPLES;
    let mut out: BTreeMap<String, BTreeMap<String, SamplePeaks>> = BTreeMap::new();
    if dirs.is_empty() {
        return Ok(out);
    }
    let f64c = |n: &str| col(n).cast(DataType::Float64);
    let run = || -> PolarsResult<DataFrame> {
        scan(dirs, FILE)?
            .group_by([
                col(PATH_COL).cast(DataType::String),
                col(samples::PHASE).cast(DataType::String),
            ])
            .agg([
                len().alias("n"),
                f64c(column::RSS_BYTES).max().alias("rss"),
                f64c(column::UNIFIED_BYTES).max().alias("unified"),
                f64c(column::WEIGHTS_CACHED_BYTES).max().alias("cached"),
                f64c(column::ENGINE_GPU_MEM_BYTES).max().alias("gpu_mem"),
                f64c(column::GPU_UTIL_PCT)
                    .is_not_null()
                    .sum()
                    .cast(DataType::Int64)
                    .alias("util_n"),
                f64c(column::GPU_UTIL_PCT)
                    .gt(lit(0.0))
                    .sum()
                    .cast(DataType::Int64)
                    .alias("busy_n"),
            ])
            .collect()
    };
    let df = run().map_err(|e| err_for(dirs, FILE, e))?;
    let e = |x: PolarsError| err_for(dirs, FILE, x);
    let path = df.column(PATH_COL).map_err(e)?.str().map_err(e)?.clone();
    let phase = df
        .column(samples::PHASE)
        .map_err(e)?
        .str()
        .map_err(e)?
        .clone();
    let n = df
        .column("n")
        .map_err(e)?
        .cast(&DataType::Int64)
        .map_err(e)?;
    let n = n.i64().map_err(e)?.clone();
    let fcol = |name: &str| -> Result<Float64Chunked, BundleError> {
        Ok(df.column(name).map_err(e)?.f64().map_err(e)?.clone())
    };
    let icol = |name: &str| -> Result<Int64Chunked, BundleError> {
        Ok(df.column(name).map_err(e)?.i64().map_err(e)?.clone())
    };
    let (rss, uni, cached, gmem) = (
        fcol("rss")?,
        fcol("unified")?,
        fcol("cached")?,
        fcol("gpu_mem")?,
    );
    let (util_n, busy_n) = (icol("util_n")?, icol("busy_n")?);
    for r in 0..df.height() {
        let key = dir_key(path.get(r).unwrap_or(""), FILE);
        let peaks = SamplePeaks {
            samples: n.get(r).unwrap_or(0).max(0) as u64,
            rss_bytes: rss.get(r),
            unified_bytes: uni.get(r),
            weights_cached_bytes: cached.get(r),
            engine_gpu_mem_bytes: gmem.get(r),
            gpu_util_samples: util_n.get(r).unwrap_or(0).max(0) as u64,
            gpu_busy_samples: busy_n.get(r).unwrap_or(0).max(0) as u64,
        };
        out.entry(key)
            .or_default()
            .entry(phase.get(r).unwrap_or("").to_string())
            .or_default()
            .merge(&peaks);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_peak_comes_from_the_close_attributes_only() {
        let f = close_peak_host_bytes;
        assert_eq!(
            f(
                r#"{"close":{"peak_host_bytes":16347136,"peak_host_source":"vmhwm_reset"},"open":{}}"#
            ),
            Some(16_347_136)
        );
        // An open attribute of that name is not a measurement of the phase.
        assert_eq!(f(r#"{"close":{},"open":{"peak_host_bytes":5}}"#), None);
        assert_eq!(f(r#"{"open":{}}"#), None);
        assert_eq!(f(r#"{"close":{"peak_host_bytes":-3}}"#), None);
        assert_eq!(f(r#"{"close":{"peak_host_bytes":1.5}}"#), None);
        assert_eq!(f(r#"{"close":{"peak_host_bytes":"1 GiB"}}"#), None);
        assert_eq!(f("not json"), None);
    }

    /// Red on: a reading (a non-integer number) kept as a fact, an integer,
    /// string, boolean or array dropped, or an open attribute taken for a
    /// close one.
    #[test]
    fn close_facts_keep_everything_but_the_readings() {
        let f = close_facts(
            r#"{"close":{"gemm_algo":"tuned","gemm_tuned":3,"staging_s":0.3,"ok":true,
               "gemm_changed":["a: #1"],"tune_ms":0.0,"peak_host_bytes":5307797504},
               "open":{"arm":"cuda"}}"#,
        );
        let keys: Vec<&str> = f.keys().map(String::as_str).collect();
        assert_eq!(keys, ["gemm_algo", "gemm_changed", "gemm_tuned", "ok"]);
        assert_eq!(f["gemm_tuned"], Value::from(3));
        assert!(close_facts(r#"{"open":{"a":"b"}}"#).is_empty());
        assert!(close_facts("not json").is_empty());
    }

    #[test]
    fn dir_key_strips_the_file_name() {
        assert_eq!(
            dir_key("/s/bundles/ab/phases.parquet", "phases.parquet"),
            "/s/bundles/ab"
        );
    }
}
