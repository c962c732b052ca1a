//! A remote bundle copied into the local store, verified before it is added:
//! what `show`, `diff`, `plot`, `export`, `pack` and `sync` (bucket to disk)
//! read. Objects stream to files under the local store's `cache/fetch/`
//! (never held whole in memory), the copy is verified exactly as `harness
//! verify` verifies a directory, then renamed into `bundles/<id>` (never
//! replacing a bundle already there).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use evidence::bundle_files::MANIFEST;
use evidence::store::Store;

use crate::remote::bucket::{Bucket, Listed};
use crate::remote::error::RemoteError;

/// The ids of the committed bundles (those whose `manifest.json` is there) of
/// a listing.
pub fn committed(listing: &BTreeMap<String, BTreeMap<String, Listed>>) -> Vec<String> {
    listing
        .iter()
        .filter(|(_, files)| files.contains_key(MANIFEST))
        .map(|(id, _)| id.clone())
        .collect()
}

/// The one committed bundle `query` (an id or a unique id prefix) names.
pub fn resolve(bucket: &Bucket, query: &str) -> Result<String, RemoteError> {
    // A whole id needs only its own objects listed, not the store's.
    let listing = if evidence::store::is_bundle_id(query) {
        let mut one = BTreeMap::new();
        let objects = bucket.list_bundle(query)?;
        if !objects.is_empty() {
            one.insert(query.to_string(), objects);
        }
        one
    } else {
        bucket.list_bundles()?
    };
    let ids = committed(&listing);
    let hits: Vec<&String> = ids.iter().filter(|id| id.starts_with(query)).collect();
    let store = bucket.location().to_string();
    match hits.as_slice() {
        [one] if !query.is_empty() => Ok((*one).clone()),
        [] => {
            let unfinished = listing
                .keys()
                .any(|id| id.starts_with(query) && !ids.contains(id));
            Err(RemoteError::Lookup {
                store,
                why: if unfinished {
                    format!(
                        "{query:?} matches only an upload that did not finish (no manifest.json): \
                         `harness recover --store {}` on the machine that made it finishes it",
                        bucket.location()
                    )
                } else {
                    format!("no bundle matches {query:?} (expected a bundle id or an id prefix)")
                },
            })
        }
        many => Err(RemoteError::Lookup {
            store,
            why: format!(
                "{query:?} matches {} bundles ({}); give more characters",
                many.len(),
                many.iter()
                    .take(3)
                    .map(|s| &s[..12.min(s.len())])
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

fn local(file: &Path) -> impl Fn(std::io::Error) -> RemoteError + '_ {
    move |source| RemoteError::Local {
        file: file.to_path_buf(),
        source,
    }
}

/// Download every object of bundle `id` into `dir` (created, must not exist).
/// Returns the number of objects.
pub fn download(bucket: &Bucket, id: &str, dir: &Path) -> Result<usize, RemoteError> {
    std::fs::create_dir_all(dir).map_err(local(dir))?;
    let objects = bucket.list_bundle(id)?;
    for name in objects.keys() {
        // A key with a '/' below the bundle is not a bundle file: kept out of
        // the directory (verification then misses nothing it should see:
        // such an object cannot be listed in a manifest either).
        if name.contains('/') || name == "." || name == ".." {
            return Err(RemoteError::Mismatch {
                store: bucket.location().to_string(),
                key: bucket.location().object_key(id, name).to_string(),
                why: "an object nested below a bundle (bundles hold files only)".into(),
            });
        }
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(local(&path))?;
        bucket.stream(&bucket.location().object_key(id, name), |chunk| {
            f.write_all(chunk)
        })?;
        f.sync_all().map_err(local(&path))?;
    }
    Ok(objects.len())
}

/// The local copy of remote bundle `id`: `bundles/<id>` of `store` when it is
/// already there and verifies, else downloaded, verified and added (replacing
/// a local copy that failed verification).
pub fn fetch(bucket: &Bucket, store: &Store, id: &str) -> Result<PathBuf, RemoteError> {
    let dst = store.bundles_dir().join(id);
    // A local copy that verifies is used as it is; one that does not (edited,
    // truncated) is replaced by a verified copy from the bucket in one step.
    if dst.join(MANIFEST).is_file() {
        let mut cache = crate::verification::local::VerifyCache::in_process();
        let ok = cache.check(&dst).is_ok();
        cache.save();
        if ok {
            return Ok(dst);
        }
    }
    land(bucket, store, id)
}

/// Download bundle `id`, verify the copy, and put it at `bundles/<id>` of
/// `store`: added when nothing is there, else replacing what is there in one
/// step (the caller found it does not verify). What `harness sync` does for
/// a destination copy that fails.
pub fn land(bucket: &Bucket, store: &Store, id: &str) -> Result<PathBuf, RemoteError> {
    let dst = store.bundles_dir().join(id);
    let existing = std::fs::symlink_metadata(&dst).is_ok();
    let scratch = store
        .cache_dir()
        .join("fetch")
        .join(format!("{id}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let result = (|| {
        download(bucket, id, &scratch)?;
        let report = evidence::verify::verify_dir_as(&scratch, id);
        if !report.ok() {
            return Err(RemoteError::Mismatch {
                store: bucket.location().to_string(),
                key: bucket.location().bundle_key(id).to_string(),
                why: format!(
                    "does not verify: {}",
                    crate::verification::local::named_failures(&report.errors)
                ),
            });
        }
        let local = |e: evidence::error::StoreError| RemoteError::Local {
            file: dst.clone(),
            source: std::io::Error::other(e.to_string()),
        };
        if existing {
            // The failed copy ends up at `scratch`, removed below.
            store.replace(&scratch, id).map_err(local).map(|_| true)
        } else {
            store.publish(&scratch, id).map_err(local)
        }
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result.map(|_| dst)
}

/// Every committed bundle of `bucket` as a local copy in `store` that
/// verified in this process ([`fetch`]): the directories, and an exclusion
/// (naming the key and the file) for each bundle whose objects do not
/// verify. What `rank` and `report` of a bucket read, so that the two agree
/// by construction.
pub fn fetch_all(
    bucket: &Bucket,
    store: &Store,
) -> Result<(Vec<PathBuf>, Vec<crate::bundle::facts::Exclusion>), RemoteError> {
    let mut dirs = Vec::new();
    let mut failed = Vec::new();
    for id in committed(&bucket.list_bundles()?) {
        match fetch(bucket, store, &id) {
            Ok(d) => dirs.push(d),
            Err(e @ RemoteError::Mismatch { .. }) => failed.push(crate::bundle::facts::Exclusion {
                id,
                reason: format!("does not verify: {e}"),
            }),
            Err(e) => return Err(e),
        }
    }
    Ok((dirs, failed))
}
