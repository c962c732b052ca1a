//! `manifest.json` of a bundle, read three ways: as JSON ([`read_json`], for
//! `diff` and the campaign's runner), as the typed manifest ([`read_typed`], for
//! `ls`, `show`, `plot` and `export`), and as the facts rank, diff and campaign
//! use ([`read_facts`]); and the weights' page-cache state at engine start, which
//! all of them report ([`cache_at_start`]).

use evidence::bundle_files::MANIFEST;
use evidence::manifest::Manifest;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

use crate::bundle::error::{FileError, ManifestError};
use crate::bundle::facts::{Bundle, FrameFacts};
use crate::bundle::files;
use evidence::error::BundleError;
use evidence::fragments::{
    self, Completion, Contention, Engine, ExecCheck, Exit, Fragment, Gates, Gpu, Host, Levers,
    Profile, Run, Rung, Sampler, Schedule, Weights, WeightsCache,
};

/// `manifest.json` of the bundle at `dir` as JSON.
pub fn read_json(dir: &Path) -> Result<Value, ManifestError> {
    let text = files::read_text(dir, MANIFEST)?;
    serde_json::from_str(&text).map_err(|e| ManifestError::NotJson {
        file: dir.join(MANIFEST),
        message: e.to_string(),
    })
}

/// `manifest.json` of the bundle at `dir` as the typed manifest.
pub fn read_typed(dir: &Path) -> Result<Manifest, ManifestError> {
    let text = files::read_text(dir, MANIFEST)?;
    parse_typed_text(&text, &dir.join(MANIFEST))
}

