//! What the harness's tests, benchmarks and examples share (the `test-kit`
//! feature, which this crate's own dev-dependency turns on; unit tests get it too):
//!
//! * [`journal`]: a synthetic run's journal, written through the evidence crate.
//! * [`ranked`]: renders with planted lever effects, sealed (rank's tests and the
//!   rank benchmark).
//! * [`scratch`]: a fresh directory for a unit test.

use std::path::PathBuf;

pub mod journal;
pub mod ranked;

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
