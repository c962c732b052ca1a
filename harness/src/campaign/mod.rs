//! `harness campaign`: every selected lever's baseline and treatment arms, interleaved
//! round by round on one engine binary, resumable after an interruption.
//!
//! The schedule is a pure function of the campaign's arguments: rounds are the outer
//! loop (so drift spreads over every lever and an interruption leaves whole rounds
//! behind), then rungs, then levers, then the two arms in an order that is either
//! ABBA (baseline first in odd rounds, treatment first in even ones) or drawn per
//! (round, rung, lever) from a ChaCha8 stream seeded with `--seed`. A lever is
//! scheduled only on rungs whose device it applies to. Each run carries its place in
//! the `schedule` manifest fragment `{campaign, round, position, arm, lever, seed}`.
//! A lever with a `with` in the spec (`with = { precision = "fp8" }`) has every one
//! of its runs, both arms and warm-ups, set those other levers' arms too.
//!
//! The campaign id is a hash of everything that shapes the schedule (engine sha256,
//! rung files' sha256, levers and their `with` settings, repeat, order, seed), so the
//! same command on the same binary names the same campaign. Resuming skips every position that already has a
//! sealed, complete bundle of that campaign; an incomplete one is run again.
//!
//! Warm-ups (`--warmup N`; default 1 on a CUDA rung, 0 on a CPU one): N throw-away
//! runs per rung right before its first entry of round 1, with that entry's lever
//! arm, round 0 and `schedule.warmup = true`. They are sealed like any run, so
//! resuming skips those already sealed; rank never pairs them and lists them as
//! warm-ups. Any warm-up is part of the campaign id, so a campaign begun before
//! the flag resumes with `--warmup 0`.
//!
//! A run refused by a gate stops the campaign cleanly: nothing further is started and
//! the outcome says where it stopped and why.
//!
//! * [`plan`]: the schedule, the campaign id, the positions already done.
//! * [`budget`]: `--budget-s`: the walls learned so far and the deadline.
//! * [`execute`]: running the positions through a [`execute::Runner`].
//! * [`runner`]: the real runner, each position a child `harness run`.
//! * [`sealed`]: the bundles a campaign already sealed, in the local store and
//!   in the bucket.
//! * [`slurm`]: the rounds as a Slurm job array across a fleet (`--scheduler
//!   slurm`): the script, the client commands, each task, `--status`.
//!
//! `harness campaign`'s arguments and entry point are [`crate::cmd::campaign`].
//! Dependencies run one way: the command -> slurm, runner, sealed -> execute ->
//! budget -> plan.

pub mod budget;
pub mod execute;
pub mod plan;
pub mod runner;
pub mod sealed;
pub mod slurm;
