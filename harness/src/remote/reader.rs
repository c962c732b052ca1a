//! Reading manifests straight from the bucket, each checked as it is read:
//! `harness ls` of an `s3://` store owns one [`Remote`] and reads every
//! committed bundle's `manifest.json` through it ([`Remote::manifest_bytes`]),
//! which must hash to the bundle's id. Verified manifests are kept in the local
//! cache directory by id, and a cached copy is used only while it still hashes
//! right. Every other reader of a bucket (`show`, `rank`, `report`, ...) fetches
//! its bundles, verified, into the local store first (`fetch::fetch_all`) and
//! reads those copies.

use evidence::bundle_files::MANIFEST;
use evidence::manifest::Manifest;

use crate::cache_dir::cache_base;
use crate::remote::bucket::Bucket;
use crate::remote::error::RemoteError;
use crate::remote::location::S3Location;

/// The largest `manifest.json` fetched (a manifest lists a few dozen files and
/// the run's fragments: kilobytes).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// A bucket whose manifests are read, each checked against its id.
pub struct Remote {
    bucket: Bucket,
}

impl Remote {
    /// A reader of `bucket`'s manifests.
    pub fn new(bucket: Bucket) -> Remote {
        Remote { bucket }
    }

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
        Manifest::from_json(text)
            .map_err(|e| self.mismatch(id, MANIFEST, format!("not a manifest: {e}")))?;
        Ok(bytes.to_vec())
    }
}
