//! The GPU control a run records: `harness control` burns the GPU and stores its
//! verdict per boot and GPU; a run takes that stored verdict rather than burning
//! before every render (see `crate::control`).

use std::path::PathBuf;

use evidence::store::Store;

use crate::control::watchdog::ControlResult;
use crate::run::facts;
use crate::sampler::gpu::Gpu;

/// Where the GPU control's last result lives: `harness control` writes it (with
/// the boot id and the GPU's uuid), every run reads it.
pub fn result_path(store: &Store) -> PathBuf {
    store.cache_dir().join("controls").join("gpu-util.json")
}

/// The record `harness control` keeps for runs: the boot and GPU it was measured
/// on, and the result (verdict, detail and figures).
pub fn record(
    boot_id: Option<&str>,
    uuid: &serde_json::Value,
    r: &ControlResult,
) -> serde_json::Value {
    serde_json::json!({
        "boot_id": boot_id,
        "uuid": uuid,
        "verdict": r.verdict,
        "detail": r.detail,
        "figures": r.figures,
    })
}

/// The GPU control a run relies on: the last `harness control` result for this
/// boot and this GPU, or `not-applicable` saying why there is none.
pub fn for_run(store: &Store, gpu: Option<&Gpu>, why_none: Option<&str>) -> ControlResult {
    let Some(gpu) = gpu else {
        return ControlResult::new(
            "gpu-util",
            "not-applicable",
            format!("no GPU: {}", why_none.unwrap_or("NVML found none")),
        );
    };
    let stored: Option<serde_json::Value> = std::fs::read(result_path(store))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    from_record(
        stored.as_ref(),
        facts::boot_id().as_deref(),
        &serde_json::json!(gpu.uuid()),
    )
}

/// The run's `gpu-util` control from a stored record: its verdict, detail and
/// figures when it was measured this boot (`boot_id`) on this GPU (`uuid`), else
/// `not-applicable`. A record without a readable verdict counts as `fail`.
pub fn from_record(
    stored: Option<&serde_json::Value>,
    boot_id: Option<&str>,
    uuid: &serde_json::Value,
) -> ControlResult {
    match stored {
        Some(v) if v["boot_id"] == serde_json::json!(boot_id) && &v["uuid"] == uuid => {
            ControlResult {
                name: "gpu-util".into(),
                verdict: v["verdict"].as_str().unwrap_or("fail").into(),
                detail: format!(
                    "from `harness control` this boot: {}",
                    v["detail"].as_str().unwrap_or("")
                ),
                figures: v["figures"].as_object().cloned().unwrap_or_default(),
            }
        }
        _ => ControlResult::new(
            "gpu-util",
            "not-applicable",
            "not run on this GPU since boot: run `harness control` to establish it".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run records carries the control's figures (exit status, TFLOP/s,
    /// time to load, readings, cadence) and its verdict, instrument errors included.
    /// Mutation: drop `figures` from `record` and the first assertion turns red.
    #[test]
    fn a_run_records_the_stored_verdict_and_figures_of_this_boot_and_gpu() {
        let mut r = ControlResult::new("gpu-util", "instrument-error", "did not reach load".into());
        r.figures.insert("to_load_s".into(), 61.0.into());
        r.figures.insert("burn_exit".into(), "killed".into());
        let uuid = serde_json::json!("GPU-1");
        let rec = record(Some("boot-a"), &uuid, &r);
        let got = from_record(Some(&rec), Some("boot-a"), &uuid);
        assert_eq!(got.figures, r.figures);
        assert_eq!(got.verdict, "instrument-error");
        assert!(got.detail.ends_with("did not reach load"), "{}", got.detail);
        // Another boot or another GPU: not established.
        for (boot, id) in [("boot-b", "GPU-1"), ("boot-a", "GPU-2")] {
            let na = from_record(Some(&rec), Some(boot), &serde_json::json!(id));
            assert_eq!(na.verdict, "not-applicable");
            assert!(na.figures.is_empty());
        }
        assert_eq!(
            from_record(None, Some("boot-a"), &uuid).verdict,
            "not-applicable"
        );
    }
}
