//! What `harness report` ([`crate::cmd::report`]: store, rank, write, swap in)
//! builds: one self-contained directory per store for reviewers, made from the same
//! ranking `harness rank` prints.
//!
//! * [`outdir`]: the `--out` directory: refused unless new, empty or made by an
//!   earlier `harness report`, staged beside it and swapped in whole;
//! * [`artifacts`]: every bundle's timeline (SVG) and every pair's diff (HTML);
//!
//! `index.html`, the page that links them, is [`crate::formats::html`], with the
//! forest plot ([`crate::formats::forest`]) inline.
//!
//! Promise: the same store (and spec, and `--out` as typed) gives the same bytes
//! in every file: bundles are sorted, no clock is read, and every picture is
//! deterministic.

pub mod artifacts;
pub mod outdir;
