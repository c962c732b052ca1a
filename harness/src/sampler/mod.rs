//! The sampler: its own thread, one [`Sample`] per tick on absolute deadlines.
//!
//! Each tick reads, in this order: the engine's process tree (procfs), the system
//! (meminfo, PSI, load, the harness's own CPU), the GPU's fast columns (NVML), and
//! takes the newest finished reading of the two slow parts, which run about once a
//! second on threads of their own ([`periodic`]): NVML's energy and PCIe throughput
//! (tens of milliseconds, see [`gpu`]) and the page-cache residency of the weight
//! files (a pass over tens of GB takes longer than a tick, see [`pagecache`]). It
//! then derives `unified_bytes`, hands the row to the
//! watchdog (which may kill the engine's process group on the spot), and passes it
//! to the sink (the journal). Timestamps are [`evidence::clock::monotonic_ns`], the
//! clock engines stamp markers with.
//!
//! With the observer off only what the watchdog needs is read and nothing is
//! journaled: the arm that measures the instrument's own overhead. Without a
//! unified budget that is `/proc/meminfo` alone (the floor check): no process-tree
//! scan, no NVML probe, no page-cache residency, no journal append.

pub mod cadence;
pub mod gpm;
pub mod gpu;
pub mod limits;
pub mod pagecache;
pub mod periodic;
pub mod procs;
pub mod system;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use evidence::clock::monotonic_ns;
use evidence::sample::Sample;

use crate::sampler::limits::{Limits, Trip};
use cadence::Ticker;
use gpm::{GpmPass, GpmSource, GpmWindow, NvmlGpm};
use gpu::{Gpu, GpuProbe, SlowReading, GPU_COLUMNS};
use pagecache::Residency;
use periodic::Periodic;
use procs::ProcessTree;
use system::SystemProbe;

/// Default cadence in milliseconds.
pub const DEFAULT_CADENCE_MS: u64 = 100;
/// Fastest cadence accepted, in milliseconds.
pub const MIN_CADENCE_MS: u64 = 10;
/// Slowest cadence accepted, in milliseconds.
pub const MAX_CADENCE_MS: u64 = 10_000;
/// The slow sub-cadence (energy, PCIe, page cache, process-tree scan) aims at this
/// interval, in milliseconds.
pub const SLOW_INTERVAL_MS: u64 = 1_000;

/// Columns whose reading failed, each with the first reason seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reasons {
    map: BTreeMap<String, String>,
    changed: bool,
}

impl Reasons {
    /// Record `reason` for `column` unless one is already recorded.
    pub fn note(&mut self, column: &str, reason: &str) {
        if !self.map.contains_key(column) {
            self.map.insert(column.to_string(), reason.to_string());
            self.changed = true;
        }
    }

    /// Forget `column`'s reason (a source for it has started since).
    pub fn forget(&mut self, column: &str) {
        if self.map.remove(column).is_some() {
            self.changed = true;
        }
    }

    /// The reasons by column.
    pub fn map(&self) -> &BTreeMap<String, String> {
        &self.map
    }

    /// Whether a reason was added since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::replace(&mut self.changed, false)
    }

    /// The `sensors_unavailable` fragment.
    pub fn fragment(&self) -> evidence::fragments::SensorsUnavailable {
        evidence::fragments::SensorsUnavailable(
            self.map
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        )
    }
}

/// Where samples go (the journal in a run; nothing in a control).
pub trait SampleSink: Send {
    /// One row, in tick order.
    fn sample(&mut self, s: &Sample);
    /// The full set of unavailable-sensor reasons, whenever it grows.
    fn unavailable(&mut self, reasons: &Reasons);
}

/// A sink that keeps nothing.
pub struct NullSink;

impl SampleSink for NullSink {
    fn sample(&mut self, _: &Sample) {}
    fn unavailable(&mut self, _: &Reasons) {}
}

