//! One S3-protocol store as the harness uses it: blocking calls (a one-thread
//! tokio runtime drives `object_store`'s futures) for listing, reading whole
//! small objects, hashing an object as it streams, and conditional creation
//! (the harness never overwrites or deletes an object, except `harness sync`
//! repairing a bundle that does not verify at its destination).

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use sha2::{Digest, Sha256};

use crate::remote::credentials;
use crate::remote::error::RemoteError;
use crate::remote::location::S3Location;

/// `e` and its causes, each text once (object_store's texts repeat their
/// sources'), so that the innermost cause (`Connection refused`) is said.
fn chain_text(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = c.source();
    }
    out
}

/// One object as a listing describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Size in bytes.
    pub bytes: u64,
    /// The server's entity tag, when the listing carries one.
    pub etag: Option<String>,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
}

/// What a conditional creation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The object was written by this call.
    Written,
    /// An object was already there (`412 Precondition Failed`): nothing written.
    AlreadyThere,
}

/// An S3-protocol store and its client.
pub struct Bucket {
    loc: S3Location,
    store: AmazonS3,
    rt: tokio::runtime::Runtime,
    /// The user and password of the endpoint URL (`AWS_ENDPOINT_URL`), kept
    /// out of every message ([`crate::redact`]).
    secrets: Vec<String>,
}

impl Bucket {
    /// Configure the client for `loc` from the environment and the AWS files
    /// ([`credentials::resolve`]). Nothing is sent yet.
    pub fn open(loc: &S3Location) -> Result<Bucket, RemoteError> {
        let settings = credentials::resolve();
        let secrets: Vec<String> = settings
            .pairs
            .iter()
            .filter(|(k, _)| matches!(k, object_store::aws::AmazonS3ConfigKey::Endpoint))
            .flat_map(|(_, v)| crate::redact::userinfo_of(v))
            .collect();
        let cfg = |why: String| RemoteError::Config {
            store: loc.to_string(),
            why: crate::redact::values(&why, &secrets),
        };
        // from_env brings what object_store itself reads from AWS_* (web
        // identity, container and instance credentials); the resolved pairs,
        // which add the shared files, win.
        // A bucket that does not answer is said within about a minute, not
        // after object_store's default three minutes of retries per request.
        let retry = object_store::RetryConfig {
            max_retries: 4,
            retry_timeout: std::time::Duration::from_secs(60),
            ..Default::default()
        };
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&loc.bucket)
            .with_retry(retry);
        for (k, v) in &settings.pairs {
            b = b.with_config(*k, v.clone());
        }
        let store = b.build().map_err(|e| {
            cfg(format!(
                "{e} (settings found: {})",
                if settings.sources.is_empty() {
                    "none: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile in ~/.aws"
                        .to_string()
                } else {
                    settings.sources.join(", ")
                }
            ))
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| cfg(format!("cannot start the I/O runtime: {e}")))?;
        Ok(Bucket {
            loc: loc.clone(),
            store,
            rt,
            secrets,
        })
    }

    /// The store location.
    pub fn location(&self) -> &S3Location {
        &self.loc
    }

    fn req(&self, op: &'static str, key: &ObjectPath, source: object_store::Error) -> RemoteError {
        RemoteError::Request {
            store: self.loc.to_string(),
            op,
            key: key.to_string(),
            cause: crate::redact::values(&chain_text(&source), &self.secrets),
        }
    }

    /// Every object under `prefix` as (its key below `prefix/`, its listing).
    fn list_under(&self, prefix: &ObjectPath) -> Result<Vec<(String, Listed)>, RemoteError> {
        let metas: Vec<_> = self
            .rt
            .block_on(async { self.store.list(Some(prefix)).collect::<Vec<_>>().await });
        let base = format!("{}/", prefix.as_ref());
        let mut out = Vec::new();
        for m in metas {
            let m = m.map_err(|e| self.req("LIST", prefix, e))?;
            if let Some(rel) = m.location.as_ref().strip_prefix(&base) {
                out.push((
                    rel.to_string(),
                    Listed {
                        bytes: m.size,
                        etag: m.e_tag.clone(),
                        modified_ns: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
                    },
                ));
            }
        }
        Ok(out)
    }

