//! The LTX-Video transformer (diffusers `LTXVideoTransformer3DModel`): its
//! config, its checkpoint layout and its CPU forward.
//!
//! One forward maps noisy latent tokens `[tokens, 128]` (raster order over the
//! latent grid `(f, h, w)`), a noise level `sigma` and the projected text to a
//! velocity of the same shape. Architecture facts: `shared/docs/ltx-architecture.md`.

use serde::{Deserialize, Serialize};

use crate::models::ConfigError;
use crate::weights::{DType, TensorSpec};

/// The transformer's `config.json` (diffusers field names; unknown keys such
/// as `_class_name` are ignored when parsing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DitConfig {
    /// Latent channels in (128).
    pub in_channels: usize,
    /// Latent channels out (128).
    pub out_channels: usize,
    /// Spatial patch (1: one token per latent voxel).
    pub patch_size: usize,
    /// Temporal patch (1).
    pub patch_size_t: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Channels per head.
    pub attention_head_dim: usize,
    /// Width of the (projected) text states cross-attention reads; equals the
    /// inner width `heads * head_dim`.
    pub cross_attention_dim: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Feed-forward activation (`gelu-approximate`, the only one supported).
    pub activation_fn: String,
    /// Query/key normalisation (`rms_norm_across_heads`, the only one supported).
    pub qk_norm: String,
    /// Whether the blocks' pre-norms carry a weight (`false` in every release).
    pub norm_elementwise_affine: bool,
    /// Epsilon of the blocks' pre-norms.
    pub norm_eps: f64,
    /// Width of the text encoder's output (4096 for T5-XXL).
    pub caption_channels: usize,
    /// Whether q/k/v projections carry a bias.
    pub attention_bias: bool,
    /// Whether the attention output projection carries a bias.
    pub attention_out_bias: bool,
}

impl DitConfig {
    /// The inner (model) width `heads * head_dim`.
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Checks that this config is one the CPU arm implements: patch 1x1x1,
    /// tanh-GELU, RMS q/k norm across heads, no pre-norm weights, biases on,
    /// cross-attention width equal to the inner width.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = |field, detail: String| Err(ConfigError::new("transformer", field, detail));
        if self.patch_size != 1 {
            return e(
                "patch_size",
                format!("is {}, only 1 is supported", self.patch_size),
            );
        }
        if self.patch_size_t != 1 {
            return e(
                "patch_size_t",
                format!("is {}, only 1 is supported", self.patch_size_t),
            );
        }
        if self.activation_fn != "gelu-approximate" {
            return e(
                "activation_fn",
                format!(
                    "is '{}', only 'gelu-approximate' is supported",
                    self.activation_fn
                ),
            );
        }
        if self.qk_norm != "rms_norm_across_heads" {
            return e(
                "qk_norm",
                format!(
                    "is '{}', only 'rms_norm_across_heads' is supported",
                    self.qk_norm
                ),
            );
        }
        if self.norm_elementwise_affine {
            return e(
                "norm_elementwise_affine",
                "is true, only false is supported".into(),
            );
        }
        if !self.attention_bias || !self.attention_out_bias {
            return e(
                "attention_bias",
                "must be true (with attention_out_bias)".into(),
            );
        }
        if self.cross_attention_dim != self.inner_dim() {
            return e(
                "cross_attention_dim",
                format!(
                    "is {}, expected the inner width heads*head_dim = {}",
                    self.cross_attention_dim,
                    self.inner_dim()
                ),
            );
        }
        if self.in_channels == 0 || self.out_channels == 0 || self.inner_dim() == 0 {
            return e("in_channels", "channels and widths must be positive".into());
        }
        if self.caption_channels == 0 {
            return e("caption_channels", "must be positive".into());
        }
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return e(
                "norm_eps",
                format!("is {}, must be positive", self.norm_eps),
            );
        }
        Ok(())
    }

    /// The `config.json` diffusers writes for this config (with `_class_name`).
    pub fn to_config_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(m) = v.as_object_mut() {
            m.insert("_class_name".into(), "LTXVideoTransformer3DModel".into());
            m.insert("_diffusers_version".into(), "0.32.0".into());
        }
        v
    }
}

/// Every tensor of the transformer checkpoint in diffusers naming, in the
/// order the model declares them, each with its shape and the released
/// storage type (bf16).
pub fn tensor_specs(cfg: &DitConfig) -> Vec<TensorSpec> {
    let d = cfg.inner_dim();
    let dt = DType::BF16;
    let mut v = Vec::new();
    let linear = |v: &mut Vec<TensorSpec>, name: &str, out: usize, inp: usize| {
        v.push(TensorSpec::new(format!("{name}.weight"), &[out, inp], dt));
        v.push(TensorSpec::new(format!("{name}.bias"), &[out], dt));
    };
    linear(&mut v, "proj_in", d, cfg.in_channels);
    linear(
        &mut v,
        "time_embed.emb.timestep_embedder.linear_1",
        d,
        TIMESTEP_CHANNELS,
    );
    linear(&mut v, "time_embed.emb.timestep_embedder.linear_2", d, d);
    linear(&mut v, "time_embed.linear", 6 * d, d);
    linear(
        &mut v,
        "caption_projection.linear_1",
        d,
        cfg.caption_channels,
    );
    linear(&mut v, "caption_projection.linear_2", d, d);
    for i in 0..cfg.num_layers {
        let b = format!("transformer_blocks.{i}");
        for attn in ["attn1", "attn2"] {
            let kv_in = if attn == "attn1" {
                d
            } else {
                cfg.cross_attention_dim
            };
            v.push(TensorSpec::new(
                format!("{b}.{attn}.norm_q.weight"),
                &[d],
                dt,
            ));
            v.push(TensorSpec::new(
                format!("{b}.{attn}.norm_k.weight"),
                &[d],
                dt,
            ));
            linear(&mut v, &format!("{b}.{attn}.to_q"), d, d);
            linear(&mut v, &format!("{b}.{attn}.to_k"), d, kv_in);
            linear(&mut v, &format!("{b}.{attn}.to_v"), d, kv_in);
            linear(&mut v, &format!("{b}.{attn}.to_out.0"), d, d);
        }
        linear(&mut v, &format!("{b}.ff.net.0.proj"), 4 * d, d);
        linear(&mut v, &format!("{b}.ff.net.2"), d, 4 * d);
        v.push(TensorSpec::new(
            format!("{b}.scale_shift_table"),
            &[6, d],
            dt,
        ));
    }
    v.push(TensorSpec::new("scale_shift_table", &[2, d], dt));
    linear(&mut v, "proj_out", cfg.out_channels, d);
    v
}

/// Width of the sinusoidal timestep embedding fed to `time_embed`.
pub const TIMESTEP_CHANNELS: usize = 256;
