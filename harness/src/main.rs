//! `harness`: drives engines, samples the machine, seals evidence bundles, and
//! re-derives the lever ranking from them. See the README for the commands.

use clap::{Parser, Subcommand};

use harness::exit;

/// Measure GPU video renders and keep the evidence.
#[derive(Parser)]
#[command(name = "harness", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Every subcommand; each lives in its own module with its own argument struct.
#[derive(Subcommand)]
enum Command {
    /// (internal) the watchdog control's allocating child.
    #[command(name = "__alloc-probe", hide = true)]
    AllocProbe {
        /// STEP EVERY_MS REPORT_AT MAX HOLD_MS
        args: Vec<String>,
    },
}

fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::AllocProbe { args } => Ok(harness::watchdog::alloc_probe_main(&args)),
    }
}

fn main() {
    let cli = Cli::parse();
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("harness: error: {err:#}");
            exit::code_for(&err)
        }
    };
    std::process::exit(i32::from(code));
}
