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

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::models::{ConfigError, LoadError, ModelError};
use crate::ops::activation::silu;
use crate::ops::conv3d::{Conv3d, PaddedFrame, TimePad};
use crate::ops::embed::timestep_embedding;
use crate::ops::linear::Linear;
use crate::ops::norm::{layer_norm_channels, modulate_channels, rms_norm_channels};
use crate::ops::space::{depth_to_space_emit, repeat_channels, unpatchify_frame};
use crate::tensor::Tensor;
use crate::weights::{DType, TensorSpec, VarBuilder};

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

/// The tensors a decoder reads from a VAE checkpoint: the decoder's own
/// ([`decoder_tensor_specs`]) and the latent statistics (`latents_mean`,
/// `latents_std`) the latents are denormalised with.
pub fn decoder_read_specs(cfg: &VaeConfig) -> Vec<TensorSpec> {
    let mut v = decoder_tensor_specs(cfg);
    v.extend(
        tensor_specs(cfg)
            .into_iter()
            .filter(|s| s.name == "latents_mean" || s.name == "latents_std"),
    );
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

/// Epsilon of the decoder's per-voxel RMS norms (fixed in the reference).
pub const PIXEL_NORM_EPS: f32 = 1e-8;

/// `timestep -> sinusoid(256) -> Linear -> SiLU -> Linear`.
struct TimeEmbedder {
    linear_1: Linear,
    linear_2: Linear,
}

impl TimeEmbedder {
    fn load(vb: &VarBuilder, dim: usize) -> Result<Self, LoadError> {
        let t = vb.pp("time_embedder.timestep_embedder");
        Ok(TimeEmbedder {
            linear_1: Linear::load(&t, "linear_1", dim, TIMESTEP_CHANNELS, true)?,
            linear_2: Linear::load(&t, "linear_2", dim, dim, true)?,
        })
    }

    fn forward(&self, t: f32) -> Vec<f32> {
        let mut h = self
            .linear_1
            .forward(&timestep_embedding(t, TIMESTEP_CHANNELS), 1);
        silu(&mut h);
        self.linear_2.forward(&h, 1)
    }
}

struct Resnet {
    conv1: Conv3d,
    conv2: Conv3d,
    /// LayerNorm (weight, bias) and 1x1x1 conv on the skip when channels change.
    shortcut: Option<(Vec<f32>, Vec<f32>, Conv3d)>,
    /// `[4, cin]`: shift1, scale1, shift2, scale2 added to the time embedding.
    scale_shift_table: Option<Vec<f32>>,
    cin: usize,
}

impl Resnet {
    fn load(vb: &VarBuilder, cin: usize, cout: usize, tc: bool) -> Result<Self, LoadError> {
        let shortcut = if cin != cout {
            Some((
                vb.get("norm3.weight", &[cin])?.into_data(),
                vb.get("norm3.bias", &[cin])?.into_data(),
                Conv3d::load(vb, "conv_shortcut.conv", cin, cout, 1)?,
            ))
        } else {
            None
        };
        Ok(Resnet {
            conv1: Conv3d::load(vb, "conv1.conv", cin, cout, 3)?,
            conv2: Conv3d::load(vb, "conv2.conv", cout, cout, 3)?,
            shortcut,
            scale_shift_table: if tc {
                Some(vb.get("scale_shift_table", &[4, cin])?.into_data())
            } else {
                None
            },
            cin,
        })
    }

    /// The four modulation rows (shift1, scale1, shift2, scale2) for a block
    /// time embedding `temb [4 * cin]`.
    fn modulation(&self, temb: Option<&[f32]>) -> Option<[Vec<f32>; 4]> {
        let (sst, temb) = (self.scale_shift_table.as_ref()?, temb?);
        let c = self.cin;
        let row = |k: usize| {
            (0..c)
                .map(|i| sst[k * c + i] + temb[k * c + i])
                .collect::<Vec<f32>>()
        };
        Some([row(0), row(1), row(2), row(3)])
    }
}

struct UpBlock {
    time_embedder: Option<TimeEmbedder>,
    conv_in: Option<Resnet>,
    upsampler: Option<(Conv3d, bool, usize)>,
    resnets: Vec<Resnet>,
}

/// The video VAE's decoder on the CPU, weights widened to f32.
pub struct VaeDecoder {
    cfg: VaeConfig,
    latents_mean: Vec<f32>,
    latents_std: Vec<f32>,
    conv_in: Conv3d,
    mid_time_embedder: Option<TimeEmbedder>,
    mid: Vec<Resnet>,
    ups: Vec<UpBlock>,
    /// Decoder-level timestep multiplier, time embedder and `[2, C]` table.
    out_time: Option<(f32, TimeEmbedder, Vec<f32>)>,
    conv_out: Conv3d,
    pad: TimePad,
}

impl VaeDecoder {
    /// Builds the decoder of `cfg` from the VAE checkpoint's tensors under
    /// `vb` (`decoder.*`, `latents_mean`, `latents_std`; the encoder's are not read).
    pub fn load(vb: &VarBuilder, cfg: &VaeConfig) -> Result<Self, LoadError> {
        cfg.validate()?;
        let tc = cfg.timestep_conditioning;
        let (first, mid_layers, plan) = cfg.decoder_plan();
        let dv = vb.pp("decoder");
        let mid_vb = dv.pp("mid_block");
        let mut mid = Vec::new();
        for j in 0..mid_layers {
            mid.push(Resnet::load(&mid_vb.pp("resnets").pp(j), first, first, tc)?);
        }
        let mut ups = Vec::new();
        for (i, b) in plan.iter().enumerate() {
            let u = dv.pp("up_blocks").pp(i);
            let conv_in = if b.in_channels != b.out_channels {
                Some(Resnet::load(
                    &u.pp("conv_in"),
                    b.in_channels,
                    b.out_channels,
                    tc,
                )?)
            } else {
                None
            };
            let upsampler = if b.upsample {
                let cin = b.out_channels * b.factor;
                let conv = Conv3d::load(&u, "upsamplers.0.conv.conv", cin, cin * 8 / b.factor, 3)?;
                Some((conv, b.residual, b.factor))
            } else {
                None
            };
            let mut resnets = Vec::new();
            for j in 0..b.layers {
                resnets.push(Resnet::load(
                    &u.pp("resnets").pp(j),
                    b.out_channels,
                    b.out_channels,
                    tc,
                )?);
            }
            ups.push(UpBlock {
                time_embedder: if tc {
                    Some(TimeEmbedder::load(&u, 4 * b.in_channels)?)
                } else {
                    None
                },
                conv_in,
                upsampler,
                resnets,
            });
        }
        let last = plan.last().map(|b| b.out_channels).unwrap_or(first);
        let out_time = if tc {
            let m = dv.get("timestep_scale_multiplier", &[])?.data()[0];
            Some((
                m,
                TimeEmbedder::load(&dv, 2 * last)?,
                dv.get("scale_shift_table", &[2, last])?.into_data(),
            ))
        } else {
            None
        };
        let c = cfg.latent_channels;
        Ok(VaeDecoder {
            cfg: cfg.clone(),
            latents_mean: vb.get("latents_mean", &[c])?.into_data(),
            latents_std: vb.get("latents_std", &[c])?.into_data(),
            conv_in: Conv3d::load(&dv, "conv_in.conv", c, first, 3)?,
            mid_time_embedder: if tc {
                Some(TimeEmbedder::load(&mid_vb, 4 * first)?)
            } else {
                None
            },
            mid,
            ups,
            out_time,
            conv_out: Conv3d::load(
                &dv,
                "conv_out.conv",
                last,
                cfg.out_channels * cfg.patch_size * cfg.patch_size,
                3,
            )?,
            pad: if cfg.decoder_causal {
                TimePad::Causal
            } else {
                TimePad::Replicate
            },
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &VaeConfig {
        &self.cfg
    }

    /// Per-channel mean of the latent space (`latents_mean`, length 128).
    pub fn latents_mean(&self) -> &[f32] {
        &self.latents_mean
    }

    /// Per-channel standard deviation of the latent space (`latents_std`).
    pub fn latents_std(&self) -> &[f32] {
        &self.latents_std
    }

    /// Pixel frames `F = t (F' - 1) + 1` of a clip of `F'` latent frames (`t`
    /// the temporal compression).
    pub fn output_frames(&self, latent_frames: usize) -> usize {
        (latent_frames.max(1) - 1) * self.cfg.temporal_compression() + 1
    }

    /// Decodes `latents [C, F', H', W']` (already denormalised) at
    /// `timestep` (used only by timestep-conditioned decoders) into pixels
    /// `[3, F, H, W]`, nominally in [-1, 1].
    pub fn decode(&self, latents: &Tensor, timestep: f32) -> Result<Tensor, ModelError> {
        let f = latents.shape().get(1).copied().unwrap_or(1).max(1);
        self.decode_chunked(latents, timestep, f, &mut |_| {})
    }

    /// [`decode`](Self::decode) in temporal chunks of `chunk_latent_frames`
    /// latent frames: the layers hold only the frames their temporal kernels
    /// need, and the pixels equal a one-piece decode exactly. `on_chunk(i)` is
    /// called once per chunk, in order, right after chunk `i`'s work (there are
    /// `ceil(F' / chunk_latent_frames)` chunks; the last one also flushes the
    /// frames the layers still hold).
    pub fn decode_chunked(
        &self,
        latents: &Tensor,
        timestep: f32,
        chunk_latent_frames: usize,
        on_chunk: &mut dyn FnMut(usize),
    ) -> Result<Tensor, ModelError> {
        let s = latents.shape();
        let c = self.cfg.latent_channels;
        if s.len() != 4 || s[0] != c || s[1..].contains(&0) {
            return Err(ModelError::Shape {
                model: "vae",
                input: "latents",
                expected: format!("[{c}, F' >= 1, H' >= 1, W' >= 1]"),
                found: s.to_vec(),
            });
        }
        if chunk_latent_frames == 0 {
            return Err(ModelError::Value {
                model: "vae",
                input: "chunk_latent_frames",
                detail: "must be at least 1".into(),
            });
        }
        if !timestep.is_finite() {
            return Err(ModelError::Value {
                model: "vae",
                input: "timestep",
                detail: format!("{timestep} is not finite"),
            });
        }
        let (lf, lh, lw) = (s[1], s[2], s[3]);
        let sc = self.cfg.spatial_compression();
        let (frames, h, w) = (self.output_frames(lf), lh * sc, lw * sc);
        let oc = self.cfg.out_channels;
        let mut out = vec![0.0f32; oc * frames * h * w];
        let mut written = 0usize;
        let mut store = |fr: Frame, out: &mut Vec<f32>| {
            debug_assert_eq!((fr.c, fr.h, fr.w), (oc, h, w));
            if written < frames {
                for ch in 0..oc {
                    out[(ch * frames + written) * h * w..(ch * frames + written + 1) * h * w]
                        .copy_from_slice(&fr.data[ch * h * w..(ch + 1) * h * w]);
                }
            }
            written += 1;
        };
        let mut chain = self.chain(timestep);
        let plane = lh * lw;
        let chunks = lf.div_ceil(chunk_latent_frames);
        for k in 0..chunks {
            for t in k * chunk_latent_frames..((k + 1) * chunk_latent_frames).min(lf) {
                let mut data = vec![0.0f32; c * plane];
                for ch in 0..c {
                    data[ch * plane..(ch + 1) * plane].copy_from_slice(
                        &latents.data()[(ch * lf + t) * plane..(ch * lf + t + 1) * plane],
                    );
                }
                for fr in chain.push(Frame {
                    data,
                    c,
                    h: lh,
                    w: lw,
                }) {
                    store(fr, &mut out);
                }
            }
            if k + 1 == chunks {
                for fr in chain.finish() {
                    store(fr, &mut out);
                }
            }
            on_chunk(k);
        }
        debug_assert_eq!(
            written, frames,
            "decoder emitted {written} frames, expected {frames}"
        );
        Ok(Tensor::new(&[oc, frames, h, w], out).expect("channels x frames x height x width"))
    }

    /// The decoder as a chain of frame-stream nodes for one timestep.
    fn chain(&self, timestep: f32) -> Chain<'_> {
        let mut nodes: Vec<Box<dyn Node + '_>> =
            vec![Box::new(ConvNode::new(&self.conv_in, self.pad))];
        let t = self.out_time.as_ref().map(|(m, _, _)| timestep * m);
        let mid_temb = t.and_then(|t| self.mid_time_embedder.as_ref().map(|e| e.forward(t)));
        for r in &self.mid {
            nodes.push(Box::new(self.resnet_node(r, mid_temb.as_deref())));
        }
        for u in &self.ups {
            let temb = t.and_then(|t| u.time_embedder.as_ref().map(|e| e.forward(t)));
            if let Some(r) = &u.conv_in {
                // The reference hands the raw timestep to this resnet; with timestep
                // conditioning it cannot exist (validated), so no modulation here.
                nodes.push(Box::new(self.resnet_node(r, None)));
            }
            if let Some((conv, residual, factor)) = &u.upsampler {
                nodes.push(Box::new(UpsampleNode {
                    conv: ConvNode::new(conv, self.pad),
                    repeats: if *residual { Some(8 / factor) } else { None },
                    inputs: VecDeque::new(),
                    t: 0,
                }));
            }
            for r in &u.resnets {
                nodes.push(Box::new(self.resnet_node(r, temb.as_deref())));
            }
        }
        let mut tail = vec![Pw::Rms];
        if let (Some(t), Some((_, emb, sst))) = (t, &self.out_time) {
            let e = emb.forward(t);
            let c = sst.len() / 2;
            let shift = (0..c).map(|i| sst[i] + e[i]).collect();
            let scale = (0..c).map(|i| sst[c + i] + e[c + i]).collect();
            tail.push(Pw::Modulate { scale, shift });
        }
        tail.push(Pw::Silu);
        nodes.push(Box::new(PointNode(tail)));
        nodes.push(Box::new(ConvNode::new(&self.conv_out, self.pad)));
        nodes.push(Box::new(UnpatchifyNode(self.cfg.patch_size)));
        Chain(nodes)
    }

    fn resnet_node<'a>(&'a self, r: &'a Resnet, temb: Option<&[f32]>) -> ResnetNode<'a> {
        let m = r.modulation(temb);
        let pre = |k: usize| {
            let mut v = vec![Pw::Rms];
            if let Some(m) = &m {
                v.push(Pw::Modulate {
                    shift: m[2 * k].clone(),
                    scale: m[2 * k + 1].clone(),
                });
            }
            v.push(Pw::Silu);
            Box::new(PointNode(v)) as Box<dyn Node + 'a>
        };
        let main = Chain(vec![
            pre(0),
            Box::new(ConvNode::new(&r.conv1, self.pad)),
            pre(1),
            Box::new(ConvNode::new(&r.conv2, self.pad)),
        ]);
        let skip = r.shortcut.as_ref().map(|(w, b, conv)| {
            let eps = self.cfg.resnet_norm_eps as f32;
            Chain(vec![
                Box::new(PointNode(vec![Pw::LayerNorm {
                    weight: w.clone(),
                    bias: b.clone(),
                    eps,
                }])) as Box<dyn Node + 'a>,
                Box::new(ConvNode::new(conv, self.pad)),
            ])
        });
        ResnetNode {
            main,
            skip,
            queue: VecDeque::new(),
        }
    }
}

/// One frame `[c, h, w]` flowing through the decoder.
#[derive(Debug, Clone)]
struct Frame {
    data: Vec<f32>,
    c: usize,
    h: usize,
    w: usize,
}

/// A layer of the frame stream: takes frames in time order and returns the
/// frames it can produce so far; `finish` flushes what it still holds.
trait Node {
    fn push(&mut self, f: Frame) -> Vec<Frame>;
    fn finish(&mut self) -> Vec<Frame>;
}

/// Nodes in sequence.
struct Chain<'a>(Vec<Box<dyn Node + 'a>>);

impl Node for Chain<'_> {
    fn push(&mut self, f: Frame) -> Vec<Frame> {
        let mut frames = vec![f];
        for n in &mut self.0 {
            frames = frames.into_iter().flat_map(|f| n.push(f)).collect();
        }
        frames
    }

    fn finish(&mut self) -> Vec<Frame> {
        let mut carry: Vec<Frame> = Vec::new();
        for n in &mut self.0 {
            let mut out: Vec<Frame> = carry.into_iter().flat_map(|f| n.push(f)).collect();
            out.extend(n.finish());
            carry = out;
        }
        carry
    }
}

/// A temporal convolution over the stream: output frame `t` is emitted once
/// input `t + right` has arrived (or at the end, where the last frame repeats).
struct ConvNode<'a> {
    conv: &'a Conv3d,
    pad: TimePad,
    kept: VecDeque<PaddedFrame>,
    first_kept: usize,
    received: usize,
    emitted: usize,
    size: (usize, usize),
}

