//! The harness as a library: the `harness` binary is a thin dispatch over
//! [`cmd`], one file per subcommand (its clap arguments and its `run`), and
//! benchmarks and integration tests call the modules below directly.
//!
//! What the subcommands are made of:
//!
//! * [`run`]: what `harness run` does: gates, the engine under sampler and
//!   watchdog, the seal.
//! * [`control`]: the instrument's positive controls.
//! * [`campaign`]: interleaved, resumable lever campaigns: the plan, the budget,
//!   the execution, each position a child `harness run`.
//! * [`rank`]: the lever ranking re-derived from bundles (arithmetic only).
//! * [`diff`]: two bundles side by side.
//! * [`report`]: one self-contained page per store for reviewers: the ranking, its
//!   forest plot, the fit, every bundle, each pair's timelines and diff.
//! * [`formats`]: every output format, one file each: the ranking's markdown
//!   table, forest SVG and HTML page; a [`timeline`] as a picture or a Perfetto
//!   trace.
//! * [`pack`]: one bundle as one verifiable file.
//! * [`remote`]: the store on the S3 protocol.
//!
//! What they share:
//!
//! * [`bundle`]: reading sealed bundles (manifest, tables, many at once with
//!   polars): the one path every command opens a bundle by.
//! * [`store_arg`]: the `--store` option and the one bundle-id resolver.
//! * [`summary`]: the manifest fields `ls` and `show` print.
//! * [`evidence::fragments`]: the manifest's fragments, one typed record each,
//!   which `run` writes and every reader reads (in the evidence crate, below the
//!   seal, whose readers use them too).
//! * [`sampler`]: the fixed-cadence sampler thread and its readers (procfs, NVML,
//!   page cache).
//! * [`control`] also holds the memory watchdog's (H1) positive control; its
//!   limits are checked by the [`sampler`] on every row.
//! * [`text_busy`]: starting a program just written (ETXTBSY retried).
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

#![deny(missing_docs)]

pub mod bundle;
pub mod cache_dir;
pub mod campaign;
pub mod classify;
pub mod closed_stdout;
pub mod cmd;
pub mod completion;
pub mod control;
pub mod diff;
pub mod escape;
pub mod exit;
pub mod formats;
pub mod gate_verdict;
pub mod harness_levers;
pub mod levers_spec;
pub mod pack;
pub mod progress;
pub mod rank;
pub mod redact;
pub mod remote;
pub mod report;
pub mod run;
pub mod sampler;
pub mod short_id;
pub mod store_arg;
pub mod summary;
#[cfg(any(test, feature = "test-kit"))]
pub mod test_kit;
pub mod text_busy;
pub mod timeline;
pub mod units;
pub mod verification;
pub mod weights;
pub mod weights_cache;
