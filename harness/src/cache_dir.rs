//! Where the harness keeps what only saves time, outside every store: the ids
//! of bundles that verified (per store), checked manifests and files of remote
//! bundles by id and sha256. `$HARNESS_VERIFY_CACHE`, else
//! `$XDG_CACHE_HOME/ltx-harness`, else `~/.cache/ltx-harness`;
//! `HARNESS_VERIFY_CACHE=off` keeps nothing (everything is verified every time).
//! Outside the store, so that a writer of a store cannot vouch for its own bundles.
//!
//! A cache entry says "verified": whoever can write the directory can vouch
//! for a tampered bundle. So the directory is used only when it is this
//! user's own ([`check_private`]): owned by the effective user, a real
//! directory (not a link), writable by no group and no other user, and not on
//! volatile storage (`/tmp`, tmpfs: shared scratch, where names are guessed).
//! Otherwise no cache is used (everything is verified every time) and one
//! line on stderr says why. `rank`, `report` and a campaign's resume never
//! consult it at all (`bundle::verified`).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The cache directory, or `None` when caching is off, no directory can be
/// named, or the one named is not this user's own ([`check_private`]).
pub fn cache_base() -> Option<PathBuf> {
    let base = named_base()?;
    match check_private(&base) {
        Ok(()) => Some(base),
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "harness: verify cache {} not used: {why}; every bundle is verified in full",
                    base.display()
                )
            });
            None
        }
    }
}

/// Whether `dir` (when it exists; else its nearest existing ancestor's
/// storage) may hold what vouches for bundles: `Err` says why not.
pub fn check_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    evidence::store::check_durable(dir).map_err(|e| e.to_string())?;
    let md = match std::fs::symlink_metadata(dir) {
        Ok(md) => md,
        // Not made yet: it will be created 0700 by this user.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    if !md.is_dir() {
        return Err("not a directory (a link or a file)".into());
    }
    // SAFETY: geteuid has no failure mode and touches no memory.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(format!(
            "owned by uid {}, not by this user ({me})",
            md.uid()
        ));
    }
    let mode = md.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(format!(
            "writable by its group or by others (mode {:o}); `chmod go-w` it",
            mode & 0o7777
        ));
    }
    Ok(())
}

/// Create the cache directory `dir` (and its parents) private to this user.
pub fn create_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The cache directory the environment names.
fn named_base() -> Option<PathBuf> {
    Some(match std::env::var_os("HARNESS_VERIFY_CACHE") {
        Some(v) if v == "off" => return None,
        Some(v) => PathBuf::from(v),
        None => match std::env::var_os("XDG_CACHE_HOME") {
            Some(x) if !x.is_empty() => PathBuf::from(x).join("ltx-harness"),
            _ => PathBuf::from(std::env::var_os("HOME")?)
                .join(".cache")
                .join("ltx-harness"),
        },
    })
}

/// The first 16 hex digits of the sha256 of `bytes` (cache file names).
pub fn hex16(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}
