//! What the tests, benchmarks and examples of both the evidence crate and the
//! harness share (the `test-kit` feature; each crate's own dev-dependency turns
//! it on):
//!
//! * [`journal`]: a journal written record by record through this crate, sealed
//!   into a store ([`journal::SynthJournal`]).
//! * [`run`]: a seeded generator of realistic runs (fragments, samples,
//!   markers, output, frames in time order) and the seal benchmark's shapes.
//! * [`scratch`]: a fresh directory for one test.

use std::path::PathBuf;

pub mod journal;
pub mod run;

/// A fresh, empty directory `target/test-scratch/<name>-<pid>` of the workspace
/// (never under /tmp, which the store's durability gate refuses); the pid keeps
/// two test processes apart.
pub fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-scratch")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}