impl<'a> ConvNode<'a> {
    fn new(conv: &'a Conv3d, pad: TimePad) -> Self {
        ConvNode {
            conv,
            pad,
            kept: VecDeque::new(),
            first_kept: 0,
            received: 0,
            emitted: 0,
            size: (0, 0),
        }
    }

    fn left(&self) -> usize {
        match self.pad {
            TimePad::Causal => self.conv.kt() - 1,
            TimePad::Replicate => (self.conv.kt() - 1) / 2,
        }
    }

    fn emit(&mut self, total: usize) -> Frame {
        let t = self.emitted;
        let idx = self.conv.window_indices(t, total, self.pad);
        let window: Vec<&PaddedFrame> = idx
            .iter()
            .map(|i| &self.kept[i - self.first_kept])
            .collect();
        let data = self.conv.forward_padded(&window);
        self.emitted += 1;
        let keep_from = self.emitted.saturating_sub(self.left());
        while self.first_kept < keep_from && self.kept.len() > 1 {
            self.kept.pop_front();
            self.first_kept += 1;
        }
        Frame {
            data,
            c: self.conv.out_channels(),
            h: self.size.0,
            w: self.size.1,
        }
    }
}

impl Node for ConvNode<'_> {
    fn push(&mut self, f: Frame) -> Vec<Frame> {
        self.size = (f.h, f.w);
        self.kept.push_back(self.conv.pad(&f.data, f.h, f.w));
        self.received += 1;
        let right = self.conv.kt() - 1 - self.left();
        let mut out = Vec::new();
        while self.emitted + right < self.received {
            // Every index the window reads is below `received`: clamping at the
            // (unknown) end cannot apply, so `received` stands in for the total.
            out.push(self.emit(self.received));
        }
        out
    }

    fn finish(&mut self) -> Vec<Frame> {
        let mut out = Vec::new();
        while self.emitted < self.received {
            out.push(self.emit(self.received));
        }
        out
    }
}

