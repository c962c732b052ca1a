//! The manifest's fragments, one typed record each, shared by the writers and
//! every reader: `harness run` journals them ([`Fragment::KEY`] names the
//! manifest key), the seal copies them into `manifest.json` (and reads the few it
//! needs: `run`'s clock, `sampler`'s cadence, `exit`'s reason,
//! `sensors_unavailable`, `store`), [`crate::verify`] and [`crate::recover`] read
//! them, and every harness reader takes them back through [`read`],
//! [`read_lenient`] or [`crate::manifest::Manifest::record`] as the same record. A renamed field is
//! a compile error on both sides, never a reader that silently finds nothing.
//!
//! The records live here, below the seal, so that this crate's own readers use
//! them too; the harness imports them as `evidence::fragments`.
//!
//! Units are in the field names (`_ns` nanoseconds, `_bytes` bytes, `_s`
//! seconds, `_ms` milliseconds, `_us` microseconds, `_cores` cores) or said in
//! the field's doc. Fields a reader must tolerate missing (bundles sealed before
//! the field existed, runs that never reached the step that writes it) are
//! `Option`s, and most are read leniently: a value of the wrong type reads as
//! absent, as a reader of untrusted JSON treats it. Parts of a fragment that only
//! one writer produces and no reader interprets stay JSON in `rest`.
//!
//! Writers journal a record with [`journal_record`] (or [`null_record`] for a
//! fragment the run has none of); the key of every record is declared once, in
//! the `fragment_keys!` list at the end of this file, which also gives [`KEYS`].
//!
//! The computed sections (`phases`, `markers`, `files`, `complete`, ...) are
//! [`crate::manifest::Manifest`]'s own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::journal::Record;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Number, Value};

/// A manifest fragment: a record stored under one key of `manifest.json`.
pub trait Fragment: Serialize + DeserializeOwned {
    /// Its key in the manifest (and in the journal's fragment records).
    const KEY: &'static str;
}

/// The journal record that stores `f` under its key ([`Fragment::KEY`]).
pub fn journal_record<F: Fragment>(f: &F) -> Result<Record, serde_json::Error> {
    Ok(Record::Fragment {
        key: F::KEY.into(),
        value: serde_json::to_value(f)?,
    })
}

/// The journal record of fragment `F` as null: the run has none (no lease, no
/// GPU, no weights).
pub fn null_record<F: Fragment>() -> Record {
    Record::Fragment {
        key: F::KEY.into(),
        value: Value::Null,
    }
}

/// The journal record of fragment `F` carried verbatim: a value the harness
/// passes through as it was given (the campaign's `schedule`, which `harness run
/// --schedule` records as the campaign wrote it).
pub fn verbatim_record<F: Fragment>(value: Value) -> Record {
    Record::Fragment {
        key: F::KEY.into(),
        value,
    }
}

/// The fragment `F` of `manifest` (a whole manifest as JSON, or the fragments of
/// a [`crate::manifest::Manifest`]): `Ok(None)` when absent or null, an error when
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

/// A field read leniently: a value of the wrong type reads as absent, as a reader
/// of untrusted JSON treats it.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// A field read leniently that has a default: a value of the wrong type reads as
/// the default.
fn lenient_or_default<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(lenient(d)?.unwrap_or_default())
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

/// `levers`: lever name -> arm, as the run applied them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Levers(pub BTreeMap<String, String>);

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
    /// The rung as JSON ([`crate::rung::Rung`]); [`RungGeometry`] reads the parts
    /// rank and the timeline use.
    #[serde(default)]
    pub config: Option<Value>,
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
    /// The harness's command line (empty when absent or mistyped, so that the
    /// rest of the record still reads).
    #[serde(default, deserialize_with = "lenient_or_default")]
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

/// `store`: how the store's gate was passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreFragment {
    /// Whether a volatile store was allowed by an override (never, today).
    pub volatile_override: bool,
}

/// `lease`: the lease the run ran under (null without one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease id as given.
    pub id: String,
    /// The Slurm node the run ran on (`SLURMD_NODENAME`; absent outside Slurm
    /// and in bundles sealed before it was recorded).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub node: Option<String>,
}

