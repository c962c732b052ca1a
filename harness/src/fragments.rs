//! The manifest's fragments, one typed record each: `harness run` journals them
//! ([`Fragment::KEY`] names the manifest key), the seal copies them into
//! `manifest.json`, and every reader takes them back through [`read`] or
//! [`read_lenient`] as the same record. A renamed field is a compile error on
//! both sides, never a reader that silently finds nothing.
//!
//! Units are in the field names (`_ns`, `_bytes`, `_s`, `_ms`, `_us`). Fields a
//! reader must tolerate missing (bundles sealed before the field existed, runs
//! that never reached the step that writes it) are `Option`s. Parts of a fragment
//! that only one writer produces and no reader interprets stay JSON in `rest`.
//!
//! The computed sections (`phases`, `markers`, `files`, `complete`, ...) are
//! [`evidence::manifest::Manifest`]'s own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A manifest fragment: a record stored under one key of `manifest.json`.
pub trait Fragment: Serialize + DeserializeOwned {
    /// Its key in the manifest (and in the journal's fragment records).
    const KEY: &'static str;
}

/// The fragment `F` of `manifest` (a whole manifest as JSON, or the fragments of
/// [`evidence::manifest::Manifest`]): `Ok(None)` when absent or null, an error when
/// present but not an `F`.
pub fn read<F: Fragment>(manifest: &Value) -> Result<Option<F>, serde_json::Error> {
    match manifest.get(F::KEY) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => F::deserialize(v).map(Some),
    }
}

/// The fragment `F` of `fragments` (the fragments of a typed manifest), for
/// display: `None` when absent, null or not an `F`.
pub fn read_lenient<F: Fragment>(fragments: &BTreeMap<String, Value>) -> Option<F> {
    match fragments.get(F::KEY) {
        None | Some(Value::Null) => None,
        Some(v) => F::deserialize(v).ok(),
    }
}

/// The fragment `F` of a typed manifest, for display ([`read_lenient`]).
pub fn of<F: Fragment>(m: &evidence::manifest::Manifest) -> Option<F> {
    read_lenient(&m.fragments)
}

/// A field read leniently: a value of the wrong type reads as absent, as a reader
/// of untrusted JSON treats it.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// A field that reads any JSON scalar as text (`"3"` for `3`), absent for null.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => Some(other.to_string()),
    })
}

/// `profile`: `default` or `baseline`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Profile(pub String);

impl Fragment for Profile {
    const KEY: &'static str = "profile";
}

/// `levers`: lever name -> arm, as the run applied them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Levers(pub BTreeMap<String, String>);

impl Fragment for Levers {
    const KEY: &'static str = "levers";
}

impl Levers {
    /// `lever=arm,...` sorted by lever, or `-` when there are none.
    pub fn joined(&self) -> String {
        if self.0.is_empty() {
            return "-".into();
        }
        let v: Vec<String> = self.0.iter().map(|(k, a)| format!("{k}={a}")).collect();
        v.join(",")
    }
}

/// `schedule`: the run's position in a campaign (`harness campaign`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Schedule {
    /// Campaign id (stable for the same campaign arguments).
    pub campaign: String,
    /// Round, 1-based.
    pub round: u32,
    /// Position in the campaign's whole schedule, 0-based.
    pub position: u32,
    /// The arm this run used.
    pub arm: String,
    /// The lever this run measured.
    pub lever: String,
    /// The seed that ordered the arms.
    pub seed: u64,
    /// A throw-away warm-up run before the campaign's first round (`harness
    /// campaign --warmup`): sealed like any run, never paired. Absent (false) in
    /// every other run, so their manifests are as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warmup: bool,
}

impl Fragment for Schedule {
    const KEY: &'static str = "schedule";
}

/// `rung`: the rung file the run rendered (absent for `--exec` without `--rung`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rung {
    /// The rung's name: the file's stem (`2` for `rungs/2.toml`).
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    /// The rung file as given.
    #[serde(default, deserialize_with = "lenient")]
    pub path: Option<PathBuf>,
    /// sha256 of the rung file's bytes, hex.
    #[serde(default, deserialize_with = "lenient")]
    pub sha256: Option<String>,
    /// The rung as JSON ([`evidence::rung::Rung`]); [`RungGeometry`] reads the parts
    /// rank and the timeline use.
    #[serde(default)]
    pub config: Option<Value>,
}

