//! The T5 v1.1 text encoder (transformers `T5EncoderModel`): its config, its
//! checkpoint layout and its CPU forward.
//!
//! Pre-norm blocks of relative-position self-attention (no 1/sqrt(d) scaling,
//! a learned bias per head and log-spaced distance bucket, shared by all
//! layers) and a gated tanh-GELU feed-forward, each with an RMS norm carrying a
//! weight, then a final RMS norm.

use serde::{Deserialize, Serialize};

use crate::models::ConfigError;
use crate::weights::{DType, TensorSpec};

/// The text encoder's `config.json` (transformers field names; the keys that
/// only matter to the decoder or to training are not kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct T5Config {
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Model width (the encoder's output width).
    pub d_model: usize,
    /// Channels per head.
    pub d_kv: usize,
    /// Feed-forward inner width.
    pub d_ff: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Relative-position buckets (32).
    pub relative_attention_num_buckets: usize,
    /// Distance beyond which all relative positions share a bucket (128).
    pub relative_attention_max_distance: usize,
    /// Epsilon of every RMS norm.
    pub layer_norm_epsilon: f64,
    /// Feed-forward kind: `gated-gelu` (T5 v1.1), the only one supported.
    pub feed_forward_proj: String,
}

impl T5Config {
    /// Width of the concatenated heads `num_heads * d_kv`.
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }

    /// Checks that this config is one the CPU arm implements (T5 v1.1: gated
    /// GELU feed-forward) and that its numbers are usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = |field, detail: String| Err(ConfigError::new("text_encoder", field, detail));
        if self.feed_forward_proj != "gated-gelu" {
            return e(
                "feed_forward_proj",
                format!(
                    "is '{}', only 'gated-gelu' (T5 v1.1) is supported",
                    self.feed_forward_proj
                ),
            );
        }
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
        ] {
            if v == 0 {
                return e(field, "must be positive".into());
            }
        }
        if self.relative_attention_num_buckets < 4 || self.relative_attention_num_buckets % 2 != 0 {
            return e(
                "relative_attention_num_buckets",
                format!(
                    "is {}, must be even and at least 4",
                    self.relative_attention_num_buckets
                ),
            );
        }
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets / 4 {
            return e(
                "relative_attention_max_distance",
                format!(
                    "is {}, must exceed num_buckets/4 = {}",
                    self.relative_attention_max_distance,
                    self.relative_attention_num_buckets / 4
                ),
            );
        }
        if self.layer_norm_epsilon.is_nan() || self.layer_norm_epsilon <= 0.0 {
            return e(
                "layer_norm_epsilon",
                format!("is {}, must be positive", self.layer_norm_epsilon),
            );
        }
        Ok(())
    }

    /// The `config.json` transformers writes for a `T5EncoderModel` of this
    /// config (with the decoder-side keys a T5 config always carries).
    pub fn to_config_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(m) = v.as_object_mut() {
            m.insert(
                "architectures".into(),
                serde_json::json!(["T5EncoderModel"]),
            );
            m.insert("model_type".into(), "t5".into());
            m.insert("dense_act_fn".into(), "gelu_new".into());
            m.insert("is_gated_act".into(), true.into());
            m.insert("num_decoder_layers".into(), self.num_layers.into());
            m.insert("dropout_rate".into(), 0.1.into());
            m.insert("initializer_factor".into(), 1.0.into());
            m.insert("is_encoder_decoder".into(), true.into());
            m.insert("tie_word_embeddings".into(), false.into());
            m.insert("use_cache".into(), true.into());
            m.insert("pad_token_id".into(), 0.into());
            m.insert("eos_token_id".into(), 1.into());
            m.insert("decoder_start_token_id".into(), 0.into());
            m.insert("torch_dtype".into(), "bfloat16".into());
        }
        v
    }
}

/// Every tensor of the encoder checkpoint in transformers naming, each with
/// its shape and the released storage type (bf16). The token embedding is
/// stored once as `shared.weight` (`encoder.embed_tokens.weight` is tied to it
/// and not written by `save_pretrained`); only block 0 holds the
/// relative-attention bias table.
pub fn tensor_specs(cfg: &T5Config) -> Vec<TensorSpec> {
    let dt = DType::BF16;
    let (d, inner, ff) = (cfg.d_model, cfg.inner_dim(), cfg.d_ff);
    let mut v = vec![TensorSpec::new("shared.weight", &[cfg.vocab_size, d], dt)];
    for i in 0..cfg.num_layers {
        let b = format!("encoder.block.{i}.layer");
        for p in ["q", "k", "v"] {
            v.push(TensorSpec::new(
                format!("{b}.0.SelfAttention.{p}.weight"),
                &[inner, d],
                dt,
            ));
        }
        v.push(TensorSpec::new(
            format!("{b}.0.SelfAttention.o.weight"),
            &[d, inner],
            dt,
        ));
        if i == 0 {
            v.push(TensorSpec::new(
                format!("{b}.0.SelfAttention.relative_attention_bias.weight"),
                &[cfg.relative_attention_num_buckets, cfg.num_heads],
                dt,
            ));
        }
        v.push(TensorSpec::new(
            format!("{b}.0.layer_norm.weight"),
            &[d],
            dt,
        ));
        v.push(TensorSpec::new(
            format!("{b}.1.DenseReluDense.wi_0.weight"),
            &[ff, d],
            dt,
        ));
        v.push(TensorSpec::new(
            format!("{b}.1.DenseReluDense.wi_1.weight"),
            &[ff, d],
            dt,
        ));
        v.push(TensorSpec::new(
            format!("{b}.1.DenseReluDense.wo.weight"),
            &[d, ff],
            dt,
        ));
        v.push(TensorSpec::new(
            format!("{b}.1.layer_norm.weight"),
            &[d],
            dt,
        ));
    }
    v.push(TensorSpec::new("encoder.final_layer_norm.weight", &[d], dt));
    v
}

/// The name under which some exports store the token embedding instead of
/// (or beside) `shared.weight`; a loader may accept it as an alias.
pub const EMBED_ALIAS: &str = "encoder.embed_tokens.weight";
