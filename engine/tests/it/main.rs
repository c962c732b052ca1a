//! The engine's end-to-end tests, one binary: the real `engine` binary and the
//! library on real files. `cargo test -p engine --test it MODULE::` runs one
//! module (e.g. `goldens::`, `render::`); every test's name is its module and
//! function (`render::rung0_renders_...`).
//!
//! Tests that render through the binary take [`common::exclusive`], so their
//! timing checks do not measure each other on a small machine; the one that
//! reads the process's peak RSS runs itself in a child process.

mod common;
mod cuda_render;
mod device_rungs;
mod fuzz_safetensors;
mod goldens;
mod layout;
mod profiles;
mod release_pages;
mod render;
mod single_file;
mod tiny_render;
mod widen_rss;
