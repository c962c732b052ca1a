//! What the harness's tests, benchmarks and examples share (the `test-kit`
//! feature, which this crate's own dev-dependency turns on; unit tests get it too):
//!
//! * [`journal`]: a synthetic run's journal, written through the evidence crate
//!   (the evidence crate's test kit, `evidence::test_kit::journal`).
//! * [`levers`]: lever specs built ([`levers::SpecToml`]), not written out.
//! * [`ranked`]: renders with planted lever effects, sealed (rank's tests and the
//!   rank benchmark).
//! * [`scratch`]: a fresh directory for a unit test (`evidence::test_kit::scratch`).

pub mod levers;
pub mod ranked;

pub use evidence::test_kit::{journal, scratch};
