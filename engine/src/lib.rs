//! The LTX-Video render engine.
//!
//! A CPU reference arm and (later) a device-resident CUDA arm behind one backend
//! trait, loading checkpoints in the layouts users have, emitting the phase markers
//! of the marker protocol (`specs/markers.md`), with optimisation levers switchable
//! per run.

pub mod cuda;
pub mod tensor;
pub mod weights;
