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

pub mod bins;
pub mod browser;
pub mod dirs;
pub mod journal;
pub mod ranked;
pub mod render;
