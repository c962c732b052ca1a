//! The LTX-Video transformer (diffusers `LTXVideoTransformer3DModel`): its
//! config, its checkpoint layout and its CPU forward.
//!
//! One forward maps noisy latent tokens `[tokens, 128]` (raster order over the
//! latent grid `(f, h, w)`), a noise level `sigma` and the projected text to a
//! velocity of the same shape. The reference is diffusers'
//! `LTXVideoTransformer3DModel` (0.42.1); `tests/it/goldens.rs` holds the two
//! to each other.

use serde::{Deserialize, Serialize};

use crate::models::{ConfigError, LoadError, ModelError};
use crate::ops::activation::{gelu_tanh, silu};
use crate::ops::attention::{attention, AttnBias};
use crate::ops::embed::timestep_embedding;
use crate::ops::linear::Linear;
use crate::ops::norm::{layer_norm_rows, modulate_rows, rms_norm_rows};
use crate::ops::rope::{apply_rope, ltx_rope, RopeTables};
use crate::tensor::Tensor;
use crate::weights::{DType, TensorSpec, VarBuilder, WeightError};

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

/// The VAE compressions RoPE scales latent positions by: every LTX-Video VAE
/// has 8x temporal and 32x spatial compression.
pub const ROPE_COMPRESSION: (usize, usize) = (8, 32);

/// Epsilon of the q/k RMS norms (fixed in the reference, not in the config).
pub const QK_NORM_EPS: f32 = 1e-5;
/// Epsilon of the output LayerNorm (fixed in the reference, not in the config).
pub const OUT_NORM_EPS: f32 = 1e-6;
/// The additive attention bias of a padded text token: the reference turns
/// the text mask into `(1 - mask) * MASK_BIAS`.
pub const MASK_BIAS: f32 = -10000.0;

struct Attention {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm_q: Vec<f32>,
    norm_k: Vec<f32>,
}

impl Attention {
    fn load(vb: &VarBuilder, d: usize, kv_in: usize) -> Result<Self, WeightError> {
        Ok(Attention {
            to_q: Linear::load(vb, "to_q", d, d, true)?,
            to_k: Linear::load(vb, "to_k", d, kv_in, true)?,
            to_v: Linear::load(vb, "to_v", d, kv_in, true)?,
            to_out: Linear::load(vb, "to_out.0", d, d, true)?,
            norm_q: vb.get("norm_q.weight", &[d])?.into_data(),
            norm_k: vb.get("norm_k.weight", &[d])?.into_data(),
        })
    }

    /// Attention of `x [nq, d]` over `kv [nk, kv_in]`.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &[f32],
        nq: usize,
        kv: &[f32],
        nk: usize,
        heads: usize,
        rope: Option<&RopeTables>,
        key_bias: Option<&[f32]>,
    ) -> Vec<f32> {
        let d = self.to_q.out_features();
        let mut q = self.to_q.forward(x, nq);
        let mut k = self.to_k.forward(kv, nk);
        let v = self.to_v.forward(kv, nk);
        rms_norm_rows(&mut q, d, Some(&self.norm_q), QK_NORM_EPS);
        rms_norm_rows(&mut k, d, Some(&self.norm_k), QK_NORM_EPS);
        if let Some(r) = rope {
            apply_rope(&mut q, r);
            apply_rope(&mut k, r);
        }
        let hd = d / heads;
        let o = attention(
            &q,
            &k,
            &v,
            nq,
            nk,
            heads,
            hd,
            1.0 / (hd as f32).sqrt(),
            AttnBias {
                per_key: key_bias,
                per_head: None,
            },
        );
        self.to_out.forward(&o, nq)
    }
}

/// One transformer block (`transformer_blocks.{i}` in the checkpoint; fields
/// named after its keys): self-attention on the modulated RMS norm with a
/// gated residual, cross-attention to the text with a plain residual, and
/// the gated feed-forward on the modulated RMS norm.
pub struct Block {
    attn1: Attention,
    attn2: Attention,
    /// `ff.net.0.proj`: d -> 4d, then tanh-GELU.
    ff_net_0_proj: Linear,
    /// `ff.net.2`: 4d -> d.
    ff_net_2: Linear,
    /// `[6, d]`: shift, scale, gate for attention, then for the feed-forward.
    scale_shift_table: Vec<f32>,
}