/// How the sampler runs.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Interval between ticks, milliseconds ([`MIN_CADENCE_MS`]..=[`MAX_CADENCE_MS`]).
    pub cadence_ms: u64,
    /// Read and journal every column (on) or only the watchdog's (off).
    pub observer: bool,
    /// The watchdog's limits; `None` disarms it (controls of other things only).
    pub limits: Option<Limits>,
    /// The weight files whose page-cache residency is read.
    pub weights: Vec<PathBuf>,
}

impl SamplerConfig {
    /// Ticks between slow reads: about [`SLOW_INTERVAL_MS`], at least 1.
    pub fn slow_every(&self) -> u64 {
        (SLOW_INTERVAL_MS + self.cadence_ms / 2)
            .checked_div(self.cadence_ms)
            .unwrap_or(1)
            .max(1)
    }

    /// The `sampler` manifest fragment (settings; the achieved cadence is derived
    /// from the samples at seal, and [`SamplerResults::record_into`] adds what
    /// the sampler achieved once it stopped).
    pub fn fragment(&self) -> evidence::fragments::Sampler {
        evidence::fragments::Sampler {
            cadence_ms: Some(self.cadence_ms.into()),
            slow_every: Some(self.slow_every()),
            pagecache_every: Some(self.slow_every()),
            off_tick_parts: Some(OFF_TICK_PARTS.iter().map(|p| p.to_string()).collect()),
            observer: Some(if self.observer { "on" } else { "off" }.to_string()),
            ticks: None,
            missed_ticks: None,
            tick_cost_us: None,
            tick_cost_parts_us: None,
            rest: serde_json::Map::new(),
        }
    }
}

/// What the sampler watches.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The engine's pid (root of the process tree).
    pub pid: i32,
    /// The engine's process group, killed by the watchdog.
    pub pgid: i32,
}

/// Per-tick work cost, microseconds: the `sampler` fragment's record
/// (from costs in nanoseconds: [`CostStats::of`]).
pub use evidence::fragments::CostStats;

/// What the sampler reports when stopped.
#[derive(Debug, Clone)]
pub struct SamplerResults {
    /// Ticks fired.
    pub ticks: u64,
    /// Deadlines skipped because a tick overran.
    pub missed_ticks: u64,
    /// Unavailable columns and why.
    pub reasons: Reasons,
    /// The watchdog's first trip, if it fired.
    pub trip: Option<Trip>,
    /// Cost of the work of one tick.
    pub cost: CostStats,
    /// Cost of each part of the sampler's work that can dominate a tick, by part:
    /// `tree_rescan` (the engine's process tree) on the slow sub-cadence and `sink`
    /// (journaling the row) every tick, both on the tick; `gpu_slow` (NVML energy
    /// and PCIe) and `pagecache` (a mincore pass over the weight files), which run
    /// on threads of their own about once a second ([`OFF_TICK_PARTS`]) and so do not
    /// count in the tick's cost.
    pub parts: BTreeMap<&'static str, CostStats>,
}

impl SamplerResults {
    /// Add what the sampler achieved to its fragment `f`.
    pub fn record_into(&self, f: &mut evidence::fragments::Sampler) {
        f.ticks = Some(self.ticks);
        f.missed_ticks = Some(self.missed_ticks);
        f.tick_cost_us = Some(self.cost.clone());
        f.tick_cost_parts_us = Some(
            self.parts
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        );
    }
}

/// The timed parts that run on threads of their own ([`periodic`]), so that their
/// cost is not part of a tick's. Recorded in the `sampler` fragment as
/// `off_tick_parts`: bundles without it read `gpu_slow` on the tick; bundles
/// before GPM have no `gpm`.
pub const OFF_TICK_PARTS: [&str; 3] = ["gpu_slow", "pagecache", "gpm"];

/// A running sampler.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    trip: Arc<Mutex<Option<Trip>>>,
    handle: JoinHandle<SamplerResults>,
}

