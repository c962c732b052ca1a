//! `harness verify ID|PATH`: re-read every file of a bundle and check it.

use clap::Args;

use crate::exit;
use crate::store_arg::{find_bundle, StoreArg};

/// Re-read every file of a bundle, recompute every hash, check every schema.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    #[command(flatten)]
    pub store: StoreArg,
    /// Print the result as one JSON object: {id, dir, ok, files, errors: [text]}.
    /// Exit 0 when ok, 1 when a check failed, 2 for an unknown or ambiguous id.
    #[arg(long)]
    pub json: bool,
}

/// Exit 0 when every check passes, 1 (naming each file at fault) when not.
pub fn run(args: VerifyArgs) -> anyhow::Result<u8> {
    let dir = find_bundle(&args.store, &args.bundle)?;
    let report = evidence::verify::verify_dir(&dir);
    if args.json {
        let v = serde_json::json!({
            "id": report.id,
            "dir": dir,
            "ok": report.ok(),
            "files": report.files,
            "errors": report.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
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
