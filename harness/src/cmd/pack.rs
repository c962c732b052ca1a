//! `harness pack`: one bundle as one file (tar + zstd) that carries every hash
//! ([`crate::pack`] holds the format), refused when the bundle does not verify.

use std::path::PathBuf;

use clap::Args;

use crate::exit;
use crate::formats;
use crate::pack::pack_bytes;
use crate::store_arg::{find_bundle, StoreArg};

/// Pack one bundle into one file.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    /// Output file (default `<id12>.bundle.tar.zst`); `-` writes to standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0 with the pack written; 1 when the bundle does not verify (nothing written).
pub fn run(args: PackArgs) -> anyhow::Result<u8> {
    let dir = find_bundle(&args.store, &args.bundle)?;
    let report = evidence::verify::verify_dir(&dir);
    if !report.ok() {
        for e in &report.errors {
            eprintln!("harness: {}: {e}", dir.display());
        }
        eprintln!(
            "harness: not packing {}: it fails verification ({} problem(s))",
            report.id,
            report.errors.len()
        );
        return Ok(exit::NEGATIVE);
    }
    let bytes = pack_bytes(&dir, &report.id)?;
    let out = args
        .out
        .unwrap_or_else(|| formats::default_out(&report.id, "bundle.tar.zst"));
    formats::write_file(&out, &bytes)?;
    let said = format!(
        "packed {} ({} files) into {} ({} bytes)",
        report.id,
        report.files,
        if formats::is_stdout(&out) {
            "standard output".to_string()
        } else {
            out.display().to_string()
        },
        bytes.len()
    );
    // With `--out -` standard output holds the pack alone.
    if formats::is_stdout(&out) {
        eprintln!("{said}");
    } else {
        println!("{said}");
    }
    Ok(exit::OK)
}