impl Sampler {
    /// Start sampling `target` on a new thread.
    pub fn spawn(
        config: SamplerConfig,
        target: Target,
        gpu: Option<Arc<Gpu>>,
        gpu_absent_reason: Option<String>,
        sink: Box<dyn SampleSink>,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let trip = Arc::new(Mutex::new(None));
        let (stop2, trip2) = (stop.clone(), trip.clone());
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || {
                run_loop(
                    config,
                    target,
                    gpu.as_ref(),
                    gpu_absent_reason,
                    sink,
                    &stop2,
                    &trip2,
                )
            })?;
        Ok(Sampler { stop, trip, handle })
    }

    /// The watchdog's trip, as soon as it happens.
    pub fn tripped(&self) -> Option<Trip> {
        self.trip.lock().map(|t| t.clone()).unwrap_or(None)
    }

    /// Stop after the current tick and return the report.
    pub fn stop(self) -> SamplerResults {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.join() {
            Ok(r) => r,
            Err(_) => {
                let mut reasons = Reasons::default();
                reasons.note("*", "the sampler thread panicked");
                SamplerResults {
                    ticks: 0,
                    missed_ticks: 0,
                    reasons,
                    trip: self.trip.lock().map(|t| t.clone()).unwrap_or(None),
                    cost: CostStats::default(),
                    parts: BTreeMap::new(),
                }
            }
        }
    }
}

/// Kill process group `pgid` with SIGKILL; refuses groups that are not a plain
/// child's (0, 1, or the harness's own).
pub fn kill_group(pgid: i32, signal: i32) -> bool {
    // SAFETY: getpgrp has no preconditions.
    if pgid <= 1 || pgid == unsafe { libc::getpgrp() } {
        return false;
    }
    // SAFETY: killpg only sends a signal.
    unsafe { libc::killpg(pgid, signal) == 0 }
}

/// One tick's readings, shared by the run loop and the benchmark.
pub struct TickReader<'g> {
    observer: bool,
    unified: bool,
    slow_every: u64,
    tree: Option<ProcessTree>,
    system: SystemProbe,
    gpu: Option<GpuProbe<'g>>,
    gpu_slow: Option<Periodic<SlowReading>>,
    gpm: Option<Periodic<Result<Option<GpmWindow>, String>>>,
    gpm_window_ms: u64,
    residency: Option<Periodic<Result<u64, String>>>,
    pids: HashSet<i32>,
    last_weights_cached: Option<f64>,
    last_engine_gpu: Option<f64>,
    /// Reasons for unavailable columns.
    pub reasons: Reasons,
    /// Nanoseconds spent in each timed part (see [`SamplerResults::parts`]).
    pub part_costs: BTreeMap<&'static str, Vec<u64>>,
}

/// Run `f`, adding its duration to `costs[part]`.
fn timed<T>(
    costs: &mut BTreeMap<&'static str, Vec<u64>>,
    part: &'static str,
    f: impl FnOnce() -> T,
) -> T {
    let t0 = monotonic_ns();
    let out = f();
    costs
        .entry(part)
        .or_default()
        .push(monotonic_ns().saturating_sub(t0));
    out
}

impl TickReader<'_> {
    /// Whether this reader touches anything beyond `/proc/meminfo` (false only
    /// with the observer off and no unified budget).
    pub fn reads_beyond_floor(&self) -> bool {
        self.tree.is_some() || self.gpu.is_some() || self.residency.is_some()
    }

    /// Statistics of each timed part so far (see [`SamplerResults::parts`]); the
    /// slow GPU reads and the page-cache passes are timed on their own threads.
    pub fn part_cost_stats(&self) -> BTreeMap<&'static str, CostStats> {
        let mut out: BTreeMap<&'static str, CostStats> = self
            .part_costs
            .iter()
            .map(|(k, v)| (*k, CostStats::of(&mut v.clone())))
            .collect();
        if let Some(p) = &self.gpu_slow {
            out.insert("gpu_slow", CostStats::of(&mut p.costs_ns()));
        }
        if let Some(p) = &self.gpm {
            out.insert("gpm", CostStats::of(&mut p.costs_ns()));
        }
        if let Some(p) = &self.residency {
            out.insert("pagecache", CostStats::of(&mut p.costs_ns()));
        }
        out
    }

    /// Note, for each slow part whose thread could not start, why its columns stop
    /// after the first reading.
    fn note_spawn_errors(&mut self) {
        if let Some(why) = self.gpu_slow.as_ref().and_then(Periodic::spawn_error) {
            for c in ["gpu_energy_mj", "gpu_pcie_tx_kibps", "gpu_pcie_rx_kibps"] {
                self.reasons.note(c, why);
            }
        }
        if let Some(why) = self.residency.as_ref().and_then(Periodic::spawn_error) {
            self.reasons.note("weights_cached_bytes", why);
        }
    }

    /// Read GPM windows from `source` on a thread of their own (replacing any
    /// source already running), one pass per window (see [`gpm`]).
    pub fn set_gpm_source(&mut self, source: Box<dyn GpmSource>) {
        for c in gpm::GPM_COLUMNS {
            self.reasons.forget(c);
        }
        let mut pass = GpmPass::new(source);
        let every = std::time::Duration::from_millis(self.gpm_window_ms);
        self.gpm = Some(Periodic::start("gpm", every, move || pass.step()));
        if let Some(why) = self.gpm.as_ref().and_then(Periodic::spawn_error) {
            gpm::note_unavailable(&mut self.reasons, why);
        }
    }
}

