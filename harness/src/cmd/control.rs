//! `harness control`: the instrument's positive controls ([`crate::control`]): the
//! GPU utilization inside the engine's burn, and the watchdog killing a probe.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use evidence::store::Store;

use crate::control::gpm::{FileGpm, GpmInput};
use crate::control::util::{FileUtil, UtilSource};
use crate::control::watchdog::{self as watchdog_control, ControlKind};
use crate::control::{
    exit_code, gpu, judge, GPU_CONTROL_LOAD_DEADLINE_S, GPU_CONTROL_MIN_UTIL_PCT,
    GPU_CONTROL_SETTLE_S,
};
use crate::exit;
use crate::sampler::gpm::NvmlGpm;
use crate::sampler::gpu::Gpu;
use crate::sampler::limits::default_floor;

/// Run the instrument's positive controls.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The evidence store (where the GPU control's result is kept for runs).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// The engine binary providing `burn` (default: `engine` next to the harness).
    #[arg(long, value_name = "PATH")]
    pub engine: Option<PathBuf>,
    /// How long the burn's load runs, seconds.
    #[arg(long, value_name = "S", default_value_t = 6.0)]
    pub seconds: f64,
    /// How long the burn may take to announce its load, seconds.
    #[arg(long, value_name = "S", default_value_t = GPU_CONTROL_LOAD_DEADLINE_S)]
    pub load_deadline_s: f64,
    /// Watchdog control cadence, milliseconds.
    #[arg(long, value_name = "N", default_value_t = crate::sampler::DEFAULT_CADENCE_MS)]
    pub cadence_ms: u64,
    /// Print one JSON document (`{"controls": [...], "exit": N}`) on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `harness control`: returns the exit code ([`exit_code`]).
pub fn run(args: &ControlArgs) -> anyhow::Result<u8> {
    if !(args.seconds.is_finite() && args.seconds > GPU_CONTROL_SETTLE_S) {
        return Err(exit::UsageError(format!(
            "--seconds {}: expected more than the {GPU_CONTROL_SETTLE_S} s settling margin",
            args.seconds
        ))
        .into());
    }
    if !(args.load_deadline_s.is_finite() && args.load_deadline_s > 0.0) {
        return Err(exit::UsageError(format!(
            "--load-deadline-s {}: expected seconds above 0",
            args.load_deadline_s
        ))
        .into());
    }
    // A volatile store is refused (3); a URL or no location is a usage error (2).
    let store = Store::resolve(args.store.as_deref())
        .map_err(crate::remote::store_error)
        .context("opening the store")?;
    let engine = args
        .engine
        .clone()
        .unwrap_or_else(crate::cmd::run::default_engine);
    let (gpu, why) = match Gpu::open(0) {
        Ok(g) => (Some(std::sync::Arc::new(g)), None),
        Err(w) => (None, Some(w)),
    };
    let fake = FileUtil::from_env();
    let source: Option<&dyn UtilSource> = match (&fake, &gpu) {
        (Some(f), _) => Some(f),
        (None, Some(g)) => Some(g.as_ref()),
        (None, None) => None,
    };
    // GPM beside the utilization: the fake with the fake, NVML on the real GPU.
    let gpm = match (FileGpm::from_env(), &fake, &gpu) {
        (Some(f), _, _) => GpmInput::Source(Box::new(f)),
        (None, Some(_), _) => {
            GpmInput::NotApplicable("a fake utilization source and no fake GPM".into())
        }
        (None, None, Some(g)) => match NvmlGpm::open(g.clone()) {
            Ok(src) => GpmInput::Source(Box::new(src)),
            Err(why) => GpmInput::Unreadable(why),
        },
        (None, None, None) => {
            GpmInput::NotApplicable(why.clone().unwrap_or_else(|| "no GPU".into()))
        }
    };
    let settings = judge::Settings {
        seconds: args.seconds,
        load_deadline_s: args.load_deadline_s,
        settle_s: GPU_CONTROL_SETTLE_S,
        min_util_pct: GPU_CONTROL_MIN_UTIL_PCT,
    };
    let (util, gpm) = gpu::gpu_controls(&engine, source, why.as_deref(), gpm, &settings);
    let mut results = vec![util, gpm];
    // Kept for runs only when measured on the real GPU.
    if let (Some(g), true) = (&gpu, source.is_some_and(|s| s.is_real())) {
        let record = crate::control::recorded::record(
            crate::run::facts::boot_id().as_deref(),
            &serde_json::json!(g.uuid()),
            &results[0],
        );
        // Through a temporary file and a rename: a run never reads half a result.
        let p = crate::control::recorded::result_path(&store);
        crate::formats::write_file(&p, &serde_json::to_vec_pretty(&record)?)?;
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
    let code = exit_code(
        &results
            .iter()
            .map(|r| r.verdict.as_str())
            .collect::<Vec<_>>(),
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"controls": results, "exit": code}))?
        );
    } else {
        for r in &results {
            println!("{:<26} {:<16} {}", r.name, r.verdict, r.detail);
        }
    }
    Ok(code)
}
