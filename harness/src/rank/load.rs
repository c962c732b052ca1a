//! Reading sealed bundles into [`Bundle`]s: `manifest.json` with serde, and
//! `phases.parquet` and `samples.parquet` with polars, one multi-file scan each over
//! every bundle (so a thousand bundles cost two queries, not two thousand).
//!
//! A bundle that cannot be read (a missing file, a missing manifest field, a corrupt
//! Parquet file) does not stop the others: it is returned in `unreadable` with an
//! error naming the file, the field and what was expected.
//!
//! Polars is used here and nowhere else in rank, so the rest stays light to build.

use polars::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::rank::bundle::{Bundle, PhaseRow, SamplePeaks, Schedule};
use crate::rank::pairing::Exclusion;

/// A bundle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The manifest is not JSON.
    #[error("{file}: not JSON: {message}")]
    Json {
        /// The manifest file.
        file: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A manifest field is missing or of the wrong type.
    #[error("{file}: field '{field}': expected {expected}")]
    Field {
        /// The manifest file.
        file: PathBuf,
        /// The field path (`engine.sha256`).
        field: String,
        /// What it must be.
        expected: String,
    },
    /// A Parquet file could not be scanned or lacks a column.
    #[error("{file}: {message}")]
    Parquet {
        /// The Parquet file.
        file: PathBuf,
        /// Polars' message.
        message: String,
    },
}

/// Bundles read, and those that could not be.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Readable bundles, sorted by id.
    pub bundles: Vec<Bundle>,
    /// Unreadable bundles: the directory and the error.
    pub unreadable: Vec<Exclusion>,
}