impl<'g> TickReader<'g> {
    /// Readers for `target`'s tree, the system, `gpu` and the weight files; starts
    /// the slow parts' threads (they stop when the reader is dropped).
    pub fn new(
        config: &SamplerConfig,
        target: Target,
        gpu: Option<&'g Arc<Gpu>>,
        gpu_absent_reason: Option<String>,
    ) -> Self {
        let mut reasons = Reasons::default();
        let unified = config
            .limits
            .as_ref()
            .is_some_and(|l| l.unified_budget_bytes.is_some());
        // Observer off without a unified budget: the floor check reads meminfo only.
        let floor_only = !config.observer && !unified;
        let gpu = if floor_only { None } else { gpu };
        let gpu_absent_reason = if floor_only {
            Some("observer off: not read".to_string())
        } else {
            gpu_absent_reason
        };
        let every =
            std::time::Duration::from_millis(config.cadence_ms.max(1) * config.slow_every());
        let mut gpu_slow = None;
        let mut gpm_source: Option<Box<dyn GpmSource>> = None;
        let gpu = match gpu.map(|g| (g, GpuProbe::new(g))) {
            Some((g, Ok(p))) => {
                // The slow columns and GPM are journaled only with the observer
                // on; the unified budget needs none of them.
                if config.observer {
                    let g2 = Arc::clone(g);
                    gpu_slow = Some(Periodic::start("gpu-slow", every, move || g2.read_slow()));
                    match NvmlGpm::open(Arc::clone(g)) {
                        Ok(src) => gpm_source = Some(Box::new(src)),
                        Err(why) => gpm::note_unavailable(&mut reasons, &why),
                    }
                } else {
                    gpm::note_unavailable(&mut reasons, "observer off: not read");
                }
                Some(p)
            }
            Some((_, Err(why))) => {
                GPU_COLUMNS.iter().for_each(|c| reasons.note(c, &why));
                gpm::note_unavailable(&mut reasons, &why);
                None
            }
            None => {
                let why = gpu_absent_reason.unwrap_or_else(|| "no GPU opened".into());
                GPU_COLUMNS.iter().for_each(|c| reasons.note(c, &why));
                gpm::note_unavailable(&mut reasons, &why);
                None
            }
        };
        let residency = if floor_only {
            reasons.note("weights_cached_bytes", "observer off: not read");
            None
        } else if config.weights.is_empty() {
            reasons.note("weights_cached_bytes", "the run names no weight files");
            None
        } else {
            match Residency::open(&config.weights) {
                Ok(mut r) => Some(Periodic::start("pagecache", every, move || {
                    r.resident_bytes()
                })),
                Err(e) => {
                    reasons.note("weights_cached_bytes", &e.to_string());
                    None
                }
            }
        };
        let tree = (!floor_only).then(|| ProcessTree::new(target.pid));
        let pids = tree.iter().flat_map(ProcessTree::pids).collect();
        let mut reader = TickReader {
            observer: config.observer,
            unified,
            slow_every: config.slow_every(),
            tree,
            system: SystemProbe::default(),
            gpu,
            gpu_slow,
            gpm: None,
            gpm_window_ms: gpm::window_ms(config.cadence_ms),
            residency,
            pids,
            last_weights_cached: None,
            last_engine_gpu: None,
            reasons,
            part_costs: BTreeMap::new(),
        };
        reader.note_spawn_errors();
        if let Some(src) = gpm_source {
            reader.set_gpm_source(src);
        }
        reader
    }

