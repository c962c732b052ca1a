//! The three networks of an LTX-Video render, each in its own module with its
//! config (field names as in the released `config.json`), its checkpoint layout
//! ([`TensorSpec`](crate::weights::TensorSpec) lists with the exact diffusers /
//! transformers tensor names) and its CPU forward:
//!
//! - [`dit`]: the video transformer (`LTXVideoTransformer3DModel`);
//! - [`t5`]: the T5 v1.1 text encoder (`T5EncoderModel`);
//! - [`vae`]: the video VAE (`AutoencoderKLLTXVideo`), decoder forward only.
//!
//! [`init`] holds the deterministic synthetic initialisation shared by
//! `engine synth-weights` and the golden tests.

pub mod config;
pub mod dit;
pub mod init;

pub mod t5;
pub mod vae;

pub use config::ConfigError;

/// A model could not be built: its config is not supported or a weight is
/// missing or malformed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The config names something the CPU arm does not implement.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A weight is missing, mis-shaped or unreadable.
    #[error(transparent)]
    Weight(#[from] crate::weights::WeightError),
}

/// A model input that does not fit the model: names the input, what was
/// expected and what was given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// An input has the wrong shape or length.
    #[error("{model}: input '{input}' has shape {found:?}, expected {expected}")]
    Shape {
        /// The model (`transformer`, `text_encoder`, `vae`).
        model: &'static str,
        /// The input's name in the forward's signature.
        input: &'static str,
        /// What the model expects, in words and numbers.
        expected: String,
        /// The shape (or `[len]`) given.
        found: Vec<usize>,
    },
    /// An input value is outside its domain (a token id past the vocabulary,
    /// a non-finite sigma, ...).
    #[error("{model}: input '{input}': {detail}")]
    Value {
        /// The model.
        model: &'static str,
        /// The input's name.
        input: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}