/// Frame-local ops.
enum Pw {
    Rms,
    Modulate {
        scale: Vec<f32>,
        shift: Vec<f32>,
    },
    Silu,
    LayerNorm {
        weight: Vec<f32>,
        bias: Vec<f32>,
        eps: f32,
    },
}

struct PointNode(Vec<Pw>);

impl Node for PointNode {
    fn push(&mut self, mut f: Frame) -> Vec<Frame> {
        for op in &self.0 {
            match op {
                Pw::Rms => rms_norm_channels(&mut f.data, f.c, PIXEL_NORM_EPS),
                Pw::Modulate { scale, shift } => modulate_channels(&mut f.data, scale, shift),
                Pw::Silu => silu(&mut f.data),
                Pw::LayerNorm { weight, bias, eps } => {
                    layer_norm_channels(&mut f.data, f.c, *eps, weight, bias)
                }
            }
        }
        vec![f]
    }

    fn finish(&mut self) -> Vec<Frame> {
        Vec::new()
    }
}

/// A resnet: the main path (norm, modulation, SiLU, conv, twice) delays
/// frames; the skip (identity, or LayerNorm + 1x1x1 conv) waits in a queue.
struct ResnetNode<'a> {
    main: Chain<'a>,
    skip: Option<Chain<'a>>,
    queue: VecDeque<Frame>,
}

