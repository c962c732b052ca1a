//! Helpers for end-to-end tests that drive the workspace's real `engine` binary
//! (built next to `harness`; `cargo test --workspace` builds every binary before
//! any test runs).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

/// The `harness` binary under test.
pub const HARNESS: &str = env!("CARGO_BIN_EXE_harness");

/// The real engine next to the harness binary; panics with the command that builds it.
pub fn engine() -> PathBuf {
    let e = Path::new(HARNESS)
        .parent()
        .expect("harness binary has a directory")
        .join("engine");
    assert!(
        e.is_file(),
        "{} is missing: build it with `cargo build -p engine --bins` \
         (cargo test --workspace does this)",
        e.display()
    );
    e
}

/// The workspace root (rung files are named relative to it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness crate lives in the workspace")
        .to_path_buf()
}

/// Bytes as text, lossily.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh directory under `CARGO_TARGET_TMPDIR` (never /tmp), emptied first.
pub fn fresh_dir(name: &str) -> PathBuf {
    let d =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The sealed bundle's directory, from the `path:` line a run prints on stdout.
pub fn bundle_path(out: &Output) -> PathBuf {
    let so = text(&out.stdout);
    let p = so
        .lines()
        .find_map(|l| l.strip_prefix("path: "))
        .unwrap_or_else(|| {
            panic!(
                "no bundle path in stdout:\n{so}\nstderr:\n{}",
                text(&out.stderr)
            )
        });
    PathBuf::from(p.trim())
}

/// The entry `name` of a manifest's `gates` list; panics naming the gates present.
pub fn gate(manifest: &serde_json::Value, name: &str) -> serde_json::Value {
    manifest["gates"]
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no '{name}' gate in {}", manifest["gates"]))
}
