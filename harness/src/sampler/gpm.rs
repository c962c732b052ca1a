//! NVML's GPU Performance Monitoring (GPM): what the SMs, their tensor pipes
//! and DRAM did, beside NVML's utilization (which only says a kernel was
//! resident).
//!
//! GPM reports metrics between two samples of the GPU's counters; NVML refreshes
//! them about every 100 ms, so consecutive samples are taken at least
//! [`MIN_WINDOW_MS`] apart (the window is the longest of that and the tick
//! interval). Samples are taken on a thread of their own ([`super::periodic`]),
//! never on the tick; each finished window lands once, in the first row after
//! it closes, carrying its own bounds (`gpm_window_start_ns`,
//! `gpm_window_end_ns`), so no reader can take a window's figure for a tick's.
//! Where GPM cannot be read (no GPU, a GPU before Hopper, no permission in a
//! container, MIG) every GPM column is null and `sensors_unavailable` says why:
//! never a 0.

use std::ffi::c_void;
use std::sync::Arc;

use evidence::clock::monotonic_ns;
use evidence::sample::{column, Sample};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};

use super::gpu::Gpu;
use super::Reasons;

/// The shortest GPM window, in milliseconds (NVML's refresh of its counters).
pub const MIN_WINDOW_MS: u64 = 100;

/// Every GPM column of [`evidence::sample::SAMPLE_COLUMNS`].
pub const GPM_COLUMNS: &[&str] = &[
    column::GPM_WINDOW_START_NS,
    column::GPM_WINDOW_END_NS,
    column::GPM_SM_ACTIVE_PCT,
    column::GPM_SM_OCCUPANCY_PCT,
    column::GPM_TENSOR_ACTIVE_PCT,
    column::GPM_DRAM_BW_PCT,
    column::GPM_PCIE_TX_BYTES_PER_S,
    column::GPM_PCIE_RX_BYTES_PER_S,
];

/// The metric columns (all but the two bounds), in the order
/// [`GpmWindow::metrics`] holds them.
fn metric_columns() -> &'static [&'static str] {
    &GPM_COLUMNS[2..]
}

/// NVML's metric for each of [`metric_columns`].
const METRIC_IDS: [GpmMetricId; 6] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
];

/// The window for a sampler ticking every `cadence_ms`: the longest of
/// [`MIN_WINDOW_MS`] and the tick interval, in milliseconds.
pub fn window_ms(cadence_ms: u64) -> u64 {
    cadence_ms.max(MIN_WINDOW_MS)
}

/// One GPM window: its bounds on the harness's clock and each metric, or why
/// that metric could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct GpmWindow {
    /// CLOCK_MONOTONIC nanoseconds at the window's first sample.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds at its second sample.
    pub end_ns: u64,
    /// One per metric column (SM active %, SM occupancy %, any-tensor active %,
    /// DRAM bandwidth %, PCIe tx and rx bytes/s), each a value or the reason it is
    /// missing.
    pub metrics: [Result<f64, String>; 6],
}

impl GpmWindow {
    /// Write the window into row `s`: its bounds and every metric that was read;
    /// a metric that was not is noted in `reasons` (and stays null).
    pub fn apply(&self, s: &mut Sample, reasons: &mut Reasons) {
        s.set(column::GPM_WINDOW_START_NS, Some(self.start_ns as f64));
        s.set(column::GPM_WINDOW_END_NS, Some(self.end_ns as f64));
        for (c, m) in metric_columns().iter().zip(&self.metrics) {
            match m {
                Ok(v) if v.is_finite() => {
                    s.set(c, Some(*v));
                }
                Ok(v) => reasons.note(c, &format!("GPM returned {v}")),
                Err(why) => reasons.note(c, why),
            }
        }
    }
}

/// Where GPM windows come from: NVML on a GPU ([`NvmlGpm`]), a script in tests.
pub trait GpmSource: Send {
    /// Take a sample now and return the window since the previous one (`None`
    /// for the first sample); an error is the reason GPM stopped.
    fn next_window(&mut self) -> Result<Option<GpmWindow>, String>;
}

