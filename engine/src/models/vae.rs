//! The LTX-Video video VAE (diffusers `AutoencoderKLLTXVideo`): its config,
//! its checkpoint layout (encoder and decoder, both written by the releases)
//! and the CPU forward of its decoder.
//!
//! The decoder maps latents `[128, F', H', W']` to pixels `[3, F, H, W]` with
//! `F = 8 (F' - 1) + 1`, `H = 32 H'`, `W = 32 W'` (for the released layouts).
//! Every op but the temporal convolutions is local to one frame, so the decoder
//! runs as a stream of frames through a chain of layers, each holding only the
//! few frames its temporal kernel needs: a decode in temporal chunks gives
//! exactly the same pixels as one in a single piece.

use serde::{Deserialize, Serialize};

use crate::models::ConfigError;
use crate::weights::{DType, TensorSpec};

/// The VAE's `config.json` (diffusers field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VaeConfig {
    /// Pixel channels in (3).
    pub in_channels: usize,
    /// Pixel channels out (3).
    pub out_channels: usize,
    /// Latent channels (128).
    pub latent_channels: usize,
    /// Encoder block widths.
    pub block_out_channels: Vec<usize>,
    /// Encoder block kinds (`LTXVideoDownBlock3D` or `LTXVideo095DownBlock3D`).
    pub down_block_types: Vec<String>,
    /// Decoder block widths, listed from the pixel end (reversed when built).
    pub decoder_block_out_channels: Vec<usize>,
    /// Encoder resnets per block (last entry: mid block).
    pub layers_per_block: Vec<usize>,
    /// Decoder resnets per block, pixel end first (last entry: mid block).
    pub decoder_layers_per_block: Vec<usize>,
    /// Encoder blocks that downsample.
    pub spatio_temporal_scaling: Vec<bool>,
    /// Decoder blocks that upsample (2x in time, height and width).
    pub decoder_spatio_temporal_scaling: Vec<bool>,
    /// Decoder blocks that inject noise (0.9.1 only; not supported).
    pub decoder_inject_noise: Vec<bool>,
    /// Encoder downsampler kinds (`conv`, `spatial`, `temporal`, `spatiotemporal`).
    pub downsample_type: Vec<String>,
    /// Decoder upsamplers that add the rearranged input back (residual).
    pub upsample_residual: Vec<bool>,
    /// Channel reduction of each decoder upsampler (1 or 2).
    pub upsample_factor: Vec<usize>,
    /// Whether the decoder is conditioned on a decode timestep.
    pub timestep_conditioning: bool,
    /// Spatial pixel patch (4).
    pub patch_size: usize,
    /// Temporal pixel patch (1).
    pub patch_size_t: usize,
    /// Epsilon of the shortcut LayerNorms.
    pub resnet_norm_eps: f64,
    /// Latent scaling factor (1.0 in every release).
    pub scaling_factor: f64,
    /// Whether the encoder's temporal padding is causal.
    pub encoder_causal: bool,
    /// Whether the decoder's temporal padding is causal (false in releases).
    pub decoder_causal: bool,
    /// Declared spatial compression (absent in 0.9.0 configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spatial_compression_ratio: Option<usize>,
    /// Declared temporal compression (absent in 0.9.0 configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporal_compression_ratio: Option<usize>,
}

/// One decoder up block as built from the config (pixel end last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpBlockPlan {
    /// Channels the block's channel-changing resnet sees (its `in_channels`).
    pub in_channels: usize,
    /// Channels after the block.
    pub out_channels: usize,
    /// Resnets after the upsampler.
    pub layers: usize,
    /// Whether the block upsamples 2x in t, h, w.
    pub upsample: bool,
    /// Whether the upsampler adds its rearranged input back.
    pub residual: bool,
    /// Channel reduction of the upsampler.
    pub factor: usize,
}

