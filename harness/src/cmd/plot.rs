//! `harness plot` and `harness export`: a bundle's timeline written in one of the
//! [`crate::formats`] (a PNG or SVG picture, a Perfetto trace).

use std::path::PathBuf;

use clap::Args;

use crate::exit::{self, UsageError};
use crate::formats::{self, Format};
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

fn write(t: &Timeline, format: &dyn Format, out: &std::path::Path) -> anyhow::Result<u8> {
    let bytes = format.encode(t)?;
    formats::write_file(out, &bytes)?;
    let said = format!(
        "wrote {} ({} {}, {} bytes) for bundle {}",
        if formats::is_stdout(out) {
            "standard output".to_string()
        } else {
            out.display().to_string()
        },
        format.name(),
        format.extension(),
        bytes.len(),
        t.id
    );
    // With `--out -` standard output holds the file alone.
    if formats::is_stdout(out) {
        eprintln!("{said}");
    } else {
        println!("{said}");
    }
    Ok(exit::OK)
}

/// Exit 0 with the file written; 2 for an unknown bundle or an unsupported extension.
pub fn plot(args: PlotArgs) -> anyhow::Result<u8> {
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
        Some("png") => write(&t, &formats::plot::Png { width: args.width }, &out),
        Some("svg") => write(&t, &formats::plot::Svg { width: args.width }, &out),
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

/// Exit 0 with the file written; 2 for an unknown bundle.
pub fn export(args: ExportArgs) -> anyhow::Result<u8> {
    let dir = find_verified_bundle(&args.store, &args.bundle)?;
    let t = Timeline::load(&dir)?;
    let out = args
        .out
        .unwrap_or_else(|| formats::default_out(&t.id, "perfetto.json"));
    write(&t, &formats::perfetto::TraceEventJson, &out)
}
