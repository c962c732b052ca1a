//! The value of a lever's metric (`specs/levers.toml`) for one bundle: which
//! phase rows and sample peaks it reads, and why a bundle has none.

use crate::bundle::facts::{Bundle, PhaseRow};
use crate::levers_spec::{GpmCounter, Metric};

/// The value of `metric` for bundle `b`, or why it has none.
pub fn value(b: &Bundle, metric: &Metric) -> Result<f64, String> {
    let rows = |phase: &Option<String>| -> Vec<&PhaseRow> {
        b.phases
            .iter()
            .filter(|p| phase.as_deref().is_none_or(|ph| p.name == ph))
            .collect()
    };
    let max_i64 = |rows: Vec<&PhaseRow>, f: fn(&PhaseRow) -> Option<i64>, what: &str| {
        rows.iter()
            .filter_map(|r| f(r))
            .max()
            .map(|v| v as f64)
            .ok_or_else(|| format!("no {what} recorded"))
    };
    let need_phase = |phase: &Option<String>| -> Result<(), String> {
        match phase {
            Some(ph) if !b.phases.iter().any(|p| &p.name == ph) => {
                Err(format!("phase {ph} absent"))
            }
            _ => Ok(()),
        }
    };
    match metric {
        Metric::PhaseWall { phase } => b
            .phase_total_s(phase)
            .map(|(s, _)| s)
            .ok_or_else(|| format!("phase {phase} absent or without a duration")),
        Metric::RenderWall => b
            .render_wall_s()
            .ok_or_else(|| "no phases to span".to_string()),
        Metric::PeakRss { phase } => {
            need_phase(phase)?;
            max_i64(
                rows(phase),
                PhaseRow::peak_host_rss_bytes,
                "peak_rss_bytes sample or peak_host_bytes close attribute",
            )
        }
        Metric::DevicePeak { phase } => {
            need_phase(phase)?;
            max_i64(rows(phase), |r| r.peak_device_bytes, "peak_device_bytes")
        }
        Metric::WeightsCached { phase } => {
            need_phase(phase)?;
            b.peaks(phase.as_deref())
                .weights_cached_bytes
                .ok_or_else(|| "no weights_cached_bytes sample".to_string())
        }
        Metric::UnifiedPeak { phase } => {
            need_phase(phase)?;
            b.peaks(phase.as_deref())
                .unified_bytes
                .ok_or_else(|| "no unified_bytes sample".to_string())
        }
        Metric::GpuBusyShare { phase } => {
            need_phase(&Some(phase.clone()))?;
            let p = b.peaks(Some(phase));
            if p.gpu_util_samples == 0 {
                Err(format!("no gpu_util_pct sample inside {phase}"))
            } else {
                Ok(p.gpu_busy_samples as f64 / p.gpu_util_samples as f64)
            }
        }
        Metric::GpmActivity { phase, counter } => {
            need_phase(&Some(phase.clone()))?;
            gpm_share(b, phase, *counter).ok_or_else(|| {
                if b.gpm.is_empty() {
                    "no GPM window recorded (a GPU or driver without GPM, or a bundle sealed before it)".to_string()
                } else {
                    format!(
                        "no GPM window with a {} figure wholly inside {phase}",
                        counter.as_str()
                    )
                }
            })
        }
    }
}

