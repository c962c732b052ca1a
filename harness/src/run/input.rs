//! The engine's verdict on the run's input, asked before anything is opened:
//! `ENGINE plan --rung R --lever ... --json` exits 2 for an unknown preset, lever
//! or arm (and anything else about the rung it refuses), and that is a usage
//! error of this run (exit 2), not a weights or headroom gate refusal, and leaves
//! no staging directory behind.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::exit::UsageError;

/// The engine's exit code for bad input (`engine/src/cli.rs`, `EXIT_BAD_INPUT`).
pub const ENGINE_BAD_INPUT: i32 = 2;

/// Ask `engine` whether it accepts `rung` with `lever_args`. `Ok` unless the
/// engine answers "bad input" (exit 2): a missing or broken engine, or any other
/// failure, is left to the gates that judge the engine and the plan.
pub fn check(engine: &Path, rung: &Path, lever_args: &[String]) -> anyhow::Result<()> {
    let mut command = Command::new(engine);
    command
        .arg("plan")
        .arg("--rung")
        .arg(rung)
        .args(lever_args)
        .arg("--json")
        .stdin(Stdio::null());
    let Ok(out) = crate::text_busy::retry_while_text_busy(|| command.output()) else {
        return Ok(());
    };
    if out.status.code() != Some(ENGINE_BAD_INPUT) {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let why = stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(it printed nothing)");
    let why = why.strip_prefix("engine: error: ").unwrap_or(why);
    Err(UsageError(format!(
        "{}: the engine refuses this input: {why}",
        rung.display()
    ))
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn engine() -> Option<PathBuf> {
        let e = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/engine");
        e.is_file().then_some(e)
    }

    #[test]
    fn an_unknown_lever_or_preset_is_a_usage_error_naming_it() {
        let Some(e) = engine() else {
            panic!("target/debug/engine is missing: cargo build -p engine --bins (cargo test --workspace builds it)");
        };
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let rung = repo.join("rungs/0.toml");
        check(&e, &rung, &[]).unwrap();
        let err = check(&e, &rung, &["--lever".into(), "nosuch=x".into()]).unwrap_err();
        assert!(err.is::<UsageError>());
        let msg = err.to_string();
        assert!(
            msg.contains("rungs/0.toml") && msg.contains("unknown lever 'nosuch'"),
            "{msg}"
        );
        let err = check(&e, &rung, &["--lever".into(), "staging=nosuch".into()]).unwrap_err();
        assert!(err.to_string().contains("no arm 'nosuch'"), "{err}");
        // A missing engine is for the engine gate to judge.
        check(Path::new("/nonexistent/engine"), &rung, &[]).unwrap();
    }
}
