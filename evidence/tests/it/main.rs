//! The evidence crate's end-to-end tests, one binary: each module was its own
//! test file and keeps its test names (`cargo test -p evidence --test it NAME`).
//!
//! * [`bundle`]: seal, verify, determinism, truncation recovery, byte flips,
//!   concurrency, recover, on recorded journals.
//! * [`durability`]: the journal's flush and fdatasync cadence, seen from outside.
//! * [`fuzz`]: property fuzzing of the journal, marker, manifest and rung parsers.
//! * [`layout`]: no two modules of `evidence/src` depend on each other, and none
//!   names a manifest fragment's key by string.
//! * [`pyarrow`]: pyarrow reads every table of a sealed bundle.
//!
//! The seeded run generator and per-test directories they share are the test
//! kit's (`evidence::test_kit::run`, the `test-kit` feature; the seal benchmark
//! uses it too).

mod bundle;
mod durability;
mod fuzz;
mod layout;
mod pyarrow;
