//! `harness plot`: a bundle's timeline drawn as a PNG or SVG picture
//! ([`crate::formats::plot`]).

use std::path::PathBuf;

use clap::Args;

use crate::exit::UsageError;
use crate::formats;
use crate::store_arg::{find_verified_bundle, StoreArg};
use crate::timeline::Timeline;

/// Draw a bundle's timeline: phases, GPU utilization and power, memory, CPU.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    /// Output file; `.png` or `.svg` picks the format (default `<id12>.timeline.png`);
    /// `-` writes to standard output (SVG unless `--format png`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The picture format, overriding the extension of `--out`: png or svg.
    #[arg(long)]
    pub format: Option<String>,
    /// Picture width in pixels (the height follows from the phase nesting).
    #[arg(long, default_value_t = formats::plot::DEFAULT_WIDTH)]
    pub width: u32,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0 with the file written; 2 for an unknown bundle or an unsupported extension.
pub fn run(args: PlotArgs) -> anyhow::Result<u8> {
    if !(200..=20_000).contains(&args.width) {
        return Err(UsageError(format!(
            "--width {}: expected 200 to 20000 pixels",
            args.width
        ))
        .into());
    }
    let dir = find_verified_bundle(&args.store, &args.bundle)?;
    let t = Timeline::load(&dir)?;
    let out = args
        .out
        .unwrap_or_else(|| formats::default_out(&t.id, "timeline.png"));
    let ext = match &args.format {
        Some(f) => Some(f.to_ascii_lowercase()),
        None if formats::is_stdout(&out) => Some("svg".to_string()),
        None => out
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase),
    };
    match ext.as_deref() {
        Some("png") => formats::write_timeline(&t, &formats::plot::Png { width: args.width }, &out),
        Some("svg") => formats::write_timeline(&t, &formats::plot::Svg { width: args.width }, &out),
        _ if args.format.is_some() => Err(UsageError(format!(
            "--format {}: expected png or svg",
            args.format.as_deref().unwrap_or("")
        ))
        .into()),
        _ => Err(UsageError(format!(
            "--out {}: expected a file name ending in .png or .svg (or --format)",
            out.display()
        ))
        .into()),
    }
}
