//! `harness sync FROM TO`: every bundle of one store into another, in either
//! direction between a directory and a bucket (or bucket to bucket, through
//! this machine's local store). Idempotent: a bundle already in TO is
//! verified there in full (every file's or object's size and sha256 against
//! the manifest, streamed, bounded memory) and counted; a copy there that
//! fails (a bare directory, a manifest alone, a torn or edited file) is
//! replaced in one step (on disk a `RENAME_EXCHANGE`, on a bucket its wrong
//! objects rewritten and the manifest last, [`repair`]), counted and named.
//! Verifying as it goes: a bundle is copied only after it verified at the
//! source, and is added at the destination only as a verified whole (the
//! manifest last on a bucket, a rename on disk). A bundle that does not
//! verify is named and skipped; the others still go (exit 1 at the end).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use evidence::bundle_files::MANIFEST;
use evidence::store::Store;

use crate::exit::{self, UsageError};
use crate::remote::{self, fetch, publish, repair, Bucket, S3Location};
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
    replaced: usize,
    refused: usize,
}

fn line(verb: &str, id: &str, detail: &str) {
    println!("{verb:<8} {} {detail}", crate::short_id::short(id));
}

/// What sync found of a bundle at the destination.
enum There {
    /// Nothing by that id.
    Absent,
    /// A copy that verifies: every file's size and sha256 against its manifest.
    Verified,
    /// A copy (or a mere directory, or a manifest alone) that does not, and why.
    Failing(String),
}

/// The destination directory store's copy of `id`, verified in full (every
/// byte hashed in this process: no stamp cache is trusted for what a backup
/// holds).
fn there_on_disk(store: &Store, id: &str) -> There {
    let dir = store.bundles_dir().join(id);
    if std::fs::symlink_metadata(&dir).is_err() {
        return There::Absent;
    }
    let report = evidence::verify::verify_dir_as(&dir, id);
    if report.ok() {
        There::Verified
    } else {
        There::Failing(crate::verification::local::named_failures(&report.errors))
    }
}

/// The destination bucket's copy of `id` against the verified local bundle
/// `dir`: every object streamed through sha256.
fn there_on_bucket(
    bucket: &Bucket,
    listing: &Listing,
    dir: &Path,
    id: &str,
) -> Result<(There, Option<(evidence::manifest::Manifest, Wrong)>), String> {
    // Only a committed copy (its manifest there) is checked and repaired; an
    // upload without a manifest may be another machine's, in progress: it goes
    // through `publish`, whose conditional creates never overwrite.
    let Some(objects) = listing.get(id).filter(|o| o.contains_key(MANIFEST)) else {
        return Ok((There::Absent, None));
    };
    let m = repair::local_manifest(dir)?;
    let wrong = repair::check(bucket, id, &m, objects).map_err(|e| e.to_string())?;
    if wrong.is_empty() {
        return Ok((There::Verified, None));
    }
    let why = wrong
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>();
    Ok((
        There::Failing(crate::verification::local::named_failures(&why)),
        Some((m, wrong)),
    ))
}

/// What is wrong with each object of a bundle at a bucket (file name -> why).
type Wrong = std::collections::BTreeMap<String, String>;

/// A bucket's listing: bundle id -> file name -> what the bucket lists of it.
type Listing = std::collections::BTreeMap<
    String,
    std::collections::BTreeMap<String, crate::remote::bucket::Listed>,
>;

/// Put the verified local bundle `dir` at the bucket: published when absent,
/// repaired when a failing copy is there, counted when a verified one is.
fn to_bucket(bucket: &Bucket, listing: &Listing, dir: &Path, id: &str, t: &mut Tally) {
    match there_on_bucket(bucket, listing, dir, id) {
        Err(why) => {
            t.refused += 1;
            line("refused", id, &why);
        }
        Ok((There::Verified, _)) => {
            t.present += 1;
            line("present", id, "");
        }
        Ok((There::Failing(why), Some((m, wrong)))) => {
            match repair::repair(bucket, id, dir, &m, &wrong) {
                Ok(n) => {
                    t.replaced += 1;
                    line(
                        "replaced",
                        id,
                        &format!("(the copy there did not verify: {why}; {n} objects rewritten)"),
                    );
                }
                Err(e) => {
                    t.refused += 1;
                    line(
                        "refused",
                        id,
                        &format!(
                            "the copy there does not verify ({why}) and could not be repaired: {e}"
                        ),
                    );
                }
            }
        }
        Ok((_, _)) => match publish::publish(bucket, None, dir) {
            Ok(p) => {
                t.copied += 1;
                line("copied", id, &format!("({} objects written)", p.written));
            }
            Err(e) => {
                t.refused += 1;
                line("refused", id, &e.to_string());
            }
        },
    }
}

