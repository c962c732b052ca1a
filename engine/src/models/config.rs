//! Errors shared by the model configs: a config that names a variant the CPU
//! arm does not implement, or whose numbers do not fit together.

/// A model config the engine cannot run, naming the config field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{model} config: field '{field}' {detail}")]
pub struct ConfigError {
    /// Which config (`transformer`, `text_encoder`, `vae`).
    pub model: &'static str,
    /// The `config.json` key at fault.
    pub field: &'static str,
    /// What was found and what is supported.
    pub detail: String,
}

impl ConfigError {
    /// A config error for `model`'s `field`.
    pub fn new(model: &'static str, field: &'static str, detail: impl Into<String>) -> Self {
        ConfigError {
            model,
            field,
            detail: detail.into(),
        }
    }
}
