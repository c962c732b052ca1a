//! The `conditioning` phase's computation: prompts tokenized and encoded the
//! way the reference pipeline (diffusers' `LTXPipeline`) does it, on either
//! arm, into what the denoise loop conditions on. The arms' encoders are
//! [`crate::arms::TextEncoder`]s: the host's in [`crate::cpu::text`], the
//! device's beside `DeviceT5` in `cuda::models::t5`.
//!
//! What the reference does, and so what this module promises
//! (`specs/fidelity.md`):
//! 1. the tokenizer appends `</s>`, truncates to the preset's
//!    `max_text_tokens` (keeping `</s>`) and pads with `<pad>` to exactly that
//!    length; its attention mask is 1 on real tokens, 0 on padding;
//! 2. the text encoder is called with the token ids and, by the rule the
//!    caller picks ([`KeyRule`]), with or without that mask. The reference
//!    pipeline passes none ([`PIPELINE_KEYS`]);
//! 3. the hidden states of every position, padding included, go to the
//!    transformer together with the tokenizer's mask, which its
//!    cross-attention applies.

use crate::denoise::TextCond;
use crate::models::t5::Keys;
use crate::models::ModelError;
use crate::tensor::Tensor;
use crate::text::tokenizer::{PromptTokenizer, TokenizerError, Tokens};

/// Which keys the text encoder's self-attention sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyRule {
    /// Every position, padding included: the encoder called with the token ids
    /// alone.
    All,
    /// Only the real tokens: the tokenizer's mask handed to the encoder.
    Masked,
}

impl KeyRule {
    /// The rule's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            KeyRule::All => "all",
            KeyRule::Masked => "masked",
        }
    }

    /// The keys the encoder attends to under this rule, given the
    /// tokenizer's `mask`.
    pub fn keys(self, mask: &[f32]) -> Keys<'_> {
        match self {
            KeyRule::All => Keys::All,
            KeyRule::Masked => Keys::Masked(mask),
        }
    }
}

/// The rule the render uses: the reference's. diffusers' `LTXPipeline` calls
/// the encoder with the token ids alone (`_get_t5_prompt_embeds`), so in every
/// block each real token also attends to the padding up to
/// `max_text_tokens`; the tokenizer's mask only reaches the transformer. The
/// engine used to hand the mask to the encoder as well (`Masked`), which put
/// its frames far from the reference's (`specs/fidelity.md`; the figures in
/// `reports/device-notes.md`, "Faithful conditioning").
pub const PIPELINE_KEYS: KeyRule = KeyRule::All;

/// Encoding a prompt failed.
#[derive(Debug, thiserror::Error)]
pub enum ConditioningError {
    /// The prompt could not be tokenized (the message names the tokenizer file).
    #[error(transparent)]
    Tokenize(#[from] TokenizerError),
    /// The host encoder refused its input.
    #[error("text encoder forward: {0}")]
    Host(#[from] ModelError),
    /// The device encoder failed (the CUDA arm's `CudaError` inside, which
    /// `cli::exit_code` finds in the chain).
    #[error("text encoder forward (device): {0}")]
    Device(#[source] anyhow::Error),
}

/// One prompt, tokenized and encoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// Token ids, `max_text_tokens` of them (padding included).
    pub ids: Vec<u32>,
    /// The tokenizer's mask: 1.0 for a real token, 0.0 for padding.
    pub mask: Vec<f32>,
    /// The encoder's last hidden states `[L, d_model]`.
    pub states: Tensor,
    /// The first blocks' outputs (the residual stream before the final norm,
    /// `[L, d_model]`), as many as asked for (host arm).
    pub blocks: Vec<Tensor>,
}

impl Encoded {
    /// What the denoise loop conditions on: the states and the tokenizer's mask.
    pub fn into_cond(self) -> TextCond {
        TextCond {
            states: self.states,
            mask: self.mask,
        }
    }
}

/// Tokenize every prompt with `tok`, in order.
pub fn tokenize(tok: &PromptTokenizer, prompts: &[&str]) -> Result<Vec<Tokens>, TokenizerError> {
    prompts.iter().map(|p| tok.encode(p)).collect()
}