/// Note `why` for every GPM column.
pub fn note_unavailable(reasons: &mut Reasons, why: &str) {
    for c in GPM_COLUMNS {
        reasons.note(c, why);
    }
}

/// GPM through NVML on the run's GPU. Holds the previous sample between calls
/// as a raw handle (type-erased: a sample borrows the NVML instance the `Gpu`
/// owns, so it cannot sit beside it), with the time it was taken.
pub struct NvmlGpm {
    gpu: Arc<Gpu>,
    prev: Option<(*mut c_void, u64)>,
}

// SAFETY: the raw sample handle is only used from the thread that owns this
// value; GpmSample itself is Send.
unsafe impl Send for NvmlGpm {}

impl NvmlGpm {
    /// GPM on `gpu`, if the device says it supports it (the error is the
    /// reason to record). The first sample is the first pass's, on the GPM
    /// thread: a refusal there (no permission in a container, MIG) is that
    /// pass's error.
    pub fn open(gpu: Arc<Gpu>) -> Result<NvmlGpm, String> {
        let g = NvmlGpm { gpu, prev: None };
        {
            let dev = g
                .gpu
                .device()
                .map_err(|e| format!("GPM: NVML device: {e}"))?;
            match dev.gpm_support() {
                Ok(true) => {}
                Ok(false) => {
                    return Err("GPM not supported on this GPU (Hopper or later needed)".into())
                }
                Err(e) => return Err(format!("GPM support query: {e}")),
            }
        }
        Ok(g)
    }
}

impl GpmSource for NvmlGpm {
    fn next_window(&mut self) -> Result<Option<GpmWindow>, String> {
        let nvml = self.gpu.nvml();
        let dev = self
            .gpu
            .device()
            .map_err(|e| format!("GPM: NVML device: {e}"))?;
        let now = dev.gpm_sample().map_err(|e| format!("GPM sample: {e}"))?;
        let t = monotonic_ns();
        let out = match self.prev.take() {
            None => None,
            Some((h, t0)) => {
                // SAFETY: `h` came from `into_handle` of a sample of this same
                // NVML instance and is owned by nobody else: rebuilt once here,
                // it is freed when dropped at the end of this scope.
                let prev = unsafe { GpmSample::from_handle(nvml, h.cast()) };
                let got = gpm_metrics_get(nvml, &prev, &now, &METRIC_IDS)
                    .map_err(|e| format!("GPM metrics: {e}"))?;
                let mut metrics: [Result<f64, String>; 6] =
                    std::array::from_fn(|_| Err("GPM did not answer".to_string()));
                for (slot, r) in metrics.iter_mut().zip(got) {
                    *slot = r.map(|m| m.value).map_err(|e| format!("GPM metric: {e}"));
                }
                Some(GpmWindow {
                    start_ns: t0,
                    end_ns: t,
                    metrics,
                })
            }
        };
        self.prev = Some((now.into_handle().cast(), t));
        Ok(out)
    }
}

impl Drop for NvmlGpm {
    fn drop(&mut self) {
        if let Some((h, _)) = self.prev.take() {
            // SAFETY: as in next_window: the one owner of the handle frees it.
            drop(unsafe { GpmSample::from_handle(self.gpu.nvml(), h.cast()) });
        }
    }
}

/// The state a [`super::periodic::Periodic`] pass carries: a source that
/// stops at its first error (after which every pass repeats that error).
pub struct GpmPass {
    source: Option<Box<dyn GpmSource>>,
    failed: Option<String>,
}

impl GpmPass {
    /// Passes over `source`.
    pub fn new(source: Box<dyn GpmSource>) -> GpmPass {
        GpmPass {
            source: Some(source),
            failed: None,
        }
    }

