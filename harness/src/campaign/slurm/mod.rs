//! `harness campaign --scheduler slurm`: a campaign's rounds as a Slurm job array
//! (issue 38), so that a fleet runs them side by side and every run lands in one
//! bucket.
//!
//! * Submitting ([`script`], [`commands::sbatch`]): the plan is made as for a
//!   local campaign (same id, same positions); the rounds that still have a
//!   position not sealed, in the bucket or this machine's store, become the
//!   array's indices (throttled to `--max-parallel` tasks at once where given);
//!   the script is written into the campaign's directory
//!   (`<local store>/campaigns/<id>/`) and submitted.
//! * Each array task ([`task`]) runs `harness campaign ... --slurm-task`: the
//!   same plan, checked to have the same id on its node, cut to its round
//!   ([`crate::campaign::plan::round_only`]: both arms in the campaign's order,
//!   round 1's also the warm-ups), every position already sealed skipped, each
//!   run a child `harness run` with the lease `slurm:<job>_<round>` (which
//!   records the node, `SLURMD_NODENAME`, beside it) that publishes to the
//!   bucket. A task that dies leaves its run's staging
//!   directory, which `harness recover --store s3://...` seals on that node, as
//!   for any dead run; its position is not sealed complete, so a resubmission
//!   runs it again.
//! * `--status` ([`status`]): squeue and sacct ([`commands`]) for the tasks, the
//!   bucket for the positions and, where Slurm no longer says, for the tasks and
//!   their nodes (the runs' leases).

pub mod commands;
pub mod error;
pub mod script;
pub mod status;
pub mod task;

pub use error::SlurmError;
