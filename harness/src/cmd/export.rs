//! `harness export --perfetto`: a bundle's timeline as Trace Event JSON for the
//! Perfetto UI ([`crate::formats::perfetto`]).

use std::path::PathBuf;

use clap::Args;

use crate::formats;
use crate::store_arg::{find_verified_bundle, StoreArg};
use crate::timeline::Timeline;

/// Write a bundle's timeline as a trace another tool opens.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    /// Trace Event JSON for the Perfetto UI (nested phase slices, ticks as instants,
    /// sampler columns as counter tracks).
    #[arg(long, required = true)]
    pub perfetto: bool,
    /// Output file (default `<id12>.perfetto.json`); `-` writes to standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0 with the file written; 2 for an unknown bundle.
pub fn run(args: ExportArgs) -> anyhow::Result<u8> {
    let dir = find_verified_bundle(&args.store, &args.bundle)?;
    let t = Timeline::load(&dir)?;
    let out = args
        .out
        .unwrap_or_else(|| formats::default_out(&t.id, "perfetto.json"));
    formats::write_timeline(&t, &formats::perfetto::TraceEventJson, &out)
}
