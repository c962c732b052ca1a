//! `engine`: the LTX-Video render engine's command line.

fn main() {
    eprintln!("engine: no commands yet");
    std::process::exit(2);
}
