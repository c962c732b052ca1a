//! `harness ls`: one line per bundle in the store.

use clap::Args;

use crate::exit;
use crate::store_arg::{classify, StoreArg};
use crate::summary::BundleSummary;

/// List the bundles: id, rung, levers, exit, wall, date, host (oldest first).
/// An exit marked `*` is an incomplete bundle.
#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0; a bundle whose manifest cannot be read is reported on stderr.
pub fn run(args: LsArgs) -> anyhow::Result<u8> {
    let store = args.store.open()?;
    let mut rows = Vec::new();
    for id in store.bundle_ids().map_err(classify)? {
        match BundleSummary::load(&store.bundles_dir().join(&id)) {
            Ok(s) => rows.push(s),
            Err(e) => eprintln!("harness: {id}: unreadable manifest: {e:#}"),
        }
    }
    rows.sort_by(|a, b| a.date_unix_s.cmp(&b.date_unix_s).then(a.id.cmp(&b.id)));
    println!(
        "{:<12}  {:<8} {:<28} {:<16} {:>9}  {:<16}  host",
        "id", "rung", "levers", "exit", "wall", "date (UTC)"
    );
    for s in &rows {
        println!(
            "{:<12}  {:<8} {:<28} {:<16} {:>9}  {:<16}  {}",
            &s.id[..12.min(s.id.len())],
            s.rung(),
            s.levers(),
            s.exit(),
            s.wall(),
            s.date(),
            s.host()
        );
    }
    if rows.is_empty() {
        println!("(no bundles in {})", store.root().display());
    }
    Ok(exit::OK)
}
