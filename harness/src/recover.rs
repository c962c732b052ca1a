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
pub fn run(args: RecoverArgs) -> anyhow::Result<u8> {
    let store = args.store.open()?;
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
    if outcomes.is_empty() {
        println!("nothing to recover in {}", store.root().display());
    }
    Ok(if failed > 0 { exit::INTERNAL } else { exit::OK })
}
