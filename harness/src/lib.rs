//! The harness as a library: the `harness` binary is a thin dispatch over these
//! modules, and benchmarks and integration tests call them directly. Every
//! subcommand's module holds its clap arguments and its entry point.
//!
//! Subcommands:
//!
//! * [`run`]: `harness run`: gates, the engine under sampler and watchdog, the seal.
//! * [`control`]: `harness control`, the instrument's positive controls.
//! * [`campaign`]: `harness campaign`, interleaved, resumable lever campaigns: the
//!   plan, the budget, the execution, each position a child `harness run`.
//! * [`rank`]: `harness rank`, the lever ranking re-derived from bundles.
//! * [`diff`]: `harness diff`, two bundles side by side.
//! * [`report`]: `harness report`, one self-contained page per store for reviewers:
//!   the ranking, its forest plot, the fit, every bundle, each pair's timelines
//!   and diff.
//! * [`ls`], [`show`], [`verify`], [`recover`]: the store's bundle commands.
//! * [`view`]: `harness plot` and `harness export`, a [`timeline`] written in one
//!   of the [`formats`] (a picture, a Perfetto trace).
//! * [`pack`]: `harness pack` and `harness unpack`, one bundle as one verifiable file.
//!
//! What they share:
//!
//! * [`bundle`]: reading sealed bundles (manifest, tables, many at once with
//!   polars): the one path every command opens a bundle by.
//! * [`store_arg`]: the `--store` option and the one bundle-id resolver.
//! * [`summary`]: the manifest fields `ls` and `show` print.
//! * [`sampler`]: the fixed-cadence sampler thread and its readers (procfs, NVML,
//!   page cache).
//! * [`watchdog`]: the memory watchdog (H1): its limits, its positive control, the
//!   probe.
//! * [`classify`]: why a run ended (the `exit` fragment of `harness run`).
//! * [`completion`]: the pixel completion check on `video.y4m`.
//! * [`weights`]: the run's weights, their digest, synthesis into the cache;
//!   [`weights_cache`] their page-cache state at engine start.
//! * [`levers_spec`]: `specs/levers.toml`, the levers and their hypotheses.
//! * [`harness_levers`]: levers the harness applies itself (`observer`), never
//!   passed to the engine.
//! * [`progress`]: the live status of a render, redrawn on a terminal, one line per
//!   event elsewhere.
//! * [`exit`]: the binary's stable exit codes and the error kinds that select them.
//! * [`closed_stdout`]: a closed standard output ends a command quietly.
//! * [`units`]: byte quantities as people type them; [`short_id`]: ids as printed.

pub mod bundle;
pub mod cache_dir;
pub mod campaign;
pub mod classify;
pub mod closed_stdout;
pub mod completion;
pub mod control;
pub mod diff;
pub mod escape;
pub mod exit;
pub mod formats;
pub mod gate;
pub mod harness_levers;
pub mod levers_spec;
pub mod ls;
pub mod pack;
pub mod progress;
pub mod rank;
pub mod recover;
pub mod redact;
pub mod remote;
pub mod report;
pub mod run;
pub mod sampler;
pub mod short_id;
pub mod show;
pub mod store_arg;
pub mod summary;
pub mod timeline;
pub mod units;
pub mod verify;
pub mod view;
pub mod watchdog;
pub mod weights;
pub mod weights_cache;
