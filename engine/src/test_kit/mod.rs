//! The engine's test kit, behind the `test-kit` feature (on for this crate's
//! tests, examples and benchmarks through its own dev-dependency): what more
//! than one test target shares, in one place instead of `#[path]` includes.
//! - [`golden_case`]: the golden cases' seeded tiny weights and inputs.

pub mod golden_case;
