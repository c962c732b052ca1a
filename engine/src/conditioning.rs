//! The `conditioning` phase's computation: prompts tokenized and encoded the
//! way the reference pipeline (diffusers' `LTXPipeline`) does it, on either
//! arm, into what the denoise loop conditions on.
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

use crate::cuda::models::t5::DeviceT5;
use crate::cuda::CudaError;
use crate::denoise::TextCond;
use crate::models::t5::{Keys, T5Encoder};
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

    fn keys(self, mask: &[f32]) -> Keys<'_> {
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
    /// The device encoder failed.
    #[error("text encoder forward (device): {0}")]
    Device(#[from] CudaError),
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

fn tokenize(tok: &PromptTokenizer, prompts: &[&str]) -> Result<Vec<Tokens>, TokenizerError> {
    prompts.iter().map(|p| tok.encode(p)).collect()
}

/// Encode `prompts` on the host (f32), one forward each, with `rule`; the
/// outputs of the first `keep_blocks` blocks are kept too.
pub fn encode_host(
    model: &T5Encoder,
    tok: &PromptTokenizer,
    prompts: &[&str],
    rule: KeyRule,
    keep_blocks: usize,
) -> Result<Vec<Encoded>, ConditioningError> {
    let d = model.config().d_model;
    tokenize(tok, prompts)?
        .into_iter()
        .map(|t| {
            let l = t.ids.len();
            let mut blocks = Vec::new();
            let states = model.forward_layers(&t.ids, rule.keys(&t.mask), &mut |i, x| {
                if i < keep_blocks {
                    blocks.push(Tensor::new(&[l, d], x.to_vec()).expect("rows x d_model"));
                }
            })?;
            Ok(Encoded {
                ids: t.ids,
                mask: t.mask,
                states,
                blocks,
            })
        })
        .collect()
}

/// Encode `prompts` on the device with `rule`, as one batch (every prompt has
/// the tokenizer's fixed length). Returns them and the forward's device
/// milliseconds.
pub fn encode_device(
    t5: &mut DeviceT5,
    tok: &PromptTokenizer,
    prompts: &[&str],
    rule: KeyRule,
) -> Result<(Vec<Encoded>, f64), ConditioningError> {
    let toks = tokenize(tok, prompts)?;
    let mut out = Vec::with_capacity(toks.len());
    let mut ms = 0.0;
    // One batch per length (the tokenizer pads to one length, so one batch).
    let mut lengths: Vec<usize> = toks.iter().map(|t| t.ids.len()).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let mut states: Vec<Option<Tensor>> = vec![None; toks.len()];
    for l in lengths {
        let members: Vec<usize> = (0..toks.len())
            .filter(|i| toks[*i].ids.len() == l)
            .collect();
        let batch: Vec<(&[u32], Keys)> = members
            .iter()
            .map(|i| (toks[*i].ids.as_slice(), rule.keys(&toks[*i].mask)))
            .collect();
        let (ys, t) = t5.encode(&batch, false)?;
        ms += t;
        for (i, y) in members.into_iter().zip(ys) {
            states[i] = Some(y);
        }
    }
    for (t, s) in toks.into_iter().zip(states) {
        let states = s.ok_or_else(|| {
            ConditioningError::Device(CudaError::Invalid(
                "the device text encoder returned fewer states than prompts".into(),
            ))
        })?;
        out.push(Encoded {
            ids: t.ids,
            mask: t.mask,
            states,
            blocks: Vec::new(),
        });
    }
    Ok((out, ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{init, t5};
    use crate::presets::t5_tiny;
    use crate::text::synth_tokenizer::synth_tokenizer_json;
    use crate::weights::VarBuilder;
    use std::path::PathBuf;

    fn setup(max: usize) -> (T5Encoder, PromptTokenizer) {
        let cfg = t5_tiny();
        let src = init::source(&t5::tensor_specs(&cfg), 3);
        let m = T5Encoder::load(&VarBuilder::new(&src), &cfg).unwrap();
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/cond");
        std::fs::create_dir_all(&d).unwrap();
        // One file per test (tests run in parallel; a shared file races).
        let p = d.join(format!("tokenizer-{max}.json"));
        std::fs::write(&p, synth_tokenizer_json(cfg.vocab_size).unwrap()).unwrap();
        (
            m,
            PromptTokenizer::from_file(&p, max, cfg.vocab_size).unwrap(),
        )
    }

    #[test]
    fn the_rule_decides_whether_padding_reaches_the_real_rows() {
        let (m, tok) = setup(16);
        let all = encode_host(&m, &tok, &["a red fox", ""], KeyRule::All, 0).unwrap();
        let masked = encode_host(&m, &tok, &["a red fox", ""], KeyRule::Masked, 0).unwrap();
        assert_eq!(all[0].ids, masked[0].ids);
        assert_eq!(all[0].mask, masked[0].mask);
        // 3 pieces + </s> real, 12 padded: the rules differ on the real rows.
        let real = all[0].mask.iter().filter(|v| **v == 1.0).count();
        assert_eq!(real, 4);
        assert_eq!(all[0].states.shape(), &[16, 64]);
        assert_ne!(
            &all[0].states.data()[..real * 64],
            &masked[0].states.data()[..real * 64]
        );
        // Each equals the model called directly with the matching keys.
        let direct = m.forward(&all[0].ids, Keys::All).unwrap();
        assert_eq!(all[0].states, direct);
        let direct = m
            .forward(&masked[1].ids, Keys::Masked(&masked[1].mask))
            .unwrap();
        assert_eq!(masked[1].states, direct);
        // The condition carries the tokenizer's mask whatever the rule.
        let c = all[0].clone().into_cond();
        assert_eq!(c.mask, masked[0].mask);
    }

    #[test]
    fn blocks_are_kept_only_when_asked() {
        let (m, tok) = setup(8);
        let e = encode_host(&m, &tok, &["fox"], KeyRule::All, 1).unwrap();
        assert_eq!(e[0].blocks.len(), 1);
        assert_eq!(e[0].blocks[0].shape(), &[8, 64]);
        let e = encode_host(&m, &tok, &["fox"], KeyRule::All, 99).unwrap();
        assert_eq!(e[0].blocks.len(), m.config().num_layers);
        assert_ne!(e[0].blocks[0], e[0].blocks[1]);
        let e = encode_host(&m, &tok, &["fox"], KeyRule::All, 0).unwrap();
        assert!(e[0].blocks.is_empty());
    }
}
