//! What the harness's tests, benchmarks and examples share (the `test-kit`
//! feature, which this crate's own dev-dependency turns on; unit tests get it too):
//!
//! * [`journal`]: a synthetic run's journal, written through the evidence crate.
//! * [`ranked`]: renders with planted lever effects, sealed (rank's tests and the
//!   rank benchmark).

pub mod journal;
pub mod ranked;
