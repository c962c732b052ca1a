//! Publishing a sealed, verified local bundle to an S3 store, safely against
//! other machines publishing at the same time.
//!
//! Every object is written with `If-None-Match: *` (create only, never
//! overwrite), the data files first and `manifest.json` last: a bundle exists
//! for readers only once its manifest is there (the commit point), so an
//! upload cut short leaves objects no reader lists as a bundle. An object
//! already at a key (another machine publishing the same bundle, or an upload
//! of ours cut short) is accepted only if its size and sha256 are the
//! manifest's; anything else is reported, naming the key, and left as it is.
//! Keys are content-addressed (`bundles/<id>/<file>`, the id the sha256 of a
//! manifest that lists every file's sha256), so two publishers of different
//! bundles never touch one key and two of the same bundle write the same bytes.
//!
//! Before the first object the bundle is noted in the local store's `outbox/`
//! (one file per bundle and bucket, fsynced), and the note is removed once the
//! manifest is committed: `harness recover --store s3://...` finishes every
//! bundle still noted ([`pending`]).
//!
//! Test hooks: `HARNESS_TEST_KILL_PUBLISH_AFTER=N` kills the process (SIGKILL,
//! no clean-up) after its N-th object is written, as a machine that stops
//! answering would; `HARNESS_TEST_PUBLISH_UNLISTED=1` publishes as if the
//! bundle's listing were empty (another machine wrote between our LIST and our
//! PUT), so that the conditional create alone is what refuses an overwrite.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use evidence::bundle_files::MANIFEST;
use evidence::manifest::Manifest;
use evidence::store::Store;

use crate::remote::bucket::{Bucket, Created};
use crate::remote::error::RemoteError;
use crate::remote::location::S3Location;

/// What publishing a bundle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The bundle id.
    pub id: String,
    /// Objects this call wrote.
    pub written: usize,
    /// Objects that were already there with the right content (the manifest
    /// among them when another publisher committed it first).
    pub present: usize,
}

fn outbox_dir(store: &Store) -> PathBuf {
    store.root().join("outbox")
}

fn outbox_file(store: &Store, loc: &S3Location, id: &str) -> PathBuf {
    let tag = crate::cache_dir::hex16(loc.to_string().as_bytes());
    outbox_dir(store).join(format!("{id}.{tag}"))
}

fn local(file: &Path) -> impl Fn(std::io::Error) -> RemoteError + '_ {
    move |source| RemoteError::Local {
        file: file.to_path_buf(),
        source,
    }
}

