//! The GPM control (`gpu-gpm`): inside the burn's announced load (a bf16 GEMM
//! loop), NVML's GPM must see the tensor pipes and the SMs busy. NVML's
//! utilization (`gpu-util`) only says a kernel was resident; this says the
//! instrument that reads tensor activity reads it where it is known to be high.
//!
//! Judged over the GPM windows wholly inside the load after its settling
//! margin. Unreadable GPM (not supported, no permission, no window inside the
//! load) is an `instrument-error`, never a GPU `fail`; no GPU is
//! `not-applicable`.

use std::path::PathBuf;

use evidence::clock::monotonic_ns;
use serde_json::json;

use crate::control::watchdog::{ControlResult, INSTRUMENT_ERROR};
use crate::sampler::gpm::{GpmSource, GpmWindow};

/// Test-only: read GPM's any-tensor and SM activity from this file instead of
/// NVML (two percents, `tensor sm` or `tensor,sm`; a missing file reads `0 0`,
/// an idle GPU), so
/// the control's verdicts can be exercised without a GPU beside the fake
/// utilization ([`crate::control::util::FAKE_UTIL_ENV`]).
pub const FAKE_GPM_ENV: &str = "HARNESS_CONTROL_FAKE_GPM";

/// Where the control's GPM windows come from.
pub enum GpmInput {
    /// Nothing to read (no GPU, or a fake utilization without a fake GPM): why.
    NotApplicable(String),
    /// GPM cannot be read on this GPU: why.
    Unreadable(String),
    /// A source of windows.
    Source(Box<dyn GpmSource>),
}

/// The fake source of [`FAKE_GPM_ENV`]: each call closes a window since the
/// previous call with the file's two figures (the other metrics unread).
pub struct FileGpm {
    path: PathBuf,
    prev: Option<u64>,
}

impl FileGpm {
    /// The fake named by [`FAKE_GPM_ENV`], when it is set.
    pub fn from_env() -> Option<FileGpm> {
        std::env::var_os(FAKE_GPM_ENV).map(|p| FileGpm {
            path: p.into(),
            prev: None,
        })
    }
}

impl GpmSource for FileGpm {
    fn next_window(&mut self) -> Result<Option<GpmWindow>, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "0 0".into(),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let v: Vec<f64> = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {text:?} is not two percents: {e}", self.path.display()))?;
        let [tensor, sm] = v[..] else {
            return Err(format!(
                "{}: {text:?} is not two percents",
                self.path.display()
            ));
        };
        let now = monotonic_ns();
        let out = self.prev.map(|start_ns| {
            let unread = || Err("fake GPM: not read".to_string());
            GpmWindow {
                start_ns,
                end_ns: now,
                metrics: [Ok(sm), unread(), Ok(tensor), unread(), unread(), unread()],
            }
        });
        self.prev = Some(now);
        Ok(out)
    }
}

/// The control's name in manifests and tables.
pub const NAME: &str = "gpu-gpm";

/// The median any-tensor activity the burn's load must reach, percent. A
/// back-to-back bf16 GEMM at 8192³ keeps the tensor pipes busy nearly all the
/// time (the H200's figure is for the device run to record); 80 leaves room for
/// the GEMM's prologue and epilogue and the gaps between launches, while a
/// sensor stuck at 0, or a burn that fell back to non-tensor code, fails.
pub const MIN_TENSOR_PCT: f64 = 80.0;
/// The median SM activity the load must reach, percent: every SM holds a warp
/// of the GEMM almost all the time.
pub const MIN_SM_PCT: f64 = 90.0;

/// What the GPM reads during the control gave.
#[derive(Debug, Clone, PartialEq)]
pub enum GpmSeen {
    /// No GPU (or only a fake utilization source): nothing to judge.
    NoGpu(String),
    /// GPM could not be read; the reason.
    Unreadable(String),
    /// The windows read from the burn's start to its stop.
    Windows(Vec<GpmWindow>),
}

/// The median of `v` (`None` when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| crate::rank::stats::median(&mut v))
}

