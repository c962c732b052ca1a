//! One file per subcommand: its clap arguments and its `run`. `main.rs` only
//! dispatches to these; nothing outside `cmd/` is a subcommand.

pub mod alloc_probe;
pub mod campaign;
pub mod control;
pub mod diff;
pub mod export;
pub mod ls;
pub mod pack;
pub mod plot;
pub mod rank;
pub mod recover;
pub mod report;
pub mod run;
pub mod show;
pub mod sync;
pub mod unpack;
pub mod verify;