/// Note bundle `id` as owed to `loc` (durably: file and directory fsynced).
pub fn note_pending(store: &Store, loc: &S3Location, id: &str) -> Result<(), RemoteError> {
    let dir = outbox_dir(store);
    std::fs::create_dir_all(&dir).map_err(local(&dir))?;
    let f = outbox_file(store, loc, id);
    let tmp = f.with_extension("part");
    std::fs::write(&tmp, format!("{loc}\n")).map_err(local(&tmp))?;
    std::fs::File::open(&tmp)
        .and_then(|h| h.sync_all())
        .map_err(local(&tmp))?;
    std::fs::rename(&tmp, &f).map_err(local(&f))?;
    evidence::store::fsync_dir(&dir).map_err(|e| RemoteError::Local {
        file: dir.clone(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// The bundle ids still owed to `loc` by `store`, sorted.
pub fn pending(store: &Store, loc: &S3Location) -> Result<Vec<String>, RemoteError> {
    let dir = outbox_dir(store);
    let tag = crate::cache_dir::hex16(loc.to_string().as_bytes());
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(local(&dir)(e)),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(local(&dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((id, t)) = name.split_once('.') {
            if t == tag && evidence::store::is_bundle_id(id) {
                out.push(id.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn kill_after(written: usize) {
    let at = std::env::var("HARNESS_TEST_KILL_PUBLISH_AFTER")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    if at == Some(written) {
        // SAFETY: kill(2) on our own pid with a constant signal.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Check that the object at `name` of bundle `id` has `bytes` and `sha256`.
fn check_present(
    bucket: &Bucket,
    id: &str,
    name: &str,
    bytes: u64,
    sha256: &str,
) -> Result<(), RemoteError> {
    let key = bucket.location().object_key(id, name);
    let (got, n) = bucket.stream(&key, |_| Ok(()))?;
    if n != bytes || got != sha256 {
        return Err(RemoteError::Mismatch {
            store: bucket.location().to_string(),
            key: key.to_string(),
            why: format!(
                "an object of other content is already there ({n} bytes, sha256 {got}; this \
                 bundle's is {bytes} bytes, sha256 {sha256}): a torn or altered upload; not \
                 overwritten. If no other machine is publishing this bundle now, delete \
                 the objects under {} (an upload that did not finish) and publish again \
                 (`harness recover` or `harness sync`); once its manifest is there, \
                 `harness sync <a store holding the verified bundle> {}` rewrites wrong objects",
                bucket.location().bundle_key(id),
                bucket.location()
            ),
        });
    }
    Ok(())
}

/// Publish the verified local bundle at `dir` (named by its id) to `bucket`,
/// noting it in `outbox`'s outbox until the manifest is committed (`None`:
/// no note, for `harness sync`, which is simply run again).
pub fn publish(
    bucket: &Bucket,
    outbox: Option<&Store>,
    dir: &Path,
) -> Result<Published, RemoteError> {
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    // Only a bundle that verifies leaves the machine: every file's bytes
    // against the manifest, the manifest against the id.
    let report = evidence::verify::verify_dir_as(dir, &id);
    if !report.ok() {
        return Err(RemoteError::Mismatch {
            store: bucket.location().to_string(),
            key: dir.display().to_string(),
            why: format!(
                "the local bundle does not verify, not published: {}",
                crate::verification::local::named_failures(&report.errors)
            ),
        });
    }
    let mpath = dir.join(MANIFEST);
    let mbytes = std::fs::read(&mpath).map_err(local(&mpath))?;
    if evidence::manifest::sha256_hex(&mbytes) != id {
        return Err(RemoteError::Mismatch {
            store: bucket.location().to_string(),
            key: mpath.display().to_string(),
            why: format!("the local manifest does not hash to the bundle id {id}: not published"),
        });
    }
    let text = String::from_utf8_lossy(&mbytes);
    let m = Manifest::from_json(&text).map_err(|e| RemoteError::Mismatch {
        store: bucket.location().to_string(),
        key: mpath.display().to_string(),
        why: format!("not a manifest: {e}"),
    })?;
    if let Some(store) = outbox {
        note_pending(store, bucket.location(), &id)?;
    }
    let mut there = bucket.list_bundle(&id)?;
    if std::env::var_os("HARNESS_TEST_PUBLISH_UNLISTED").is_some() {
        there.clear();
    }
    let mut out = Published {
        id: id.clone(),
        written: 0,
        present: 0,
    };
    // Already committed (by us earlier, or by another machine): the listing's
    // sizes and the manifest's hash are checked, nothing is downloaded whole
    // (`harness verify --store s3://...` hashes every object).
    if there.contains_key(MANIFEST) {
        let key = bucket.location().object_key(&id, MANIFEST);
        let have = bucket.get(&key, crate::remote::reader::MAX_MANIFEST_BYTES)?;
        let got = evidence::manifest::sha256_hex(&have);
        let sizes_ok = m
            .files
            .iter()
            .all(|(n, e)| there.get(n).map(|l| l.bytes) == Some(e.bytes));
        if got != id || !sizes_ok || there.len() != m.files.len() + 1 {
            return Err(RemoteError::Mismatch {
                store: bucket.location().to_string(),
                key: bucket.location().bundle_key(&id).to_string(),
                why: format!(
                    "committed, but its objects are not this bundle's (`harness verify --store {loc} {id}` \
                     names them); nothing written. `harness sync <a store holding the verified \
                     bundle> {loc}` rewrites the wrong objects",
                    loc = bucket.location()
                ),
            });
        }
        out.present = there.len();
        done(outbox, bucket.location(), &id)?;
        return Ok(out);
    }
    for (name, entry) in &m.files {
        if there.contains_key(name) {
            check_present(bucket, &id, name, entry.bytes, &entry.sha256)?;
            out.present += 1;
            continue;
        }
        let path = dir.join(name);
        let body = std::fs::read(&path).map_err(local(&path))?;
        let key = bucket.location().object_key(&id, name);
        match bucket.create(&key, Bytes::from(body))? {
            Created::Written => {
                out.written += 1;
                kill_after(out.written);
            }
            Created::AlreadyThere => {
                check_present(bucket, &id, name, entry.bytes, &entry.sha256)?;
                out.present += 1;
            }
        }
    }
    let key = bucket.location().object_key(&id, MANIFEST);
    match bucket.create(&key, Bytes::from(mbytes))? {
        Created::Written => out.written += 1,
        Created::AlreadyThere => {
            let have = bucket.get(&key, crate::remote::reader::MAX_MANIFEST_BYTES)?;
            let got = evidence::manifest::sha256_hex(&have);
            if got != id {
                return Err(RemoteError::Mismatch {
                    store: bucket.location().to_string(),
                    key: key.to_string(),
                    why: format!("a manifest hashing to {got} is already there; not overwritten"),
                });
            }
            out.present += 1;
        }
    }
    done(outbox, bucket.location(), &id)?;
    Ok(out)
}

/// Remove bundle `id`'s outbox note (if any) once it is committed.
fn done(outbox: Option<&Store>, loc: &S3Location, id: &str) -> Result<(), RemoteError> {
    let Some(store) = outbox else {
        return Ok(());
    };
    let note = outbox_file(store, loc, id);
    match std::fs::remove_file(&note) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(local(&note)(e)),
        _ => Ok(()),
    }
}
