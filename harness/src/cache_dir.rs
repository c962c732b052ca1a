//! Where the harness keeps what only saves time, outside every store: the ids
//! of bundles that verified (per store), checked manifests and files of remote
//! bundles by id and sha256. `$HARNESS_VERIFY_CACHE`, else
//! `$XDG_CACHE_HOME/ltx-harness`, else `~/.cache/ltx-harness`;
//! `HARNESS_VERIFY_CACHE=off` keeps nothing (everything is verified every time).
//! Outside the store, so that a writer of a store cannot vouch for its own bundles.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// The cache directory, or `None` when caching is off or no directory can be named.
pub fn cache_base() -> Option<PathBuf> {
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