/// The bytes of a `manifest.json` read elsewhere (`ls` of a bucket) as the typed
/// manifest; `file` names it in errors.
pub fn parse_typed(bytes: Vec<u8>, file: &Path) -> Result<Manifest, ManifestError> {
    let text = String::from_utf8(bytes).map_err(|e| FileError {
        file: file.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    parse_typed_text(&text, file)
}

fn parse_typed_text(text: &str, file: &Path) -> Result<Manifest, ManifestError> {
    Manifest::from_json(text).map_err(|why| ManifestError::Malformed {
        file: file.to_path_buf(),
        why,
    })
}

/// The manifest's facts of the bundle at `dir` (phases and samples left empty).
pub fn read_facts(dir: &Path) -> Result<Bundle, BundleError> {
    let text = files::read_text(dir, MANIFEST).map_err(|e| BundleError::Io {
        file: e.file,
        source: e.source,
    })?;
    let file = dir.join(MANIFEST);
    let m: Value = serde_json::from_str(&text).map_err(|e| BundleError::Json {
        file: file.clone(),
        message: e.to_string(),
    })?;
    manifest_facts(&m, &file, dir)
}

/// The value at `path` in `m`: a fragment's key ([`Fragment::KEY`]) or a computed
/// section's, then the fields below it.
fn get<'a>(m: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(m, |v, k| v.get(k))
}

/// Fragment `F` of manifest `m` as its record: `None` when absent, null or not
/// an `F` (whose fields read leniently: a mistyped one is absent).
fn record<F: Fragment>(m: &Value) -> Option<F> {
    fragments::read(m).ok().flatten()
}

/// `path` as errors name it (`rung.config.width`).
fn dotted(path: &[&str]) -> String {
    path.join(".")
}

/// The facts rank needs from a parsed manifest; `file` names it in errors and the
/// directory name is the id when the manifest does not carry one.
pub fn manifest_facts(m: &Value, file: &Path, dir: &Path) -> Result<Bundle, BundleError> {
    let field = |path: &str, expected: &str| BundleError::Field {
        file: file.to_path_buf(),
        field: path.to_string(),
        expected: expected.to_string(),
    };
    let string = |path: &[&str]| -> Result<String, BundleError> {
        get(m, path)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| field(&dotted(path), "a string"))
    };
    let opt_string = |path: &[&str]| get(m, path).and_then(Value::as_str).map(str::to_string);
    // The id is the directory's name, which verification checked is the sha256
    // of this manifest. A manifest has no id of its own: one that claims one
    // other than its directory's is refused, never believed.
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| field("id", "a bundle directory named by its id"))?;
    if let Some(claimed) = get(m, &["id"]) {
        if claimed.as_str() != Some(id.as_str()) {
            return Err(field(
                "id",
                &format!("no such field (a bundle is named by its directory, {id})"),
            ));
        }
    }
    // A `harness run --exec` without `--rung` records no rung: its bundle has
    // no rung name (`-`) and no voxel count (0: the fit leaves it out, and
    // without a schedule no pair takes it); a rung fragment, when there, must
    // be whole.
    let no_rung = matches!(get(m, &[Rung::KEY]), None | Some(Value::Null));
    let empty = Value::Object(Default::default());
    let cfg = if no_rung {
        &empty
    } else {
        get(m, &[Rung::KEY, "config"])
            .ok_or_else(|| field(&dotted(&[Rung::KEY, "config"]), "the rung as JSON"))?
    };
    let dim = |k: &str| -> Result<u64, BundleError> {
        cfg.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| field(&dotted(&[Rung::KEY, "config", k]), "a positive integer"))
    };
    let voxels = if no_rung {
        0
    } else {
        dim("width")?
            .checked_mul(dim("height")?)
            .and_then(|v| v.checked_mul(dim("frames").ok()?))
            .ok_or_else(|| {
                field(
                    &dotted(&[Rung::KEY, "config"]),
                    "width x height x frames within 2^64 (a rung the engine could render)",
                )
            })?
    };
    let levers = match get(m, &[Levers::KEY]) {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| field(&dotted(&[Levers::KEY, k]), "an arm name (string)"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(field(&dotted(&[Levers::KEY]), "an object of lever = arm")),
    };
    let schedule = match get(m, &[Schedule::KEY]) {
        None | Some(Value::Null) => None,
        Some(s) => {
            let u = |k: &str| {
                s.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| field(&dotted(&[Schedule::KEY, k]), "a non-negative integer"))
            };
            let st = |k: &str| {
                s.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| field(&dotted(&[Schedule::KEY, k]), "a string"))
            };
            let small = |k: &str| -> Result<u32, BundleError> {
                u32::try_from(u(k)?).map_err(|_| field(&dotted(&[Schedule::KEY, k]), "below 2^32"))
            };
            Some(Schedule {
                campaign: st("campaign")?,
                round: small("round")?,
                position: small("position")?,
                arm: st("arm")?,
                lever: st("lever")?,
                seed: u("seed")?,
                warmup: match s.get("warmup") {
                    None => false,
                    Some(v) => v.as_bool().ok_or_else(|| {
                        field(&dotted(&[Schedule::KEY, "warmup"]), "true or false")
                    })?,
                },
            })
        }
    };
    // The hostname and the GPU's name as strings alone (their records read any
    // scalar as text): the host key rank groups by has always taken only strings.
    let host = [
        opt_string(&[Run::KEY, "hostname"]).unwrap_or_else(|| "?".into()),
        record::<Host>(m)
            .and_then(|h| h.cpu_model)
            .unwrap_or_else(|| "?".into()),
        opt_string(&[Gpu::KEY, "name"]).unwrap_or_else(|| "no-gpu".into()),
    ]
    .join("|");
    let contended = record::<Contention>(m)
        .filter(|c| c.flagged == Some(true))
        .map(|c| c.detail.unwrap_or_else(|| "flagged at start".into()));
    Ok(Bundle {
        id,
        rung: if no_rung {
            "-".into()
        } else {
            string(&[Rung::KEY, "name"])?
        },
        voxels,
        device: cfg
            .get("device")
            .and_then(Value::as_str)
            .map(str::to_string),
        profile: record::<Profile>(m).map_or_else(|| "default".into(), |p| p.0),
        engine_sha256: string(&[Engine::KEY, "sha256"])?,
        host,
        boot_id: opt_string(&[Run::KEY, "boot_id"]).unwrap_or_else(|| "?".into()),
        // An --exec run reads no weights the harness knows of: no fragment.
        weights_digest: match get(m, &[Weights::KEY]) {
            None | Some(Value::Null) => "-".into(),
            Some(_) => string(&[Weights::KEY, "digest"])?,
        },
        arms: reported_arms(m),
        levers,
        schedule,
        start_unix_ns: record::<Run>(m).and_then(|r| r.start_unix_ns),
        run_wall_s: get(m, &["phases", "run_wall_s"]).and_then(Value::as_f64),
        contended,
        incomplete: incompleteness(m),
        phases: Vec::new(),
        samples_by_phase: BTreeMap::new(),
        gpm: Vec::new(),
        cache_share_at_start: cache_at_start_of(m).map(|c| c.share),
        frames: frame_facts(m, dir),
    })
}

