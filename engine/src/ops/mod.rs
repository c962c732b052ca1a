//! The CPU arm's kernels, one file per family, each pinned by tests against
//! hand-computed values (and, for products and convolutions, a naive loop).
//!
//! Layout conventions: token-major `[rows, channels]` row-major slices for the
//! transformer and T5; channel-first `[C, T, H, W]` (frames `[C, H, W]`) for the
//! VAE. Parallel work goes through rayon's current pool, so the caller's pool
//! size (the `host-threads` lever) bounds the cores used.

pub mod activation;
pub mod attention;
pub mod conv3d;
pub mod embed;
pub mod linear;
pub mod norm;
pub mod rope;
pub mod space;
pub mod t5;
