//! A bundle already at a bucket, as `harness sync` finds it at its
//! destination: [`check`] hashes every object against the manifest (streamed,
//! bounded memory), and [`repair`] makes a copy that fails whole from a
//! verified local bundle of the same id.
//!
//! Keys are content-addressed (`bundles/<id>/<file>`, the id the sha256 of a
//! manifest listing every file's sha256), so for each key exactly one content
//! is right: a repair overwrites only objects that are wrong or missing,
//! removes objects the manifest does not list, and writes `manifest.json`
//! last. Until it is done the copy fails verification, as it did before; once
//! it is done it verifies: no reader ever sees a mixture that verifies.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use evidence::bundle_files::MANIFEST;
use evidence::manifest::Manifest;

use crate::remote::bucket::{Bucket, Listed};
use crate::remote::error::RemoteError;

/// What is wrong with each object of a bundle at the bucket (file name ->
/// why), against the manifest `m` of bundle `id`; empty when it verifies.
/// `listed` is the bundle's listing (file name -> listing).
pub fn check(
    bucket: &Bucket,
    id: &str,
    m: &Manifest,
    listed: &BTreeMap<String, Listed>,
) -> Result<BTreeMap<String, String>, RemoteError> {
    let mut wrong = BTreeMap::new();
    for name in listed.keys() {
        if name != MANIFEST && !m.files.contains_key(name) {
            wrong.insert(name.clone(), "not listed in the manifest".to_string());
        }
    }
    match listed.get(MANIFEST) {
        None => {
            wrong.insert(MANIFEST.to_string(), "missing".to_string());
        }
        Some(_) => {
            let key = bucket.location().object_key(id, MANIFEST);
            let (sha, _) = bucket.stream(&key, |_| Ok(()))?;
            if sha != id {
                wrong.insert(
                    MANIFEST.to_string(),
                    format!("sha256 {sha}, not the bundle id"),
                );
            }
        }
    }
    for (name, e) in &m.files {
        let Some(l) = listed.get(name) else {
            wrong.insert(name.clone(), "missing".to_string());
            continue;
        };
        if l.bytes != e.bytes {
            wrong.insert(
                name.clone(),
                format!("{} bytes, the manifest says {}", l.bytes, e.bytes),
            );
            continue;
        }
        let key = bucket.location().object_key(id, name);
        let (sha, n) = bucket.stream(&key, |_| Ok(()))?;
        if n != e.bytes || sha != e.sha256 {
            wrong.insert(
                name.clone(),
                format!(
                    "{n} bytes, sha256 {sha}; the manifest says {} bytes, sha256 {}",
                    e.bytes, e.sha256
                ),
            );
        }
    }
    Ok(wrong)
}

/// The `wrong` objects of bundle `id` at the bucket made right from the
/// verified local bundle `dir` (manifest `m`): each wrong or missing object
/// written, each unlisted one deleted, `manifest.json` written last. Returns
/// the number of objects written or deleted.
pub fn repair(
    bucket: &Bucket,
    id: &str,
    dir: &Path,
    m: &Manifest,
    wrong: &BTreeMap<String, String>,
) -> Result<usize, RemoteError> {
    let local = |file: &Path| {
        let file = file.to_path_buf();
        move |source| RemoteError::Local { file, source }
    };
    let mut n = 0;
    for name in wrong.keys() {
        let key = bucket.location().object_key(id, name);
        if name == MANIFEST {
            continue;
        }
        if m.files.contains_key(name) {
            let path = dir.join(name);
            let body = std::fs::read(&path).map_err(local(&path))?;
            bucket.overwrite(&key, Bytes::from(body))?;
        } else {
            bucket.delete(&key)?;
        }
        n += 1;
    }
    if wrong.contains_key(MANIFEST) {
        let path = dir.join(MANIFEST);
        let body = std::fs::read(&path).map_err(local(&path))?;
        bucket.overwrite(
            &bucket.location().object_key(id, MANIFEST),
            Bytes::from(body),
        )?;
        n += 1;
    }
    Ok(n)
}

/// The manifest of the verified local bundle at `dir`.
pub fn local_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Manifest::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}
