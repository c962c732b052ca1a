//! `engine`: the LTX-Video render engine's command line (see `engine::cli`).

use clap::Parser;

fn main() {
    let cli = engine::cli::Cli::parse();
    let code = match engine::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("engine: error: {err:#}");
            engine::cli::exit_code(&err)
        }
    };
    std::process::exit(code);
}