impl ResnetNode<'_> {
    fn add_skip(&mut self, frames: Vec<Frame>) -> Vec<Frame> {
        frames
            .into_iter()
            .map(|mut f| {
                let s = self
                    .queue
                    .pop_front()
                    .expect("a skip frame for every main frame");
                f.data.iter_mut().zip(&s.data).for_each(|(a, b)| *a += b);
                f
            })
            .collect()
    }
}

impl Node for ResnetNode<'_> {
    fn push(&mut self, f: Frame) -> Vec<Frame> {
        match &mut self.skip {
            Some(s) => {
                let sk = s.push(f.clone());
                self.queue.extend(sk);
            }
            None => self.queue.push_back(f.clone()),
        }
        let out = self.main.push(f);
        self.add_skip(out)
    }

    fn finish(&mut self) -> Vec<Frame> {
        if let Some(s) = &mut self.skip {
            let sk = s.finish();
            self.queue.extend(sk);
        }
        let out = self.main.finish();
        self.add_skip(out)
    }
}

/// Conv then depth-to-space (2x in t, h, w; first frame dropped), plus the
/// rearranged input repeated along channels when residual.
struct UpsampleNode<'a> {
    conv: ConvNode<'a>,
    repeats: Option<usize>,
    inputs: VecDeque<Frame>,
    t: usize,
}