impl Fragment for Rung {
    const KEY: &'static str = "rung";
}

/// The parts of a rung's `config` that readers use.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RungGeometry {
    /// Frame width, pixels.
    #[serde(default, deserialize_with = "lenient")]
    pub width: Option<u64>,
    /// Frame height, pixels.
    #[serde(default, deserialize_with = "lenient")]
    pub height: Option<u64>,
    /// Frames rendered.
    #[serde(default, deserialize_with = "lenient")]
    pub frames: Option<u64>,
    /// Denoising steps.
    #[serde(default, deserialize_with = "lenient")]
    pub steps: Option<u64>,
    /// `cpu` or `cuda`.
    #[serde(default, deserialize_with = "lenient")]
    pub device: Option<String>,
    /// The model preset (`tiny`, `ltxv-2b`, ...).
    #[serde(default, deserialize_with = "lenient")]
    pub preset: Option<String>,
}

impl RungGeometry {
    /// The geometry of a rung `config` (absent or mistyped fields are `None`).
    pub fn of(config: &Value) -> RungGeometry {
        RungGeometry::deserialize(config).unwrap_or_default()
    }
}

/// `run`: the harness invocation; written at start and again at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// CLOCK_MONOTONIC at start, nanoseconds: the clock of markers and samples.
    #[serde(default, deserialize_with = "lenient")]
    pub start_ns: Option<u64>,
    /// Wall clock at start, nanoseconds since the Unix epoch (for people and `ls`).
    #[serde(default, deserialize_with = "lenient")]
    pub start_unix_ns: Option<u64>,
    /// CLOCK_MONOTONIC at the end, nanoseconds; null until the run ends.
    #[serde(default, deserialize_with = "lenient")]
    pub end_ns: Option<u64>,
    /// The harness's command line.
    #[serde(default)]
    pub argv: Vec<String>,
    /// `/proc/sys/kernel/random/boot_id`.
    #[serde(default, deserialize_with = "lenient")]
    pub boot_id: Option<String>,
    /// The host's name.
    #[serde(default, deserialize_with = "text")]
    pub hostname: Option<String>,
    /// The harness's version.
    #[serde(default, deserialize_with = "lenient")]
    pub harness_version: Option<String>,
    /// The working directory of the harness.
    #[serde(default, deserialize_with = "lenient")]
    pub cwd: Option<PathBuf>,
}

impl Fragment for Run {
    const KEY: &'static str = "run";
}

/// `host`: the machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// `/proc/cpuinfo`'s model name.
    #[serde(default, deserialize_with = "lenient")]
    pub cpu_model: Option<String>,
    /// Online CPU cores.
    #[serde(default, deserialize_with = "lenient")]
    pub cores: Option<u64>,
    /// `MemTotal`, bytes.
    #[serde(default, deserialize_with = "lenient")]
    pub mem_total_bytes: Option<u64>,
    /// The kernel release.
    #[serde(default, deserialize_with = "lenient")]
    pub kernel: Option<String>,
    /// The OS's pretty name.
    #[serde(default, deserialize_with = "lenient")]
    pub os: Option<String>,
}

impl Fragment for Host {
    const KEY: &'static str = "host";
}

/// `store`: how the store's gate was passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreFragment {
    /// Whether a volatile store was allowed by an override (never, today).
    pub volatile_override: bool,
}

impl Fragment for StoreFragment {
    const KEY: &'static str = "store";
}

/// `lease`: the lease the run ran under (null without one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease id as given.
    pub id: String,
}

impl Fragment for Lease {
    const KEY: &'static str = "lease";
}

/// `gpu`: the GPU's facts as NVML reported them (null without a GPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// The product name.
    #[serde(default, deserialize_with = "text")]
    pub name: Option<String>,
    /// Everything else NVML reported (uuid, driver, memory, clocks, ...).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for Gpu {
    const KEY: &'static str = "gpu";
}

