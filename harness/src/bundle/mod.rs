//! Reading sealed bundles: the one path by which a command opens a bundle's
//! manifest and tables (`rank`, `diff`, `show`, `ls`, `plot`, `export`,
//! `campaign`, and `run` reading back what it sealed). Every read goes through
//! [`files`], so a check that should hold for every reader (a later change adds
//! hash verification against the manifest) has one place to live. `verify` and
//! `pack` read through `evidence::verify`, which checks every hash itself.
//!
//! * [`files`]: a bundle's files by name, and the bundle directories of a store.
//! * [`manifest`]: `manifest.json` as JSON, as the typed manifest, or as facts;
//!   the weights' page-cache state at engine start.
//! * [`tables`]: one bundle's Parquet tables with Arrow: record batches, JSON rows,
//!   the phase table text.
//! * [`scan`]: many bundles' phases and samples at once with polars, into facts.
//! * [`facts`]: what rank, diff and campaign know about one bundle, as plain data.
//! * [`verified`]: every bundle a command reads is verified first (cached per
//!   store by the files' stamps); one that fails is excluded or refused.
//! * [`error`]: the typed errors of all of these, each naming its file.

pub mod error;
pub mod facts;
pub mod files;
pub mod manifest;
pub mod scan;
pub mod tables;
