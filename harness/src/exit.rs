//! The harness's exit codes, stable and documented in the README.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (a run: completed; verify: every check passed) |
//! | 1 | the command ran and its answer is negative (a run not completed, a bundle that fails verify, a control that failed) |
//! | 2 | usage or input error (bad arguments, malformed rung file, unknown bundle id) |
//! | 3 | refused by a gate (volatile store, missing lease id, a CUDA rung without a usable GPU, no headroom, a run whose watchdog control failed) |
//! | 4 | the harness itself failed (I/O error, full disk, internal error; a control whose instrument could not measure) |

/// The exit codes as `harness --help` prints them (after the command list).
pub const HELP: &str = "\
Exit codes (stable; the same with --json, whose document goes to stdout and errors to stderr):
  0  success: a run completed, verify passed, the file was written, the bundle is in the store
  1  the command ran and the answer is negative: a run not completed, a control that
     failed, a bundle that fails verify (or that pack refuses for it), a pack whose
     files do not verify on unpack
  2  usage or input error: bad arguments, unknown or ambiguous bundle id, malformed rung
     file, a malformed or hostile pack (traversal, link, duplicate, oversize,
     tar extension header), an empty store to report, a report --out directory
     that harness report did not make
  3  refused by a gate: volatile store, missing lease id, a CUDA rung without a GPU,
     no headroom, a run whose watchdog control failed
  4  the harness itself failed: I/O error, full disk, internal error; a control whose
     instrument could not measure (instrument-error: no verdict on the GPU)";

/// Success.
pub const OK: u8 = 0;
/// The command ran and its answer is negative.
pub const NEGATIVE: u8 = 1;
/// Usage or input error.
pub const USAGE: u8 = 2;
/// Refused by a gate.
pub const REFUSED: u8 = 3;
/// The harness itself failed.
pub const INTERNAL: u8 = 4;

/// An input error: a bad argument, file or id. Exit code [`USAGE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The command ran and its answer is negative (a bundle that does not verify,
/// asked to be read). Exit code [`NEGATIVE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Negative(pub String);

/// A gate refused to proceed. Exit code [`REFUSED`].
#[derive(Debug, thiserror::Error)]
#[error("refused by gate '{gate}': {why}")]
pub struct Refusal {
    /// The gate's name (`store-durable`, `lease`, `headroom`, ...).
    pub gate: String,
    /// What was found and what is required.
    pub why: String,
}

/// The exit code for an error that ended a command.
pub fn code_for(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.is::<Refusal>()) {
        REFUSED
    } else if err.chain().any(|e| e.is::<Negative>()) {
        NEGATIVE
    } else if err.chain().any(|e| e.is::<UsageError>()) {
        USAGE
    } else {
        INTERNAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_help_text_lists_every_code_with_its_value() {
        for (code, word) in [
            (OK, "success"),
            (NEGATIVE, "negative"),
            (USAGE, "usage"),
            (REFUSED, "gate"),
            (INTERNAL, "harness itself"),
        ] {
            let line = HELP
                .lines()
                .find(|l| l.starts_with(&format!("  {code}  ")))
                .unwrap_or_else(|| panic!("no line for exit code {code}"));
            assert!(line.contains(word), "exit {code}: {line}");
        }
    }

    #[test]
    fn codes_follow_the_error_kind_through_context() {
        let r: anyhow::Result<()> = Err(Refusal {
            gate: "lease".into(),
            why: "no lease id".into(),
        }
        .into());
        assert_eq!(code_for(&r.context("starting run").unwrap_err()), REFUSED);
        let u: anyhow::Error = UsageError("bad".into()).into();
        assert_eq!(code_for(&u), USAGE);
        assert_eq!(code_for(&anyhow::anyhow!("disk full")), INTERNAL);
    }
}
