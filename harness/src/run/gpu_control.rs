//! The GPU control a run records: `harness control` burns the GPU and stores its
//! verdict per boot and GPU; a run takes that stored verdict rather than burning
//! before every render (see `crate::control`).

use std::path::PathBuf;

use evidence::store::Store;

use crate::run::facts;
use crate::sampler::gpu::Gpu;
use crate::watchdog::control::ControlResult;

/// Where the GPU control's last result lives: `harness control` writes it (with
/// the boot id and the GPU's uuid), every run reads it.
pub fn result_path(store: &Store) -> PathBuf {
    store.cache_dir().join("controls").join("gpu-util.json")
}

/// The GPU control a run relies on: the last `harness control` result for this
/// boot and this GPU, or `not-applicable` saying why there is none.
pub fn for_run(store: &Store, gpu: Option<&Gpu>, why_none: Option<&str>) -> ControlResult {
    let na = |detail: String| ControlResult {
        name: "gpu-util".into(),
        verdict: "not-applicable".into(),
        detail,
    };
    let Some(gpu) = gpu else {
        return na(format!("no GPU: {}", why_none.unwrap_or("NVML found none")));
    };
    let uuid = gpu.facts()["uuid"].clone();
    let boot = facts::boot_id();
    let stored: Option<serde_json::Value> = std::fs::read(result_path(store))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    match stored {
        Some(v) if v["boot_id"] == serde_json::json!(boot) && v["uuid"] == uuid => ControlResult {
            name: "gpu-util".into(),
            verdict: v["verdict"].as_str().unwrap_or("fail").into(),
            detail: format!(
                "from `harness control` this boot: {}",
                v["detail"].as_str().unwrap_or("")
            ),
        },
        _ => na("not run on this GPU since boot: run `harness control` to establish it".into()),
    }
}
