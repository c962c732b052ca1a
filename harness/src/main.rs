//! `harness`: drives engines, samples the machine, seals evidence bundles, and
//! re-derives the lever ranking from them. See the README for the commands.

use clap::{Parser, Subcommand};
use harness::cmd::{
    alloc_probe, campaign, control, diff, export, ls, pack, plot, rank, recover, report, run, show,
    sync, unpack, verify,
};
use harness::exit;

/// Measure GPU video renders and keep the evidence.
#[derive(Parser)]
#[command(name = "harness", version, about, long_about = None, after_help = exit::HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Every subcommand; each lives in its own module with its own argument struct.
#[derive(Subcommand)]
enum Command {
    /// Render a rung (or run any protocol-speaking engine) under the instrument and seal a bundle.
    Run(run::RunArgs),
    /// Run the instrument's positive controls (GPU utilization under burn, the watchdog).
    Control(control::ControlArgs),
    /// Re-read every file of a bundle and check every hash and schema (exit 1 on any fault).
    Verify(verify::VerifyArgs),
    /// Seal every dead run's staging directory as an incomplete bundle.
    Recover(recover::RecoverArgs),
    /// List the bundles in the store.
    Ls(ls::LsArgs),
    /// Print a bundle's manifest summary and phase table.
    Show(show::ShowArgs),
    /// Re-derive the lever ranking from the bundles in a store (reports/levers.md).
    Rank(rank::RankArgs),
    /// Compare two bundles: phases, manifest differences, samples, exit, completion.
    Diff(diff::DiffArgs),
    /// Write one self-contained page per store: ranking, forest plot, fit, every
    /// bundle, each pair's timelines and diff.
    Report(report::ReportArgs),
    /// Interleave every selected lever's arms round by round (ABBA or seeded random).
    Campaign(campaign::CampaignArgs),
    /// (internal) the watchdog control's allocating child.
    #[command(name = "__alloc-probe", hide = true)]
    AllocProbe(alloc_probe::AllocProbeArgs),
    /// Draw a bundle's timeline (phases, GPU, power, memory, CPU) as PNG or SVG.
    Plot(plot::PlotArgs),
    /// Write a bundle's timeline as a Perfetto trace (Trace Event JSON).
    Export(export::ExportArgs),
    /// Pack one bundle into one file (tar + zstd) that carries every hash.
    Pack(pack::PackArgs),
    /// Check a pack's every entry and hash, then add its bundle to the store atomically.
    Unpack(unpack::UnpackArgs),
    /// Copy every bundle of one store into another (directories and s3:// buckets,
    /// either way), verifying as it goes; idempotent.
    Sync(sync::SyncArgs),
}

fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Run(a) => run::run(&a),
        Command::Control(a) => control::run(&a),
        Command::Verify(a) => verify::run(a),
        Command::Recover(a) => recover::run(a),
        Command::Ls(a) => ls::run(a),
        Command::Show(a) => show::run(a),
        Command::Rank(a) => rank::run(&a),
        Command::Diff(a) => diff::run(&a),
        Command::Report(a) => report::run(&a),
        Command::Campaign(a) => campaign::run(&a),
        Command::AllocProbe(a) => Ok(alloc_probe::run(&a)),
        Command::Plot(a) => plot::run(a),
        Command::Export(a) => export::run(a),
        Command::Pack(a) => pack::run(a),
        Command::Unpack(a) => unpack::run(a),
        Command::Sync(a) => sync::run(&a),
    }
}

fn main() {
    harness::closed_stdout::install();
    let cli = Cli::parse();
    let code = match dispatch(cli) {
        Ok(code) => code,
        // The reader went away (`| head`): nobody is left to tell.
        Err(err) if harness::closed_stdout::is_closed_output(&err) => exit::INTERNAL,
        Err(err) => {
            // No credentials of a URL (`--store`, `AWS_ENDPOINT_URL`) in any message.
            eprintln!(
                "harness: error: {}",
                harness::redact::urls(&format!("{err:#}"))
            );
            exit::code_for(&err)
        }
    };
    std::process::exit(i32::from(code));
}
