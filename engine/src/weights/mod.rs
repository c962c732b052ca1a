//! Weights: what a model expects ([`TensorSpec`]), where tensors come from
//! ([`TensorSource`]) and the path builder models use to ask for them
//! ([`VarBuilder`], names mirroring the checkpoint's); the safetensors loader,
//! checkpoint layouts, the weights digest and page-cache
//! residency. (The synthetic-weights generator, which reads the presets, the
//! models' tensor lists and the synthetic tokenizer, is [`crate::synth_weights`].)

pub mod digest;
pub mod layout;
pub mod residency;
pub mod safetensors;
pub mod source;
pub mod spec;

pub use source::{MapSource, TensorSource, VarBuilder, WeightError};
pub use spec::{DType, TensorSpec};
