//! Slurm's client commands as a campaign uses them: `sbatch` submits the array,
//! `squeue` and `sacct` say what became of its tasks. Each is run by name from
//! PATH (with `SLURM_CONF` and the rest of the environment as given), and its
//! output parsed here; a command that cannot be started or fails is a
//! [`SlurmError`] naming it.

use std::path::Path;
use std::process::Command;

use crate::campaign::slurm::error::SlurmError;

/// One array task as Slurm reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskState {
    /// The array's job id (`SLURM_ARRAY_JOB_ID`).
    pub job: u64,
    /// The array index (`SLURM_ARRAY_TASK_ID`): the round.
    pub task: u32,
    /// Slurm's state (`PENDING`, `RUNNING`, `COMPLETED`, `CANCELLED`, `FAILED`, ...).
    pub state: String,
    /// The node it ran on (empty while pending).
    pub node: String,
    /// Which command said so: `squeue` or `sacct`.
    pub source: &'static str,
}

/// What `sacct` could say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accounting {
    /// Its rows for the campaign's tasks.
    Rows(Vec<TaskState>),
    /// The cluster keeps no accounting (no slurmdbd): what sacct said.
    Disabled(String),
}

/// Run `program args`, returning its stdout; `NotFound` when it cannot be started,
/// `Failed` when it exits non-zero.
fn run(program: &'static str, args: &[String]) -> Result<String, SlurmError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| SlurmError::NotFound {
            program,
            why: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(SlurmError::Failed {
            command: command_line(program, args),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn command_line(program: &str, args: &[String]) -> String {
    std::iter::once(program.to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Submit `script` with `sbatch --parsable`; the array's job id.
pub fn sbatch(script: &Path) -> Result<u64, SlurmError> {
    let args = vec!["--parsable".to_string(), script.display().to_string()];
    let out = run("sbatch", &args)?;
    parse_job_id(&out).ok_or_else(|| SlurmError::Unexpected {
        command: command_line("sbatch", &args),
        output: out.trim().to_string(),
        expected: "a job id (`--parsable`: `ID` or `ID;CLUSTER`)",
    })
}

/// The job id of `sbatch --parsable`'s output (`123` or `123;cluster`).
pub fn parse_job_id(out: &str) -> Option<u64> {
    out.trim().split(';').next()?.trim().parse().ok()
}

/// `JOB_TASK` (an array element, as squeue `-r` and sacct print it) as numbers;
/// `None` for anything else (a job step, a pending range `JOB_[1-3]`).
pub fn parse_task_id(id: &str) -> Option<(u64, u32)> {
    let (job, task) = id.trim().split_once('_')?;
    Some((job.parse().ok()?, task.parse().ok()?))
}

/// The tasks of the arrays named `name` that slurmctld still knows (pending,
/// running, and finished ones for `MinJobAge` seconds): `squeue --name NAME
/// --states=all -r`.
pub fn squeue(name: &str) -> Result<Vec<TaskState>, SlurmError> {
    let args: Vec<String> = ["--noheader", "--array", "--states=all", "--format=%i|%T|%N"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--name={name}")])
        .collect();
    Ok(parse_rows(&run("squeue", &args)?, "squeue"))
}

/// The tasks of the arrays named `name` in the cluster's accounting over the last
/// 30 days (`sacct --name NAME -X -P`), or [`Accounting::Disabled`] where the
/// cluster keeps none.
pub fn sacct(name: &str) -> Result<Accounting, SlurmError> {
    let args: Vec<String> = [
        "--noheader",
        "--parsable2",
        "--allocations",
        "--starttime=now-30days",
        "--format=JobID,State,NodeList",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--name={name}")])
    .collect();
    match run("sacct", &args) {
        Ok(out) => Ok(Accounting::Rows(parse_rows(&out, "sacct"))),
        Err(SlurmError::Failed { stderr, .. })
            if stderr.contains("accounting storage is disabled") =>
        {
            Ok(Accounting::Disabled(stderr))
        }
        Err(e) => Err(e),
    }
}

/// Rows `JOB_TASK|STATE|NODE` (squeue's format above, sacct's `--parsable2`);
/// lines that are not an array element are skipped. sacct's states may carry a
/// suffix (`CANCELLED by 0`): the first word is kept.
pub fn parse_rows(text: &str, source: &'static str) -> Vec<TaskState> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('|');
            let (job, task) = parse_task_id(f.next()?)?;
            let state = f.next()?.split_whitespace().next()?.to_string();
            let node = f.next().unwrap_or("").trim().to_string();
            Some(TaskState {
                job,
                task,
                state,
                node: if node == "(null)" || node == "None assigned" {
                    String::new()
                } else {
                    node
                },
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_and_rows_parse_as_slurm_prints_them() {
        assert_eq!(parse_job_id("42\n"), Some(42));
        assert_eq!(parse_job_id("42;harness-test\n"), Some(42));
        assert_eq!(parse_job_id("Submitted batch job 42"), None);
        assert_eq!(parse_task_id("12_3"), Some((12, 3)));
        assert_eq!(parse_task_id("12_[1-3]"), None);
        assert_eq!(parse_task_id("12_3.batch"), None);
        // squeue -r --states=all (as the test cluster printed it) and sacct -P.
        let sq = "7_2|PENDING|\n7_1|RUNNING|vm\n6_1|COMPLETED|vm\n";
        let rows = parse_rows(sq, "squeue");
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[1],
            TaskState {
                job: 7,
                task: 1,
                state: "RUNNING".into(),
                node: "vm".into(),
                source: "squeue"
            }
        );
        assert_eq!(rows[0].node, "");
        let sa = "9_1|COMPLETED|gpu01\n9_2|CANCELLED by 0|gpu02\n9_[3-4]|PENDING|None assigned\n";
        let rows = parse_rows(sa, "sacct");
        let got: Vec<(u32, &str, &str)> = rows
            .iter()
            .map(|r| (r.task, r.state.as_str(), r.node.as_str()))
            .collect();
        assert_eq!(got, [(1, "COMPLETED", "gpu01"), (2, "CANCELLED", "gpu02")]);
    }

    #[test]
    fn a_missing_command_is_named() {
        // A program name that is on no PATH, through the same runner.
        let e = run("sbatch-that-does-not-exist-38", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`sbatch-that-does-not-exist-38` on PATH") && e.contains("slurm-client"),
            "{e}"
        );
    }
}
