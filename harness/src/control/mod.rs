//! `harness control`: the instrument's positive controls.
//!
//! * `gpu-util`: GPU utilization must read high inside the load of the engine's
//!   burn kernel (`engine burn --seconds S`, a known GEMM load announced through
//!   the marker protocol as `burn.setup` then `burn.load`). Without a GPU the
//!   control is `not-applicable` and says why; a burn that never reaches its load
//!   (or fails in it) is an `instrument-error`, which says nothing about the GPU.
//! * `watchdog-floor` (and `watchdog-unified-budget` on unified-memory GPUs): the
//!   watchdog kills an allocating child within two ticks (see [`crate::watchdog`]).
//!
//! The GPU result is kept in the store's cache for this boot and GPU, and every
//! `harness run` records it among the controls it relied on.
//!
//! * [`burn`]: the burn child under a marker channel.
//! * [`util`]: where readings come from (NVML, or a test-only fake).
//! * [`judge`]: the verdict from the readings inside the load.
//! * [`gpu`]: the control itself: start, read at a fixed cadence, stop, judge.

pub mod burn;
pub mod gpu;
pub mod judge;
pub mod util;

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use evidence::store::Store;

use crate::exit;
use crate::sampler::gpu::Gpu;
use crate::watchdog::control::{self as watchdog_control, ControlKind, INSTRUMENT_ERROR};
use crate::watchdog::limits::default_floor;
use util::{FileUtil, UtilSource};

/// The median GPU utilization the burn's load must reach, percent.
///
/// A GEMM loop keeps a kernel resident essentially all the time, and NVML's
/// utilization is the share of time any kernel ran; a healthy reading is 97-100.
/// 90 leaves room for launch gaps between kernels and the sampling window edges
/// while still failing a sensor stuck at 0 or a burn that silently ran on the CPU.
pub const GPU_CONTROL_MIN_UTIL_PCT: f64 = 90.0;
/// Readings in the first part of the load are left out, seconds: NVML averages
/// utilization over a sample period of 1/6 s to 1 s depending on the product, so a
/// reading within a second of `burn.load` opening may still average over the time
/// before it.
pub const GPU_CONTROL_SETTLE_S: f64 = 1.0;
/// How long the burn may take from its start to announcing `burn.load`, seconds.
///
/// Before the load: CUDA context creation (driver initialisation on a machine
/// just started, no persistence daemon: seconds), the kernels' NVRTC compilation
/// and module load, three 128 MiB operands and eight warm-up GEMMs (milliseconds).
/// All of it is seconds to tens of seconds on a cold machine; 60 s is several
/// times that, so a burn still in setup at 60 s is stuck, not slow.
pub const GPU_CONTROL_LOAD_DEADLINE_S: f64 = 60.0;

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

/// The exit code of a set of control verdicts: any `fail` is a negative answer
/// ([`exit::NEGATIVE`]); else any `instrument-error` is the instrument failing
/// to measure ([`exit::INTERNAL`]: nothing is said about the GPU); else
/// [`exit::OK`].
pub fn exit_code(verdicts: &[&str]) -> u8 {
    if verdicts.contains(&"fail") {
        exit::NEGATIVE
    } else if verdicts.contains(&INSTRUMENT_ERROR) {
        exit::INTERNAL
    } else {
        exit::OK
    }
}

/// `harness control`: returns the exit code ([`exit_code`]).
pub fn control(args: &ControlArgs) -> anyhow::Result<u8> {
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
        Ok(g) => (Some(g), None),
        Err(w) => (None, Some(w)),
    };
    let fake = FileUtil::from_env();
    let source: Option<&dyn UtilSource> = match (&fake, &gpu) {
        (Some(f), _) => Some(f),
        (None, Some(g)) => Some(g),
        (None, None) => None,
    };
    let settings = judge::Settings {
        seconds: args.seconds,
        load_deadline_s: args.load_deadline_s,
        settle_s: GPU_CONTROL_SETTLE_S,
        min_util_pct: GPU_CONTROL_MIN_UTIL_PCT,
    };
    let mut results = vec![gpu::gpu_control(&engine, source, why.as_deref(), &settings)];
    // Kept for runs only when measured on the real GPU.
    if let (Some(g), true) = (&gpu, source.is_some_and(|s| s.is_real())) {
        let record = crate::run::gpu_control::record(
            crate::run::facts::boot_id().as_deref(),
            &g.facts()["uuid"],
            &results[0],
        );
        // Through a temporary file and a rename: a run never reads half a result.
        let p = crate::run::gpu_control::result_path(&store);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed control is a negative answer (1) even beside an instrument error;
    /// an instrument error alone is the instrument failing (4), never a GPU fail.
    #[test]
    fn a_fail_outranks_an_instrument_error_which_is_not_a_fail() {
        assert_eq!(exit_code(&["pass", "not-applicable"]), exit::OK);
        assert_eq!(exit_code(&[INSTRUMENT_ERROR, "pass"]), exit::INTERNAL);
        assert_eq!(exit_code(&[INSTRUMENT_ERROR, "fail"]), exit::NEGATIVE);
    }
}