/// The frame facts of manifest `m` of the bundle at `dir` (frame sha256s are filled
/// by the scan): the kept images with their sha256, whether `frames.parquet` is
/// kept, the hello's engine and string attributes, and the rung file's sha256.
fn frame_facts(m: &Value, dir: &Path) -> FrameFacts {
    let files = get(m, &["files"]).and_then(Value::as_object);
    let images = evidence::bundle_files::FRAME_IMAGES
        .iter()
        .filter_map(|name| {
            let sha = files?.get(*name)?.get("sha256")?.as_str()?;
            Some((name.to_string(), sha.to_string()))
        })
        .collect();
    let hello = get(m, &["markers", "hello"]);
    FrameFacts {
        dir: dir.to_path_buf(),
        images,
        has_frames_table: files.is_some_and(|f| f.contains_key(evidence::bundle_files::FRAMES)),
        frame_sha256: BTreeMap::new(),
        engine: hello
            .and_then(|h| h.get("engine")) // not a manifest key: the hello marker's field
            .and_then(Value::as_str)
            .map(str::to_string),
        engine_attrs: hello
            .and_then(|h| h.get("attrs"))
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        rung_sha256: record::<Rung>(m).and_then(|r| r.sha256),
    }
}

/// The arms a run reports it ran ([`Bundle::arms`]): the engine hello's `levers`
/// attribute (string arms only; another value is not an arm and is skipped) and the
/// observer's arm from `sampler.observer`.
fn reported_arms(m: &Value) -> BTreeMap<String, String> {
    let mut arms: BTreeMap<String, String> = get(m, &["markers", "hello", "attrs", "levers"])
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    if let Some(o) = record::<Sampler>(m).and_then(|s| s.observer) {
        arms.insert(crate::harness_levers::OBSERVER.to_string(), o);
    }
    arms
}

/// The weights' page-cache state at engine start, as a manifest records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAtStart {
    /// `as-is`, `cold` or `warm`, where recorded.
    pub policy: Option<String>,
    /// Share (0..1) of the weight bytes resident.
    pub share: f64,
}

/// The page-cache state at engine start of manifest `m` ([`cache_at_start`] of its
/// `weights_cache` and `gates` fragments).
pub fn cache_at_start_of(m: &Value) -> Option<CacheAtStart> {
    let cache = fragments::read::<WeightsCache>(m).ok().flatten();
    let gates = fragments::read::<Gates>(m).ok().flatten();
    cache_at_start(cache.as_ref(), gates.as_ref())
}