impl VaeConfig {
    /// The decoder's up blocks in execution order (latent end first), exactly
    /// as diffusers derives them from the reversed config lists.
    pub fn decoder_plan(&self) -> (usize, usize, Vec<UpBlockPlan>) {
        let boc: Vec<usize> = self
            .decoder_block_out_channels
            .iter()
            .rev()
            .copied()
            .collect();
        let sts: Vec<bool> = self
            .decoder_spatio_temporal_scaling
            .iter()
            .rev()
            .copied()
            .collect();
        let lpb: Vec<usize> = self
            .decoder_layers_per_block
            .iter()
            .rev()
            .copied()
            .collect();
        let res: Vec<bool> = self.upsample_residual.iter().rev().copied().collect();
        let fac: Vec<usize> = self.upsample_factor.iter().rev().copied().collect();
        let first = boc.first().copied().unwrap_or(0);
        let mid_layers = lpb.first().copied().unwrap_or(0);
        let mut out = first;
        let mut blocks = Vec::new();
        for (i, &width) in boc.iter().enumerate() {
            let f = fac.get(i).copied().unwrap_or(1).max(1);
            let input = out / f;
            out = width / f;
            blocks.push(UpBlockPlan {
                in_channels: input,
                out_channels: out,
                layers: lpb.get(i + 1).copied().unwrap_or(0),
                upsample: sts.get(i).copied().unwrap_or(false),
                residual: res.get(i).copied().unwrap_or(false),
                factor: f,
            });
        }
        (first, mid_layers, blocks)
    }

    /// Pixels per latent voxel along height and width, as the decoder
    /// produces them: `patch_size * 2^(upsampling blocks)`.
    pub fn spatial_compression(&self) -> usize {
        let ups = self
            .decoder_spatio_temporal_scaling
            .iter()
            .filter(|s| **s)
            .count() as u32;
        self.patch_size * 2usize.pow(ups)
    }

    /// Frames per latent frame after the first: `patch_size_t * 2^(upsampling blocks)`.
    pub fn temporal_compression(&self) -> usize {
        let ups = self
            .decoder_spatio_temporal_scaling
            .iter()
            .filter(|s| **s)
            .count() as u32;
        self.patch_size_t * 2usize.pow(ups)
    }

    /// Checks that the decoder described is one the CPU arm runs: no noise
    /// injection, temporal patch 1, list lengths that fit together, channel
    /// counts that divide, and declared compression ratios that match.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = |field, detail: String| Err(ConfigError::new("vae", field, detail));
        let n = self.decoder_block_out_channels.len();
        if n == 0 {
            return e("decoder_block_out_channels", "is empty".into());
        }
        if self.decoder_layers_per_block.len() != n + 1 {
            return e(
                "decoder_layers_per_block",
                format!(
                    "has {} entries, expected {} (one per decoder block plus the mid block)",
                    self.decoder_layers_per_block.len(),
                    n + 1
                ),
            );
        }
        for (field, len) in [
            (
                "decoder_spatio_temporal_scaling",
                self.decoder_spatio_temporal_scaling.len(),
            ),
            ("upsample_residual", self.upsample_residual.len()),
            ("upsample_factor", self.upsample_factor.len()),
        ] {
            if len != n {
                return e(field, format!("has {len} entries, expected {n}"));
            }
        }
        if self.decoder_inject_noise.len() < n + 1 {
            return e(
                "decoder_inject_noise",
                format!(
                    "has {} entries, expected {}",
                    self.decoder_inject_noise.len(),
                    n + 1
                ),
            );
        }
        if self.decoder_inject_noise.iter().any(|x| *x) {
            return e(
                "decoder_inject_noise",
                "enables noise injection (the 0.9.1 decoder), which is not supported".into(),
            );
        }
        if self.patch_size_t != 1 {
            return e(
                "patch_size_t",
                format!("is {}, only 1 is supported", self.patch_size_t),
            );
        }
        if self.patch_size == 0 || self.latent_channels == 0 || self.out_channels == 0 {
            return e(
                "patch_size",
                "patch size and channel counts must be positive".into(),
            );
        }
        if self.upsample_factor.iter().any(|f| !(*f == 1 || *f == 2)) {
            return e(
                "upsample_factor",
                format!("is {:?}, entries must be 1 or 2", self.upsample_factor),
            );
        }
        let (first, _, blocks) = self.decoder_plan();
        if first == 0 {
            return e(
                "decoder_block_out_channels",
                "widths must be positive".into(),
            );
        }
        for (i, b) in blocks.iter().enumerate() {
            if b.out_channels == 0 || b.in_channels == 0 {
                return e(
                    "decoder_block_out_channels",
                    format!("up block {i}: widths must stay positive after upsample_factor"),
                );
            }
            if self.timestep_conditioning && b.in_channels != b.out_channels {
                return e(
                    "decoder_block_out_channels",
                    format!(
                        "up block {i} changes width {} -> {} with timestep conditioning, which the \
                         reference does not support",
                        b.in_channels, b.out_channels
                    ),
                );
            }
            if b.upsample && b.residual && (b.out_channels * b.factor) % 8 != 0 {
                return e(
                    "upsample_residual",
                    format!(
                        "up block {i}: residual needs its width {} divisible by 8",
                        b.out_channels * b.factor
                    ),
                );
            }
        }
        if let Some(r) = self.spatial_compression_ratio {
            if r != self.spatial_compression() {
                return e(
                    "spatial_compression_ratio",
                    format!(
                        "is {r}, but the decoder upsamples {}x",
                        self.spatial_compression()
                    ),
                );
            }
        }
        if let Some(r) = self.temporal_compression_ratio {
            if r != self.temporal_compression() {
                return e(
                    "temporal_compression_ratio",
                    format!(
                        "is {r}, but the decoder upsamples {}x",
                        self.temporal_compression()
                    ),
                );
            }
        }
        if self.scaling_factor.is_nan()
            || self.scaling_factor <= 0.0
            || !self.scaling_factor.is_finite()
        {
            return e(
                "scaling_factor",
                format!("is {}, must be positive", self.scaling_factor),
            );
        }
        Ok(())
    }

    /// The `config.json` diffusers writes for this config (with `_class_name`).
    pub fn to_config_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(m) = v.as_object_mut() {
            m.insert("_class_name".into(), "AutoencoderKLLTXVideo".into());
            m.insert("_diffusers_version".into(), "0.32.0".into());
        }
        v
    }
}

