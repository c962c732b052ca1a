//! The CPU reference arm's text encoder: the `models` T5 in f32 on the host,
//! behind [`TextEncoder`].

use crate::arms::TextEncoder;
use crate::conditioning::{tokenize, ConditioningError, Encoded, KeyRule};
use crate::models::t5::T5Encoder;
use crate::tensor::Tensor;
use crate::text::tokenizer::PromptTokenizer;

/// The host T5 and the stored bytes `widen-f32 = double` keeps beside its f32
/// copies while it lives (empty under `single`).
pub struct HostT5 {
    model: T5Encoder,
    _kept: Vec<Vec<u8>>,
}

impl HostT5 {
    /// Encode with `model`, keeping `kept` alive as long as it.
    pub fn new(model: T5Encoder, kept: Vec<Vec<u8>>) -> HostT5 {
        HostT5 { model, _kept: kept }
    }
}

impl TextEncoder for HostT5 {
    fn arm(&self) -> &'static str {
        "cpu"
    }

    fn encode(
        &mut self,
        tok: &PromptTokenizer,
        prompts: &[&str],
        rule: KeyRule,
    ) -> Result<(Vec<Encoded>, Option<f64>), ConditioningError> {
        Ok((encode_host(&self.model, tok, prompts, rule, 0)?, None))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::t5::Keys;
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