impl UpsampleNode<'_> {
    fn expand(&mut self, ys: Vec<Frame>) -> Vec<Frame> {
        let mut out = Vec::new();
        for y in ys {
            let mut frames = depth_to_space_emit(self.t, &y.data, y.c, y.h, y.w);
            if let Some(r) = self.repeats {
                let x = self
                    .inputs
                    .pop_front()
                    .expect("an input frame for every conv frame");
                let res = depth_to_space_emit(self.t, &x.data, x.c, x.h, x.w);
                for (f, rf) in frames.iter_mut().zip(res) {
                    let rf = repeat_channels(&rf, r);
                    f.iter_mut().zip(&rf).for_each(|(a, b)| *a += b);
                }
            }
            self.t += 1;
            out.extend(frames.into_iter().map(|data| Frame {
                data,
                c: y.c / 8,
                h: 2 * y.h,
                w: 2 * y.w,
            }));
        }
        out
    }
}

impl Node for UpsampleNode<'_> {
    fn push(&mut self, f: Frame) -> Vec<Frame> {
        if self.repeats.is_some() {
            self.inputs.push_back(f.clone());
        }
        let ys = self.conv.push(f);
        self.expand(ys)
    }

    fn finish(&mut self) -> Vec<Frame> {
        let ys = self.conv.finish();
        self.expand(ys)
    }
}

