//! What can go wrong between a campaign and Slurm, each naming the command and
//! what was expected.

use std::path::PathBuf;

/// An error of the Slurm scheduler.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// A Slurm client command could not be started (not on PATH, not executable).
    #[error(
        "--scheduler slurm needs Slurm's `{program}` on PATH (the client commands sbatch, \
         squeue and sacct: Debian's slurm-client, or the cluster's module), and it could \
         not be started: {why}"
    )]
    NotFound {
        /// The command (`sbatch`, `squeue`, `sacct`).
        program: &'static str,
        /// The operating system's reason.
        why: String,
    },
    /// A Slurm command ran and exited non-zero.
    #[error("`{command}` exited {status}: {stderr}")]
    Failed {
        /// The command line, as run.
        command: String,
        /// Its exit status.
        status: String,
        /// What it said on stderr (trimmed).
        stderr: String,
    },
    /// A Slurm command printed something this harness does not understand.
    #[error("`{command}` printed {output:?}; expected {expected}")]
    Unexpected {
        /// The command line, as run.
        command: String,
        /// What it printed (trimmed).
        output: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A value passed through to `#SBATCH` cannot be written into the script.
    #[error("--{option} {value:?}: {why}")]
    Option {
        /// The option (`partition`, `gres`, `time`).
        option: &'static str,
        /// The value given.
        value: String,
        /// What was expected.
        why: &'static str,
    },
    /// An array task's environment lacks what Slurm sets.
    #[error(
        "an array task of `harness campaign --scheduler slurm` reads its job and round from \
         Slurm: {var} {problem} (it runs inside the sbatch array the campaign submits)"
    )]
    NotInTask {
        /// The variable (`SLURM_ARRAY_JOB_ID`, `SLURM_ARRAY_TASK_ID`).
        var: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The campaign's directory or script could not be written.
    #[error("{file}: {source}")]
    Write {
        /// The file or directory.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}
