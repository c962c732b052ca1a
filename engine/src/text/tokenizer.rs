//! Prompt tokenization through the `tokenizers` crate, padded and truncated to the
//! preset's token budget the way the reference pipeline asks T5's tokenizer to:
//! special tokens added (T5 appends `</s>`), truncated to `max_tokens` (keeping
//! `</s>`), padded with `<pad>` to exactly `max_tokens`, attention mask 1 on real
//! tokens and 0 on padding.

use std::path::{Path, PathBuf};

use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// Tokenization failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.json` could not be read or parsed.
    #[error("{file}: cannot load tokenizer: {detail}")]
    Load {
        /// The file.
        file: PathBuf,
        /// The tokenizers crate's message.
        detail: String,
    },
    /// Encoding a prompt failed.
    #[error("{file}: cannot tokenize the prompt: {detail}")]
    Encode {
        /// The tokenizer file.
        file: PathBuf,
        /// The tokenizers crate's message.
        detail: String,
    },
    /// A token id outside the text encoder's vocabulary.
    #[error(
        "{file}: token '{token}' has id {id}, outside the text encoder's vocabulary of {vocab}"
    )]
    Vocab {
        /// The tokenizer file.
        file: PathBuf,
        /// The token.
        token: String,
        /// Its id.
        id: u32,
        /// The encoder's vocabulary size.
        vocab: usize,
    },
}

/// Token ids and attention mask of one prompt, both `max_tokens` long.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokens {
    /// Token ids (padding included).
    pub ids: Vec<u32>,
    /// 1.0 for a real token, 0.0 for padding.
    pub mask: Vec<f32>,
}

/// A prompt tokenizer with the preset's budget.
pub struct PromptTokenizer {
    inner: Tokenizer,
    file: PathBuf,
    vocab: usize,
}

impl PromptTokenizer {
    /// Load `tokenizer.json`, set truncation and fixed padding to `max_tokens`;
    /// ids must stay below `vocab` (the text encoder's embedding rows).
    pub fn from_file(path: &Path, max_tokens: usize, vocab: usize) -> Result<Self, TokenizerError> {
        let load = |detail: String| TokenizerError::Load {
            file: path.to_path_buf(),
            detail,
        };
        let mut inner = Tokenizer::from_file(path).map_err(|e| load(e.to_string()))?;
        let pad_id = inner.token_to_id("<pad>").unwrap_or(0);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..Default::default()
            }))
            .map_err(|e| load(e.to_string()))?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(max_tokens),
            pad_id,
            pad_token: "<pad>".into(),
            ..Default::default()
        }));
        Ok(PromptTokenizer {
            inner,
            file: path.to_path_buf(),
            vocab,
        })
    }

    /// Tokenize `text` (special tokens added, truncated, padded).
    pub fn encode(&self, text: &str) -> Result<Tokens, TokenizerError> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| TokenizerError::Encode {
                file: self.file.clone(),
                detail: e.to_string(),
            })?;
        let ids = enc.get_ids().to_vec();
        if let Some((i, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.vocab)
        {
            return Err(TokenizerError::Vocab {
                file: self.file.clone(),
                token: enc.get_tokens().get(i).cloned().unwrap_or_default(),
                id,
                vocab: self.vocab,
            });
        }
        let mask = enc.get_attention_mask().iter().map(|&m| m as f32).collect();
        Ok(Tokens { ids, mask })
    }

    /// The underlying tokenizer (for inspection).
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::synth_tokenizer::synth_tokenizer_json;

    fn tok(max: usize) -> PromptTokenizer {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/tokenizer");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join(format!("tokenizer-{max}.json"));
        std::fs::write(&p, synth_tokenizer_json(512).unwrap()).unwrap();
        PromptTokenizer::from_file(&p, max, 512).unwrap()
    }

    #[test]
    fn prompt_gets_eos_padding_and_mask() {
        let t = tok(16);
        let a = t.encode("a red fox").unwrap();
        assert_eq!(a.ids.len(), 16);
        assert_eq!(a.mask.len(), 16);
        let n = a.mask.iter().filter(|&&m| m == 1.0).count();
        // "▁a", "▁red", "▁fox" are whole pieces of the synthetic vocabulary, then </s>.
        assert_eq!(n, 4, "{:?}", t.inner().id_to_token(a.ids[0]));
        assert_eq!(a.ids[3], 1, "</s> has id 1");
        assert!(a.ids[4..].iter().all(|&i| i == 0), "pad id 0: {:?}", a.ids);
        assert!(a.mask[..4].iter().all(|&m| m == 1.0) && a.mask[4..].iter().all(|&m| m == 0.0));
        let b = t.encode("a red fax").unwrap();
        assert_ne!(a.ids, b.ids);
    }

    #[test]
    fn long_prompt_is_truncated_keeping_eos() {
        let t = tok(8);
        let a = t
            .encode("the quick brown fox jumps over the lazy dog again and again")
            .unwrap();
        assert_eq!(a.ids.len(), 8);
        assert!(a.mask.iter().all(|&m| m == 1.0));
        assert_eq!(a.ids[7], 1);
    }

    #[test]
    fn empty_prompt_is_eos_only_and_out_of_vocab_ids_are_refused() {
        let t = tok(4);
        let a = t.encode("").unwrap();
        assert_eq!(a.ids, vec![1, 0, 0, 0]);
        assert_eq!(a.mask, vec![1.0, 0.0, 0.0, 0.0]);
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/tokenizer");
        let p = d.join("small-vocab.json");
        std::fs::write(&p, synth_tokenizer_json(512).unwrap()).unwrap();
        let small = PromptTokenizer::from_file(&p, 8, 40).unwrap();
        let e = small.encode("fox").unwrap_err().to_string();
        assert!(
            e.contains("outside the text encoder's vocabulary of 40"),
            "{e}"
        );
        let e = PromptTokenizer::from_file(&d.join("none.json"), 8, 40)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("none.json"), "{e}");
    }
}
