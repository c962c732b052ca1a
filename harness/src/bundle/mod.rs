//! Reading sealed bundles: the one path by which a command opens a bundle's
//! manifest and tables (`rank`, `diff`, `show`, `ls`, `plot`, `export`,
//! `campaign`, and `run` reading back what it sealed). Every read goes through
//! [`files`], and only bundles that verified are read
//! ([`crate::verification`]: every hash, schema and count checked first, or file
//! by file for a bucket). `verify` and `pack` read through `evidence::verify`,
//! which checks every hash itself.
//!
//! * [`files`]: a bundle's files by name, and the bundle directories of a store.
//! * [`manifest`]: `manifest.json` as JSON, as the typed manifest, or as facts;
//!   the weights' page-cache state at engine start.
//! * [`tables`]: one bundle's Parquet tables with Arrow: record batches, JSON rows,
//!   the phase table text.
//! * [`scan`]: many bundles' phases and samples at once with polars, into facts.
//! * [`facts`]: what rank, diff and campaign know about one bundle, as plain data.
//! * [`error`]: the typed errors of all of these, each naming its file.

pub mod error;
pub mod facts;
pub mod files;
pub mod manifest;
pub mod scan;
pub mod tables;
