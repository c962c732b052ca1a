//! What `rank`, `diff` and `campaign` know about one sealed bundle, as plain data.
//!
//! [`crate::bundle::manifest`] and [`crate::bundle::scan`] fill these from a
//! bundle's `manifest.json`, `phases.parquet` and `samples.parquet`; everything
//! downstream (pairing, statistics, fit, reports, the diff, the campaign's resume)
//! works on these structs only, so it is testable without Parquet and independent
//! of the order bundles were found in.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A bundle that is not used, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Exclusion {
    /// The bundle id (or the path of an unreadable bundle).
    pub id: String,
    /// Why it is not used.
    pub reason: String,
}

/// The `schedule` manifest fragment of a campaign run.
pub use evidence::fragments::Schedule;

/// One row of `phases.parquet` (the columns rank uses).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseRow {
    /// Phase name.
    pub name: String,
    /// Nesting depth, 0 at top.
    pub depth: i64,
    /// Open time, CLOCK_MONOTONIC nanoseconds.
    pub open_ns: i64,
    /// Close time; `None` if the phase was still open at the end.
    pub close_ns: Option<i64>,
    /// Duration in seconds (to the end of the record when still open).
    pub duration_s: Option<f64>,
    /// Whether the phase has no sub-phases.
    pub is_leaf: bool,
    /// Peak sampled RSS inside the phase, bytes.
    pub peak_rss_bytes: Option<i64>,
    /// The engine's own high-water mark of its resident set inside the phase (the
    /// `peak_host_bytes` close attribute, `specs/markers.md`), bytes; `None` when the
    /// engine did not report one or the phase never closed.
    pub peak_host_bytes: Option<i64>,
    /// Peak device bytes from the close attributes.
    pub peak_device_bytes: Option<i64>,
    /// Seconds the engine spent opening the device inside the phase (the
    /// `device_open_s` close attribute of a CUDA load phase); `None` when absent.
    pub device_open_s: Option<f64>,
    /// Share of the phase's samples with the GPU busy, 0..1.
    pub gpu_busy_share: Option<f64>,
    /// Samples inside the phase.
    pub samples: Option<i64>,
    /// The close attributes that are facts rather than readings, by name:
    /// strings, booleans, integers, arrays and objects (an arm, a digest, a
    /// count, a version). Every non-integer number is a reading (seconds, GB/s,
    /// ms) that differs from run to run and is left out, as are the high-water
    /// marks (`peak_*`). Empty when the phase never closed or its attributes do
    /// not parse.
    pub close_facts: BTreeMap<String, Value>,
}

impl PhaseRow {
    /// Peak resident host bytes inside the phase: the larger of the sampled peak
    /// and the engine's reported high-water mark. Samples bound the peak from
    /// below (a phase shorter than the cadence has none); the engine's mark is
    /// exact for its own process but absent from engines that do not report it.
    pub fn peak_host_rss_bytes(&self) -> Option<i64> {
        match (self.peak_rss_bytes, self.peak_host_bytes) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Peaks and counts of the sampled columns rank uses, over one set of samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SamplePeaks {
    /// Samples in the set.
    pub samples: u64,
    /// Largest `rss_bytes`.
    pub rss_bytes: Option<f64>,
    /// Largest `unified_bytes`.
    pub unified_bytes: Option<f64>,
    /// Largest `weights_cached_bytes`.
    pub weights_cached_bytes: Option<f64>,
    /// Largest `engine_gpu_mem_bytes`.
    pub engine_gpu_mem_bytes: Option<f64>,
    /// Samples with `gpu_util_pct` readable.
    pub gpu_util_samples: u64,
    /// Samples with `gpu_util_pct > 0`.
    pub gpu_busy_samples: u64,
}

impl SamplePeaks {
    /// Fold `other` into `self` (max of peaks, sum of counts).
    pub fn merge(&mut self, other: &SamplePeaks) {
        fn mx(a: Option<f64>, b: Option<f64>) -> Option<f64> {
            match (a, b) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, None) => x,
                (None, y) => y,
            }
        }
        self.samples += other.samples;
        self.rss_bytes = mx(self.rss_bytes, other.rss_bytes);
        self.unified_bytes = mx(self.unified_bytes, other.unified_bytes);
        self.weights_cached_bytes = mx(self.weights_cached_bytes, other.weights_cached_bytes);
        self.engine_gpu_mem_bytes = mx(self.engine_gpu_mem_bytes, other.engine_gpu_mem_bytes);
        self.gpu_util_samples += other.gpu_util_samples;
        self.gpu_busy_samples += other.gpu_busy_samples;
    }
}