    /// Read tick `index` taken at `t_ns` (CLOCK_MONOTONIC).
    pub fn read(&mut self, index: u64, t_ns: u64) -> Sample {
        let mut s = Sample::empty(t_ns);
        let slow = index % self.slow_every == 0;
        let full = self.observer;
        if let Some(tree) = &mut self.tree {
            if slow && index > 0 {
                timed(&mut self.part_costs, "tree_rescan", || tree.rescan());
                self.pids = tree.pids().collect();
            }
            tree.read(&mut s, &mut self.reasons, !full, t_ns);
        }
        if full {
            self.system.read(&mut s, &mut self.reasons);
        } else {
            self.system.read_memory(&mut s, &mut self.reasons);
        }
        if let Some(g) = &self.gpu {
            if full {
                g.read_fast(&mut s, &mut self.reasons, &self.pids);
                // Each slow pass lands in the first row after it ends.
                if let Some(r) = self.gpu_slow.as_mut().and_then(Periodic::take_new) {
                    r.value.apply(&mut s, &mut self.reasons);
                }
            } else if self.unified {
                g.read_processes(&mut s, &mut self.reasons, &self.pids);
            }
            if let Some(v) = s.get("engine_gpu_mem_bytes") {
                self.last_engine_gpu = Some(v);
            }
        }
        // Each GPM window lands once, in the first row after it closes.
        if full {
            if let Some(r) = self.gpm.as_mut().and_then(Periodic::take_new) {
                match r.value {
                    Ok(Some(w)) => w.apply(&mut s, &mut self.reasons),
                    Ok(None) => {}
                    Err(why) => gpm::note_unavailable(&mut self.reasons, &why),
                }
            }
        }
        // Each pass of the page-cache probe lands in the first row after it ends.
        if full || self.unified {
            if let Some(r) = self.residency.as_mut().and_then(Periodic::take_new) {
                match r.value {
                    Ok(b) => {
                        self.last_weights_cached = Some(b as f64);
                        s.set("weights_cached_bytes", Some(b as f64));
                    }
                    Err(e) => self.reasons.note("weights_cached_bytes", &e),
                }
            }
        }
        // The modelled unified footprint: the latest reading of each part; a part
        // that cannot be read (no GPU, no weights) counts as 0 and its own column
        // says why.
        if let Some(rss) = s.get("rss_bytes") {
            let total =
                rss + self.last_weights_cached.unwrap_or(0.0) + self.last_engine_gpu.unwrap_or(0.0);
            s.set("unified_bytes", Some(total));
        }
        s
    }
}