/// Every tensor of the VAE checkpoint (encoder, decoder and the latent
/// statistics buffers) in diffusers naming, with shapes and the released
/// storage type (bf16). The encoder entries are listed so a loader can tell a
/// real file from a wrong one; the engine runs only the decoder.
pub fn tensor_specs(cfg: &VaeConfig) -> Vec<TensorSpec> {
    let mut v = Vec::new();
    encoder_specs(cfg, &mut v);
    v.extend(decoder_tensor_specs(cfg));
    v.push(TensorSpec::new(
        "latents_mean",
        &[cfg.latent_channels],
        DType::BF16,
    ));
    v.push(TensorSpec::new(
        "latents_std",
        &[cfg.latent_channels],
        DType::BF16,
    ));
    v
}

/// The decoder's tensors only (`decoder.*`): what [`VaeDecoder`] loads besides
/// `latents_mean` / `latents_std`.
pub fn decoder_tensor_specs(cfg: &VaeConfig) -> Vec<TensorSpec> {
    let mut v = Vec::new();
    let tc = cfg.timestep_conditioning;
    let (first, mid_layers, blocks) = cfg.decoder_plan();
    conv_spec(&mut v, "decoder.conv_in", cfg.latent_channels, first, 3);
    if tc {
        time_embedder_spec(&mut v, "decoder.mid_block", 4 * first);
    }
    for j in 0..mid_layers {
        resnet_spec(
            &mut v,
            &format!("decoder.mid_block.resnets.{j}"),
            first,
            first,
            tc,
        );
    }
    for (i, b) in blocks.iter().enumerate() {
        let p = format!("decoder.up_blocks.{i}");
        if tc {
            time_embedder_spec(&mut v, &p, 4 * b.in_channels);
        }
        if b.in_channels != b.out_channels {
            resnet_spec(
                &mut v,
                &format!("{p}.conv_in"),
                b.in_channels,
                b.out_channels,
                tc,
            );
        }
        if b.upsample {
            let cin = b.out_channels * b.factor;
            conv_spec(
                &mut v,
                &format!("{p}.upsamplers.0.conv"),
                cin,
                cin * 8 / b.factor,
                3,
            );
        }
        for j in 0..b.layers {
            resnet_spec(
                &mut v,
                &format!("{p}.resnets.{j}"),
                b.out_channels,
                b.out_channels,
                tc,
            );
        }
    }
    let last = blocks.last().map(|b| b.out_channels).unwrap_or(first);
    let pixels_out = cfg.out_channels * cfg.patch_size * cfg.patch_size;
    conv_spec(&mut v, "decoder.conv_out", last, pixels_out, 3);
    if tc {
        v.push(TensorSpec::new(
            "decoder.timestep_scale_multiplier",
            &[],
            DType::BF16,
        ));
        time_embedder_spec(&mut v, "decoder", 2 * last);
        v.push(TensorSpec::new(
            "decoder.scale_shift_table",
            &[2, last],
            DType::BF16,
        ));
    }
    v
}

