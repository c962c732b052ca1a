//! The store on the S3 protocol: `--store s3://bucket/prefix` (or
//! `HARNESS_STORE=s3://...`), so that runs from many GPU machines land in one
//! bucket that `rank`, `diff` and `verify` read.
//!
//! The bucket holds the store's layout (`<prefix>/bundles/<id>/<file>`). Every
//! machine keeps a local store on durable disk as well
//! (`$HARNESS_LOCAL_STORE`, else the default location): runs stage, journal and
//! seal there exactly as without a bucket (the durability gate applies to it),
//! then [`publish`] uploads the verified bundle with conditional writes, the
//! manifest last; `harness recover` finishes an upload that was cut short.
//! Readers check what they read against the bundle's id ([`reader`],
//! [`fetch`]). Credentials come from the environment and the AWS
//! files ([`credentials`]), never from a flag or a URL, and are never printed.

pub mod bucket;
pub mod credentials;
pub mod error;
pub mod fetch;
pub mod location;
pub mod publish;
pub mod reader;
pub mod repair;

use std::path::Path;

use anyhow::Context;
use evidence::store::Store;

pub use bucket::Bucket;
pub use error::RemoteError;
pub use location::{is_s3, S3Location};

/// The S3 location `store` names (else `$HARNESS_STORE`), if it names one; an
/// `s3://` value that does not parse is a usage error.
pub fn location_of(store: Option<&Path>) -> anyhow::Result<Option<S3Location>> {
    let text = match store {
        Some(p) => p.to_string_lossy().into_owned(),
        None => std::env::var(evidence::store::STORE_ENV).unwrap_or_default(),
    };
    if !is_s3(&text) {
        return Ok(None);
    }
    S3Location::parse(&text)
        .map(Some)
        .map_err(|e| crate::exit::UsageError(e.to_string()).into())
}

/// This machine's local store (durability gate applied, layout created): where
/// runs stage and seal, and verified copies of remote bundles are kept, when
/// the store is a bucket.
pub fn local_store() -> anyhow::Result<Store> {
    let root = evidence::store::local_default_location().map_err(store_error)?;
    Store::resolve(Some(&root))
        .map_err(store_error)
        .context("opening the local store (HARNESS_LOCAL_STORE) that stages runs for the bucket")
}

/// A local store's error as its exit code: a volatile store is refused by the
/// `store-durable` gate (3), a missing or URL location is a usage error (2).
pub fn store_error(e: evidence::error::StoreError) -> anyhow::Error {
    use evidence::error::StoreError;
    match e {
        StoreError::Volatile { .. } => crate::exit::Refusal {
            gate: "store-durable".into(),
            why: e.to_string(),
        }
        .into(),
        StoreError::Io(_) => anyhow::Error::new(e),
        other => crate::exit::UsageError(other.to_string()).into(),
    }
}

/// The client for `loc`.
pub fn open(loc: &S3Location) -> anyhow::Result<Bucket> {
    Bucket::open(loc).map_err(|e| crate::exit::UsageError(e.to_string()).into())
}