/// The verdict over `seen`, counting the windows wholly inside
/// `[load_open + settle_s, load_close]` (CLOCK_MONOTONIC ns; `None`: the load
/// never opened or closed, so nothing is inside).
pub fn judge(seen: &GpmSeen, load: Option<(u64, u64)>, settle_s: f64) -> ControlResult {
    let windows = match seen {
        GpmSeen::NoGpu(why) => {
            return ControlResult::new(NAME, "not-applicable", format!("no GPU: {why}"))
        }
        GpmSeen::Unreadable(why) => {
            return ControlResult::new(
                NAME,
                INSTRUMENT_ERROR,
                format!("GPM unreadable: {why}. No verdict on the GPU"),
            )
        }
        GpmSeen::Windows(w) => w,
    };
    let Some((open, close)) = load else {
        return ControlResult::new(
            NAME,
            INSTRUMENT_ERROR,
            "the burn's load never opened and closed: no GPM window to judge. No verdict on the GPU"
                .to_string(),
        );
    };
    let from = open.saturating_add((settle_s * 1e9) as u64);
    let inside: Vec<&GpmWindow> = windows
        .iter()
        .filter(|w| w.start_ns >= from && w.end_ns <= close)
        .collect();
    let pick = |i: usize| -> Vec<f64> {
        inside
            .iter()
            .filter_map(|w| w.metrics[i].as_ref().ok().copied())
            .filter(|v| v.is_finite())
            .collect()
    };
    // metrics[2]: any-tensor active, metrics[0]: SM active (GpmWindow's order).
    let (tensor, sm) = (median(pick(2)), median(pick(0)));
    let (Some(t), Some(s)) = (tensor, sm) else {
        let why = inside
            .iter()
            .find_map(|w| w.metrics[2].as_ref().err().cloned())
            .unwrap_or_else(|| format!("{} window(s) inside the load", inside.len()));
        return ControlResult::new(
            NAME,
            INSTRUMENT_ERROR,
            format!(
                "no tensor/SM activity read inside the load ({why}; {} window(s) in all). \
                 No verdict on the GPU",
                windows.len()
            ),
        );
    };
    let pass = t >= MIN_TENSOR_PCT && s >= MIN_SM_PCT;
    let mut r = ControlResult::new(
        NAME,
        if pass { "pass" } else { "fail" },
        format!(
            "median any-tensor activity {t:.1}% (>= {MIN_TENSOR_PCT:.0}%) and SM activity \
             {s:.1}% (>= {MIN_SM_PCT:.0}%) over {} GPM window(s) inside the burn's load",
            inside.len()
        ),
    );
    if let serde_json::Value::Object(m) = json!({
        "tensor_active_pct": t,
        "sm_active_pct": s,
        "windows_inside": inside.len(),
        "windows": windows.len(),
        "min_tensor_pct": MIN_TENSOR_PCT,
        "min_sm_pct": MIN_SM_PCT,
    }) {
        r.figures = m;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::gpm::tests::window;

    const S: u64 = 1_000_000_000;

    fn windows(tensor: f64, sm: f64) -> Vec<GpmWindow> {
        (0..40)
            .map(|i| {
                let mut w = window(i * S / 10, (i + 1) * S / 10, tensor);
                w.metrics[0] = Ok(sm);
                w
            })
            .collect()
    }

    /// The three outcomes and not-applicable. Red if the thresholds are dropped
    /// (the idle burn passes), an unreadable GPM is judged as a GPU fail, or
    /// windows outside the load are counted (the idle edges pull the median).
    #[test]
    fn a_busy_load_passes_an_idle_one_fails_and_unreadable_gpm_is_an_instrument_error() {
        let load = Some((S / 2, 3 * S + S / 2));
        let busy = judge(&GpmSeen::Windows(windows(93.0, 99.0)), load, 1.0);
        assert_eq!(busy.verdict, "pass", "{}", busy.detail);
        // 1.5 s .. 3.5 s: 20 whole windows of 100 ms.
        assert!(
            busy.detail.contains("over 20 GPM window(s)"),
            "{}",
            busy.detail
        );
        let idle = judge(&GpmSeen::Windows(windows(3.0, 40.0)), load, 1.0);
        assert_eq!(idle.verdict, "fail", "{}", idle.detail);
        let sm_low = judge(&GpmSeen::Windows(windows(93.0, 70.0)), load, 1.0);
        assert_eq!(sm_low.verdict, "fail", "{}", sm_low.detail);
        // Busy only inside the load, idle around it: passes on the inside alone.
        let mut edges = windows(0.0, 0.0);
        for w in edges
            .iter_mut()
            .filter(|w| w.start_ns >= 3 * S / 2 && w.end_ns <= 7 * S / 2)
        {
            w.metrics[2] = Ok(90.0);
            w.metrics[0] = Ok(98.0);
        }
        assert_eq!(judge(&GpmSeen::Windows(edges), load, 1.0).verdict, "pass");
        let denied = judge(
            &GpmSeen::Unreadable("GPM sample: Insufficient Permissions".into()),
            load,
            1.0,
        );
        assert_eq!(denied.verdict, INSTRUMENT_ERROR);
        assert!(denied.detail.contains("Insufficient Permissions"));
        let mut unsupported = windows(93.0, 99.0);
        for w in &mut unsupported {
            w.metrics[2] = Err("GPM metric: Not Supported".into());
        }
        let u = judge(&GpmSeen::Windows(unsupported), load, 1.0);
        assert_eq!(u.verdict, INSTRUMENT_ERROR, "{}", u.detail);
        assert!(u.detail.contains("Not Supported"), "{}", u.detail);
        assert_eq!(
            judge(&GpmSeen::Windows(windows(93.0, 99.0)), None, 1.0).verdict,
            INSTRUMENT_ERROR
        );
        assert_eq!(
            judge(&GpmSeen::NoGpu("NVML unavailable".into()), load, 1.0).verdict,
            "not-applicable"
        );
    }
}