    /// Every object under `<prefix>/bundles/`, by bundle id then file name
    /// (an object deeper inside a bundle under its relative path, which
    /// verification refuses).
    pub fn list_bundles(&self) -> Result<BTreeMap<String, BTreeMap<String, Listed>>, RemoteError> {
        let mut out: BTreeMap<String, BTreeMap<String, Listed>> = BTreeMap::new();
        for (rel, l) in self.list_under(&self.loc.bundles_key())? {
            if let Some((id, name)) = rel.split_once('/') {
                out.entry(id.to_string())
                    .or_default()
                    .insert(name.to_string(), l);
            }
        }
        Ok(out)
    }

    /// The objects of bundle `id` (file name -> listing).
    pub fn list_bundle(&self, id: &str) -> Result<BTreeMap<String, Listed>, RemoteError> {
        Ok(self
            .list_under(&self.loc.bundle_key(id))?
            .into_iter()
            .collect())
    }

    async fn open_get(&self, key: &ObjectPath) -> Result<object_store::GetResult, RemoteError> {
        self.store
            .get(key)
            .await
            .map_err(|e| self.req("GET", key, e))
    }

    /// The whole object at `key`, refusing one over `max_bytes` (its size from
    /// the response, checked before the body is read).
    pub fn get(&self, key: &ObjectPath, max_bytes: u64) -> Result<Bytes, RemoteError> {
        self.rt.block_on(async {
            let r = self.open_get(key).await?;
            if r.meta.size > max_bytes {
                return Err(RemoteError::Mismatch {
                    store: self.loc.to_string(),
                    key: key.to_string(),
                    why: format!("{} bytes, expected at most {max_bytes}", r.meta.size),
                });
            }
            r.bytes().await.map_err(|e| self.req("GET", key, e))
        })
    }

    /// Stream the object at `key` through `sink` (each chunk in order) and
    /// return its sha256 (hex) and size, without holding it in memory.
    pub fn stream(
        &self,
        key: &ObjectPath,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(String, u64), RemoteError> {
        self.rt.block_on(async {
            let mut s = self.open_get(key).await?.into_stream();
            let mut h = Sha256::new();
            let mut n = 0u64;
            while let Some(chunk) = s.next().await {
                let chunk = chunk.map_err(|e| self.req("GET", key, e))?;
                h.update(&chunk);
                n += chunk.len() as u64;
                sink(&chunk).map_err(|e| RemoteError::Local {
                    file: std::path::PathBuf::from(key.as_ref()),
                    source: e,
                })?;
            }
            Ok((evidence::manifest::hex(&h.finalize()), n))
        })
    }

    /// Write the object at `key` whatever is there: only for `harness sync`
    /// repairing a bundle whose object at this content-addressed key does not
    /// match its manifest ([`crate::remote::repair`]).
    pub fn overwrite(&self, key: &ObjectPath, body: Bytes) -> Result<(), RemoteError> {
        self.rt.block_on(async {
            self.store
                .put(key, PutPayload::from_bytes(body))
                .await
                .map(|_| ())
                .map_err(|e| self.req("PUT", key, e))
        })
    }

    /// Delete the object at `key`: only for `harness sync` removing an object
    /// below a bundle that its manifest does not list ([`crate::remote::repair`]).
    pub fn delete(&self, key: &ObjectPath) -> Result<(), RemoteError> {
        self.rt.block_on(async {
            self.store
                .delete(key)
                .await
                .map_err(|e| self.req("DELETE", key, e))
        })
    }

    /// Create the object at `key` only if none is there (`If-None-Match: *`).
    pub fn create(&self, key: &ObjectPath, body: Bytes) -> Result<Created, RemoteError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.rt.block_on(async {
            match self
                .store
                .put_opts(key, PutPayload::from_bytes(body), opts)
                .await
            {
                Ok(_) => Ok(Created::Written),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::AlreadyThere),
                Err(e) => Err(self.req("PUT", key, e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(&'static str, std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn a_cause_is_said_once_and_the_innermost_one_is_said() {
        let refused = || std::io::Error::other("tcp connect error: Connection refused");
        let e = Outer("GET http://127.0.0.1:1/b failed", refused());
        assert_eq!(
            chain_text(&e),
            "GET http://127.0.0.1:1/b failed: tcp connect error: Connection refused"
        );
        // A text that already carries its source's is not extended by it again.
        let e = Outer(
            "GET failed: tcp connect error: Connection refused",
            refused(),
        );
        assert_eq!(
            chain_text(&e),
            "GET failed: tcp connect error: Connection refused"
        );
    }
}