/// What a bundle keeps of its render's frames and the engine that made them: what
/// `rank` compares a pair's frames by (`harness/src/rank/fidelity.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameFacts {
    /// The bundle directory the frame images are read from (empty for a bundle
    /// built in memory).
    pub dir: PathBuf,
    /// The frame images the bundle keeps (`first.png`, `middle.png`, `last.png`),
    /// with their sha256 from the manifest, by name.
    pub images: BTreeMap<String, String>,
    /// Whether the bundle keeps `frames.parquet`.
    pub has_frames_table: bool,
    /// Every frame's sha256 (`frames.parquet`: of the y4m's Y, U and V planes), by
    /// frame index; empty without that file.
    pub frame_sha256: BTreeMap<i64, String>,
    /// The engine the hello named (`engine`, `diffusers-ltx`), when recorded.
    pub engine: Option<String>,
    /// The hello's attributes that are strings (`dtype`, `noise`), by name.
    pub engine_attrs: BTreeMap<String, String>,
    /// `rung.sha256`: the rung file, so its seed and prompt.
    pub rung_sha256: Option<String>,
}

/// One bundle, as rank sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bundle {
    /// The bundle id (sha256 of its canonical manifest).
    pub id: String,
    /// `rung.name`.
    pub rung: String,
    /// Output voxels of the rung (width x height x frames).
    pub voxels: u64,
    /// `rung.config.device` (`cpu`, `cuda`), when recorded.
    pub device: Option<String>,
    /// `profile`.
    pub profile: String,
    /// `engine.sha256`: the measured binary.
    pub engine_sha256: String,
    /// The host key: `run.hostname`, `host.cpu_model` and the GPU name, joined by `|`.
    pub host: String,
    /// `run.boot_id`: the kernel's boot id when the run started (`?` when not
    /// recorded). Two runs with one boot id ran in one sitting of one machine; lent
    /// machines share a hostname, so the host key alone cannot say that.
    pub boot_id: String,
    /// `weights.digest`.
    pub weights_digest: String,
    /// `levers`: the arms the harness passed.
    pub levers: BTreeMap<String, String>,
    /// The arms the run reports it ran, whether passed or defaulted: every engine
    /// lever's arm from the hello's `levers` attribute (the engine resolves its profile
    /// and the passed arms before it says hello) and the observer's from
    /// `sampler.observer`; empty for a bundle that records neither. See
    /// [`Bundle::assignment`].
    pub arms: BTreeMap<String, String>,
    /// `schedule`, for campaign runs.
    pub schedule: Option<Schedule>,
    /// `run.start_unix_ns`: when the harness started the run, in nanoseconds since the
    /// Unix epoch (the host's clock), when recorded.
    pub start_unix_ns: Option<u64>,
    /// `phases.run_wall_s`: seconds from the harness starting the run to its end
    /// (gates, engine and sealing included), when recorded.
    pub run_wall_s: Option<f64>,
    /// Why the run counts as contended (`contention.flagged`), if it does.
    pub contended: Option<String>,
    /// Share (0..1) of the weight files' bytes in the page cache just before the
    /// engine started (`weights_cache`, or the `weights-cache` gate of bundles sealed
    /// before that fragment existed); `None` where neither was recorded.
    pub cache_share_at_start: Option<f64>,
    /// Why the run is incomplete (`complete`, `exit`, `completion`), if it is.
    pub incomplete: Option<String>,
    /// Phase rows in open order.
    pub phases: Vec<PhaseRow>,
    /// Sample peaks per innermost phase name (`""` for samples outside any phase).
    pub samples_by_phase: BTreeMap<String, SamplePeaks>,
    /// The frames it keeps, for fidelity.
    pub frames: FrameFacts,
    /// The GPM windows of its samples (`gpm_window_start_ns` .. `gpm_window_end_ns`
    /// with their activity percentages), in sample order; empty for a bundle sealed
    /// before the GPM columns or sampled where the GPU or driver has no GPM.
    #[serde(skip)]
    pub gpm: Vec<evidence::phase_table::GpmFigure>,
}

impl Bundle {
    /// The lever assignment the run ran under: [`Bundle::arms`] with the passed
    /// [`Bundle::levers`] over them. Two runs with equal assignments ran the same
    /// arms, whether an arm was passed or was the profile's default (a campaign's
    /// `attention=cudnn` arm and a plain run of a profile whose default is `cudnn`).
    pub fn assignment(&self) -> BTreeMap<String, String> {
        let mut a = self.arms.clone();
        a.extend(self.levers.iter().map(|(k, v)| (k.clone(), v.clone())));
        a
    }

    /// The short id people read: the first 12 characters.
    pub fn short_id(&self) -> &str {
        crate::short_id::short(&self.id)
    }

    /// Every instance of the phase named `name` (at any depth) as
    /// `[open_ns, close_ns]`, CLOCK_MONOTONIC nanoseconds; a phase still open at
    /// the end spans its open instant only.
    pub fn phase_spans(&self, name: &str) -> Vec<(i64, i64)> {
        self.phases
            .iter()
            .filter(|p| p.name == name)
            .map(|p| (p.open_ns, p.close_ns.unwrap_or(p.open_ns)))
            .collect()
    }

