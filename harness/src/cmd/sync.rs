//! `harness sync FROM TO`: every bundle of one store into another, in either
//! direction between a directory and a bucket (or bucket to bucket, through
//! this machine's local store). Idempotent: a bundle already in TO is checked
//! (its manifest's hash and the listed sizes) and counted, never written again.
//! Verifying as it goes: a bundle is copied only after it verified at the
//! source, and is added at the destination only as a verified whole (the
//! manifest last on a bucket, a rename on disk). A bundle that does not
//! verify is named and skipped; the others still go (exit 1 at the end).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use evidence::store::Store;

use crate::exit::{self, UsageError};
use crate::remote::{self, fetch, publish, Bucket, S3Location};
use crate::verification::local::VerifyCache;

/// `harness sync FROM TO`.
#[derive(Debug, Clone, Args)]
pub struct SyncArgs {
    /// The source store: a directory or s3://bucket/prefix.
    pub from: String,
    /// The destination store: a directory or s3://bucket/prefix.
    pub to: String,
}

enum End {
    Dir(PathBuf),
    S3(S3Location),
}

fn end(text: &str) -> anyhow::Result<End> {
    if remote::is_s3(text) {
        return Ok(End::S3(
            S3Location::parse(text).map_err(|e| UsageError(e.to_string()))?,
        ));
    }
    if text.contains("://") {
        return Err(UsageError(format!(
            "{text}: expected a store directory or s3://bucket/prefix"
        ))
        .into());
    }
    Ok(End::Dir(PathBuf::from(text)))
}

/// Outcome counts.
#[derive(Debug, Default)]
struct Tally {
    copied: usize,
    present: usize,
    refused: usize,
}

fn line(verb: &str, id: &str, detail: &str) {
    println!("{verb:<8} {} {detail}", crate::short_id::short(id));
}

/// Run the command; exit 0 when every bundle is in TO, 1 when one was refused.
pub fn run(args: &SyncArgs) -> anyhow::Result<u8> {
    let (from, to) = (end(&args.from)?, end(&args.to)?);
    let mut t = Tally::default();
    match (&from, &to) {
        (End::Dir(src), End::S3(dst)) => {
            let bucket = remote::open(dst)?;
            let there = fetch::committed(&bucket.list_bundles()?);
            for dir in local_bundles(src)? {
                let id = name(&dir);
                if there.contains(&id) {
                    t.present += 1;
                    line("present", &id, "");
                    continue;
                }
                if let Err(why) = verify_local(src, &dir) {
                    t.refused += 1;
                    line("refused", &id, &why);
                    continue;
                }
                match publish::publish(&bucket, None, &dir) {
                    Ok(p) => {
                        t.copied += 1;
                        line("copied", &id, &format!("({} objects written)", p.written));
                    }
                    Err(e) => {
                        t.refused += 1;
                        line("refused", &id, &e.to_string());
                    }
                }
            }
        }
        (End::S3(src), End::Dir(dst)) => {
            let bucket = remote::open(src)?;
            let store = Store::resolve(Some(dst))
                .map_err(remote::store_error)
                .with_context(|| format!("opening the destination store {}", dst.display()))?;
            pull(&bucket, &store, &mut t)?;
        }
        (End::S3(src), End::S3(dst)) => {
            let (a, b) = (remote::open(src)?, remote::open(dst)?);
            let local = remote::local_store()?;
            let there = fetch::committed(&b.list_bundles()?);
            for id in fetch::committed(&a.list_bundles()?) {
                if there.contains(&id) {
                    t.present += 1;
                    line("present", &id, "");
                    continue;
                }
                let r = fetch::fetch(&a, &local, &id)
                    .map_err(|e| e.to_string())
                    .and_then(|dir| {
                        verify_local(local.root(), &dir)?;
                        publish::publish(&b, None, &dir).map_err(|e| e.to_string())
                    });
                match r {
                    Ok(p) => {
                        t.copied += 1;
                        line("copied", &id, &format!("({} objects written)", p.written));
                    }
                    Err(why) => {
                        t.refused += 1;
                        line("refused", &id, &why);
                    }
                }
            }
        }
        (End::Dir(src), End::Dir(dst)) => {
            let store = Store::resolve(Some(dst))
                .map_err(remote::store_error)
                .with_context(|| format!("opening the destination store {}", dst.display()))?;
            for dir in local_bundles(src)? {
                let id = name(&dir);
                if store.bundles_dir().join(&id).exists() {
                    t.present += 1;
                    line("present", &id, "");
                    continue;
                }
                match verify_local(src, &dir).and_then(|()| copy_dir(&store, &dir, &id)) {
                    Ok(n) => {
                        t.copied += 1;
                        line("copied", &id, &format!("({n} files)"));
                    }
                    Err(why) => {
                        t.refused += 1;
                        line("refused", &id, &why);
                    }
                }
            }
        }
    }
    println!(
        "sync {} -> {}: {} copied, {} already there, {} refused",
        args.from, args.to, t.copied, t.present, t.refused
    );
    Ok(if t.refused == 0 {
        exit::OK
    } else {
        exit::NEGATIVE
    })
}

fn name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn local_bundles(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    crate::bundle::files::store_bundle_dirs(root)
        .map_err(|e| UsageError(format!("store {}: {e}", root.display())).into())
}

fn verify_local(root: &Path, dir: &Path) -> Result<(), String> {
    let mut cache = VerifyCache::for_store(root);
    let r = cache.check(dir).map_err(|e| e.to_string());
    cache.save();
    r
}

/// Every committed bundle of `bucket` into `store` (verified before added).
fn pull(bucket: &Bucket, store: &Store, t: &mut Tally) -> anyhow::Result<()> {
    for id in fetch::committed(&bucket.list_bundles()?) {
        if store.bundles_dir().join(&id).exists() {
            t.present += 1;
            line("present", &id, "");
            continue;
        }
        match fetch::fetch(bucket, store, &id) {
            Ok(_) => {
                t.copied += 1;
                line("copied", &id, "");
            }
            Err(e) => {
                t.refused += 1;
                line("refused", &id, &e.to_string());
            }
        }
    }
    Ok(())
}

/// Copy the verified bundle `dir` into `store` through a scratch directory
/// on its file system, verified again there, then renamed into place.
fn copy_dir(store: &Store, dir: &Path, id: &str) -> Result<usize, String> {
    let scratch = store
        .cache_dir()
        .join("fetch")
        .join(format!("{id}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let r = (|| -> Result<usize, String> {
        std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        let mut n = 0;
        for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
            let to = scratch.join(e.file_name());
            std::fs::copy(e.path(), &to).map_err(|err| format!("{}: {err}", to.display()))?;
            std::fs::File::open(&to)
                .and_then(|f| f.sync_all())
                .map_err(|err| format!("{}: {err}", to.display()))?;
            n += 1;
        }
        let report = evidence::verify::verify_dir_as(&scratch, id);
        if !report.ok() {
            return Err(format!(
                "the copy does not verify: {}",
                report
                    .errors
                    .first()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            ));
        }
        store.publish(&scratch, id).map_err(|e| e.to_string())?;
        Ok(n)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    r
}
