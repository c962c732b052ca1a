//! The harness as a library: the `harness` binary is a thin layer over these modules,
//! and benchmarks and integration tests call them directly.
//!
//! * [`bundle`]: reading sealed bundles (manifest, tables, many at once with
//!   polars): the one path every command opens a bundle by.
//! * [`campaign`]: interleaved, resumable lever campaigns (`harness campaign`): the
//!   plan, the budget, the execution, each position a child `harness run`.
//! * [`classify`]: why a run ended (the `exit` fragment of `harness run`).
//! * [`completion`]: the pixel completion check on `video.y4m`.
//! * [`control`]: the instrument's positive controls (`harness control`).
//! * [`diff`]: two bundles side by side (`harness diff`).
//! * [`exit`]: the binary's stable exit codes and the error kinds that select them.
//! * [`levers_spec`]: `specs/levers.toml`, the levers and their hypotheses.
//! * [`rank`]: the lever ranking re-derived from bundles (`harness rank`).
//! * [`run`]: `harness run`: gates, the engine under sampler and watchdog, the seal.
//! * [`sampler`]: the fixed-cadence sampler thread and its readers (procfs, NVML,
//!   page cache).
//! * [`units`]: byte quantities as people type them.
//! * [`verify`], [`recover`], [`ls`], [`show`]: the store's bundle commands;
//!   [`store_arg`] their `--store` option, [`summary`] the manifest fields they print.
//! * [`watchdog`]: the memory watchdog (H1) and its positive control.
//! * [`weights`]: the run's weights, their digest, synthesis into the cache.
//! * [`pack`]: one bundle as one verifiable file (`harness pack`, `harness unpack`).
//! * [`progress`]: the live status of a render (`harness run`), redrawn on a terminal,
//!   one line per event elsewhere.
//! * [`timeline`]: a bundle read onto one time axis; [`formats`] writes it as a
//!   picture or a Perfetto trace; [`view`] holds `harness plot` and `harness export`.

pub mod bundle;
pub mod campaign;
pub mod classify;
pub mod completion;
pub mod control;
pub mod diff;
pub mod exit;
pub mod formats;
pub mod levers_spec;
pub mod ls;
pub mod pack;
pub mod progress;
pub mod rank;
pub mod recover;
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