/// `gpu`: the GPU's facts as NVML reported them (null without a GPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// The product name.
    #[serde(default, deserialize_with = "text")]
    pub name: Option<String>,
    /// The GPU's UUID (`GPU-...`).
    #[serde(default, deserialize_with = "lenient")]
    pub uuid: Option<String>,
    /// The driver's version.
    #[serde(default, deserialize_with = "lenient")]
    pub driver: Option<String>,
    /// The CUDA driver API's version (`12.4`).
    #[serde(default, deserialize_with = "lenient")]
    pub cuda: Option<String>,
    /// Whether the GPU shares host memory (unified memory).
    #[serde(default, deserialize_with = "lenient")]
    pub unified_memory: Option<bool>,
    /// NVML's device index.
    #[serde(default, deserialize_with = "lenient")]
    pub index: Option<u32>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
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
    /// Where the binary runs from: its copy in the store, `bin/<sha256>`
    /// (null for an `--exec` engine, which runs in place).
    #[serde(default, deserialize_with = "lenient")]
    pub store_path: Option<PathBuf>,
    /// The binary or program as given.
    #[serde(default, deserialize_with = "lenient")]
    pub source_path: Option<PathBuf>,
    /// The engine's arguments.
    #[serde(default, deserialize_with = "lenient")]
    pub args: Option<Vec<String>>,
    /// Whether it is an `--exec` engine.
    #[serde(default, deserialize_with = "lenient")]
    pub exec: Option<bool>,
    /// An `--exec` engine's program as run (absent otherwise).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub run_path: Option<PathBuf>,
    /// An `--exec` engine's pinned files, hashed before it started (absent
    /// otherwise; `run::pinned`'s record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<Value>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `weights`: the weights the engine read (null for an `--exec` engine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// `sha256:<hex>` over the files ([`crate::weights_digest`]).
    #[serde(default, deserialize_with = "lenient")]
    pub digest: Option<String>,
    /// Where the digest came from (`DIGEST file` or `computed`).
    #[serde(default, deserialize_with = "lenient")]
    pub digest_source: Option<String>,
    /// The weights directory.
    #[serde(default, deserialize_with = "lenient")]
    pub dir: Option<PathBuf>,
    /// Every file, sorted by path.
    #[serde(default, deserialize_with = "lenient")]
    pub files: Option<Vec<WeightFile>>,
    /// Whether the harness synthesized these weights.
    #[serde(default, deserialize_with = "lenient")]
    pub synthesized: Option<bool>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One weight file of the `weights` fragment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightFile {
    /// Path relative to the weights directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// `weights_cache`: the weights' page-cache state at engine start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsCache {
    /// `as-is`, `cold` or `warm`.
    #[serde(default, deserialize_with = "lenient")]
    pub policy: Option<String>,
    /// Bytes of all weight files.
    #[serde(default, deserialize_with = "lenient")]
    pub total_bytes: Option<u64>,
    /// Bytes resident before the policy was applied.
    #[serde(default, deserialize_with = "lenient")]
    pub resident_before_bytes: Option<u64>,
    /// Bytes resident just before the engine started.
    #[serde(default, deserialize_with = "lenient")]
    pub resident_after_bytes: Option<u64>,
    /// Seconds spent evicting or reading.
    #[serde(default, deserialize_with = "lenient")]
    pub seconds: Option<f64>,
    /// A cold start's disk measurement: bytes read from the weights past the
    /// page cache (`O_DIRECT`).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_read_bytes: Option<u64>,
    /// Its wall seconds, first request to the last reader's end.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_read_s: Option<f64>,
    /// Its readers, each on its own range.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_readers: Option<u64>,
    /// Why a cold start has no disk figure.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_read_note: Option<String>,
}

/// `contention`: other work on the host at start, during the run and per phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contention {
    /// Cores busy with other work just before the engine started (null when
    /// `/proc/stat` was unreadable).
    #[serde(default, deserialize_with = "lenient")]
    pub busy_cores_at_start: Option<f64>,
    /// The window `busy_cores_at_start` was measured over, milliseconds.
    #[serde(default, deserialize_with = "lenient")]
    pub window_ms: Option<u64>,
    /// The one-minute load average at start, for reference only.
    #[serde(default, deserialize_with = "lenient")]
    pub load1_at_start: Option<f64>,
    /// Other processes on the GPU at start (null without a GPU or when
    /// unreadable).
    #[serde(default, deserialize_with = "lenient")]
    pub other_gpu_procs: Option<u64>,
    /// Whether the run counts as contended (rank excludes it).
    #[serde(default, deserialize_with = "lenient")]
    pub flagged: Option<bool>,
    /// Why, in words.
    #[serde(default, deserialize_with = "lenient")]
    pub detail: Option<String>,
    /// Seconds the run waited for a quiet host before the start window that
    /// `busy_cores_at_start` reports (`harness run --quiet-wait-s`); absent when
    /// it was not asked to wait.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub quiet_wait_s: Option<f64>,
    /// The most it would have waited, seconds; absent when it was not asked to.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub quiet_wait_limit_s: Option<f64>,
    /// Other work over the engine's lifetime and per top-level phase (absent
    /// until the engine has ended).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub during: Option<During>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Other work's CPU over the engine's lifetime (`contention.during`), judged by
