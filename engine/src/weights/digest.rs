//! The weights digest (the manifest's `weights.digest`), as `evidence::weights_digest`
//! defines it for both crates: this module walks a weights directory, hashes its
//! files in parallel and writes the `DIGEST` file durably.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use evidence::weights_digest;
use rayon::prelude::*;

pub use evidence::weights_digest::DIGEST_FILE;

/// A digest could not be computed or written.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {source}")]
pub struct DigestError {
    /// The file or directory involved.
    pub file: PathBuf,
    /// The I/O error.
    pub source: std::io::Error,
}

/// One file of a weights directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// Path relative to the directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Lowercase hex sha256 of the contents.
    pub sha256: String,
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex sha256 of the file at `path`, streamed in 1 MiB reads.
pub fn sha256_file(path: &Path) -> Result<String, DigestError> {
    weights_digest::sha256_file(path).map_err(|source| DigestError {
        file: path.to_path_buf(),
        source,
    })
}

/// The digest of a list of files (any order): `sha256:<hex>` per the module docs.
pub fn digest_of(files: &[FileDigest]) -> String {
    weights_digest::digest_of(files.iter().map(|f| (f.path.as_str(), f.sha256.as_str())))
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DigestError> {
    let err = |source| DigestError {
        file: dir.to_path_buf(),
        source,
    };
    for e in std::fs::read_dir(dir).map_err(err)? {
        let e = e.map_err(err)?;
        let ty = e.file_type().map_err(err)?;
        let p = e.path();
        if ty.is_dir() {
            walk(root, &p, out)?;
        } else if ty.is_file() && !(dir == root && e.file_name() == DIGEST_FILE) {
            out.push(p);
        }
    }
    Ok(())
}

/// Every file under `dir` (except `DIGEST`) hashed in parallel, sorted by path.
pub fn hash_dir(dir: &Path) -> Result<Vec<FileDigest>, DigestError> {
    let mut paths = Vec::new();
    walk(dir, dir, &mut paths)?;
    let mut files = paths
        .par_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(dir)
                .unwrap_or(p)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let bytes = std::fs::metadata(p)
                .map_err(|source| DigestError {
                    file: p.clone(),
                    source,
                })?
                .len();
            Ok(FileDigest {
                path: rel,
                bytes,
                sha256: sha256_file(p)?,
            })
        })
        .collect::<Result<Vec<_>, DigestError>>()?;
    files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    Ok(files)
}

/// Write `DIR/DIGEST` (`digest` + newline) durably: a temporary file, fsync,
/// rename, fsync of the directory.
pub fn write_digest_file(dir: &Path, digest: &str) -> Result<(), DigestError> {
    let tmp = dir.join(".DIGEST.tmp");
    let fin = dir.join(DIGEST_FILE);
    let err = |file: &Path| {
        let file = file.to_path_buf();
        move |source| DigestError { file, source }
    };
    let mut f = File::create(&tmp).map_err(err(&tmp))?;
    f.write_all(format!("{digest}\n").as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(err(&tmp))?;
    std::fs::rename(&tmp, &fin).map_err(err(&fin))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(dir))?;
    Ok(())
}

/// The digest recorded in `DIR/DIGEST`, if the file exists and holds one.
pub fn read_digest_file(dir: &Path) -> Option<String> {
    weights_digest::parse_digest(&std::fs::read_to_string(dir.join(DIGEST_FILE)).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_digest_skips_digest_file_and_sees_content_changes() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/digest");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a.txt"), b"abc").unwrap();
        std::fs::write(d.join("sub/b.bin"), b"xyz").unwrap();
        let files = hash_dir(&d).unwrap();
        assert_eq!(
            files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            ["a.txt", "sub/b.bin"]
        );
        // sha256("abc"), the FIPS 180-2 test vector.
        assert_eq!(
            files[0].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dg = digest_of(&files);
        write_digest_file(&d, &dg).unwrap();
        assert_eq!(read_digest_file(&d).unwrap(), dg);
        assert_eq!(
            digest_of(&hash_dir(&d).unwrap()),
            dg,
            "DIGEST must not count"
        );
        std::fs::write(d.join("sub/b.bin"), b"xyZ").unwrap();
        assert_ne!(digest_of(&hash_dir(&d).unwrap()), dg);
    }
}