/// The median share (0..1) of `counter` over the GPM windows of `b` wholly inside
/// an instance of the phase named `phase`; `None` when no window with that figure
/// is inside one (a phase shorter than a window has none).
pub fn gpm_share(b: &Bundle, phase: &str, counter: GpmCounter) -> Option<f64> {
    evidence::phase_table::inside_median(&b.phase_spans(phase), &b.gpm, |w| counter.pick(w))
        .map(|pct| pct / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::facts::tests::sample_bundle;

    #[test]
    fn metrics_read_the_right_rows_and_samples() {
        let b = sample_bundle("abc");
        let m = |m: Metric| value(&b, &m);
        assert_eq!(
            m(Metric::PhaseWall {
                phase: "denoise.step".into()
            }),
            Ok(10.0)
        );
        assert_eq!(m(Metric::RenderWall), Ok(12.0));
        assert_eq!(m(Metric::PeakRss { phase: None }), Ok(1500.0));
        assert_eq!(
            m(Metric::PeakRss {
                phase: Some("load.dit".into())
            }),
            Ok(1000.0)
        );
        assert_eq!(m(Metric::WeightsCached { phase: None }), Ok(5000.0));
        assert_eq!(
            m(Metric::WeightsCached {
                phase: Some("denoise".into())
            }),
            Ok(3000.0)
        );
        assert_eq!(
            m(Metric::GpuBusyShare {
                phase: "denoise".into()
            }),
            Ok(0.8)
        );
        assert!(m(Metric::PhaseWall {
            phase: "vae".into()
        })
        .unwrap_err()
        .contains("vae"));
        assert!(m(Metric::DevicePeak { phase: None })
            .unwrap_err()
            .contains("peak_device_bytes"));
        assert!(m(Metric::UnifiedPeak {
            phase: Some("load.dit".into())
        })
        .is_err());
    }

    /// A GPM window `[s, e]` seconds with the four counters in percent.
    fn window(s: f64, e: f64, pct: [f64; 4]) -> evidence::phase_table::GpmFigure {
        evidence::phase_table::GpmFigure {
            start_ns: (s * 1e9) as i64,
            end_ns: (e * 1e9) as i64,
            tensor_pct: Some(pct[0]),
            sm_pct: Some(pct[1]),
            occupancy_pct: Some(pct[2]),
            dram_pct: Some(pct[3]),
        }
    }

    #[test]
    fn gpm_activity_is_the_median_of_the_windows_inside_the_phase() {
        let mut b = sample_bundle("abc");
        let m = |b: &Bundle, phase: &str, counter| {
            value(
                b,
                &Metric::GpmActivity {
                    phase: phase.into(),
                    counter,
                },
            )
        };
        // No window at all: the reason says GPM is absent, not that the phase is.
        let e = m(&b, "denoise", GpmCounter::Tensor).unwrap_err();
        assert!(e.contains("no GPM window recorded"), "{e}");
        let denoise = b.phase_spans("denoise")[0];
        let (o, c) = (denoise.0 as f64 / 1e9, denoise.1 as f64 / 1e9);
        assert!(c - o > 2.0, "the sample bundle's denoise spans seconds");
        b.gpm = vec![
            // Straddles the open: outside.
            window(o - 0.1, o + 0.1, [99.0, 99.0, 99.0, 99.0]),
            window(o + 0.2, o + 0.4, [60.0, 90.0, 20.0, 10.0]),
            window(o + 0.4, o + 0.6, [50.0, 80.0, 18.0, 14.0]),
            window(o + 0.6, o + 0.8, [70.0, 85.0, 22.0, 12.0]),
            // Inside load.dit only.
            window(1.1, 1.3, [1.0, 1.0, 1.0, 1.0]),
        ];
        let near = |got: Result<f64, String>, want: f64| {
            let g = got.unwrap();
            assert!((g - want).abs() < 1e-12, "{g} != {want}");
        };
        near(m(&b, "denoise", GpmCounter::Tensor), 0.60);
        near(m(&b, "denoise", GpmCounter::Sm), 0.85);
        near(m(&b, "denoise", GpmCounter::SmOccupancy), 0.20);
        near(m(&b, "denoise", GpmCounter::Dram), 0.12);
        // A figure the GPU did not report is not a zero.
        for w in &mut b.gpm {
            w.dram_pct = None;
        }
        let e = m(&b, "denoise", GpmCounter::Dram).unwrap_err();
        assert!(
            e.contains("no GPM window with a dram figure wholly inside denoise"),
            "{e}"
        );
        assert!(m(&b, "vae", GpmCounter::Tensor)
            .unwrap_err()
            .contains("vae"));
    }

    #[test]
    fn peak_rss_is_the_larger_of_the_samples_and_the_engines_own_mark() {
        let mut b = sample_bundle("abc");
        // load.dit: no sample fell inside it (a phase shorter than the cadence),
        // but the engine reported its high-water mark.
        b.phases[0].peak_rss_bytes = None;
        b.phases[0].peak_host_bytes = Some(2600);
        // One step's mark exceeds every sample; the other's is below its sample.
        b.phases[2].peak_host_bytes = Some(1700);
        b.phases[3].peak_host_bytes = Some(1100);
        let m = |b: &Bundle, phase: Option<&str>| {
            value(
                b,
                &Metric::PeakRss {
                    phase: phase.map(str::to_string),
                },
            )
        };
        assert_eq!(m(&b, Some("load.dit")), Ok(2600.0));
        assert_eq!(m(&b, Some("denoise.step")), Ok(1700.0));
        assert_eq!(m(&b, Some("denoise")), Ok(1500.0));
        assert_eq!(m(&b, None), Ok(2600.0));
        b.phases[0].peak_host_bytes = None;
        let e = m(&b, Some("load.dit")).unwrap_err();
        assert!(
            e.contains("peak_rss_bytes") && e.contains("peak_host_bytes"),
            "{e}"
        );
    }
}
