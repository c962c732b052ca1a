//! Evidence for GPU video renders.
//!
//! This crate holds everything that both the engine and the harness must agree on,
//! and the bundle format that outlives a run:
//!
//! * [`clock`]: the one clock (CLOCK_MONOTONIC, nanoseconds) that markers and
//!   samples are stamped with.
//! * [`module_graph`]: a crate's module graph and its circles (the layout tests).
//! * [`marker`]: the marker protocol an engine speaks to the harness
//!   (`specs/markers.md`), its parser and an emitter for engines.
//! * [`sample`]: the sampler's column schema, with units and averaging windows.
//! * [`rung`]: the rung file format (`rungs/N.toml`).
//! * [`journal`]: the crash-safe run journal (framed, checksummed, typed records).
//! * [`store`]: the durable store, its gate, staging directories and atomic publish.
//! * [`error`]: the typed errors of the bundle machinery.
//! * [`manifest`]: `manifest.json` (typed sections, canonical JSON, the bundle id).
//! * [`fragments`]: the manifest's fragments, one typed record each (`KEY` and
//!   fields with units), shared by the harness's writers and every reader.
//! * [`phases`]: the phase tree from markers, coverage, containment, exclusivity.
//! * [`bundle_files`]: the names of a bundle's files.
//! * [`parquet_tables`]: the Parquet tables' schemas, fixed writer settings and
//!   checking reader.
//! * [`seal`]: journal -> bundle, deterministic, read back, published atomically.
//! * [`verify`]: re-read a bundle and check every hash, schema and count.
//! * [`recover`]: seal the staging directories of dead runs as incomplete bundles.
//! * [`phase_table`]: the phase table people read.
//!
//! ```
//! use evidence::marker::{parse_marker_line, Marker};
//! let m = parse_marker_line(r#"{"ev":"open","t_ns":5,"name":"load.dit"}"#).unwrap();
//! assert!(matches!(m, Marker::Open { .. }));
//! ```

#![deny(missing_docs)]

pub mod bundle_files;
pub mod clock;
pub mod error;
pub mod fragments;
pub mod journal;
pub mod manifest;
pub mod marker;
pub mod module_graph;
pub mod parquet_tables;
pub mod phase_table;
pub mod phases;
pub mod recover;
pub mod rung;
pub mod sample;
pub mod seal;
pub mod store;
#[cfg(feature = "test-kit")]
pub mod test_kit;
pub mod verify;
pub mod weights_digest;
