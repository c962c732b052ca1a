//! What the end-to-end tests share, each module one kind of help:
//!
//! * [`bins`]: the binaries under test (`harness`, the test engine, the real
//!   engine) and running them; reading what a run printed.
//! * [`browser`]: headless Chromium for the report's page test.
//! * [`dirs`]: fresh directories and stores under the build directory.
//! * [`journal`]: a synthetic run's journal, written through the evidence crate.
//! * [`ranked`]: renders with planted lever effects, sealed (rank's tests and the
//!   rank benchmark).
//! * [`render`]: one render-shaped bundle with ticks, steps and an unavailable
//!   sensor, sealed (the surfaces tests).
//! * [`s3`]: a real S3-protocol server (s3s-fs, `scripts/s3-server.sh`) on
//!   the loopback interface, and `harness` pointed at one of its buckets.
//! * [`slurm`]: a real one-node Slurm (`scripts/slurm-cluster.sh`) on loopback,
//!   its tasks listed and waited for.

pub mod bins;
pub mod browser;
pub mod dirs;
pub use harness::test_kit::{journal, ranked};
pub mod render;
pub mod s3;
pub mod slurm;
