//! `harness control`: the instrument's positive controls.
//!
//! * `gpu-util`: GPU utilization must read high while the engine's burn kernel
//!   (`engine burn --seconds S`, a known GEMM load) runs. Without a GPU the control
//!   is `not-applicable` and says why.
//! * `watchdog-floor` (and `watchdog-unified-budget` on unified-memory GPUs): the
//!   watchdog kills an allocating child within two ticks (see [`crate::watchdog`]).
//!
//! The GPU result is kept in the store's cache for this boot and GPU, and every
//! `harness run` records it among the controls it relied on.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use evidence::error::StoreError;
use evidence::store::Store;

use crate::exit::{self, Refusal};
use crate::sampler::gpu::Gpu;
use crate::watchdog::control::{self as watchdog_control, ControlKind, ControlResult};
use crate::watchdog::limits::default_floor;

/// The median GPU utilization the burn must reach, percent.
///
/// A GEMM loop keeps a kernel resident essentially all the time, and NVML's
/// utilization is the share of time any kernel ran; a healthy reading is 97-100.
/// 90 leaves room for launch gaps between kernels and the sampling window edges
/// while still failing a sensor stuck at 0 or a burn that silently ran on the CPU.
pub const GPU_CONTROL_MIN_UTIL_PCT: f64 = 90.0;
/// Readings in the first part of the burn are ignored (context creation, first
/// compilation), seconds.
pub const GPU_CONTROL_WARMUP_S: f64 = 1.0;

/// Run the instrument's positive controls.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The evidence store (where the GPU control's result is kept for runs).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// The engine binary providing `burn` (default: `engine` next to the harness).
    #[arg(long, value_name = "PATH")]
    pub engine: Option<PathBuf>,
    /// How long the burn runs, seconds.
    #[arg(long, value_name = "S", default_value_t = 6.0)]
    pub seconds: f64,
    /// Watchdog control cadence, milliseconds.
    #[arg(long, value_name = "N", default_value_t = crate::sampler::DEFAULT_CADENCE_MS)]
    pub cadence_ms: u64,
}

/// The GPU control: burn and read utilization.
pub fn gpu_control(
    engine: &Path,
    gpu: Option<&Gpu>,
    why_none: Option<&str>,
    seconds: f64,
) -> ControlResult {
    let name = "gpu-util".to_string();
    let Some(gpu) = gpu else {
        return ControlResult {
            name,
            verdict: "not-applicable".into(),
            detail: format!("no GPU: {}", why_none.unwrap_or("NVML found none")),
        };
    };
    let fail = |detail: String| ControlResult {
        name: "gpu-util".into(),
        verdict: "fail".into(),
        detail,
    };
    let idle = gpu.utilization_pct().ok();
    let mut child = match Command::new(engine)
        .args(["burn", "--seconds", &seconds.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start {} burn: {e}", engine.display())),
    };
    let start = Instant::now();
    let mut readings = Vec::new();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(_) => break None,
        }
        if start.elapsed().as_secs_f64() > seconds + 30.0 {
            let _ = child.kill();
            break child.wait().ok();
        }
        if start.elapsed().as_secs_f64() >= GPU_CONTROL_WARMUP_S {
            if let Ok(u) = gpu.utilization_pct() {
                readings.push(u as f64);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.is_some_and(|s| s.success()) {
        return fail(format!("`engine burn` ended with {status:?}"));
    }
    if readings.is_empty() {
        return fail("no utilization reading during the burn".into());
    }
    readings.sort_by(f64::total_cmp);
    let median = readings[readings.len() / 2];
    let detail = format!(
        "median utilization {median:.0}% over {} readings during a {seconds} s burn (idle before: {}; need >= {GPU_CONTROL_MIN_UTIL_PCT}%)",
        readings.len(),
        idle.map(|u| format!("{u}%")).unwrap_or_else(|| "unreadable".into())
    );
    if median >= GPU_CONTROL_MIN_UTIL_PCT {
        ControlResult {
            name,
            verdict: "pass".into(),
            detail,
        }
    } else {
        fail(detail)
    }
}

/// `harness control`: returns the exit code (0 all pass or not-applicable, 1 any failed).
pub fn control(args: &ControlArgs) -> anyhow::Result<u8> {
    if !(args.seconds.is_finite() && args.seconds > GPU_CONTROL_WARMUP_S) {
        return Err(exit::UsageError(format!(
            "--seconds {}: expected more than the {GPU_CONTROL_WARMUP_S} s warm-up",
            args.seconds
        ))
        .into());
    }
    let store = Store::resolve(args.store.as_deref()).map_err(|e| match e {
        StoreError::Volatile { .. } => anyhow::Error::from(Refusal {
            gate: "store-durable".into(),
            why: e.to_string(),
        }),
        other => anyhow::Error::from(other).context("opening the store"),
    })?;
    let engine = args
        .engine
        .clone()
        .unwrap_or_else(crate::run::args::default_engine);
    let (gpu, why) = match Gpu::open(0) {
        Ok(g) => (Some(g), None),
        Err(w) => (None, Some(w)),
    };
    let mut results = vec![gpu_control(
        &engine,
        gpu.as_ref(),
        why.as_deref(),
        args.seconds,
    )];
    if let Some(g) = &gpu {
        let record = serde_json::json!({
            "boot_id": crate::run::facts::boot_id(),
            "uuid": g.facts()["uuid"],
            "verdict": results[0].verdict,
            "detail": results[0].detail,
        });
        let p = crate::run::gpu_control::result_path(&store);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&p, serde_json::to_vec_pretty(&record)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let me = std::env::current_exe().context("locating the harness binary")?;
    let mem_total = crate::sampler::system::mem_total_bytes().map_err(anyhow::Error::msg)?;
    let floor = default_floor(mem_total);
    results.push(watchdog_control::control(
        &me,
        ControlKind::Floor,
        args.cadence_ms,
        floor,
    ));
    if gpu.as_ref().is_some_and(|g| g.unified_memory()) {
        results.push(watchdog_control::control(
            &me,
            ControlKind::UnifiedBudget,
            args.cadence_ms,
            floor,
        ));
    }
    for r in &results {
        println!("{:<26} {:<15} {}", r.name, r.verdict, r.detail);
    }
    Ok(if results.iter().any(|r| r.verdict == "fail") {
        exit::NEGATIVE
    } else {
        exit::OK
    })
}
