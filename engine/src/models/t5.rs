//! The T5 v1.1 text encoder (transformers `T5EncoderModel`): its config, its
//! checkpoint layout and its CPU forward.
//!
//! Pre-norm blocks of relative-position self-attention (no 1/sqrt(d) scaling,
//! a learned bias per head and log-spaced distance bucket, shared by all
//! layers) and a gated tanh-GELU feed-forward, each with an RMS norm carrying a
//! weight, then a final RMS norm.

use serde::{Deserialize, Serialize};

use crate::models::{ConfigError, LoadError, ModelError};
use crate::ops::attention::{attention, AttnBias};
use crate::ops::linear::Linear;
use crate::ops::norm::rms_norm_rows;
use crate::ops::t5::{gated_gelu, position_bias};
use crate::tensor::Tensor;
use crate::weights::{DType, TensorSpec, VarBuilder, WeightError};

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

/// Which positions the encoder's self-attention may attend to: the
/// `attention_mask` a caller of transformers' `T5EncoderModel` passes, or not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keys<'a> {
    /// Every position, padding included (the encoder called with token ids
    /// alone, no attention mask).
    All,
    /// Only the positions whose value is above 0.5 (one value per token; at
    /// least one must be real): padded keys get the most negative f32 as a
    /// bias, so their probability is exactly 0.
    Masked(&'a [f32]),
}

/// The name under which some exports store the token embedding instead of
/// (or beside) `shared.weight`; a loader may accept it as an alias.
pub const EMBED_ALIAS: &str = "encoder.embed_tokens.weight";

struct T5Block {
    ln_attn: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln_ff: Vec<f32>,
    wi_0: Linear,
    wi_1: Linear,
    wo: Linear,
}

/// The T5 encoder on the CPU, weights widened to f32.
pub struct T5Encoder {
    cfg: T5Config,
    /// `[vocab, d_model]`.
    embed: Tensor,
    /// `[num_buckets, heads]` (block 0's table, shared by every block).
    rel_bias: Vec<f32>,
    blocks: Vec<T5Block>,
    final_norm: Vec<f32>,
}