/// `run::contention`. A reader takes a field a bundle lacks as its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct During {
    /// Seconds between the two marks.
    pub window_s: f64,
    /// Cores busy across the whole host, mean over the window.
    pub host_busy_cores: Option<f64>,
    /// Cores the engine and its descendants used, mean over the window.
    pub engine_cores: Option<f64>,
    /// Cores the harness itself used (sampler, readers, journal), mean.
    pub harness_cores: Option<f64>,
    /// `host_busy_cores - engine_cores - harness_cores`, floored at 0 (the
    /// counters tick at different granularities), cores.
    pub other_busy_cores: Option<f64>,
    /// Other work above this many cores flags the run: the start gate's limit.
    pub limit_cores: f64,
    /// Whether the window was long enough and every counter readable.
    pub judged: bool,
    /// Whether other work exceeded the limit, over the lifetime or inside a
    /// top-level phase.
    pub flagged: bool,
    /// One line for people.
    pub detail: String,
    /// Each top-level phase's own judgement (empty when the engine marked none).
    #[serde(default)]
    pub phases: Vec<PhaseDuring>,
}

/// Other work inside one top-level phase (`contention.during.phases`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseDuring {
    /// The phase name.
    pub phase: String,
    /// Seconds from its open to its close (or to the end of the engine).
    pub seconds: f64,
    /// Sampler rows inside it.
    pub ticks: usize,
    /// Mean cores of other work over those rows.
    pub other_busy_cores: Option<f64>,
    /// Whether it was long enough (`run::contention::MIN_WINDOW_S`,
    /// `MIN_PHASE_TICKS`) to judge.
    pub judged: bool,
    /// Whether other work exceeded the limit inside it.
    pub flagged: bool,
}

/// `sensors_unavailable`: sampler column -> why it has no values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SensorsUnavailable(pub BTreeMap<String, Value>);

impl SensorsUnavailable {
    /// Why `column` has no values, if recorded as text.
    pub fn reason(&self, column: &str) -> Option<&str> {
        self.0.get(column).and_then(Value::as_str)
    }
}

/// `sampler`: its settings, and after the run what it achieved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampler {
    /// Interval between ticks, milliseconds: whole milliseconds as `harness run`
    /// writes it, any number as a reader takes it (the seal's expected cadence).
    #[serde(default, deserialize_with = "lenient")]
    pub cadence_ms: Option<Number>,
    /// Ticks between the slow reads (the process tree's rescan).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub slow_every: Option<u64>,
    /// Ticks between page-cache residency reads.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub pagecache_every: Option<u64>,
    /// The timed parts that run off the tick, on threads of their own.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub off_tick_parts: Option<Vec<String>>,
    /// `on` or `off`.
    #[serde(default, deserialize_with = "lenient")]
    pub observer: Option<String>,
    /// Ticks fired (absent until the run ends).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub ticks: Option<u64>,
    /// Deadlines skipped because a tick overran (absent until the run ends).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub missed_ticks: Option<u64>,
    /// The work of one tick, microseconds (absent until the run ends).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub tick_cost_us: Option<CostStats>,
    /// The work of each timed part, by part, microseconds (absent until the run
    /// ends).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub tick_cost_parts_us: Option<BTreeMap<String, CostStats>>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The cost of a piece of the sampler's work per tick, microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CostStats {
    /// Ticks measured.
    pub ticks: u64,
    /// Median work per tick, microseconds.
    pub median_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// Largest, microseconds.
    pub max_us: f64,
}