/// Pixel patches `[c p^2, h, w]` to pixels `[c, h p, w p]`.
struct UnpatchifyNode(usize);

impl Node for UnpatchifyNode {
    fn push(&mut self, f: Frame) -> Vec<Frame> {
        let p = self.0;
        let data = unpatchify_frame(&f.data, f.c, f.h, f.w, p);
        vec![Frame {
            data,
            c: f.c / (p * p),
            h: f.h * p,
            w: f.w * p,
        }]
    }

    fn finish(&mut self) -> Vec<Frame> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::init;
    use crate::ops::space::{depth_to_space, stack_frames};
    use crate::presets::vae_tiny;
    use crate::rng::Gaussian;
    use crate::weights::MapSource;

    /// A tiny decoder in the 0.9.0 layout: no timestep conditioning, plain
    /// upsamplers, channel-changing resnets with LayerNorm + 1x1 shortcut.
    fn vae_tiny_090() -> VaeConfig {
        let mut c = crate::presets::vae_090();
        c.block_out_channels = vec![8, 16, 32, 32];
        c.layers_per_block = vec![1, 1, 1, 1, 1];
        c.decoder_block_out_channels = vec![8, 16, 32, 32];
        c.decoder_layers_per_block = vec![1, 1, 1, 1, 1];
        c
    }

    fn load(cfg: &VaeConfig, seed: u64) -> (VaeDecoder, MapSource) {
        let src = init::source(&tensor_specs(cfg), seed);
        (VaeDecoder::load(&VarBuilder::new(&src), cfg).unwrap(), src)
    }

    fn latents(f: usize, h: usize, w: usize) -> Tensor {
        Tensor::new(&[128, f, h, w], Gaussian::new(4, "z").vec(128 * f * h * w)).unwrap()
    }

