//! The harness as a library: what `harness` (the binary) is built from, exposed so
//! benchmarks and tests can drive the parts directly.
//!
//! * [`sampler`]: the fixed-cadence sampler thread and its readers (procfs, NVML,
//!   page cache).
//! * [`watchdog`]: the memory watchdog (H1) and its positive control.
//! * [`classify`]: why a run ended (the `exit` fragment).
//! * [`completion`]: the pixel completion check on `video.y4m`.
//! * [`weights`]: the run's weights, their digest, synthesis into the cache.
//! * [`units`]: byte quantities as people type them.
//! * [`exit`]: the stable exit codes.

pub mod classify;
pub mod completion;
pub mod exit;
pub mod sampler;
pub mod units;
pub mod watchdog;
pub mod weights;