    /// One pass: the window since the previous pass, nothing on the first, or
    /// the reason GPM stopped (the source is dropped at the first error).
    pub fn step(&mut self) -> Result<Option<GpmWindow>, String> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        let r = match self.source.as_mut() {
            Some(s) => s.next_window(),
            None => Err("GPM source closed".to_string()),
        };
        if let Err(why) = &r {
            self.failed = Some(why.clone());
            self.source = None;
        }
        r
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A scripted GPM source: each call pops the next answer.
    pub struct ScriptedGpm(pub VecDeque<Result<Option<GpmWindow>, String>>);

    impl GpmSource for ScriptedGpm {
        fn next_window(&mut self) -> Result<Option<GpmWindow>, String> {
            self.0
                .pop_front()
                .unwrap_or_else(|| Err("script exhausted".into()))
        }
    }

    /// A window with every metric read.
    pub fn window(start_ns: u64, end_ns: u64, tensor: f64) -> GpmWindow {
        GpmWindow {
            start_ns,
            end_ns,
            metrics: [
                Ok(95.0),
                Ok(19.5),
                Ok(tensor),
                Ok(13.0),
                Ok(1.0e6),
                Ok(2.0e6),
            ],
        }
    }

    #[test]
    fn a_window_sets_its_bounds_and_metrics_and_names_what_is_missing() {
        let mut w = window(1_000, 101_000, 52.5);
        w.metrics[5] = Err("GPM metric: Not supported".into());
        w.metrics[3] = Ok(f64::NAN);
        let mut s = Sample::empty(200_000);
        let mut reasons = Reasons::default();
        w.apply(&mut s, &mut reasons);
        assert_eq!(s.get(column::GPM_WINDOW_START_NS), Some(1_000.0));
        assert_eq!(s.get(column::GPM_WINDOW_END_NS), Some(101_000.0));
        assert_eq!(s.get(column::GPM_TENSOR_ACTIVE_PCT), Some(52.5));
        assert_eq!(s.get(column::GPM_SM_ACTIVE_PCT), Some(95.0));
        // Missing stays null, never 0, and says why.
        assert_eq!(s.get(column::GPM_PCIE_RX_BYTES_PER_S), None);
        assert_eq!(s.get(column::GPM_DRAM_BW_PCT), None);
        assert_eq!(
            reasons
                .map()
                .get(column::GPM_PCIE_RX_BYTES_PER_S)
                .map(String::as_str),
            Some("GPM metric: Not supported")
        );
        assert!(reasons.map()[column::GPM_DRAM_BW_PCT].contains("NaN"));
    }

    #[test]
    fn a_pass_stops_at_the_first_error_and_repeats_it() {
        let mut p = GpmPass::new(Box::new(ScriptedGpm(VecDeque::from([
            Ok(None),
            Ok(Some(window(0, 100, 50.0))),
            Err("GPM sample: Insufficient Permissions".into()),
            Ok(Some(window(100, 200, 60.0))),
        ]))));
        assert_eq!(p.step(), Ok(None));
        assert_eq!(p.step().unwrap().unwrap().start_ns, 0);
        let e = p.step().unwrap_err();
        assert!(e.contains("Permissions"));
        // The source is gone: its later answers are never read.
        assert_eq!(p.step().unwrap_err(), e);
    }

    #[test]
    fn the_window_is_never_shorter_than_nvml_refreshes() {
        assert_eq!(window_ms(10), 100);
        assert_eq!(window_ms(100), 100);
        assert_eq!(window_ms(250), 250);
    }

    #[test]
    fn every_gpm_column_is_a_sample_column() {
        for c in GPM_COLUMNS {
            assert!(
                evidence::sample::column_index(c).is_some(),
                "{c} missing from SAMPLE_COLUMNS"
            );
        }
        assert_eq!(metric_columns().len(), METRIC_IDS.len());
        assert_eq!(metric_columns()[2], column::GPM_TENSOR_ACTIVE_PCT);
    }
}
