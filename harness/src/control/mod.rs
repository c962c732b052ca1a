//! The instrument's positive controls, all of them here: what `harness control`
//! ([`crate::cmd::control`]) runs, and the result a run records.
//!
//! * `gpu-util`: GPU utilization must read high inside the load of the engine's
//!   burn kernel (`engine burn --seconds S`, a known GEMM load announced through
//!   the marker protocol as `burn.setup` then `burn.load`). Without a GPU the
//!   control is `not-applicable` and says why; a burn that never reaches its load
//!   (or fails in it) is an `instrument-error`, which says nothing about the GPU.
//! * `gpu-gpm`: inside the same load, NVML's GPM must read the tensor pipes and
//!   the SMs busy (see [`gpm`]); unreadable GPM is an `instrument-error`.
//! * `watchdog-floor` (and `watchdog-unified-budget` on unified-memory GPUs): the
//!   watchdog kills an allocating child within two ticks (see [`watchdog`]).
//!
//! The GPU result is kept in the store's cache for this boot and GPU, and every
//! `harness run` records it among the controls it relied on.
//!
//! * [`burn`]: the burn child under a marker channel.
//! * [`util`]: where readings come from (NVML, or a test-only fake).
//! * [`judge`]: the verdict from the readings inside the load.
//! * [`gpu`]: the control itself: start, read at a fixed cadence, stop, judge.
//! * [`recorded`]: the GPU control's result as kept for runs, and read by them.
//! * [`watchdog`]: the watchdog's control (a probe killed at its limit).

pub mod burn;
pub mod gpm;
pub mod gpu;
pub mod judge;
pub mod recorded;
pub mod util;
pub mod watchdog;

use crate::control::watchdog::INSTRUMENT_ERROR;
use crate::exit;

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
