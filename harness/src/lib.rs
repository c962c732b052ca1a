//! The harness as a library: what `harness` (the binary) is built from, exposed so
//! benchmarks and tests can drive the parts directly.
//!
//! * [`completion`]: the pixel completion check on `video.y4m`.
//! * [`units`]: byte quantities as people type them.
//! * [`exit`]: the stable exit codes.

pub mod completion;
pub mod exit;
pub mod units;
