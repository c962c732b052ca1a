//! A bundle's files by name: the one place where a command's read of a bundle
//! file happens. Every bundle read is a directory on disk that was verified
//! whole before any read ([`crate::verification::local`]; a bucket's bundles are
//! fetched into the local store first, `crate::remote::fetch`). The polars scan
//! opens its files itself, by the paths [`scan_path`] gives.

use std::path::{Path, PathBuf};

use crate::bundle::error::FileError;
use evidence::error::BundleError;

/// The bytes of file `name` (`manifest.json`, `phases.parquet`, ...) of the bundle
/// at `dir`.
pub fn read(dir: &Path, name: &str) -> Result<Vec<u8>, FileError> {
    let file = dir.join(name);
    std::fs::read(&file).map_err(|source| FileError { file, source })
}

/// The text of file `name` of the bundle at `dir` (an error unless UTF-8).
pub fn read_text(dir: &Path, name: &str) -> Result<String, FileError> {
    let bytes = read(dir, name)?;
    String::from_utf8(bytes).map_err(|e| FileError {
        file: dir.join(name),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

/// The path of file `name` of the bundle at `dir`, for a reader that opens the
/// file itself (the polars scan in [`crate::bundle::scan`]).
pub fn scan_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// The bundle directories under a store root (`<root>/bundles/*` holding a
/// `manifest.json`), sorted by name. Listed without the store's durability gate:
/// reading needs none.
pub fn store_bundle_dirs(root: &Path) -> Result<Vec<PathBuf>, BundleError> {
    let dir = root.join("bundles");
    let rd = std::fs::read_dir(&dir).map_err(|source| BundleError::Io {
        file: dir.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| BundleError::Io {
            file: dir.clone(),
            source,
        })?;
        let p = e.path();
        if p.join("manifest.json").is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}
