//! Reading bundles straight from the bucket, each file checked as it is read.
//!
//! A command that reads a remote store installs one [`Remote`] for the process
//! ([`install`]); from then on a bundle "directory" is its URL
//! (`s3://bucket/prefix/bundles/<id>`, [`S3Location::bundle_url`]) and
//! [`crate::bundle::files::read`] fetches through here: `manifest.json` must
//! hash to the id, and every other file must have the size and sha256 the
//! manifest lists (a file the manifest does not list is not read at all);
//! verified bytes are kept in the local cache directory by sha256 (manifests by
//! id), and a cached copy is used only while it still hashes right. Ranking a
//! bucket does not scan it in place: its bundles are fetched and verified into
//! the local store first (`fetch::fetch_all`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use evidence::bundle_files::MANIFEST;
use evidence::manifest::{FileEntry, Manifest};

use crate::cache_dir::cache_base;
use crate::remote::bucket::Bucket;
use crate::remote::error::RemoteError;
use crate::remote::location::{S3Location, SCHEME};

fn is_sha256_hex(s: &str) -> bool {
    evidence::store::is_bundle_id(s)
}

/// The largest `manifest.json` fetched (a manifest lists a few dozen files and
/// the run's fragments: kilobytes).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// A bucket read from, with the manifests already checked.
pub struct Remote {
    bucket: Bucket,
    manifests: Mutex<BTreeMap<String, BTreeMap<String, FileEntry>>>,
    fetched: AtomicUsize,
}

static ACTIVE: OnceLock<Remote> = OnceLock::new();

/// Make `bucket` the process's remote store (the first call wins; a process
/// reads one store).
pub fn install(bucket: Bucket) -> &'static Remote {
    ACTIVE.get_or_init(|| Remote {
        bucket,
        manifests: Mutex::new(BTreeMap::new()),
        fetched: AtomicUsize::new(0),
    })
}

/// The process's remote store, if one was installed.
pub fn active() -> Option<&'static Remote> {
    ACTIVE.get()
}

/// The remote store and bundle id of a bundle URL, when `dir` is one.
pub fn for_dir(dir: &Path) -> Option<(&'static Remote, String)> {
    let text = dir.to_str()?;
    if !text.starts_with(SCHEME) {
        return None;
    }
    let r = active()?;
    let id = text.rsplit('/').next()?.to_string();
    (r.bucket.location().bundle_url(&id) == text).then_some((r, id))
}

impl Remote {
    /// The bucket.
    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// The store location.
    pub fn location(&self) -> &S3Location {
        self.bucket.location()
    }

    fn mismatch(&self, id: &str, name: &str, why: String) -> RemoteError {
        RemoteError::Mismatch {
            store: self.location().to_string(),
            key: self.location().object_key(id, name).to_string(),
            why,
        }
    }

    /// Manifests fetched from the bucket so far (not from the local cache).
    pub fn manifests_fetched(&self) -> usize {
        self.fetched.load(Ordering::Relaxed)
    }

    /// The bytes of `manifest.json` of bundle `id`, checked: their sha256 is the
    /// id. A manifest is immutable under its id, so a copy is kept in the local
    /// cache directory ([`cache_base`]`/manifests/<id>.json`) and used when its
    /// bytes still hash to the id.
    pub fn manifest_bytes(&self, id: &str) -> Result<Vec<u8>, RemoteError> {
        let cached = cache_base()
            .filter(|_| evidence::store::is_bundle_id(id))
            .map(|b| b.join("manifests").join(format!("{id}.json")));
        let from_cache = cached
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .filter(|b| evidence::manifest::sha256_hex(b) == id);
        let bytes = match from_cache {
            Some(b) => bytes::Bytes::from(b),
            None => {
                let key = self.location().object_key(id, MANIFEST);
                let b = self.bucket.get(&key, MAX_MANIFEST_BYTES)?;
                self.fetched.fetch_add(1, Ordering::Relaxed);
                if let (Some(p), true) = (&cached, evidence::manifest::sha256_hex(&b) == id) {
                    if let Some(d) = p.parent() {
                        let _ = std::fs::create_dir_all(d);
                    }
                    let tmp = p.with_extension(format!("json.{}.part", std::process::id()));
                    if std::fs::write(&tmp, &b).is_err() || std::fs::rename(&tmp, p).is_err() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                }
                b
            }
        };
        let got = evidence::manifest::sha256_hex(&bytes);
        if got != id {
            return Err(self.mismatch(
                id,
                MANIFEST,
                format!("sha256 {got}, expected the bundle id {id}"),
            ));
        }
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| self.mismatch(id, MANIFEST, format!("not UTF-8: {e}")))?;
        let m = Manifest::from_json(text)
            .map_err(|e| self.mismatch(id, MANIFEST, format!("not a manifest: {e}")))?;
        if let Ok(mut g) = self.manifests.lock() {
            g.insert(id.to_string(), m.files);
        }
        Ok(bytes.to_vec())
    }

    /// The files bundle `id`'s (checked) manifest lists.
    pub fn listed_files(&self, id: &str) -> Result<BTreeMap<String, FileEntry>, RemoteError> {
        if let Some(f) = self.manifests.lock().ok().and_then(|g| g.get(id).cloned()) {
            return Ok(f);
        }
        self.manifest_bytes(id)?;
        self.manifests
            .lock()
            .ok()
            .and_then(|g| g.get(id).cloned())
            .ok_or_else(|| self.mismatch(id, MANIFEST, "the manifest was not kept".into()))
    }

    /// The bytes of file `name` of bundle `id`, checked against the manifest.
    pub fn read(&self, id: &str, name: &str) -> Result<Vec<u8>, RemoteError> {
        if name == MANIFEST {
            return self.manifest_bytes(id);
        }
        let files = self.listed_files(id)?;
        let entry = files
            .get(name)
            .ok_or_else(|| self.mismatch(id, name, "not listed in the bundle's manifest".into()))?;
        // A file is immutable under its sha256: a copy in the local cache
        // (`objects/<sha256>`) serves when its bytes still hash to it.
        let cached = cache_base()
            .filter(|_| is_sha256_hex(&entry.sha256))
            .map(|b| b.join("objects").join(&entry.sha256));
        if let Some(b) = cached
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .filter(|b| evidence::manifest::sha256_hex(b) == entry.sha256)
        {
            return Ok(b);
        }
        let bytes = self
            .bucket
            .get(&self.location().object_key(id, name), entry.bytes)?;
        if bytes.len() as u64 != entry.bytes {
            return Err(self.mismatch(
                id,
                name,
                format!("{} bytes, the manifest lists {}", bytes.len(), entry.bytes),
            ));
        }
        let got = evidence::manifest::sha256_hex(&bytes);
        if got != entry.sha256 {
            return Err(self.mismatch(
                id,
                name,
                format!("sha256 {got}, the manifest lists {}", entry.sha256),
            ));
        }
        if let Some(p) = &cached {
            if let Some(d) = p.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            let tmp = p.with_extension(format!("{}.part", std::process::id()));
            if std::fs::write(&tmp, &bytes).is_err() || std::fs::rename(&tmp, p).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Ok(bytes.to_vec())
    }
}
