//! `engine`: the LTX-Video render engine's command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use engine::cuda::{self, CudaError};

#[derive(Parser)]
#[command(name = "engine", version, about = "LTX-Video render engine")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check every CUDA kernel and the device DiT forward against the f32 host
    /// reference; with --bench also run the device benchmarks.
    SelftestCuda {
        /// Also run the benchmarks (`just bench-gpu`).
        #[arg(long)]
        bench: bool,
        /// Scratch directory for synthetic weight files (durable, a few GB free).
        #[arg(long, default_value = "target/selftest-cuda")]
        scratch: PathBuf,
    },
    /// A known bf16 GEMM load for S seconds (the GPU-utilization control).
    Burn {
        /// Seconds of load.
        #[arg(long)]
        seconds: f64,
    },
}

/// Exit code of a render or device failure.
const EXIT_FAILURE: u8 = 1;
/// Exit code of bad arguments or no usable device.
const EXIT_USAGE: u8 = 2;

fn cuda_exit(e: &CudaError) -> ExitCode {
    eprintln!("engine: {e}");
    match e {
        CudaError::NotAvailable(_) | CudaError::Invalid(_) => ExitCode::from(EXIT_USAGE),
        _ => ExitCode::from(EXIT_FAILURE),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::SelftestCuda { bench, scratch } => {
            match cuda::selftest::run(&cuda::selftest::SelftestOptions { scratch, bench }) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(EXIT_FAILURE),
                Err(e) => cuda_exit(&e),
            }
        }
        Cmd::Burn { seconds } => match cuda::burn::burn(seconds) {
            Ok(r) => {
                println!(
                    "burn: {} GEMMs of {n}x{n}x{n} bf16 in {:.2} s wall, {:.1} ms device, {:.1} TFLOP/s",
                    r.gemms,
                    r.wall_s,
                    r.device_ms,
                    r.tflops,
                    n = cuda::burn::N
                );
                ExitCode::SUCCESS
            }
            Err(e) => cuda_exit(&e),
        },
    }
}