/// Run the command; exit 0 when every bundle is in TO, 1 when one was refused.
pub fn run(args: &SyncArgs) -> anyhow::Result<u8> {
    let (from, to) = (end(&args.from)?, end(&args.to)?);
    let mut t = Tally::default();
    match (&from, &to) {
        (End::Dir(src), End::S3(dst)) => {
            let bucket = remote::open(dst)?;
            let listing = bucket.list_bundles()?;
            for dir in local_bundles(src)? {
                let id = name(&dir);
                if let Err(why) = verify_local(src, &dir) {
                    t.refused += 1;
                    line("refused", &id, &why);
                    continue;
                }
                to_bucket(&bucket, &listing, &dir, &id, &mut t);
            }
        }
        (End::S3(src), End::Dir(dst)) => {
            let bucket = remote::open(src)?;
            // The bucket answers before anything is created at the destination.
            let ids = fetch::committed(&bucket.list_bundles()?);
            let store = Store::resolve(Some(dst))
                .map_err(remote::store_error)
                .with_context(|| format!("opening the destination store {}", dst.display()))?;
            pull(&bucket, &ids, &store, &mut t);
        }
        (End::S3(src), End::S3(dst)) => {
            let (a, b) = (remote::open(src)?, remote::open(dst)?);
            // Both buckets answer before the local store is touched.
            let ids = fetch::committed(&a.list_bundles()?);
            let listing = b.list_bundles()?;
            let local = remote::local_store()?;
            for id in ids {
                let r = fetch::fetch(&a, &local, &id)
                    .map_err(|e| e.to_string())
                    .and_then(|dir| verify_local(local.root(), &dir).map(|()| dir));
                match r {
                    Ok(dir) => to_bucket(&b, &listing, &dir, &id, &mut t),
                    Err(why) => {
                        t.refused += 1;
                        line("refused", &id, &why);
                    }
                }
            }
        }
        (End::Dir(src), End::Dir(dst)) => {
            let bundles = local_bundles(src)?;
            let store = Store::resolve(Some(dst))
                .map_err(remote::store_error)
                .with_context(|| format!("opening the destination store {}", dst.display()))?;
            for dir in bundles {
                let id = name(&dir);
                let there = there_on_disk(&store, &id);
                if matches!(there, There::Verified) {
                    t.present += 1;
                    line("present", &id, "");
                    continue;
                }
                match verify_local(src, &dir).and_then(|()| copy_dir(&store, &dir, &id)) {
                    Ok(n) => match there {
                        There::Failing(why) => {
                            t.replaced += 1;
                            line(
                                "replaced",
                                &id,
                                &format!("(the copy there did not verify: {why}; {n} files)"),
                            );
                        }
                        _ => {
                            t.copied += 1;
                            line("copied", &id, &format!("({n} files)"));
                        }
                    },
                    Err(why) => {
                        t.refused += 1;
                        line("refused", &id, &why);
                    }
                }
            }
        }
    }
    println!(
        "sync {} -> {}: {} copied, {} already there, {} refused, {} replaced",
        crate::redact::urls(&args.from),
        crate::redact::urls(&args.to),
        t.copied,
        t.present,
        t.refused,
        t.replaced
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

/// Verify the bundle at `dir` (of the store at `_root`) in full in this process.
fn verify_local(_root: &Path, dir: &Path) -> Result<(), String> {
    let mut cache = VerifyCache::in_process();
    let r = cache.check(dir).map_err(|e| e.to_string());
    cache.save();
    r
}

/// Every committed bundle `ids` of `bucket` into `store` (verified before
/// added; a failing local copy replaced in one step).
fn pull(bucket: &Bucket, ids: &[String], store: &Store, t: &mut Tally) {
    for id in ids {
        let there = there_on_disk(store, id);
        if matches!(there, There::Verified) {
            t.present += 1;
            line("present", id, "");
            continue;
        }
        match (fetch::land(bucket, store, id), there) {
            (Ok(_), There::Failing(why)) => {
                t.replaced += 1;
                line(
                    "replaced",
                    id,
                    &format!("(the copy there did not verify: {why})"),
                );
            }
            (Ok(_), _) => {
                t.copied += 1;
                line("copied", id, "");
            }
            (Err(e), _) => {
                t.refused += 1;
                line("refused", id, &e.to_string());
            }
        }
    }
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
        if std::fs::symlink_metadata(store.bundles_dir().join(id)).is_ok() {
            // A copy there that failed verification: replaced in one step (it
            // ends up at `scratch`, removed below).
            store.replace(&scratch, id).map_err(|e| e.to_string())?;
        } else if !store.publish(&scratch, id).map_err(|e| e.to_string())? {
            return Err("a bundle of this id appeared at the destination meanwhile".into());
        }
        Ok(n)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    r
}
