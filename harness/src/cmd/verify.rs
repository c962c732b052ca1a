//! `harness verify ID|PATH`: re-read every file of a bundle and check it.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use crate::exit;
use crate::store_arg::{find_bundle, StoreArg};

/// Re-read every file of a bundle, recompute every hash, check every schema.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
    /// Print the result as one JSON object: {id, dir, ok, files, errors: \[text\]}.
    /// Exit 0 when ok, 1 when a check failed, 2 for an unknown or ambiguous id.
    #[arg(long)]
    pub json: bool,
}

/// `harness verify --json`: one bundle's verification. Fields are stable; new
/// ones may be added (`specs/bundle.md`). They are declared in name order, the
/// order in which the document has always printed its keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyRecord {
    /// The bundle directory checked (absolute when found through the store).
    pub dir: PathBuf,
    /// One text per failed check, each naming its file; empty when `ok`.
    pub errors: Vec<String>,
    /// Files read, `manifest.json` included (a count of files).
    pub files: usize,
    /// The bundle id the files were checked against (64 hex).
    pub id: String,
    /// True when every hash, schema and count checked.
    pub ok: bool,
}

impl VerifyRecord {
    /// The record of `report`, the verification of the bundle at `dir`.
    pub fn of(dir: PathBuf, report: &evidence::verify::VerifyReport) -> VerifyRecord {
        VerifyRecord {
            dir,
            errors: report.errors.iter().map(ToString::to_string).collect(),
            files: report.files,
            id: report.id.clone(),
            ok: report.ok(),
        }
    }
}

/// Exit 0 when every check passes, 1 (naming each file at fault) when not.
///
/// With `--store s3://...` every object of the bundle is downloaded afresh
/// (streamed into a scratch directory of the local store, removed after) and
/// checked the same way; `dir` is then the bundle's URL.
pub fn run(args: VerifyArgs) -> anyhow::Result<u8> {
    let (dir, report) = match crate::remote::location_of(args.store.store.as_deref())? {
        Some(loc) => remote_report(&loc, &args.bundle)?,
        None => {
            let dir = find_bundle(&args.store, &args.bundle)?;
            let report = evidence::verify::verify_dir(&dir);
            (dir, report)
        }
    };
    if args.json {
        let record = VerifyRecord::of(dir, &report);
        println!("{}", serde_json::to_string_pretty(&record)?);
        return Ok(if report.ok() {
            exit::OK
        } else {
            exit::NEGATIVE
        });
    }
    if report.ok() {
        println!("ok {} ({} files)", report.id, report.files);
        Ok(exit::OK)
    } else {
        for e in &report.errors {
            println!("FAIL {}: {e}", dir.display());
        }
        println!(
            "{}: {} problem(s) in {} files",
            report.id,
            report.errors.len(),
            report.files
        );
        Ok(exit::NEGATIVE)
    }
}

/// Download bundle `query` of the bucket at `loc` afresh and verify the copy.
fn remote_report(
    loc: &crate::remote::S3Location,
    query: &str,
) -> anyhow::Result<(PathBuf, evidence::verify::VerifyReport)> {
    let bucket = crate::remote::open(loc)?;
    let id =
        crate::remote::fetch::resolve(&bucket, query).map_err(crate::store_arg::remote_lookup)?;
    let local = crate::remote::local_store()?;
    let scratch = local
        .cache_dir()
        .join("verify")
        .join(format!("{id}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let got = crate::remote::fetch::download(&bucket, &id, &scratch);
    let report = got.map(|_| evidence::verify::verify_dir_as(&scratch, &id));
    let _ = std::fs::remove_dir_all(&scratch);
    Ok((PathBuf::from(loc.bundle_url(&id)), report?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document keeps the keys, their order and their shapes it had when it
    /// was built from a sorted JSON map.
    #[test]
    fn the_record_prints_the_keys_it_always_had() {
        let r = VerifyRecord {
            dir: "/s/bundles/ab".into(),
            errors: vec!["samples.parquet: sha256 mismatch".into()],
            files: 9,
            id: "ab".into(),
            ok: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"dir":"/s/bundles/ab","errors":["samples.parquet: sha256 mismatch"],"files":9,"id":"ab","ok":false}"#
        );
    }
}
