//! One array task's identity: the array's job id and the task's index (the
//! campaign round it runs), from the variables Slurm sets, and the lease every
//! run of the task records (`slurm:<job>_<index>`, Slurm's own name for an
//! array element), which satisfies a rung's `require.lease` (H3: the Slurm job
//! is the lease the machine was granted under).

use crate::campaign::slurm::error::SlurmError;

/// The variable holding the array's job id.
pub const JOB_VAR: &str = "SLURM_ARRAY_JOB_ID";
/// The variable holding the task's array index.
pub const TASK_VAR: &str = "SLURM_ARRAY_TASK_ID";

/// An array task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayTask {
    /// The array's job id.
    pub job: u64,
    /// The array index: the campaign round this task runs (1-based).
    pub round: u32,
}

impl ArrayTask {
    /// The task from this process's environment.
    pub fn from_env() -> Result<ArrayTask, SlurmError> {
        ArrayTask::from_values(
            std::env::var(JOB_VAR).ok().as_deref(),
            std::env::var(TASK_VAR).ok().as_deref(),
        )
    }

    /// The task from the two variables' values (`None`: not set).
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
        Ok(ArrayTask { job, round })
    }

    /// The lease id its runs record: `slurm:<job>_<round>`.
    pub fn lease_id(&self) -> String {
        format!("slurm:{}_{}", self.job, self.round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_and_its_lease_come_from_slurms_variables() {
        let t = ArrayTask::from_values(Some("812"), Some("3")).unwrap();
        assert_eq!(t, ArrayTask { job: 812, round: 3 });
        assert_eq!(t.lease_id(), "slurm:812_3");
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