/// What every block of one forward reads besides the residual stream.
pub struct BlockInputs<'a> {
    /// Video tokens (rows of the residual stream).
    pub n: usize,
    /// `time_embed.linear`'s output: the 6 modulation rows `[6, d]` the
    /// blocks add to their `scale_shift_table`.
    pub temb: &'a [f32],
    /// The projected text `[l, d]` (`caption_projection`'s output).
    pub text: &'a [f32],
    /// Text tokens.
    pub l: usize,
    /// The cross-attention's additive bias per text token (`[l]`).
    pub key_bias: &'a [f32],
    /// RoPE over the video tokens' latent positions.
    pub rope: &'a RopeTables,
    /// Attention heads.
    pub heads: usize,
    /// Epsilon of the blocks' RMS norms (the config's `norm_eps`).
    pub eps: f32,
}

impl Block {
    /// The block under `vb` (`transformer_blocks.{i}`) of a transformer of `cfg`.
    pub fn load(vb: &VarBuilder, cfg: &DitConfig) -> Result<Self, WeightError> {
        let d = cfg.inner_dim();
        Ok(Block {
            attn1: Attention::load(&vb.pp("attn1"), d, d)?,
            attn2: Attention::load(&vb.pp("attn2"), d, cfg.cross_attention_dim)?,
            ff_net_0_proj: Linear::load(vb, "ff.net.0.proj", 4 * d, d, true)?,
            ff_net_2: Linear::load(vb, "ff.net.2", d, 4 * d, true)?,
            scale_shift_table: vb.get("scale_shift_table", &[6, d])?.into_data(),
        })
    }

    /// Add this block's update to the residual stream `x` (`[n, d]`).
    pub fn forward(&self, x: &mut [f32], inp: &BlockInputs<'_>) {
        let (n, d) = (inp.n, self.ff_net_2.out_features());
        let ada: Vec<f32> = self
            .scale_shift_table
            .iter()
            .zip(inp.temb)
            .map(|(s, t)| s + t)
            .collect();
        let row = |k: usize| &ada[k * d..(k + 1) * d];
        let mut h = x.to_vec();
        rms_norm_rows(&mut h, d, None, inp.eps);
        modulate_rows(&mut h, row(1), row(0));
        let a = self
            .attn1
            .forward(&h, n, &h, n, inp.heads, Some(inp.rope), None);
        add_gated(x, &a, row(2));
        let a = self
            .attn2
            .forward(x, n, inp.text, inp.l, inp.heads, None, Some(inp.key_bias));
        x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
        let mut h = x.to_vec();
        rms_norm_rows(&mut h, d, None, inp.eps);
        modulate_rows(&mut h, row(4), row(3));
        let mut f = self.ff_net_0_proj.forward(&h, n);
        gelu_tanh(&mut f);
        let f = self.ff_net_2.forward(&f, n);
        add_gated(x, &f, row(5));
    }
}

/// The LTX-Video transformer on the CPU, weights widened to f32.
pub struct Transformer {
    cfg: DitConfig,
    proj_in: Linear,
    /// `time_embed.emb.timestep_embedder.linear_1`.
    time_embed_linear_1: Linear,
    /// `time_embed.emb.timestep_embedder.linear_2`.
    time_embed_linear_2: Linear,
    /// `time_embed.linear`: the 6 modulation rows.
    time_embed_linear: Linear,
    caption_projection_linear_1: Linear,
    caption_projection_linear_2: Linear,
    blocks: Vec<Block>,
    /// `[2, d]`: shift and scale of the output norm.
    scale_shift_table: Vec<f32>,
    proj_out: Linear,
}

