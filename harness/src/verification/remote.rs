//! Which bundles of an S3 store `rank` may read, checked without downloading
//! what it does not read: each committed bundle's `manifest.json` must hash to
//! its id (manifests are cached locally by id: a cached copy is checked the
//! same way); the listing must hold exactly the files the manifest lists, at
//! the listed sizes; and the Parquet tables polars will scan
//! ([`crate::bundle::scan::SCANNED_FILES`]) are hashed as they stream. A
//! table's hash is remembered, outside the store, with the object's size,
//! entity tag and modification time: an object that is exactly as it was is
//! not read again, any rewrite is. The frame images fidelity compares are
//! checked when they are read ([`crate::remote::reader`]). The remembered hashes
//! are a [`StampCache`], the local store's cache type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use evidence::bundle_files::MANIFEST;
use serde::{Deserialize, Serialize};

use crate::bundle::facts::Exclusion;
use crate::bundle::scan::SCANNED_FILES;
use crate::cache_dir::{cache_base, hex16};
use crate::remote::bucket::Listed;
use crate::remote::reader::Remote;
use crate::verification::cache::StampCache;

/// One object whose content hashed right, as the listing described it then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    bytes: u64,
    etag: Option<String>,
    modified_ns: i64,
    sha256: String,
}

/// What a check of a remote store found: the bundle URLs to read, the
/// exclusions, and what it cost.
#[derive(Debug, Default)]
pub struct Checked {
    /// Bundle URLs that passed, sorted by id.
    pub dirs: Vec<PathBuf>,
    /// Bundles that did not, each naming the object at fault.
    pub excluded: Vec<Exclusion>,
    /// Manifests fetched from the bucket (not from the local cache).
    pub manifests_fetched: usize,
    /// Tables hashed (streamed) this time.
    pub tables_hashed: usize,
    /// Bytes streamed to hash them.
    pub bytes_hashed: u64,
}

/// Check every committed bundle of `listing` (see the module docs).
pub fn check(remote: &Remote, listing: &BTreeMap<String, BTreeMap<String, Listed>>) -> Checked {
    let loc = remote.location().clone();
    let cache_path =
        cache_base().map(|b| b.join(format!("s3-{}.json", hex16(loc.to_string().as_bytes()))));
    let mut cache: StampCache<Seen> = StampCache::open(cache_path, loc.to_string(), "objects");
    let mut out = Checked::default();
    let fetched_before = remote.manifests_fetched();
    for (id, objects) in listing {
        if !objects.contains_key(MANIFEST) {
            continue; // not committed: not a bundle yet
        }
        let exclude = |why: String| Exclusion {
            id: id.clone(),
            reason: format!("does not verify: {why}"),
        };
        if !evidence::store::is_bundle_id(id) {
            out.excluded.push(exclude(format!(
                "{}: the name {id:?} is not a bundle id (64 lowercase hex digits)",
                loc.bundle_key(id)
            )));
            continue;
        }
        // The manifest, checked against the id (from the local cache when a
        // copy there still hashes to it).
        let files = remote.listed_files(id).map_err(|e| e.to_string());
        let files = match files {
            Ok(f) => f,
            Err(e) => {
                out.excluded.push(exclude(e));
                continue;
            }
        };
        // The listing against the manifest: every listed file at its size,
        // nothing unlisted.
        let mut faults = Vec::new();
        for (name, e) in &files {
            match objects.get(name) {
                None => faults.push(format!("{}: missing", loc.object_key(id, name))),
                Some(l) if l.bytes != e.bytes => faults.push(format!(
                    "{}: {} bytes, the manifest lists {}",
                    loc.object_key(id, name),
                    l.bytes,
                    e.bytes
                )),
                Some(_) => {}
            }
        }
        for name in objects.keys() {
            if name != MANIFEST && !files.contains_key(name) {
                faults.push(format!(
                    "{}: not listed in the manifest",
                    loc.object_key(id, name)
                ));
            }
        }
        // The tables polars scans: hashed unless seen exactly so before.
        if faults.is_empty() {
            for name in SCANNED_FILES {
                let (Some(e), Some(l)) = (files.get(name), objects.get(name)) else {
                    continue;
                };
                let key = loc.object_key(id, name).to_string();
                let now = Seen {
                    bytes: l.bytes,
                    etag: l.etag.clone(),
                    modified_ns: l.modified_ns,
                    sha256: e.sha256.clone(),
                };
                let same = cache.trusted(&key, &now);
                if same {
                    continue;
                }
                match remote
                    .bucket()
                    .stream(&loc.object_key(id, name), |_| Ok(()))
                {
                    Ok((sha, n)) => {
                        out.tables_hashed += 1;
                        out.bytes_hashed += n;
                        if sha != e.sha256 || n != e.bytes {
                            faults.push(format!(
                                "{key}: sha256 {sha} ({n} bytes), the manifest lists {} ({} bytes)",
                                e.sha256, e.bytes
                            ));
                            cache.forget(&key);
                        } else {
                            cache.remember(key, Seen { sha256: sha, ..now });
                        }
                    }
                    Err(err) => faults.push(err.to_string()),
                }
            }
        }
        if faults.is_empty() {
            out.dirs.push(PathBuf::from(loc.bundle_url(id)));
        } else {
            let n = faults.len();
            let mut why: Vec<String> = faults.into_iter().take(3).collect();
            if n > 3 {
                why.push(format!("and {} more", n - 3));
            }
            out.excluded.push(exclude(why.join("; ")));
        }
    }
    out.manifests_fetched = remote.manifests_fetched() - fetched_before;
    cache.save();
    out
}