/// The page-cache state at engine start: from the `weights_cache` fragment (bytes),
/// else from the `weights-cache` gate's detail, whose figures bundles sealed before
/// the fragment existed carry only as text ("as-is: ... GiB after (100.0%) ..."; the
/// wording is the harness's own and frozen in those bundles). The one reader of it
/// for rank, `show` and `diff`.
pub fn cache_at_start(cache: Option<&WeightsCache>, gates: Option<&Gates>) -> Option<CacheAtStart> {
    if let Some((a, t, c)) = cache.and_then(|c| Some((c.resident_after_bytes?, c.total_bytes?, c)))
    {
        return Some(CacheAtStart {
            policy: c.policy.clone(),
            share: if t > 0 {
                (a as f64 / t as f64).clamp(0.0, 1.0)
            } else {
                1.0
            },
        });
    }
    let gate = gates?
        .0
        .iter()
        .find(|g| g.name.as_deref() == Some("weights-cache"))?;
    let detail = gate.detail.as_deref()?;
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
    let exit = record::<Exit>(m);
    match exit.as_ref().and_then(|e| e.reason.as_deref()) {
        Some("completed") => {}
        Some(r) => {
            let detail = exit
                .as_ref()
                .and_then(|e| e.detail.as_deref())
                .unwrap_or("");
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
    let completion = record::<Completion>(m);
    match completion.as_ref().and_then(|c| c.verdict.as_deref()) {
        Some("pass") => {}
        Some(v) => {
            let reasons: Vec<&str> = completion
                .as_ref()
                .and_then(|c| c.reasons.as_ref())
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
    if get(m, &["complete"]).and_then(Value::as_bool) == Some(false) && why.is_empty() {
        why.push("sealed as incomplete".to_string());
    }
    // Phases built without the markers whose time was not believable are not
    // the run's phases: such a run is not compared with others.
    if let Some(n) = get(m, &["markers", "clock_rejected"])
        .and_then(Value::as_u64)
        .filter(|n| *n > 0)
    {
        why.push(format!(
            "{n} marker(s) rejected by the clock check ({})",
            get(m, &["markers", "first_clock_error"])
                .and_then(Value::as_str)
                .unwrap_or("no detail")
        ));
    }
    if let Some(changed) = record::<ExecCheck>(m)
        .and_then(|x| x.changed)
        .filter(|c| !c.is_empty())
    {
        why.push(format!(
            "inputs changed while it ran: {}",
            changed
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

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

    fn facts(m: &Value) -> Result<Bundle, BundleError> {
        manifest_facts(
            m,
            Path::new("b/manifest.json"),
            Path::new("store/bundles/deadbeef"),
        )
    }

    /// The engine's resolved arms and the observer's make the run's assignment; a
    /// passed arm stands over the reported one, and a non-string arm is skipped.
    #[test]
    fn the_assignment_is_the_reported_arms_with_the_passed_ones_over_them() {
        let mut m = manifest();
        assert!(
            facts(&m).unwrap().arms.is_empty(),
            "nothing reported, no arms"
        );
        m["markers"] = json!({"hello": {"attrs": {"levers": {
            "attention": "cudnn", "staging": "serial", "vae": 3
        }}}});
        m["sampler"] = json!({"observer": "off"});
        let b = facts(&m).unwrap();
        assert_eq!(b.arms["attention"], "cudnn");
        assert_eq!(b.arms["observer"], "off");
        assert!(!b.arms.contains_key("vae"), "{:?}", b.arms);
        let a = b.assignment();
        // Passed `staging=batched` over the reported `serial`.
        assert_eq!(a["staging"], "batched");
        assert_eq!(a["attention"], "cudnn");
        assert_eq!(a.len(), 3, "{a:?}");
    }

    #[test]
    fn a_run_with_clock_rejected_markers_is_not_compared() {
        let mut m = manifest();
        assert_eq!(facts(&m).unwrap().incomplete, None);
        m["markers"] = json!({"clock_rejected": 2, "first_clock_error": "clock: marker line 3: x"});
        let why = facts(&m).unwrap().incomplete.unwrap();
        assert!(
            why.contains("2 marker(s) rejected by the clock check (clock: marker line 3: x)"),
            "{why}"
        );
    }

    #[test]
    fn a_claimed_id_other_than_the_directory_is_refused() {
        let mut m = manifest();
        m["id"] = json!("0".repeat(64));
        let e = facts(&m).unwrap_err().to_string();
        assert!(e.contains("b/manifest.json") && e.contains("id"), "{e}");
        m["id"] = json!("deadbeef");
        assert_eq!(facts(&m).unwrap().id, "deadbeef");
    }

    #[test]
    fn a_rung_too_large_to_multiply_is_refused_not_a_panic() {
        let mut m = manifest();
        m["rung"]["config"]["width"] = json!(1u64 << 32);
        m["rung"]["config"]["height"] = json!(1u64 << 32);
        let e = facts(&m).unwrap_err().to_string();
        assert!(e.contains("rung.config"), "{e}");
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
        assert_eq!(
            cache_at_start_of(&m).unwrap().policy.as_deref(),
            Some("as-is")
        );
        // The fragment wins over the text.
        m["weights_cache"] = json!({"policy": "warm", "total_bytes": 400u64,
            "resident_before_bytes": 0u64, "resident_after_bytes": 300u64, "seconds": 1.5});
        assert_eq!(facts(&m).unwrap().cache_share_at_start, Some(0.75));
        assert_eq!(
            cache_at_start_of(&m).unwrap().policy.as_deref(),
            Some("warm")
        );
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
    fn an_exec_run_without_a_rung_has_no_rung_and_no_voxels_but_a_partial_rung_is_refused() {
        let dir = Path::new("/s/bundles/ab");
        let mut m = manifest();
        m.as_object_mut().unwrap().remove("rung");
        m.as_object_mut().unwrap().remove("weights");
        let b = manifest_facts(&m, Path::new("m.json"), dir).unwrap();
        assert_eq!(
            (b.rung.as_str(), b.voxels, b.weights_digest.as_str()),
            ("-", 0, "-")
        );
        assert_eq!(b.device, None);
        // A rung fragment without its config is still an error naming the field.
        let mut m = manifest();
        m["rung"] = json!({"name": "2"});
        let e = manifest_facts(&m, Path::new("m.json"), dir)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rung.config"), "{e}");
    }
}
