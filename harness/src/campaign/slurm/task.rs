//! One array task's identity: the array's job id, the task's index (the
//! campaign round it runs) and the node it runs on, from the variables Slurm
//! sets, and the lease every run of the task records (`slurm:<job>_<index>`,
//! Slurm's own name for an array element), which satisfies a rung's
//! `require.lease` (H3: the Slurm job is the lease the machine was granted
//! under). The node (`SLURMD_NODENAME`) is recorded beside the lease id by
//! every `harness run` that Slurm started ([`node_from_env`]), so that a bundle
//! says where it ran after Slurm has forgotten the job.

use crate::campaign::slurm::error::SlurmError;

/// The variable holding the array's job id.
pub const JOB_VAR: &str = "SLURM_ARRAY_JOB_ID";
/// The variable holding the task's array index.
pub const TASK_VAR: &str = "SLURM_ARRAY_TASK_ID";
/// The variable holding the name of the Slurm node a job runs on (set by slurmd
/// for every job and step it starts).
pub const NODE_VAR: &str = "SLURMD_NODENAME";

/// The Slurm node this process runs on: `SLURMD_NODENAME`, trimmed; `None` when
/// unset or empty (not under Slurm).
pub fn node_from_env() -> Option<String> {
    node_from_value(std::env::var(NODE_VAR).ok().as_deref())
}

/// The node of a `SLURMD_NODENAME` value (`None`: unset).
pub fn node_from_value(v: Option<&str>) -> Option<String> {
    v.map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

/// An array task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayTask {
    /// The array's job id.
    pub job: u64,
    /// The array index: the campaign round this task runs (1-based).
    pub round: u32,
    /// The Slurm node it runs on, where Slurm says (`SLURMD_NODENAME`).
    pub node: Option<String>,
}

impl ArrayTask {
    /// The task from this process's environment.
    pub fn from_env() -> Result<ArrayTask, SlurmError> {
        Ok(ArrayTask {
            node: node_from_env(),
            ..ArrayTask::from_values(
                std::env::var(JOB_VAR).ok().as_deref(),
                std::env::var(TASK_VAR).ok().as_deref(),
            )?
        })
    }

    /// The task from the job and index variables' values (`None`: not set);
    /// no node.
    pub fn from_values(job: Option<&str>, task: Option<&str>) -> Result<ArrayTask, SlurmError> {
        let parse = |var: &'static str, v: Option<&str>| -> Result<u64, SlurmError> {
            let v = v.ok_or(SlurmError::NotInTask {
                var,
                problem: "is not set".into(),
            })?;
            v.trim().parse().map_err(|_| SlurmError::NotInTask {
                var,
                problem: format!("is {v:?}, not a number"),
            })
        };
        let job = parse(JOB_VAR, job)?;
        let round = u32::try_from(parse(TASK_VAR, task)?)
            .ok()
            .filter(|r| *r >= 1)
            .ok_or(SlurmError::NotInTask {
                var: TASK_VAR,
                problem: "is not a round (1 or more)".into(),
            })?;
        Ok(ArrayTask {
            job,
            round,
            node: None,
        })
    }

    /// The lease id its runs record: `slurm:<job>_<round>`.
    pub fn lease_id(&self) -> String {
        format!("slurm:{}_{}", self.job, self.round)
    }
}

/// The job and round of a lease id `slurm:<job>_<round>` (what a task's runs
/// record); `None` for any other lease.
pub fn parse_lease_id(id: &str) -> Option<(u64, u32)> {
    crate::campaign::slurm::commands::parse_task_id(id.strip_prefix("slurm:")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_and_its_lease_come_from_slurms_variables() {
        let t = ArrayTask::from_values(Some("812"), Some("3")).unwrap();
        assert_eq!(
            t,
            ArrayTask {
                job: 812,
                round: 3,
                node: None
            }
        );
        assert_eq!(t.lease_id(), "slurm:812_3");
        assert_eq!(parse_lease_id(&t.lease_id()), Some((812, 3)));
        assert_eq!(parse_lease_id("812_3"), None, "not a Slurm lease");
        assert_eq!(parse_lease_id("slurm:812"), None);
        assert_eq!(node_from_value(Some(" n2\n")), Some("n2".to_string()));
        assert_eq!(node_from_value(Some("")), None);
        assert_eq!(node_from_value(None), None);
        for (job, task, want) in [
            (None, Some("1"), "SLURM_ARRAY_JOB_ID is not set"),
            (Some("8"), None, "SLURM_ARRAY_TASK_ID is not set"),
            (
                Some("x"),
                Some("1"),
                "SLURM_ARRAY_JOB_ID is \"x\", not a number",
            ),
            (Some("8"), Some("0"), "SLURM_ARRAY_TASK_ID is not a round"),
        ] {
            let e = ArrayTask::from_values(job, task).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