    /// The same decoder computed layer by layer on whole clips (Conv3d::forward,
    /// whole-clip depth-to-space): an independent check of the stream's delays.
    fn whole_clip(d: &VaeDecoder, z: &Tensor, timestep: f32) -> Vec<f32> {
        let (mut f, mut h, mut w) = (z.shape()[1], z.shape()[2], z.shape()[3]);
        let pad = d.pad;
        let pointwise = |x: &mut Vec<f32>, c: usize, f: usize, ops: &[Pw]| {
            let s = x.len() / c / f;
            for t in 0..f {
                let mut fr: Vec<f32> = (0..c)
                    .flat_map(|ch| x[(ch * f + t) * s..(ch * f + t + 1) * s].to_vec())
                    .collect();
                for op in ops {
                    match op {
                        Pw::Rms => rms_norm_channels(&mut fr, c, PIXEL_NORM_EPS),
                        Pw::Modulate { scale, shift } => modulate_channels(&mut fr, scale, shift),
                        Pw::Silu => silu(&mut fr),
                        Pw::LayerNorm { weight, bias, eps } => {
                            layer_norm_channels(&mut fr, c, *eps, weight, bias)
                        }
                    }
                }
                for ch in 0..c {
                    x[(ch * f + t) * s..(ch * f + t + 1) * s]
                        .copy_from_slice(&fr[ch * s..(ch + 1) * s]);
                }
            }
        };
        let resnet =
            |x: &Vec<f32>, r: &Resnet, temb: Option<&[f32]>, f: usize, h: usize, w: usize| {
                let m = r.modulation(temb);
                let pre = |k: usize| {
                    let mut v = vec![Pw::Rms];
                    if let Some(m) = &m {
                        v.push(Pw::Modulate {
                            shift: m[2 * k].clone(),
                            scale: m[2 * k + 1].clone(),
                        });
                    }
                    v.push(Pw::Silu);
                    v
                };
                let mut a = x.clone();
                pointwise(&mut a, r.cin, f, &pre(0));
                let mut a = r.conv1.forward(&a, f, h, w, pad);
                pointwise(&mut a, r.conv1.out_channels(), f, &pre(1));
                let mut a = r.conv2.forward(&a, f, h, w, pad);
                let skip = match &r.shortcut {
                    Some((wt, b, conv)) => {
                        let mut s = x.clone();
                        pointwise(
                            &mut s,
                            r.cin,
                            f,
                            &[Pw::LayerNorm {
                                weight: wt.clone(),
                                bias: b.clone(),
                                eps: 1e-6,
                            }],
                        );
                        conv.forward(&s, f, h, w, pad)
                    }
                    None => x.clone(),
                };
                a.iter_mut().zip(&skip).for_each(|(a, s)| *a += s);
                a
            };
        let t = d.out_time.as_ref().map(|(m, _, _)| timestep * m);
        let mut x = d.conv_in.forward(z.data(), f, h, w, pad);
        let temb = t.and_then(|t| d.mid_time_embedder.as_ref().map(|e| e.forward(t)));
        for r in &d.mid {
            x = resnet(&x, r, temb.as_deref(), f, h, w);
        }
        for u in &d.ups {
            let temb = t.and_then(|t| u.time_embedder.as_ref().map(|e| e.forward(t)));
            if let Some(r) = &u.conv_in {
                x = resnet(&x, r, None, f, h, w);
            }
            if let Some((conv, residual, factor)) = &u.upsampler {
                let y = conv.forward(&x, f, h, w, pad);
                let mut up = depth_to_space(&y, conv.out_channels(), f, h, w);
                if *residual {
                    let r = depth_to_space(&x, conv.in_channels(), f, h, w);
                    let (c8, f2, s2) = (conv.in_channels() / 8, 2 * f - 1, 4 * h * w);
                    let frames: Vec<Vec<f32>> = (0..f2)
                        .map(|t| {
                            let fr: Vec<f32> = (0..c8)
                                .flat_map(|c| r[(c * f2 + t) * s2..(c * f2 + t + 1) * s2].to_vec())
                                .collect();
                            repeat_channels(&fr, 8 / factor)
                        })
                        .collect();
                    let rep = stack_frames(&frames, c8 * 8 / factor);
                    up.iter_mut().zip(&rep).for_each(|(a, b)| *a += b);
                }
                x = up;
                (f, h, w) = (2 * f - 1, 2 * h, 2 * w);
            }
            for r in &u.resnets {
                x = resnet(&x, r, temb.as_deref(), f, h, w);
            }
        }
        let c = d.conv_out.in_channels();
        let mut tail = vec![Pw::Rms];
        if let (Some(t), Some((_, emb, sst))) = (t, &d.out_time) {
            let e = emb.forward(t);
            tail.push(Pw::Modulate {
                shift: (0..c).map(|i| sst[i] + e[i]).collect(),
                scale: (0..c).map(|i| sst[c + i] + e[c + i]).collect(),
            });
        }
        tail.push(Pw::Silu);
        pointwise(&mut x, c, f, &tail);
        let y = d.conv_out.forward(&x, f, h, w, pad);
        let (co, p) = (d.conv_out.out_channels(), d.cfg.patch_size);
        let frames: Vec<Vec<f32>> = (0..f)
            .map(|t| {
                let fr: Vec<f32> = (0..co)
                    .flat_map(|ch| y[(ch * f + t) * h * w..(ch * f + t + 1) * h * w].to_vec())
                    .collect();
                unpatchify_frame(&fr, co, h, w, p)
            })
            .collect();
        stack_frames(&frames, co / (p * p))
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn tiny_decode_has_the_video_shape_and_sane_pixels() {
        let (d, _) = load(&vae_tiny(), 21);
        let y = d.decode(&latents(2, 2, 2), 0.05).unwrap();
        assert_eq!(y.shape(), &[3, 9, 64, 64]);
        assert!(y.data().iter().all(|v| v.is_finite()));
        let n = y.numel() as f32;
        let mean = y.data().iter().sum::<f32>() / n;
        let std = (y
            .data()
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum::<f32>()
            / n)
            .sqrt();
        assert!(std > 0.05 && std < 3.0, "pixel std {std}");
        // Frames differ from each other (the clip moves).
        let fr = |k: usize| -> Vec<f32> {
            (0..3)
                .flat_map(|c| y.data()[(c * 9 + k) * 4096..(c * 9 + k + 1) * 4096].to_vec())
                .collect()
        };
        for k in 0..8 {
            assert!(
                max_diff(&fr(k), &fr(k + 1)) > 1e-3,
                "frames {k} and {} equal",
                k + 1
            );
        }
        // The decode timestep matters.
        let y2 = d.decode(&latents(2, 2, 2), 0.5).unwrap();
        assert!(max_diff(y.data(), y2.data()) > 1e-4);
    }

    #[test]
    fn chunked_decode_equals_one_piece_and_the_whole_clip_reference() {
        for cfg in [vae_tiny(), vae_tiny_090()] {
            let (d, _) = load(&cfg, 22);
            let z = latents(3, 1, 2);
            let one = d.decode(&z, 0.05).unwrap();
            assert_eq!(one.shape(), &[3, 17, 32, 64]);
            for chunk in [1, 2, 5] {
                let mut calls = Vec::new();
                let c = d
                    .decode_chunked(&z, 0.05, chunk, &mut |i| calls.push(i))
                    .unwrap();
                assert_eq!(c, one, "chunk {chunk}");
                assert_eq!(calls, (0..3usize.div_ceil(chunk)).collect::<Vec<_>>());
            }
            let whole = whole_clip(&d, &z, 0.05);
            let diff = max_diff(one.data(), &whole);
            assert!(
                diff < 1e-5,
                "stream vs whole clip: {diff} ({})",
                cfg.decoder_block_out_channels.len()
            );
        }
    }

    #[test]
    fn a_single_latent_frame_decodes_to_one_frame() {
        let (d, _) = load(&vae_tiny(), 23);
        let y = d.decode(&latents(1, 1, 1), 0.0).unwrap();
        assert_eq!(y.shape(), &[3, 1, 32, 32]);
    }

    #[test]
    fn bad_inputs_and_weights_are_named() {
        let (d, mut src) = load(&vae_tiny(), 24);
        let e = d
            .decode(&Tensor::zeros(&[64, 1, 1, 1]), 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("latents") && e.contains("128"), "{e}");
        assert!(d
            .decode_chunked(&latents(1, 1, 1), 0.0, 0, &mut |_| {})
            .is_err());
        assert!(d.decode(&latents(1, 1, 1), f32::INFINITY).is_err());
        src.insert(
            "decoder.up_blocks.1.upsamplers.0.conv.conv.weight",
            Tensor::zeros(&[128, 32, 3, 3, 2]),
        );
        let e = VaeDecoder::load(&VarBuilder::new(&src), &vae_tiny())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("decoder.up_blocks.1.upsamplers.0.conv.conv.weight")
                && e.contains("[128, 32, 3, 3, 3]"),
            "{e}"
        );
        let mut noisy = vae_tiny();
        noisy.decoder_inject_noise[1] = true;
        let e = VaeDecoder::load(&VarBuilder::new(&src), &noisy)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("decoder_inject_noise"), "{e}");
    }
}