impl Transformer {
    /// Builds the transformer of `cfg` from tensors named as in
    /// [`tensor_specs`] under `vb`.
    pub fn load(vb: &VarBuilder, cfg: &DitConfig) -> Result<Self, LoadError> {
        cfg.validate()?;
        let d = cfg.inner_dim();
        let te = vb.pp("time_embed");
        let blocks = (0..cfg.num_layers)
            .map(|i| Block::load(&vb.pp("transformer_blocks").pp(i), cfg))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Transformer {
            cfg: cfg.clone(),
            proj_in: Linear::load(vb, "proj_in", d, cfg.in_channels, true)?,
            time_embed_linear_1: Linear::load(
                &te,
                "emb.timestep_embedder.linear_1",
                d,
                TIMESTEP_CHANNELS,
                true,
            )?,
            time_embed_linear_2: Linear::load(&te, "emb.timestep_embedder.linear_2", d, d, true)?,
            time_embed_linear: Linear::load(&te, "linear", 6 * d, d, true)?,
            caption_projection_linear_1: Linear::load(
                vb,
                "caption_projection.linear_1",
                d,
                cfg.caption_channels,
                true,
            )?,
            caption_projection_linear_2: Linear::load(
                vb,
                "caption_projection.linear_2",
                d,
                d,
                true,
            )?,
            blocks,
            scale_shift_table: vb.get("scale_shift_table", &[2, d])?.into_data(),
            proj_out: Linear::load(vb, "proj_out", cfg.out_channels, d, true)?,
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &DitConfig {
        &self.cfg
    }

    /// The velocity `[tokens, out_channels]` at noise level `sigma` (in
    /// [0, 1]; the network sees timestep `sigma * 1000`) for `latents
    /// [tokens, in_channels]` in `(f, h, w)` raster order over the latent
    /// `grid`, cross-attending to `text [L, caption_channels]` where
    /// `text_mask` (L values, 1 = real token, 0 = padding) is 1; `fps` (frames
    /// per second) scales RoPE's time axis.
    pub fn forward(
        &self,
        latents: &Tensor,
        sigma: f32,
        text: &Tensor,
        text_mask: &[f32],
        grid: (usize, usize, usize),
        fps: f32,
    ) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let d = cfg.inner_dim();
        let n = grid.0 * grid.1 * grid.2;
        if latents.shape() != [n, cfg.in_channels] {
            return Err(shape_err(
                "latents",
                format!("[{n}, {}] for grid {grid:?}", cfg.in_channels),
                latents.shape(),
            ));
        }
        let l = text.shape().first().copied().unwrap_or(0);
        if text.shape().len() != 2 || l == 0 || text.shape()[1] != cfg.caption_channels {
            return Err(shape_err(
                "text",
                format!("[L >= 1, {}]", cfg.caption_channels),
                text.shape(),
            ));
        }
        if text_mask.len() != l {
            return Err(shape_err(
                "text_mask",
                format!("[{l}] (one value per text token)"),
                &[text_mask.len()],
            ));
        }
        if !sigma.is_finite() {
            return Err(value_err("sigma", format!("{sigma} is not finite")));
        }
        if !(fps.is_finite() && fps > 0.0) {
            return Err(value_err(
                "fps",
                format!("{fps} must be a positive frame rate"),
            ));
        }

        let mut x = self.proj_in.forward(latents.data(), n);
        // Timestep: sinusoid -> MLP = embedded timestep; SiLU -> linear = 6 modulation rows.
        let mut t = self
            .time_embed_linear_1
            .forward(&timestep_embedding(sigma * 1000.0, TIMESTEP_CHANNELS), 1);
        silu(&mut t);
        let embedded = self.time_embed_linear_2.forward(&t, 1);
        let mut e = embedded.clone();
        silu(&mut e);
        let temb = self.time_embed_linear.forward(&e, 1);
        // Caption projection.
        let mut c = self.caption_projection_linear_1.forward(text.data(), l);
        gelu_tanh(&mut c);
        let text_states = self.caption_projection_linear_2.forward(&c, l);
        let key_bias: Vec<f32> = text_mask.iter().map(|m| (1.0 - m) * MASK_BIAS).collect();
        let rope = ltx_rope(grid, fps, ROPE_COMPRESSION.0, ROPE_COMPRESSION.1, d);
        let inputs = BlockInputs {
            n,
            temb: &temb,
            text: &text_states,
            l,
            key_bias: &key_bias,
            rope: &rope,
            heads: cfg.num_attention_heads,
            eps: cfg.norm_eps as f32,
        };
        for b in &self.blocks {
            b.forward(&mut x, &inputs);
        }
        let shift: Vec<f32> = self.scale_shift_table[..d]
            .iter()
            .zip(&embedded)
            .map(|(s, e)| s + e)
            .collect();
        let scale: Vec<f32> = self.scale_shift_table[d..]
            .iter()
            .zip(&embedded)
            .map(|(s, e)| s + e)
            .collect();
        layer_norm_rows(&mut x, d, OUT_NORM_EPS, None, None);
        modulate_rows(&mut x, &scale, &shift);
        let out = self.proj_out.forward(&x, n);
        Ok(
            Tensor::new(&[n, cfg.out_channels], out)
                .expect("proj_out yields tokens x out_channels"),
        )
    }
}

/// `x += a * gate` with a per-channel gate of length `d`, row by row.
fn add_gated(x: &mut [f32], a: &[f32], gate: &[f32]) {
    let d = gate.len();
    for (xr, ar) in x.chunks_mut(d).zip(a.chunks(d)) {
        for ((x, a), g) in xr.iter_mut().zip(ar).zip(gate) {
            *x += a * g;
        }
    }
}

fn shape_err(input: &'static str, expected: String, found: &[usize]) -> ModelError {
    ModelError::Shape {
        model: "transformer",
        input,
        expected,
        found: found.to_vec(),
    }
}

fn value_err(input: &'static str, detail: String) -> ModelError {
    ModelError::Value {
        model: "transformer",
        input,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::init;
    use crate::presets::dit_tiny;
    use crate::rng::Gaussian;
    use crate::weights::MapSource;

    fn tiny() -> (DitConfig, MapSource) {
        let cfg = dit_tiny();
        let src = init::source(&tensor_specs(&cfg), 11);
        (cfg, src)
    }

    fn inputs(grid: (usize, usize, usize), l: usize, c: usize) -> (Tensor, Tensor) {
        let n = grid.0 * grid.1 * grid.2;
        let lat = Tensor::new(&[n, 128], Gaussian::new(3, "lat").vec(n * 128)).unwrap();
        let txt = Tensor::new(&[l, c], Gaussian::new(3, "txt").vec(l * c)).unwrap();
        (lat, txt)
    }

    #[test]
    fn tiny_forward_is_finite_nontrivial_and_depends_on_every_input() {
        let (cfg, src) = tiny();
        let m = Transformer::load(&VarBuilder::new(&src), &cfg).unwrap();
        let grid = (2, 2, 3);
        let (lat, txt) = inputs(grid, 6, cfg.caption_channels);
        let mask = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
        let v = m.forward(&lat, 0.7, &txt, &mask, grid, 25.0).unwrap();
        assert_eq!(v.shape(), &[12, 128]);
        assert!(v.data().iter().all(|x| x.is_finite()));
        let std = (v.data().iter().map(|x| x * x).sum::<f32>() / v.numel() as f32).sqrt();
        assert!(std > 0.1 && std < 10.0, "velocity rms {std}");
        let differs = |w: &Tensor| {
            v.data()
                .iter()
                .zip(w.data())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        assert!(
            differs(&m.forward(&lat, 0.3, &txt, &mask, grid, 25.0).unwrap()) > 1e-3,
            "sigma ignored"
        );
        assert!(
            differs(&m.forward(&lat, 0.7, &txt, &mask, grid, 12.0).unwrap()) > 1e-5,
            "fps ignored"
        );
        assert!(
            differs(&m.forward(&lat, 0.7, &txt, &[1.0; 6], grid, 25.0).unwrap()) > 1e-4,
            "mask ignored"
        );
        // Padded tokens are masked out: changing them changes (almost) nothing.
        let mut txt2 = txt.clone();
        txt2.data_mut()[4 * 64..].iter_mut().for_each(|x| *x += 5.0);
        assert!(differs(&m.forward(&lat, 0.7, &txt2, &mask, grid, 25.0).unwrap()) < 1e-3);
    }

    #[test]
    fn bad_inputs_are_named() {
        let (cfg, src) = tiny();
        let m = Transformer::load(&VarBuilder::new(&src), &cfg).unwrap();
        let (lat, txt) = inputs((1, 2, 2), 3, 64);
        let e = m
            .forward(&lat, 0.5, &txt, &[1.0; 3], (1, 2, 3), 25.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("latents") && e.contains("[6, 128]"), "{e}");
        let e = m
            .forward(&lat, 0.5, &txt, &[1.0; 2], (1, 2, 2), 25.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("text_mask"), "{e}");
        let e = m
            .forward(&lat, f32::NAN, &txt, &[1.0; 3], (1, 2, 2), 25.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sigma"), "{e}");
        let e = m
            .forward(&lat, 0.5, &txt, &[1.0; 3], (1, 2, 2), 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fps"), "{e}");
    }

    #[test]
    fn missing_or_misshaped_weights_name_the_tensor() {
        let (cfg, mut src) = tiny();
        src.insert(
            "transformer_blocks.1.attn2.to_k.weight",
            Tensor::zeros(&[64, 63]),
        );
        let e = Transformer::load(&VarBuilder::new(&src), &cfg)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("transformer_blocks.1.attn2.to_k.weight") && e.contains("[64, 64]"),
            "{e}"
        );
        let mut bad = cfg.clone();
        bad.qk_norm = "layer_norm".into();
        let e = Transformer::load(&VarBuilder::new(&src), &bad)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("qk_norm"), "{e}");
    }
}
