//! The LTX-Video render engine.
//!
//! A CPU reference arm ([`cpu`]) and a device-resident CUDA arm ([`cuda`])
//! behind the three traits of [`arms`] (text encoder, denoiser, decoder) that
//! [`pipeline`] drives, loading checkpoints in the layouts users have, emitting
//! the phase markers of the marker protocol (`specs/markers.md`), with
//! optimisation levers switchable per run.
//!
//! The numeric core: [`presets`] (model configs), [`models`] (layouts and
//! forwards of the transformer, T5 and the VAE decoder), [`ops`] (the CPU
//! kernels they are built from), [`schedule`] (sigmas, Euler, guidance, latent
//! scaling) and [`rng`] (the seeded Gaussian generator).
//!
//! Around it: [`weights`] (safetensors loading, layouts, digest, page-cache
//! residency), [`synth_weights`] (a preset's synthetic checkpoint), [`text`] (tokenizer, prompt embeddings),
//! [`levers`], [`frames`] (y4m and PNG output), [`fp8`] (the e4m3 row-scaled
//! quantization the CUDA arm's `precision = fp8` is checked against).

#![deny(missing_docs)]

pub mod arms;
pub mod cli;
pub mod conditioning;
pub mod cpu;
pub mod cuda;
pub mod denoise;
pub mod fp8;
pub mod frames;
pub mod hostmem;
pub mod levers;
pub mod models;
pub mod ops;
pub mod oracle;
pub mod phase;
pub mod pipeline;
pub mod plan;
pub mod presets;
pub mod rng;
pub mod schedule;
pub mod synth_weights;
pub mod tensor;
#[cfg(feature = "test-kit")]
pub mod test_kit;
pub mod text;
pub mod weights;
