//! The `--store DIR` option every command takes; [`find_bundle`], the one way a
//! command resolves a bundle id, prefix or directory (through the store and its
//! durability gate); [`read_root`], the store a whole-store reader lists; and
//! turning store errors into the harness's exit codes (volatile store: refused, 3;
//! unknown or ambiguous id: usage, 2).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use evidence::error::StoreError;
use evidence::store::Store;

use crate::exit::{Negative, Refusal, UsageError};
use crate::verification::local::VerifyCache;

/// Where the store is.
#[derive(Debug, Clone, Args)]
pub struct StoreArg {
    /// The store: a directory on durable storage (default:
    /// $XDG_DATA_HOME/harness/store or ~/.local/share/harness/store), or
    /// s3://bucket/prefix (runs stage in $HARNESS_LOCAL_STORE, credentials from
    /// the AWS environment or ~/.aws).
    #[arg(long, env = "HARNESS_STORE", value_name = "DIR|s3://BUCKET/PREFIX")]
    pub store: Option<PathBuf>,
}

/// Map a store error to the error kind that carries its exit code.
pub fn classify(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::Volatile { .. } => Refusal {
            gate: "store-durable".into(),
            why: e.to_string(),
        }
        .into(),
        StoreError::UnknownBundle { .. }
        | StoreError::AmbiguousBundle { .. }
        | StoreError::NoLocation
        | StoreError::NotLocal { .. } => UsageError(e.to_string()).into(),
        StoreError::Io(_) => anyhow::Error::new(e),
    }
}

impl StoreArg {
    /// Open the store (durability gate applied, layout created).
    pub fn open(&self) -> anyhow::Result<Store> {
        Store::resolve(self.store.as_deref())
            .map_err(classify)
            .context("opening the store")
    }
}

/// The store root for reading the whole store (`rank`, `campaign`): `explicit`, then
/// `$HARNESS_STORE`, then `$XDG_DATA_HOME/harness/store`, then
/// `~/.local/share/harness/store` (`evidence::store::default_location`). No
/// durability gate and nothing created: listing needs neither, and `rank` reads
/// committed stores such as `reports/evidence` as they are.
pub fn read_root(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    evidence::store::default_location(explicit).map_err(|e| match e {
        StoreError::NoLocation => {
            UsageError("no store: pass --store DIR or set HARNESS_STORE".into()).into()
        }
        other => classify(other),
    })
}

/// [`find_bundle`], then the bundle verified ([`crate::verification::local`]): a
/// bundle that does not verify is refused with exit 1, naming the files at
/// fault. What `show`, `diff`, `plot` and `export` read.
///
/// With `--store s3://...` the bundle is fetched into this machine's local
/// store first ([`crate::remote::fetch`]: downloaded, verified, added), then
/// read from there like any local bundle.
pub fn find_verified_bundle(arg: &StoreArg, query: &str) -> anyhow::Result<PathBuf> {
    let dir = find_bundle(arg, query)?;
    // A bucket's bundle comes back from fetch verified (a fresh download checked
    // before it was added, or a local copy checked through the cache): not again.
    if crate::remote::location_of(arg.store.as_deref())?.is_some() && !Path::new(query).is_dir() {
        return Ok(dir);
    }
    // The store a bundle directory belongs to: <root>/bundles/<id>.
    let root = dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or(dir.as_path())
        .to_path_buf();
    let mut cache = VerifyCache::for_store(&root);
    let checked = cache.check(&dir);
    cache.save();
    checked.map_err(|e| Negative(format!("{e} (harness verify lists every failure)")))?;
    Ok(dir)
}

/// The bundle directory for an id, id prefix, or path. A path to a bundle
/// directory is used as is, without opening a store.
pub fn find_bundle(arg: &StoreArg, query: &str) -> anyhow::Result<PathBuf> {
    let p = Path::new(query);
    if p.join(evidence::bundle_files::MANIFEST).is_file() {
        return p
            .canonicalize()
            .with_context(|| format!("resolving {}", p.display()));
    }
    if query.contains('/') {
        return Err(UsageError(format!(
            "{query}: not a bundle directory (no manifest.json in it)"
        ))
        .into());
    }
    if let Some(loc) = crate::remote::location_of(arg.store.as_deref())? {
        let bucket = crate::remote::open(&loc)?;
        let id = crate::remote::fetch::resolve(&bucket, query).map_err(remote_lookup)?;
        let local = crate::remote::local_store()?;
        return crate::remote::fetch::fetch(&bucket, &local, &id)
            .map_err(|e| Negative(e.to_string()).into());
    }
    let store = arg.open()?;
    store.find(query).map_err(classify)
}

/// A remote lookup error as its exit code: an unknown or ambiguous id is a
/// usage error (2), a failed request an internal one.
pub fn remote_lookup(e: crate::remote::RemoteError) -> anyhow::Error {
    match e {
        crate::remote::RemoteError::Lookup { .. } => UsageError(e.to_string()).into(),
        other => anyhow::Error::new(other),
    }
}