/// The bundle directories under a store root (`<root>/bundles/*` holding a
/// `manifest.json`), sorted by name.
pub fn store_bundle_dirs(root: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let dir = root.join("bundles");
    let rd = std::fs::read_dir(&dir).map_err(|source| LoadError::Io {
        file: dir.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| LoadError::Io {
            file: dir.clone(),
            source,
        })?;
        let p = e.path();
        if p.join("manifest.json").is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Read every bundle directory in `dirs`.
pub fn load_dirs(dirs: &[PathBuf]) -> Loaded {
    let mut loaded = Loaded::default();
    let mut ok: Vec<(PathBuf, Bundle)> = Vec::new();
    for d in dirs {
        match read_manifest(d) {
            Ok(b) => ok.push((d.clone(), b)),
            Err(e) => loaded.unreadable.push(Exclusion {
                id: d.display().to_string(),
                reason: format!("unreadable: {e}"),
            }),
        }
    }
    // Both scans at once; on failure, fall back to one bundle at a time so that one
    // bad file excludes one bundle only.
    match (phases_scan(&ok), samples_scan(&ok)) {
        (Ok(mut phases), Ok(mut samples)) => {
            for (d, mut b) in ok {
                let key = d.display().to_string();
                b.phases = phases.remove(&key).unwrap_or_default();
                b.samples_by_phase = samples.remove(&key).unwrap_or_default();
                loaded.bundles.push(b);
            }
        }
        _ => {
            for (d, mut b) in ok {
                let one = [(d.clone(), b.clone())];
                match (phases_scan(&one), samples_scan(&one)) {
                    (Ok(mut p), Ok(mut s)) => {
                        let key = d.display().to_string();
                        b.phases = p.remove(&key).unwrap_or_default();
                        b.samples_by_phase = s.remove(&key).unwrap_or_default();
                        loaded.bundles.push(b);
                    }
                    (Err(e), _) | (_, Err(e)) => loaded.unreadable.push(Exclusion {
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

/// The manifest's facts (phases and samples left empty).
pub fn read_manifest(dir: &Path) -> Result<Bundle, LoadError> {
    let file = dir.join("manifest.json");
    let text = std::fs::read_to_string(&file).map_err(|source| LoadError::Io {
        file: file.clone(),
        source,
    })?;
    let m: Value = serde_json::from_str(&text).map_err(|e| LoadError::Json {
        file: file.clone(),
        message: e.to_string(),
    })?;
    manifest_facts(&m, &file, dir)
}

fn get<'a>(m: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(m, |v, k| v.get(k))
}

/// The facts rank needs from a parsed manifest; `file` names it in errors and the
/// directory name is the id when the manifest does not carry one.
pub fn manifest_facts(m: &Value, file: &Path, dir: &Path) -> Result<Bundle, LoadError> {
    let field = |path: &str, expected: &str| LoadError::Field {
        file: file.to_path_buf(),
        field: path.to_string(),
        expected: expected.to_string(),
    };
    let string = |path: &str| -> Result<String, LoadError> {
        get(m, path)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| field(path, "a string"))
    };
    let opt_string = |path: &str| get(m, path).and_then(Value::as_str).map(str::to_string);
    let id = match get(m, "id").and_then(Value::as_str) {
        Some(s) => s.to_string(),
        None => dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .ok_or_else(|| field("id", "a bundle id or a directory named by it"))?,
    };
    let cfg = get(m, "rung.config").ok_or_else(|| field("rung.config", "the rung as JSON"))?;
    let dim = |k: &str| -> Result<u64, LoadError> {
        cfg.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| field(&format!("rung.config.{k}"), "a positive integer"))
    };
    let voxels = dim("width")? * dim("height")? * dim("frames")?;
    let levers = match get(m, "levers") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| field(&format!("levers.{k}"), "an arm name (string)"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(field("levers", "an object of lever = arm")),
    };
    let schedule = match get(m, "schedule") {
        None | Some(Value::Null) => None,
        Some(s) => {
            let u = |k: &str| {
                s.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| field(&format!("schedule.{k}"), "a non-negative integer"))
            };
            let st = |k: &str| {
                s.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| field(&format!("schedule.{k}"), "a string"))
            };
            let small = |k: &str| -> Result<u32, LoadError> {
                u32::try_from(u(k)?).map_err(|_| field(&format!("schedule.{k}"), "below 2^32"))
            };
            Some(Schedule {
                campaign: st("campaign")?,
                round: small("round")?,
                position: small("position")?,
                arm: st("arm")?,
                lever: st("lever")?,
                seed: u("seed")?,
            })
        }
    };
    let host = [
        opt_string("run.hostname").unwrap_or_else(|| "?".into()),
        opt_string("host.cpu_model").unwrap_or_else(|| "?".into()),
        opt_string("gpu.name").unwrap_or_else(|| "no-gpu".into()),
    ]
    .join("|");
    let contended = match get(m, "contention.flagged").and_then(Value::as_bool) {
        Some(true) => {
            Some(opt_string("contention.detail").unwrap_or_else(|| "flagged at start".into()))
        }
        _ => None,
    };
    Ok(Bundle {
        id,
        rung: string("rung.name")?,
        voxels,
        device: cfg
            .get("device")
            .and_then(Value::as_str)
            .map(str::to_string),
        profile: opt_string("profile").unwrap_or_else(|| "default".into()),
        engine_sha256: string("engine.sha256")?,
        host,
        weights_digest: string("weights.digest")?,
        levers,
        schedule,
        start_unix_ns: get(m, "run.start_unix_ns").and_then(Value::as_u64),
        run_wall_s: get(m, "phases.run_wall_s").and_then(Value::as_f64),
        contended,
        incomplete: incompleteness(m),
        phases: Vec::new(),
        samples_by_phase: BTreeMap::new(),
        cache_share_at_start: cache_at_start(m).map(|c| c.share),
    })
}

/// The weights' page-cache state at engine start, as a manifest records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAtStart {
    /// `as-is`, `cold` or `warm`, where recorded.
    pub policy: Option<String>,
    /// Share (0..1) of the weight bytes resident.
    pub share: f64,
}

/// The page-cache state at engine start of manifest `m` (or of an object holding
/// its `weights_cache` and `gates`): from the `weights_cache` fragment (bytes),
/// else from the `weights-cache` gate's detail, whose figures bundles sealed before
/// the fragment existed carry only as text ("as-is: ... GiB after (100.0%) ..."; the
/// wording is the harness's own and frozen in those bundles). The one reader of it
/// for rank, `show` and `diff`.
pub fn cache_at_start(m: &Value) -> Option<CacheAtStart> {
    let after = get(m, "weights_cache.resident_after_bytes").and_then(Value::as_f64);
    let total = get(m, "weights_cache.total_bytes").and_then(Value::as_f64);
    if let (Some(a), Some(t)) = (after, total) {
        return Some(CacheAtStart {
            policy: get(m, "weights_cache.policy")
                .and_then(Value::as_str)
                .map(str::to_string),
            share: if t > 0.0 {
                (a / t).clamp(0.0, 1.0)
            } else {
                1.0
            },
        });
    }
    let gate = get(m, "gates")?
        .as_array()?
        .iter()
        .find(|g| g.get("name").and_then(Value::as_str) == Some("weights-cache"))?;
    let detail = gate.get("detail")?.as_str()?;
    let (policy, figures) = detail.split_once(": ")?;
    let (_, rest) = figures.split_once(" GiB after (")?;
    let (pct, _) = rest.split_once("%)")?;
    let pct: f64 = pct.trim().parse().ok()?;
    (0.0..=100.0).contains(&pct).then(|| CacheAtStart {
        policy: Some(policy.to_string()),
        share: pct / 100.0,
    })
}

/// Why a run is incomplete: `complete` false, an exit other than `completed`, or a
/// completion verdict other than `pass`. `None` when none of these holds.
fn incompleteness(m: &Value) -> Option<String> {
    let mut why = Vec::new();
    let reason = get(m, "exit.reason").and_then(Value::as_str);
    match reason {
        Some("completed") => {}
        Some(r) => {
            let detail = get(m, "exit.detail").and_then(Value::as_str).unwrap_or("");
            why.push(format!(
                "exit {r}{}",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(" ({detail})")
                }
            ));
        }
        None => why.push("no exit recorded".to_string()),
    }
    match get(m, "completion.verdict").and_then(Value::as_str) {
        Some("pass") => {}
        Some(v) => {
            let reasons: Vec<&str> = get(m, "completion.reasons")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            why.push(format!(
                "completion {v}{}",
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", reasons.join("; "))
                }
            ));
        }
        None => why.push("no completion verdict".to_string()),
    }
    if get(m, "complete").and_then(Value::as_bool) == Some(false) && why.is_empty() {
        why.push("sealed as incomplete".to_string());
    }
    (!why.is_empty()).then(|| why.join(", "))
}

const PATH_COL: &str = "__bundle_dir";

fn scan(dirs: &[(PathBuf, Bundle)], file: &str) -> PolarsResult<LazyFrame> {
    let paths = dirs
        .iter()
        .map(|(d, _)| PlRefPath::new(d.join(file).display().to_string().as_str()));
    let args = ScanArgsParquet {
        include_file_paths: Some(PATH_COL.into()),
        glob: false,
        cache: false,
        ..Default::default()
    };
    LazyFrame::scan_parquet_files(paths.collect(), args)
}

fn err_for(dirs: &[(PathBuf, Bundle)], file: &str, e: PolarsError) -> LoadError {
    let f = match dirs {
        [(d, _)] => d.join(file),
        _ => PathBuf::from(format!("<{} bundles>/{file}", dirs.len())),
    };
    LoadError::Parquet {
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
fn phases_scan(dirs: &[(PathBuf, Bundle)]) -> Result<BTreeMap<String, Vec<PhaseRow>>, LoadError> {
    const FILE: &str = "phases.parquet";
    let mut out: BTreeMap<String, Vec<PhaseRow>> = BTreeMap::new();
    if dirs.is_empty() {
        return Ok(out);
    }
    let run = || -> PolarsResult<DataFrame> {
        scan(dirs, FILE)?
            .select([
                col(PATH_COL).cast(DataType::String),
                col("seq").cast(DataType::Int64),
                col("name").cast(DataType::String),
                col("depth").cast(DataType::Int64),
                col("open_ns").cast(DataType::Int64),
                col("close_ns").cast(DataType::Int64),
                col("duration_s").cast(DataType::Float64),
                col("is_leaf").cast(DataType::Boolean),
                col("peak_rss_bytes").cast(DataType::Int64),
                col("peak_device_bytes").cast(DataType::Int64),
                col("attrs_json").cast(DataType::String),
                col("gpu_busy_share").cast(DataType::Float64),
                col("samples").cast(DataType::Int64),
            ])
            .sort([PATH_COL, "seq"], Default::default())
            .collect()
    };
    let df = run().map_err(|e| err_for(dirs, FILE, e))?;
    let c = |name: &str| df.column(name).map_err(|e| err_for(dirs, FILE, e));
    let (path, name) = (c(PATH_COL)?.str().cloned(), c("name")?.str().cloned());
    let path = path.map_err(|e| err_for(dirs, FILE, e))?;
    let name = name.map_err(|e| err_for(dirs, FILE, e))?;
    let i = |n: &str| -> Result<Int64Chunked, LoadError> {
        c(n)?.i64().cloned().map_err(|e| err_for(dirs, FILE, e))
    };
    let f = |n: &str| -> Result<Float64Chunked, LoadError> {
        c(n)?.f64().cloned().map_err(|e| err_for(dirs, FILE, e))
    };
    let (depth, open, close, rss, dev, samples) = (
        i("depth")?,
        i("open_ns")?,
        i("close_ns")?,
        i("peak_rss_bytes")?,
        i("peak_device_bytes")?,
        i("samples")?,
    );
    let (dur, busy) = (f("duration_s")?, f("gpu_busy_share")?);
    let attrs = c("attrs_json")?
        .str()
        .cloned()
        .map_err(|e| err_for(dirs, FILE, e))?;
    let leaf = c("is_leaf")?
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
            gpu_busy_share: busy.get(r),
            samples: samples.get(r),
        });
    }
    Ok(out)
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

/// Sample peaks per bundle directory and innermost phase.
fn samples_scan(
    dirs: &[(PathBuf, Bundle)],
) -> Result<BTreeMap<String, BTreeMap<String, SamplePeaks>>, LoadError> {
    const FILE: &str = "samples.parquet";
    let mut out: BTreeMap<String, BTreeMap<String, SamplePeaks>> = BTreeMap::new();
    if dirs.is_empty() {
        return Ok(out);
    }
    let f64c = |n: &str| col(n).cast(DataType::Float64);
    let run = || -> PolarsResult<DataFrame> {
        scan(dirs, FILE)?
            .group_by([
                col(PATH_COL).cast(DataType::String),
                col("phase").cast(DataType::String),
            ])
            .agg([
                len().alias("n"),
                f64c("rss_bytes").max().alias("rss"),
                f64c("unified_bytes").max().alias("unified"),
                f64c("weights_cached_bytes").max().alias("cached"),
                f64c("engine_gpu_mem_bytes").max().alias("gpu_mem"),
                f64c("gpu_util_pct")
                    .is_not_null()
                    .sum()
                    .cast(DataType::Int64)
                    .alias("util_n"),
                f64c("gpu_util_pct")
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
    let phase = df.column("phase").map_err(e)?.str().map_err(e)?.clone();
    let n = df
        .column("n")
        .map_err(e)?
        .cast(&DataType::Int64)
        .map_err(e)?;
    let n = n.i64().map_err(e)?.clone();
    let fcol = |name: &str| -> Result<Float64Chunked, LoadError> {
        Ok(df.column(name).map_err(e)?.f64().map_err(e)?.clone())
    };
    let icol = |name: &str| -> Result<Int64Chunked, LoadError> {
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
    use serde_json::json;

    fn manifest() -> Value {
        json!({
            "run": {"hostname": "box", "start_ns": 1, "end_ns": 2},
            "rung": {"name": "2", "config": {"width": 64, "height": 32, "frames": 9, "device": "cpu"}},
            "profile": "default",
            "levers": {"staging": "batched"},
            "engine": {"sha256": "abc"},
            "weights": {"digest": "sha256:w"},
            "host": {"cpu_model": "Xeon"},
            "gpu": null,
            "contention": {"flagged": false},
            "exit": {"reason": "completed", "code": 0},
            "completion": {"verdict": "pass", "reasons": []},
            "schedule": {"campaign": "c1", "round": 2, "position": 5, "arm": "batched", "lever": "staging", "seed": 9},
            "phases": {"run_wall_s": 12.5},
            "complete": true
        })
    }

    fn facts(m: &Value) -> Result<Bundle, LoadError> {
        manifest_facts(
            m,
            Path::new("b/manifest.json"),
            Path::new("store/bundles/deadbeef"),
        )
    }

    #[test]
    fn manifest_facts_read_every_field_rank_uses() {
        let b = facts(&manifest()).unwrap();
        assert_eq!(b.id, "deadbeef");
        assert_eq!(b.voxels, 64 * 32 * 9);
        assert_eq!(b.host, "box|Xeon|no-gpu");
        assert_eq!(b.levers["staging"], "batched");
        let s = b.schedule.unwrap();
        assert_eq!(
            (s.round, s.position, s.seed, s.lever.as_str()),
            (2, 5, 9, "staging")
        );
        assert_eq!(b.contended, None);
        assert_eq!(b.incomplete, None);
        assert_eq!(b.device.as_deref(), Some("cpu"));
        assert_eq!(b.run_wall_s, Some(12.5));
        assert_eq!(b.cache_share_at_start, None, "neither fragment nor gate");
    }

    #[test]
    fn the_cache_share_at_start_comes_from_the_fragment_or_the_old_gate_text() {
        let mut m = manifest();
        // A bundle from before the fragment: the gate's own wording.
        m["gates"] = json!([
            {"name": "headroom", "verdict": "pass", "detail": "x"},
            {"name": "weights-cache", "verdict": "pass",
             "detail": "as-is: 1.313 of 35.487 GiB resident before, 1.313 GiB after (3.7%), 0.00 s"}
        ]);
        let b = facts(&m).unwrap();
        assert!((b.cache_share_at_start.unwrap() - 0.037).abs() < 1e-12);
        assert_eq!(cache_at_start(&m).unwrap().policy.as_deref(), Some("as-is"));
        // The fragment wins over the text.
        m["weights_cache"] = json!({"policy": "warm", "total_bytes": 400u64,
            "resident_before_bytes": 0u64, "resident_after_bytes": 300u64, "seconds": 1.5});
        assert_eq!(facts(&m).unwrap().cache_share_at_start, Some(0.75));
        assert_eq!(cache_at_start(&m).unwrap().policy.as_deref(), Some("warm"));
        // A gate that could not read residency says nothing about the share.
        m["weights_cache"] = Value::Null;
        m["gates"] = json!([{"name": "weights-cache", "verdict": "not-applicable",
            "detail": "as-is: page-cache residency of the weights cannot be read: EPERM"}]);
        assert_eq!(facts(&m).unwrap().cache_share_at_start, None);
    }

    #[test]
    fn contention_and_incompleteness_are_explained() {
        let mut m = manifest();
        m["contention"] = json!({"flagged": true, "detail": "load1 7.5 at start"});
        m["exit"] = json!({"reason": "killed", "detail": "SIGKILL"});
        m["completion"] = json!({"verdict": "fail", "reasons": ["frame 3 near-black"]});
        let b = facts(&m).unwrap();
        assert_eq!(b.contended.as_deref(), Some("load1 7.5 at start"));
        assert_eq!(
            b.incomplete.as_deref(),
            Some("exit killed (SIGKILL), completion fail: frame 3 near-black")
        );
    }

    #[test]
    fn missing_fields_name_file_and_field() {
        let mut m = manifest();
        m["engine"] = json!({});
        let e = facts(&m).unwrap_err().to_string();
        assert!(
            e.contains("b/manifest.json")
                && e.contains("'engine.sha256'")
                && e.contains("a string"),
            "{e}"
        );
        let mut m = manifest();
        m["schedule"]["round"] = json!("two");
        let e = facts(&m).unwrap_err().to_string();
        assert!(e.contains("'schedule.round'"), "{e}");
        let mut m = manifest();
        m["rung"]["config"]["width"] = json!(null);
        let e = facts(&m).unwrap_err().to_string();
        assert!(e.contains("'rung.config.width'"), "{e}");
    }

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

    #[test]
    fn dir_key_strips_the_file_name() {
        assert_eq!(
            dir_key("/s/bundles/ab/phases.parquet", "phases.parquet"),
            "/s/bundles/ab"
        );
    }
}