fn run_loop(
    config: SamplerConfig,
    target: Target,
    gpu: Option<&Arc<Gpu>>,
    gpu_absent_reason: Option<String>,
    mut sink: Box<dyn SampleSink>,
    stop: &AtomicBool,
    trip_slot: &Mutex<Option<Trip>>,
) -> SamplerResults {
    let mut reader = TickReader::new(&config, target, gpu, gpu_absent_reason);
    let mut ticker = Ticker::new(config.cadence_ms * 1_000_000);
    let mut costs = Vec::new();
    let mut trip: Option<Trip> = None;
    let mut ticks = 0u64;
    while let Some(tick) = ticker.wait(stop) {
        ticks += 1;
        let mut s = reader.read(tick.index, tick.fired_ns);
        s.set("tick_lag_ns", Some(tick.lag_ns() as f64));
        if trip.is_none() {
            if let Some(limits) = &config.limits {
                if let Some(t) = limits.check(&s) {
                    kill_group(target.pgid, libc::SIGKILL);
                    if let Ok(mut slot) = trip_slot.lock() {
                        *slot = Some(t.clone());
                    }
                    trip = Some(t);
                }
            }
        }
        if config.observer {
            timed(&mut reader.part_costs, "sink", || sink.sample(&s));
            if reader.reasons.take_changed() {
                sink.unavailable(&reader.reasons);
            }
        }
        costs.push(monotonic_ns().saturating_sub(tick.fired_ns));
    }
    if config.observer && reader.reasons.take_changed() {
        sink.unavailable(&reader.reasons);
    }
    let parts = reader.part_cost_stats();
    SamplerResults {
        ticks,
        missed_ticks: ticker.missed(),
        reasons: reader.reasons,
        trip,
        cost: CostStats::of(&mut costs),
        parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    struct VecSink(Arc<Mutex<Vec<Sample>>>, Arc<Mutex<Reasons>>);
    impl SampleSink for VecSink {
        fn sample(&mut self, s: &Sample) {
            self.0.lock().unwrap().push(s.clone());
        }
        fn unavailable(&mut self, r: &Reasons) {
            *self.1.lock().unwrap() = r.clone();
        }
    }

    #[test]
    fn slow_every_aims_at_one_second() {
        let c = |ms| SamplerConfig {
            cadence_ms: ms,
            observer: true,
            limits: None,
            weights: vec![],
        };
        assert_eq!(c(100).slow_every(), 10);
        assert_eq!(c(10).slow_every(), 100);
        assert_eq!(c(300).slow_every(), 3);
        assert_eq!(c(5000).slow_every(), 1);
        assert_eq!(c(100).fragment().observer.as_deref(), Some("on"));
    }

    #[test]
    fn samples_a_child_at_cadence_with_reasons_for_missing_sensors() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        let rows = Arc::new(Mutex::new(Vec::new()));
        let reasons = Arc::new(Mutex::new(Reasons::default()));
        let config = SamplerConfig {
            cadence_ms: 20,
            observer: true,
            limits: None,
            weights: vec![],
        };
        let s = Sampler::spawn(
            config,
            Target { pid, pgid: pid },
            None,
            Some("NVML unavailable: test".into()),
            Box::new(VecSink(rows.clone(), reasons.clone())),
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let report = s.stop();
        child.kill().unwrap();
        child.wait().unwrap();
        let rows = rows.lock().unwrap();
        assert_eq!(rows.len() as u64, report.ticks);
        assert!(rows.len() >= 5, "{} rows in 300 ms at 20 ms", rows.len());
        // Deadlines are absolute: every interval is a multiple of the period
        // minus/plus the lag of each tick.
        for w in rows.windows(2) {
            assert!(w[1].t_ns > w[0].t_ns);
        }
        let r = &rows[rows.len() - 1];
        assert!(r.get("rss_bytes").unwrap() > 0.0);
        assert!(r.get("mem_available_bytes").unwrap() > 0.0);
        assert_eq!(r.get("unified_bytes"), r.get("rss_bytes"));
        assert!(r.get("tick_lag_ns").is_some());
        assert_eq!(r.get("gpu_util_pct"), None);
        let reasons = reasons.lock().unwrap();
        assert_eq!(reasons.map()["gpu_util_pct"], "NVML unavailable: test");
        assert_eq!(
            reasons.map()["weights_cached_bytes"],
            "the run names no weight files"
        );
        assert!(report.trip.is_none());
        assert!(report.cost.median_us > 0.0);
    }

    /// GPM through a scripted source: each window lands once, with its own
    /// bounds, in a row after it closes (never repeated on later rows); rows
    /// without a window are null, not 0; the source's error nulls every GPM
    /// column with its reason. Mutations that turn it red: `take_new` replaced by
    /// a peek (windows repeat), `apply` writing 0 for a missing metric, the error
    /// arm of `read` dropped.
    #[test]
    fn gpm_windows_land_once_each_and_an_error_is_a_reason() {
        use gpm::tests::{window, ScriptedGpm};
        use std::collections::VecDeque;
        let pid = std::process::id() as i32;
        let target = Target { pid, pgid: pid };
        let cfg = SamplerConfig {
            cadence_ms: 10,
            observer: true,
            limits: None,
            weights: vec![],
        };
        let mut r = TickReader::new(&cfg, target, None, Some("no GPU here".into()));
        // No GPU: every GPM column says why.
        assert_eq!(
            r.reasons
                .map()
                .get("gpm_tensor_active_pct")
                .map(String::as_str),
            Some("no GPU here")
        );
        let (w1, w2) = (
            window(1_000, 101_000_000, 52.0),
            window(101_000_000, 202_000_000, 65.0),
        );
        r.set_gpm_source(Box::new(ScriptedGpm(VecDeque::from([
            Ok(None),
            Ok(Some(w1.clone())),
            Ok(Some(w2.clone())),
            Err("GPM sample: Insufficient Permissions".into()),
        ]))));
        assert!(!r.reasons.map().contains_key("gpm_tensor_active_pct"));
        let mut seen = Vec::new();
        let mut rows = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline
            && !r.reasons.map().contains_key("gpm_tensor_active_pct")
        {
            let s = r.read(rows, monotonic_ns());
            rows += 1;
            match s.get("gpm_window_end_ns") {
                Some(end) => seen.push((
                    s.get("gpm_window_start_ns"),
                    end,
                    s.get("gpm_tensor_active_pct"),
                    s.get("gpm_sm_occupancy_pct"),
                )),
                None => {
                    for c in gpm::GPM_COLUMNS {
                        assert_eq!(s.get(c), None, "{c} without a window");
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            seen,
            vec![
                (Some(1_000.0), 101_000_000.0, Some(52.0), Some(19.5)),
                (Some(101_000_000.0), 202_000_000.0, Some(65.0), Some(19.5)),
            ],
            "each window exactly once, in order, over {rows} rows"
        );
        assert!(
            rows > 10,
            "windows are 100 ms apart, ticks 10 ms: {rows} rows"
        );
        for c in gpm::GPM_COLUMNS {
            assert_eq!(
                r.reasons.map().get(*c).map(String::as_str),
                Some("GPM sample: Insufficient Permissions"),
                "{c}"
            );
        }
        assert!(r.part_cost_stats().contains_key("gpm"));
    }

    #[test]
    fn observer_off_reads_only_meminfo_and_journals_nothing() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        let target = Target { pid, pgid: pid };
        let limits = Limits {
            mem_floor_bytes: 1,
            unified_budget_bytes: None,
        };
        let off = SamplerConfig {
            cadence_ms: 10,
            observer: false,
            limits: Some(limits.clone()),
            weights: vec![PathBuf::from("/proc/self/exe")],
        };
        let mut r = TickReader::new(&off, target, None, None);
        assert!(!r.reads_beyond_floor());
        let s = r.read(0, monotonic_ns());
        assert!(s.get("mem_available_bytes").unwrap() > 0.0);
        for c in [
            "rss_bytes",
            "cpu_cores",
            "weights_cached_bytes",
            "unified_bytes",
        ] {
            assert_eq!(s.get(c), None, "{c} read with the observer off");
        }
        // A unified budget needs the tree even with the observer off.
        let budget = SamplerConfig {
            limits: Some(Limits {
                mem_floor_bytes: 1,
                unified_budget_bytes: Some(u64::MAX / 2),
            }),
            ..off.clone()
        };
        let mut r = TickReader::new(&budget, target, None, None);
        assert!(r.reads_beyond_floor());
        assert!(r.read(0, monotonic_ns()).get("rss_bytes").unwrap() > 0.0);
        // The run loop journals nothing with the observer off, yet ticks.
        let rows = Arc::new(Mutex::new(Vec::new()));
        let reasons = Arc::new(Mutex::new(Reasons::default()));
        let sampler = Sampler::spawn(
            off,
            target,
            None,
            None,
            Box::new(VecSink(rows.clone(), reasons.clone())),
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let report = sampler.stop();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(report.ticks >= 5, "{} ticks", report.ticks);
        assert!(rows.lock().unwrap().is_empty());
        assert!(reasons.lock().unwrap().map().is_empty());
    }
}