impl CostStats {
    /// The statistics of `costs_ns` (each a piece of work's cost, nanoseconds;
    /// sorted in place), in microseconds; all zero when there are none.
    pub fn of(costs_ns: &mut [u64]) -> Self {
        if costs_ns.is_empty() {
            return CostStats::default();
        }
        costs_ns.sort_unstable();
        let n = costs_ns.len();
        let q = |p: f64| costs_ns[((n - 1) as f64 * p).round() as usize] as f64 / 1e3;
        CostStats {
            ticks: n as u64,
            median_us: q(0.5),
            p99_us: q(0.99),
            mean_us: costs_ns.iter().sum::<u64>() as f64 / n as f64 / 1e3,
            max_us: costs_ns[n - 1] as f64 / 1e3,
        }
    }
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

/// `exit`: why the run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exit {
    /// `completed`, `engine-failed`, `refused`, `interrupted`, ...
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    /// The engine's exit code, if it exited.
    #[serde(default, deserialize_with = "lenient")]
    pub code: Option<i32>,
    /// The signal that ended the engine, if any.
    #[serde(default, deserialize_with = "lenient")]
    pub signal: Option<i32>,
    /// In words.
    #[serde(default, deserialize_with = "lenient")]
    pub detail: Option<String>,
    /// The phases open at the end, outermost first (the open one is the last).
    #[serde(default, deserialize_with = "lenient")]
    pub open_phases: Option<Vec<String>>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
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

/// `controls`: every positive control the run relied on, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Controls(pub Vec<Verdicted>);

/// `exec_check`: an `--exec` engine's pinned files checked again after the run
/// (written only when one changed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecCheck {
    /// The pinned files whose hash changed while the engine ran, in words.
    #[serde(default, deserialize_with = "lenient")]
    pub changed: Option<Vec<Value>>,
    /// What the check means, in words.
    #[serde(default, deserialize_with = "lenient")]
    pub detail: Option<String>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `escaped`: descendants of the engine that left its process group, killed and
/// named (the harness's `run::escaped`); written only when there were any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Escaped {
    /// Every process killed.
    #[serde(default, deserialize_with = "lenient")]
    pub killed: Option<Vec<EscapedProcess>>,
    /// What the list means, in words.
    #[serde(default, deserialize_with = "lenient")]
    pub detail: Option<String>,
    /// Anything else an older or newer harness recorded.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One process of the `escaped` fragment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscapedProcess {
    /// Its pid.
    pub pid: i32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// Its session id when found (differs from the engine's after `setsid`).
    pub session: i32,
}

/// Declares each record's [`Fragment`] impl and [`KEYS`] from one list: a key is
/// written once, here.
macro_rules! fragment_keys {
    ($($record:ty => $key:literal),+ $(,)?) => {
        $(
            impl Fragment for $record {
                const KEY: &'static str = $key;
            }
        )+
        /// Every fragment key, for the layout test and for tools that list them.
        pub const KEYS: &[&str] = &[$($key),+];
    };
}

fragment_keys! {
    Profile => "profile",
    Levers => "levers",
    Schedule => "schedule",
    Rung => "rung",
    Run => "run",
    Host => "host",
    StoreFragment => "store",
    Lease => "lease",
    Gpu => "gpu",
    Engine => "engine",
    Weights => "weights",
    WeightsCache => "weights_cache",
    Contention => "contention",
    SensorsUnavailable => "sensors_unavailable",
    Sampler => "sampler",
    Watchdog => "watchdog",
    Completion => "completion",
    Exit => "exit",
    Gates => "gates",
    Controls => "controls",
    ExecCheck => "exec_check",
    Escaped => "escaped",
}

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
    fn a_mistyped_argv_leaves_the_run_readable_and_cadence_keeps_its_number() {
        // The seal and recover take `run`'s clock and boot id from any object.
        let m = json!({"run": {"argv": "harness run", "start_ns": 5, "boot_id": "b"}});
        let run = read::<Run>(&m).unwrap().unwrap();
        assert_eq!((run.start_ns, run.argv.len()), (Some(5), 0));
        assert_eq!(run.boot_id.as_deref(), Some("b"));
        // Whole milliseconds as `harness run` writes them; fractions as older
        // journals hold them; a string reads as absent.
        for (v, ms) in [
            (json!(100), Some(100.0)),
            (json!(2.5), Some(2.5)),
            (json!("x"), None),
        ] {
            let s = read::<Sampler>(&json!({"sampler": {"cadence_ms": v}}))
                .unwrap()
                .unwrap();
            assert_eq!(s.cadence_ms.and_then(|n| n.as_f64()), ms);
        }
        let written = Sampler::deserialize(json!({"cadence_ms": 100})).unwrap();
        assert_eq!(
            serde_json::to_value(&written).unwrap()["cadence_ms"],
            json!(100)
        );
    }

    #[test]
    fn keys_are_unique() {
        let mut k = KEYS.to_vec();
        k.sort_unstable();
        k.dedup();
        assert_eq!(k.len(), KEYS.len());
    }
}
