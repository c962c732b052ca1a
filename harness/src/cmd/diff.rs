//! `harness diff A B`: its arguments, and the command that resolves both bundles
//! through the store, reads them and prints the comparison.

use std::path::Path;

use crate::bundle::error::ManifestError;
use crate::bundle::manifest;
use crate::bundle::scan::load_dirs;
use crate::diff::{diff, markdown::markdown};
use crate::exit::{self, UsageError};
use crate::store_arg::{find_verified_bundle, StoreArg};

/// `harness diff A B`: two bundles side by side.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// Bundle A: an id (or unique prefix) in the store, or a bundle directory.
    pub a: String,
    /// Bundle B: an id (or unique prefix) in the store, or a bundle directory.
    pub b: String,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
    /// Print the comparison as one JSON object on stdout: {a, b, fields, phases,
    /// frames, summaries}. Exit 0; 2 for an unknown or ambiguous id.
    #[arg(long)]
    pub json: bool,
}

/// Run `harness diff`; exit 0, 2 for an unknown, ambiguous or unreadable bundle.
pub fn run(args: &DiffArgs) -> anyhow::Result<u8> {
    let da = find_verified_bundle(&args.store, &args.a)?;
    let db = find_verified_bundle(&args.store, &args.b)?;
    let loaded = load_dirs(&[da.clone(), db.clone()]);
    if let Some(u) = loaded.unreadable.first() {
        return Err(UsageError(format!("{}: {}", u.id, u.reason)).into());
    }
    // A manifest that is not JSON is an input error (exit 2).
    let read = |d: &Path| -> anyhow::Result<serde_json::Value> {
        manifest::read_json(d).map_err(|e| match e {
            ManifestError::NotJson { .. } => UsageError(e.to_string()).into(),
            other => other.into(),
        })
    };
    let (ma, mb) = (read(&da)?, read(&db)?);
    let facts = |d: &Path| manifest::read_facts(d).map(|b| b.id);
    let (ia, ib) = (facts(&da)?, facts(&db)?);
    let get = |id: &str| loaded.bundles.iter().find(|b| b.id == id);
    // The same bundle twice is a valid (empty) diff.
    let (Some(a), Some(b)) = (get(&ia), get(&ib)) else {
        return Err(UsageError(format!("{ia} or {ib} could not be loaded")).into());
    };
    let d = diff(a, &ma, b, &mb);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", markdown(&d));
    }
    Ok(exit::OK)
}
