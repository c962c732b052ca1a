//! The LTX-Video render engine.
//!
//! A CPU reference arm and (later) a device-resident CUDA arm behind one backend
//! trait, loading checkpoints in the layouts users have, emitting the phase markers
//! of the marker protocol (`specs/markers.md`), with optimisation levers switchable
//! per run.
//!
//! The numeric core: [`presets`] (model configs), [`models`] (layouts and
//! forwards of the transformer, T5 and the VAE decoder), [`ops`] (the CPU
//! kernels they are built from), [`schedule`] (sigmas, Euler, guidance, latent
//! scaling) and [`rng`] (the seeded Gaussian generator).

pub mod cuda;
pub mod models;
pub mod presets;
pub mod schedule;
pub mod tensor;
pub mod weights;
