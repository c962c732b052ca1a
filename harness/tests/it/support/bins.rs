//! The binaries under test and how the tests run them: this package's `harness`
//! and `test-engine`, and the workspace's real `engine` (built next to `harness`;
//! `cargo test --workspace` builds every binary before any test runs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `harness` binary under test.
pub const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
/// The scriptable protocol-speaking test engine (`harness/src/bin/test-engine.rs`).
pub const TEST_ENGINE: &str = env!("CARGO_BIN_EXE_test-engine");

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

/// The workspace root (rung files, specs and reports are named relative to it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness crate lives in the workspace")
        .to_path_buf()
}

/// The `harness` binary with no store in its environment.
pub fn harness() -> Command {
    let mut c = Command::new(HARNESS);
    c.env_remove("HARNESS_STORE");
    c
}

/// Run a command: (exit code, or -1 when killed by a signal; stdout; stderr).
pub fn run(c: &mut Command) -> (i32, String, String) {
    let out = c.output().expect("run the command");
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// Bytes as text, lossily.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
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

/// The test Python (`just test` sets it to target/pyenv/bin/python).
pub fn python() -> String {
    std::env::var("HARNESS_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "HARNESS_TEST_PYTHON is not set. This test needs the third-party readers of \
             scripts/pyenv.sh: run `just test`, or `./scripts/pyenv.sh` and then \
             `HARNESS_TEST_PYTHON=$PWD/target/pyenv/bin/python cargo test -p harness --test it surfaces::`"
        )
    })
}