impl T5Encoder {
    /// Builds the encoder of `cfg` from tensors named as in [`tensor_specs`]
    /// under `vb` (the embedding may also be found under [`EMBED_ALIAS`]).
    pub fn load(vb: &VarBuilder, cfg: &T5Config) -> Result<Self, LoadError> {
        cfg.validate()?;
        let (d, inner, ff) = (cfg.d_model, cfg.inner_dim(), cfg.d_ff);
        let embed = match vb.get("shared.weight", &[cfg.vocab_size, d]) {
            Ok(t) => t,
            Err(WeightError::Missing { .. }) => vb.get(EMBED_ALIAS, &[cfg.vocab_size, d])?,
            Err(e) => return Err(e.into()),
        };
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        let mut rel_bias = Vec::new();
        for i in 0..cfg.num_layers {
            let b = vb.pp("encoder.block").pp(i).pp("layer");
            let (a, f) = (b.pp("0"), b.pp("1"));
            let sa = a.pp("SelfAttention");
            if i == 0 {
                rel_bias = sa
                    .get(
                        "relative_attention_bias.weight",
                        &[cfg.relative_attention_num_buckets, cfg.num_heads],
                    )?
                    .into_data();
            }
            let dd = f.pp("DenseReluDense");
            blocks.push(T5Block {
                ln_attn: a.get("layer_norm.weight", &[d])?.into_data(),
                q: Linear::load(&sa, "q", inner, d, false)?,
                k: Linear::load(&sa, "k", inner, d, false)?,
                v: Linear::load(&sa, "v", inner, d, false)?,
                o: Linear::load(&sa, "o", d, inner, false)?,
                ln_ff: f.get("layer_norm.weight", &[d])?.into_data(),
                wi_0: Linear::load(&dd, "wi_0", ff, d, false)?,
                wi_1: Linear::load(&dd, "wi_1", ff, d, false)?,
                wo: Linear::load(&dd, "wo", d, ff, false)?,
            });
        }
        Ok(T5Encoder {
            cfg: cfg.clone(),
            embed,
            rel_bias,
            blocks,
            final_norm: vb.get("encoder.final_layer_norm.weight", &[d])?.into_data(),
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &T5Config {
        &self.cfg
    }

    /// The encoder's last hidden states `[L, d_model]` for token `ids` (L of
    /// them), attending to the positions `keys` allows. Padded rows are
    /// computed as the reference computes them.
    pub fn forward(&self, ids: &[u32], keys: Keys<'_>) -> Result<Tensor, ModelError> {
        self.forward_layers(ids, keys, &mut |_, _| {})
    }

    /// [`Self::forward`], also handing each block's output (the residual
    /// stream before the final norm, `[L, d_model]`) to `block` with the
    /// block's index: what transformers reports as `hidden_states[i + 1]`.
    pub fn forward_layers(
        &self,
        ids: &[u32],
        keys: Keys<'_>,
        block: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let (l, d, heads) = (ids.len(), cfg.d_model, cfg.num_heads);
        if l == 0 {
            return Err(ModelError::Shape {
                model: "text_encoder",
                input: "ids",
                expected: "at least one token".into(),
                found: vec![0],
            });
        }
        if let Keys::Masked(mask) = keys {
            if mask.len() != l {
                return Err(ModelError::Shape {
                    model: "text_encoder",
                    input: "mask",
                    expected: format!("[{l}] (one value per token)"),
                    found: vec![mask.len()],
                });
            }
            if mask.iter().all(|m| *m <= 0.5) {
                return Err(ModelError::Value {
                    model: "text_encoder",
                    input: "mask",
                    detail: "masks every token".into(),
                });
            }
        }
        if let Some((i, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= cfg.vocab_size)
        {
            return Err(ModelError::Value {
                model: "text_encoder",
                input: "ids",
                detail: format!(
                    "token {i} has id {id}, past the vocabulary of {}",
                    cfg.vocab_size
                ),
            });
        }
        let emb = self.embed.data();
        let mut x: Vec<f32> = ids
            .iter()
            .flat_map(|id| {
                emb[*id as usize * d..(*id as usize + 1) * d]
                    .iter()
                    .copied()
            })
            .collect();
        let pos = position_bias(
            &self.rel_bias,
            heads,
            l,
            l,
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
        );
        // The reference adds the most negative f32 for padded keys.
        let key_bias: Option<Vec<f32>> = match keys {
            Keys::All => None,
            Keys::Masked(mask) => Some(
                mask.iter()
                    .map(|m| if *m > 0.5 { 0.0 } else { f32::MIN })
                    .collect(),
            ),
        };
        let eps = cfg.layer_norm_epsilon as f32;
        for (i, b) in self.blocks.iter().enumerate() {
            let mut h = x.clone();
            rms_norm_rows(&mut h, d, Some(&b.ln_attn), eps);
            let (q, k, v) = (b.q.forward(&h, l), b.k.forward(&h, l), b.v.forward(&h, l));
            let a = attention(
                &q,
                &k,
                &v,
                l,
                l,
                heads,
                cfg.d_kv,
                1.0,
                AttnBias {
                    per_key: key_bias.as_deref(),
                    per_head: Some(&pos),
                },
            );
            let a = b.o.forward(&a, l);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let mut h = x.clone();
            rms_norm_rows(&mut h, d, Some(&b.ln_ff), eps);
            let mut g = b.wi_0.forward(&h, l);
            gated_gelu(&mut g, &b.wi_1.forward(&h, l));
            let f = b.wo.forward(&g, l);
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            block(i, &x);
        }
        rms_norm_rows(&mut x, d, Some(&self.final_norm), eps);
        Ok(Tensor::new(&[l, d], x).expect("rows x d_model"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::init;
    use crate::presets::t5_tiny;

    fn tiny() -> (T5Config, crate::weights::MapSource) {
        let cfg = t5_tiny();
        let src = init::source(&tensor_specs(&cfg), 12);
        (cfg, src)
    }

    #[test]
    fn tiny_forward_is_finite_nontrivial_and_honours_the_mask() {
        let (cfg, src) = tiny();
        let m = T5Encoder::load(&VarBuilder::new(&src), &cfg).unwrap();
        let ids = [37, 5, 301, 1, 0, 0];
        let mask = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
        let y = m.forward(&ids, Keys::Masked(&mask)).unwrap();
        assert_eq!(y.shape(), &[6, 64]);
        assert!(y.data().iter().all(|v| v.is_finite()));
        let rms = (y.data().iter().map(|v| v * v).sum::<f32>() / y.numel() as f32).sqrt();
        assert!(rms > 0.3 && rms < 3.0, "{rms}");
        // Real rows do not see padded tokens: other pad ids change nothing in rows 0..4.
        let y2 = m
            .forward(&[37, 5, 301, 1, 7, 9], Keys::Masked(&mask))
            .unwrap();
        assert_eq!(&y.data()[..4 * 64], &y2.data()[..4 * 64]);
        assert_ne!(&y.data()[4 * 64..], &y2.data()[4 * 64..]);
        // Token order matters (relative positions), and so does the mask.
        let y3 = m
            .forward(&[5, 37, 301, 1, 0, 0], Keys::Masked(&mask))
            .unwrap();
        assert_ne!(&y.data()[2 * 64..3 * 64], &y3.data()[2 * 64..3 * 64]);
        // An all-ones mask is the same computation as no mask.
        let all = m.forward(&ids, Keys::All).unwrap();
        assert_eq!(all, m.forward(&ids, Keys::Masked(&[1.0; 6])).unwrap());
        assert_ne!(&y.data()[..64], &all.data()[..64]);
        // Without a mask the padded tokens are keys like any other: their ids
        // reach the real rows.
        let all2 = m.forward(&[37, 5, 301, 1, 7, 9], Keys::All).unwrap();
        assert_ne!(&all.data()[..4 * 64], &all2.data()[..4 * 64]);
    }

    #[test]
    fn forward_layers_reports_every_block_and_ends_in_the_final_norm() {
        let (cfg, src) = tiny();
        let m = T5Encoder::load(&VarBuilder::new(&src), &cfg).unwrap();
        let ids = [37, 5, 301, 1, 0, 0];
        let mut seen = Vec::new();
        let y = m
            .forward_layers(&ids, Keys::All, &mut |i, x| seen.push((i, x.to_vec())))
            .unwrap();
        assert_eq!(seen.len(), cfg.num_layers);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(k, (i, x))| k == *i && x.len() == 6 * 64));
        let mut last = seen.last().unwrap().1.clone();
        rms_norm_rows(
            &mut last,
            64,
            Some(&m.final_norm),
            cfg.layer_norm_epsilon as f32,
        );
        assert_eq!(last.as_slice(), y.data());
        assert_ne!(seen[0].1, seen[1].1);
    }

    #[test]
    fn bad_inputs_and_the_embedding_alias() {
        let (cfg, src) = tiny();
        let m = T5Encoder::load(&VarBuilder::new(&src), &cfg).unwrap();
        let e = m.forward(&[1, 512], Keys::All).unwrap_err().to_string();
        assert!(e.contains("512") && e.contains("vocabulary"), "{e}");
        assert!(m.forward(&[1, 2], Keys::Masked(&[1.0])).is_err());
        assert!(m.forward(&[], Keys::All).is_err());
        assert!(m.forward(&[1, 2], Keys::Masked(&[0.0, 0.0])).is_err());
        // The embedding stored under the tied alias only loads the same model.
        let specs = tensor_specs(&cfg);
        let mut alias = crate::weights::MapSource::new();
        for s in specs.iter().filter(|s| s.name != "shared.weight") {
            alias.insert(s.name.clone(), init::tensor(s, 12));
        }
        alias.insert(EMBED_ALIAS, init::tensor(&specs[0], 12));
        let m2 = T5Encoder::load(&VarBuilder::new(&alias), &cfg).unwrap();
        assert_eq!(
            m2.forward(&[3, 4], Keys::All).unwrap(),
            m.forward(&[3, 4], Keys::All).unwrap()
        );
        // A mis-shaped alias is reported under its own name.
        alias.insert(EMBED_ALIAS, Tensor::zeros(&[2, 2]));
        let e = T5Encoder::load(&VarBuilder::new(&alias), &cfg)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(EMBED_ALIAS) && e.contains("[512, 64]"), "{e}");
    }
}
