//! `harness recover`: seal every dead run's staging directory as an incomplete bundle.

use clap::Args;
use evidence::recover::{recover_all, Outcome};

use crate::exit;
use crate::store_arg::{classify, StoreArg};

/// Seal every unlocked staging directory (a run that died) as an incomplete
/// bundle with exit reason host-lost or harness-killed, keeping every intact record.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// The store whose staging directories are recovered (`--store`, `$HARNESS_STORE`).
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0 when everything found was sealed (or is still live), 4 when a
/// directory could not be sealed (it is left as it was).
///
/// With `--store s3://...` the local store that stages for the bucket is
/// recovered, then every bundle it still owes the bucket (an upload cut short:
/// its outbox note) and every bundle this call sealed is published; a bundle
/// that cannot be published stays noted (exit 4).
pub fn run(args: RecoverArgs) -> anyhow::Result<u8> {
    let remote = crate::remote::location_of(args.store.store.as_deref())?;
    let store = match &remote {
        Some(_) => crate::remote::local_store()?,
        None => args.store.open()?,
    };
    let outcomes = recover_all(&store).map_err(classify)?;
    let mut failed = 0;
    for o in &outcomes {
        match o {
            Outcome::Sealed {
                staging,
                sealed,
                reason,
            } => println!(
                "sealed {} -> {} ({reason}{})",
                staging.display(),
                sealed.id,
                if sealed.fresh {
                    ""
                } else {
                    ", identical bundle existed"
                }
            ),
            Outcome::Cleaned { staging, id } => {
                println!("cleaned {} (already sealed as {id})", staging.display())
            }
            Outcome::Busy { staging } => {
                println!(
                    "live {} (its run holds the lock; left alone)",
                    staging.display()
                )
            }
            Outcome::Failed { staging, error } => {
                failed += 1;
                eprintln!("harness: cannot recover {}: {error}", staging.display());
            }
        }
    }
    let mut published = 0;
    if let Some(loc) = &remote {
        let bucket = crate::remote::open(loc)?;
        for o in &outcomes {
            if let Outcome::Sealed { sealed, .. } = o {
                crate::remote::publish::note_pending(&store, loc, &sealed.id)?;
            }
        }
        for id in crate::remote::publish::pending(&store, loc)? {
            let dir = store.bundles_dir().join(&id);
            match crate::remote::publish::publish(&bucket, Some(&store), &dir) {
                Ok(p) => {
                    published += 1;
                    println!(
                        "published {} -> {} ({} objects written, {} already there)",
                        id,
                        loc.bundle_url(&id),
                        p.written,
                        p.present
                    );
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("harness: cannot publish {id} to {loc} (still owed): {e}");
                }
            }
        }
    }
    if outcomes.is_empty() && published == 0 && failed == 0 {
        println!("nothing to recover in {}", store.root().display());
    }
    Ok(if failed > 0 { exit::INTERNAL } else { exit::OK })
}
