//! Directories for the tests: under the build directory (never /tmp, which the
//! store's durability gate refuses), one per name, emptied first. The tests of one
//! binary share a process, so every caller passes a name no other test uses (by
//! convention its module's name first: `faults-full-disk`).

use std::path::PathBuf;

use evidence::store::Store;

/// `CARGO_TARGET_TMPDIR/it/<name>`, removed if it exists and not created (for a
/// directory the command under test must create, such as a store).
pub fn vacant_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("it")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `CARGO_TARGET_TMPDIR/it/<name>`, fresh and empty.
pub fn fresh_dir(name: &str) -> PathBuf {
    let d = vacant_dir(name);
    std::fs::create_dir_all(&d).expect("create a test directory");
    d
}

/// A fresh store at [`vacant_dir`]`(name)`, opened past its durability gate.
pub fn fresh_store(name: &str) -> Store {
    Store::resolve(Some(&vacant_dir(name))).expect("open a test store")
}
