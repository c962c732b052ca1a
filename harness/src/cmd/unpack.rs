//! `harness unpack`: check a pack's every entry and hash ([`crate::pack`]), then
//! land its bundle in the store atomically (and publish it, with a bucket).

use std::path::PathBuf;

use clap::Args;

use crate::exit::{self, UsageError};
use crate::pack::{shown, unpack_into, Landed};
use crate::store_arg::StoreArg;

/// Check a pack and add its bundle to the store.
#[derive(Debug, Args)]
pub struct UnpackArgs {
    /// The pack file (`harness pack` output).
    pub file: PathBuf,
    /// The store the bundle lands in (`--store`, `$HARNESS_STORE`).
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0 when the bundle is in the store (new, already there intact, or replacing
/// a copy that failed verification); 1 when its files do not verify; 2 for a
/// malformed or hostile pack; 3 for a store refused by its gate; 4 when the store
/// could not be written. Nothing is left behind on a refusal.
pub fn run(args: UnpackArgs) -> anyhow::Result<u8> {
    let f = std::fs::File::open(&args.file)
        .map_err(|e| UsageError(format!("{}: cannot open: {e}", args.file.display())))?;
    // With a bucket: unpacked into this machine's local store, then published.
    let remote = crate::remote::location_of(args.store.store.as_deref())?;
    let store = match &remote {
        Some(_) => crate::remote::local_store()?,
        None => args.store.open()?,
    };
    let landed = match unpack_into(&store, &args.file, std::io::BufReader::new(f)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("harness: {}: {e}", args.file.display());
            return Ok(e.exit_code());
        }
    };
    let id = store_id(&landed);
    match &landed {
        Landed::New(p) => println!("unpacked {id} into {} (verified)", p.display()),
        Landed::AlreadyPresent(p) => {
            println!(
                "{id} is already in the store at {} (same id: same manifest and file hashes; verified intact, not replaced)",
                p.display()
            )
        }
        Landed::ReplacedCorrupt { path, why } => {
            eprintln!(
                "harness: {}: the copy in the store failed verification ({} problem(s): {}); replaced it with the verified copy from {}",
                path.display(),
                why.len(),
                shown(why.join("; ").as_bytes()),
                args.file.display()
            );
            println!(
                "unpacked {id} into {} (verified), replacing a corrupt copy that failed verification",
                path.display()
            )
        }
    }
    if let Some(loc) = &remote {
        let bucket = crate::remote::open(loc)?;
        let dir = store.bundles_dir().join(&id);
        let p = crate::remote::publish::publish(&bucket, Some(&store), &dir).map_err(|e| {
            anyhow::anyhow!(
                "{e} (the bundle is in {}; `harness recover --store {loc}` publishes it)",
                store.root().display()
            )
        })?;
        println!(
            "published {id} -> {} ({} objects written, {} already there)",
            loc.bundle_url(&id),
            p.written,
            p.present
        );
    }
    Ok(exit::OK)
}

/// The bundle id of where `l` landed (the directory's name).
fn store_id(l: &Landed) -> String {
    let p = match l {
        Landed::New(p) | Landed::AlreadyPresent(p) => p,
        Landed::ReplacedCorrupt { path, .. } => path,
    };
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