    /// Sample peaks over every sample, or over the samples whose innermost phase is
    /// `phase` or a dotted descendant of it.
    pub fn peaks(&self, phase: Option<&str>) -> SamplePeaks {
        let mut acc = SamplePeaks::default();
        for (name, p) in &self.samples_by_phase {
            if phase.is_none_or(|ph| in_subtree(name, ph)) {
                acc.merge(p);
            }
        }
        acc
    }

    /// Engine wall in seconds: from the first phase's open to the last phase's close
    /// (or end, for a phase still open).
    pub fn render_wall_s(&self) -> Option<f64> {
        let open = self.phases.iter().map(|p| p.open_ns).min()?;
        let end = self
            .phases
            .iter()
            .filter_map(|p| {
                p.close_ns.or_else(|| {
                    p.duration_s
                        .map(|d| p.open_ns.saturating_add((d * 1e9).round() as i64))
                })
            })
            .max()?;
        (end > open).then(|| (end - open) as f64 / 1e9)
    }

    /// Seconds spent opening the device, summed over every phase that reports
    /// `device_open_s` (the load phases of a CUDA render): the run's
    /// first-initialization figure. `None` when no phase reports one.
    pub fn device_open_s(&self) -> Option<f64> {
        let v: Vec<f64> = self.phases.iter().filter_map(|p| p.device_open_s).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }

    /// Total seconds of every instance of the phase named `name`, with the count.
    pub fn phase_total_s(&self, name: &str) -> Option<(f64, usize)> {
        let mut total = 0.0;
        let mut n = 0;
        for p in self.phases.iter().filter(|p| p.name == name) {
            total += p.duration_s?;
            n += 1;
        }
        (n > 0).then_some((total, n))
    }
}

/// Whether phase `name` is `root` or a dotted descendant of it (`denoise.step` of
/// `denoise`).
pub fn in_subtree(name: &str, root: &str) -> bool {
    name == root
        || (name.len() > root.len()
            && name.starts_with(root)
            && name.as_bytes()[root.len()] == b'.')
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bundle with phases `load.dit` (2 s), `denoise` (10 s) holding two
    /// `denoise.step`s, and samples in `load.dit` and `denoise.step`.
    pub(crate) fn sample_bundle(id: &str) -> Bundle {
        let ph = |name: &str, depth, open: i64, dur: f64, rss: i64| PhaseRow {
            name: name.into(),
            depth,
            open_ns: open,
            close_ns: Some(open + (dur * 1e9) as i64),
            duration_s: Some(dur),
            is_leaf: name != "denoise",
            peak_rss_bytes: Some(rss),
            peak_host_bytes: None,
            peak_device_bytes: None,
            device_open_s: None,
            gpu_busy_share: None,
            samples: Some(3),
            close_facts: Default::default(),
        };
        let mut samples = BTreeMap::new();
        samples.insert(
            "load.dit".to_string(),
            SamplePeaks {
                samples: 4,
                rss_bytes: Some(900.0),
                weights_cached_bytes: Some(5000.0),
                gpu_util_samples: 4,
                gpu_busy_samples: 0,
                ..Default::default()
            },
        );
        samples.insert(
            "denoise.step".to_string(),
            SamplePeaks {
                samples: 10,
                rss_bytes: Some(1200.0),
                weights_cached_bytes: Some(3000.0),
                unified_bytes: Some(7000.0),
                gpu_util_samples: 10,
                gpu_busy_samples: 8,
                ..Default::default()
            },
        );
        Bundle {
            id: id.into(),
            rung: "2".into(),
            voxels: 1000,
            device: Some("cpu".into()),
            profile: "default".into(),
            engine_sha256: "e".into(),
            host: "h".into(),
            boot_id: "b".into(),
            weights_digest: "w".into(),
            levers: BTreeMap::new(),
            arms: BTreeMap::new(),
            schedule: None,
            start_unix_ns: None,
            run_wall_s: None,
            contended: None,
            incomplete: None,
            phases: vec![
                ph("load.dit", 0, 1_000_000_000, 2.0, 1000),
                ph("denoise", 0, 3_000_000_000, 10.0, 1500),
                ph("denoise.step", 1, 3_000_000_000, 5.0, 1400),
                ph("denoise.step", 1, 8_000_000_000, 5.0, 1500),
            ],
            samples_by_phase: samples,
            gpm: Vec::new(),
            cache_share_at_start: None,
            frames: FrameFacts::default(),
        }
    }

    #[test]
    fn subtree_matches_dotted_descendants_only() {
        assert!(in_subtree("denoise", "denoise"));
        assert!(in_subtree("denoise.step", "denoise"));
        assert!(!in_subtree("denoiser", "denoise"));
        assert!(!in_subtree("load.dit", "load.d"));
    }
}