fn encoder_specs(cfg: &VaeConfig, v: &mut Vec<TensorSpec>) {
    let boc = &cfg.block_out_channels;
    let Some(&first) = boc.first() else { return };
    let cin = cfg.in_channels * cfg.patch_size * cfg.patch_size;
    conv_spec(v, "encoder.conv_in", cin, first, 3);
    let is095 = cfg.down_block_types.last().map(String::as_str) == Some("LTXVideo095DownBlock3D");
    let n = boc.len() - usize::from(is095);
    let mut out = first;
    for i in 0..n {
        let input = out;
        out = if is095 {
            boc.get(i + 1).copied().unwrap_or(input)
        } else if i + 1 < n {
            boc[i + 1]
        } else {
            boc[i]
        };
        let p = format!("encoder.down_blocks.{i}");
        for j in 0..cfg.layers_per_block.get(i).copied().unwrap_or(0) {
            resnet_spec(v, &format!("{p}.resnets.{j}"), input, input, false);
        }
        let scales = cfg.spatio_temporal_scaling.get(i).copied().unwrap_or(false);
        let kind = cfg
            .down_block_types
            .get(i)
            .map(String::as_str)
            .unwrap_or("");
        let dtype_kind = cfg
            .downsample_type
            .get(i)
            .map(String::as_str)
            .unwrap_or("conv");
        if scales {
            if kind == "LTXVideo095DownBlock3D" && dtype_kind != "conv" {
                let stride: usize = match dtype_kind {
                    "spatial" => 4,
                    "temporal" => 2,
                    _ => 8,
                };
                conv_spec(
                    v,
                    &format!("{p}.downsamplers.0.conv"),
                    input,
                    out / stride,
                    3,
                );
            } else {
                conv_spec(v, &format!("{p}.downsamplers.0"), input, input, 3);
            }
        }
        if kind != "LTXVideo095DownBlock3D" && input != out {
            resnet_spec(v, &format!("{p}.conv_out"), input, out, false);
        }
    }
    for j in 0..cfg.layers_per_block.last().copied().unwrap_or(0) {
        resnet_spec(
            v,
            &format!("encoder.mid_block.resnets.{j}"),
            out,
            out,
            false,
        );
    }
    conv_spec(v, "encoder.conv_out", out, cfg.latent_channels + 1, 3);
}

fn conv_spec(v: &mut Vec<TensorSpec>, p: &str, cin: usize, cout: usize, k: usize) {
    v.push(TensorSpec::new(
        format!("{p}.conv.weight"),
        &[cout, cin, k, k, k],
        DType::BF16,
    ));
    v.push(TensorSpec::new(
        format!("{p}.conv.bias"),
        &[cout],
        DType::BF16,
    ));
}

fn time_embedder_spec(v: &mut Vec<TensorSpec>, p: &str, dim: usize) {
    let t = format!("{p}.time_embedder.timestep_embedder");
    v.push(TensorSpec::new(
        format!("{t}.linear_1.weight"),
        &[dim, TIMESTEP_CHANNELS],
        DType::BF16,
    ));
    v.push(TensorSpec::new(
        format!("{t}.linear_1.bias"),
        &[dim],
        DType::BF16,
    ));
    v.push(TensorSpec::new(
        format!("{t}.linear_2.weight"),
        &[dim, dim],
        DType::BF16,
    ));
    v.push(TensorSpec::new(
        format!("{t}.linear_2.bias"),
        &[dim],
        DType::BF16,
    ));
}

fn resnet_spec(v: &mut Vec<TensorSpec>, p: &str, cin: usize, cout: usize, tc: bool) {
    conv_spec(v, &format!("{p}.conv1"), cin, cout, 3);
    conv_spec(v, &format!("{p}.conv2"), cout, cout, 3);
    if cin != cout {
        v.push(TensorSpec::new(
            format!("{p}.norm3.weight"),
            &[cin],
            DType::BF16,
        ));
        v.push(TensorSpec::new(
            format!("{p}.norm3.bias"),
            &[cin],
            DType::BF16,
        ));
        conv_spec(v, &format!("{p}.conv_shortcut"), cin, cout, 1);
    }
    if tc {
        v.push(TensorSpec::new(
            format!("{p}.scale_shift_table"),
            &[4, cin],
            DType::BF16,
        ));
    }
}

/// Width of the sinusoidal timestep embedding inside the decoder.
pub const TIMESTEP_CHANNELS: usize = 256;