/// `engine`: what ran (the binary, its copy, an `--exec` engine's pinned files,
/// the name and version the engine announced).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Engine {
    /// sha256 of the binary (or the `--exec` program), hex.
    #[serde(default, deserialize_with = "text")]
    pub sha256: Option<String>,
    /// The version the engine announced (`hello`); null until it does.
    #[serde(default, deserialize_with = "text")]
    pub version: Option<String>,
    /// The name the engine announced (`hello`), once it has.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// Everything else (`store_path`, `source_path`, `args`, `exec`, `run_path`,
    /// `pinned`).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for Engine {
    const KEY: &'static str = "engine";
}

/// `weights`: the weights the engine read (null for an `--exec` engine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// `sha256:<hex>` over the files ([`evidence::weights_digest`]).
    #[serde(default, deserialize_with = "lenient")]
    pub digest: Option<String>,
    /// Everything else (`digest_source`, `dir`, `files`, `synthesized`).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for Weights {
    const KEY: &'static str = "weights";
}

/// `weights_cache`: the weights' page-cache state at engine start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsCache {
    /// `as-is`, `cold` or `warm`.
    #[serde(default, deserialize_with = "lenient")]
    pub policy: Option<String>,
    /// Bytes of all weight files.
    #[serde(default, deserialize_with = "lenient")]
    pub total_bytes: Option<f64>,
    /// Bytes resident before the policy was applied.
    #[serde(default, deserialize_with = "lenient")]
    pub resident_before_bytes: Option<f64>,
    /// Bytes resident just before the engine started.
    #[serde(default, deserialize_with = "lenient")]
    pub resident_after_bytes: Option<f64>,
    /// Seconds spent evicting or reading.
    #[serde(default, deserialize_with = "lenient")]
    pub seconds: Option<f64>,
}

impl Fragment for WeightsCache {
    const KEY: &'static str = "weights_cache";
}

/// `contention`: other work on the host at start, during the run and per phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contention {
    /// Whether the run counts as contended (rank excludes it).
    #[serde(default, deserialize_with = "lenient")]
    pub flagged: Option<bool>,
    /// Why, in words.
    #[serde(default, deserialize_with = "lenient")]
    pub detail: Option<String>,
    /// Everything else (`at_start`, `during`, `phases`, limits).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for Contention {
    const KEY: &'static str = "contention";
}

/// `sensors_unavailable`: sampler column -> why it has no values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SensorsUnavailable(pub BTreeMap<String, Value>);

impl Fragment for SensorsUnavailable {
    const KEY: &'static str = "sensors_unavailable";
}

impl SensorsUnavailable {
    /// Why `column` has no values, if recorded as text.
    pub fn reason(&self, column: &str) -> Option<&str> {
        self.0.get(column).and_then(Value::as_str)
    }
}

/// `sampler`: its settings, and after the run what it achieved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampler {
    /// Interval between ticks, milliseconds.
    #[serde(default, deserialize_with = "lenient")]
    pub cadence_ms: Option<u64>,
    /// `on` or `off`.
    #[serde(default, deserialize_with = "lenient")]
    pub observer: Option<String>,
    /// Ticks fired.
    #[serde(default, deserialize_with = "lenient")]
    pub ticks: Option<u64>,
    /// Deadlines skipped because a tick overran.
    #[serde(default, deserialize_with = "lenient")]
    pub missed_ticks: Option<u64>,
    /// Everything else (`slow_every`, `pagecache_every`, `off_tick_parts`,
    /// `tick_cost_us`, `tick_cost_parts_us`).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for Sampler {
    const KEY: &'static str = "sampler";
}

/// `watchdog`: its limits and its trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Watchdog {
    /// Kill when MemAvailable falls below this, bytes.
    pub mem_floor_bytes: u64,
    /// Kill when `unified_bytes` rises above this, bytes.
    pub unified_budget_bytes: Option<u64>,
    /// The reading that tripped it (`column`, `value`, `limit`, `t_ns`), if any.
    pub tripped: Option<Value>,
}

impl Fragment for Watchdog {
    const KEY: &'static str = "watchdog";
}

/// `completion`: the pixel completion check on `video.y4m`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// `pass`, `fail` or `not-checked`.
    #[serde(default, deserialize_with = "lenient")]
    pub verdict: Option<String>,
    /// Every failed check, in the order found.
    #[serde(default, deserialize_with = "lenient")]
    pub reasons: Option<Vec<Value>>,
    /// Frames checked.
    #[serde(default, deserialize_with = "lenient")]
    pub frames: Option<u64>,
}

impl Fragment for Completion {
    const KEY: &'static str = "completion";
}

/// `exit`: why the run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exit {
    /// `completed`, `engine-failed`, `refused`, `interrupted`, ...
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    /// In words.
    #[serde(default, deserialize_with = "lenient")]
    pub detail: Option<String>,
    /// Everything else (`code`, `signal`, `open_phases`).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for Exit {
    const KEY: &'static str = "exit";
}

/// One verdict of the `gates` or `controls` list: its name, verdict and detail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdicted {
    /// The gate's or control's name.
    #[serde(default, deserialize_with = "text")]
    pub name: Option<String>,
    /// Its verdict (`pass`, `warn`, `refuse`, `fail`, ...).
    #[serde(default, deserialize_with = "text")]
    pub verdict: Option<String>,
    /// In words.
    #[serde(default, deserialize_with = "text")]
    pub detail: Option<String>,
    /// Everything else a control records (readings, figures).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `gates`: every gate of the run, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Gates(pub Vec<Verdicted>);

impl Fragment for Gates {
    const KEY: &'static str = "gates";
}

/// `controls`: every positive control the run relied on, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Controls(pub Vec<Verdicted>);

impl Fragment for Controls {
    const KEY: &'static str = "controls";
}

/// `exec_check`: an `--exec` engine's pinned files checked again after the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecCheck {
    /// The pinned files whose hash changed while the engine ran.
    #[serde(default, deserialize_with = "lenient")]
    pub changed: Option<Vec<Value>>,
    /// Everything else.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Fragment for ExecCheck {
    const KEY: &'static str = "exec_check";
}

/// `escaped`: descendants of the engine that left its process group (killed and
/// named, [`crate::run::escaped`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Escaped(pub Value);

impl Fragment for Escaped {
    const KEY: &'static str = "escaped";
}

/// Every fragment key, for the layout test and for tools that list them.
pub const KEYS: [&str; 22] = [
    Profile::KEY,
    Levers::KEY,
    Schedule::KEY,
    Rung::KEY,
    Run::KEY,
    Host::KEY,
    StoreFragment::KEY,
    Lease::KEY,
    Gpu::KEY,
    Engine::KEY,
    Weights::KEY,
    WeightsCache::KEY,
    Contention::KEY,
    SensorsUnavailable::KEY,
    Sampler::KEY,
    Watchdog::KEY,
    Completion::KEY,
    Exit::KEY,
    Gates::KEY,
    Controls::KEY,
    ExecCheck::KEY,
    Escaped::KEY,
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_read_back_what_a_manifest_holds_and_tolerate_mistyped_fields() {
        let m = json!({
            "levers": {"vae": "tiled"},
            "schedule": {"campaign": "c", "round": 1, "position": 2, "arm": "a", "lever": "l", "seed": 7},
            "run": {"hostname": 5, "start_unix_ns": "soon"},
            "exit": null,
        });
        assert_eq!(read::<Levers>(&m).unwrap().unwrap().joined(), "vae=tiled");
        assert_eq!(read::<Schedule>(&m).unwrap().unwrap().round, 1);
        let run = read::<Run>(&m).unwrap().unwrap();
        assert_eq!(run.hostname.as_deref(), Some("5"));
        assert_eq!(run.start_unix_ns, None);
        assert_eq!(read::<Exit>(&m).unwrap(), None);
        assert_eq!(read::<Profile>(&m).unwrap(), None);
        let bad = json!({"schedule": {"round": "two"}});
        assert!(read::<Schedule>(&bad).is_err());
    }

    #[test]
    fn keys_are_unique() {
        let mut k = KEYS.to_vec();
        k.sort_unstable();
        k.dedup();
        assert_eq!(k.len(), KEYS.len());
    }
}
