//! Named model presets: the configs of the three networks, the
//! scheduler's config and the latent scaling, for `tiny` (a few MB, for tests and
//! rung 0) and the released `ltxv-2b` and `ltxv-13b`.
//!
//! `ltxv-2b-0.9.0` is the first release: the same 2B transformer with the 0.9.0
//! VAE decoder (no timestep conditioning, so no decode timestep or decode noise).
//!
//! `tiny` keeps every shape formula of the real models (128 latent channels,
//! 32x spatial and 8x temporal compression, the 0.9.5+ VAE decoder layout with
//! timestep conditioning and residual depth-to-space upsampling, RoPE with
//! padding slots, T5 with relative buckets), only narrower and shallower.

pub use crate::models::dit::DitConfig;
pub use crate::models::t5::T5Config;
pub use crate::models::vae::VaeConfig;
pub use crate::schedule::SchedulerConfig;

/// A preset name that does not exist.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unknown preset '{name}' (known: {known})")]
pub struct PresetError {
    /// The name asked for.
    pub name: String,
    /// The known names, comma-separated.
    pub known: String,
}

/// How latents map to the VAE's input, besides the per-channel
/// `latents_mean` / `latents_std` stored in the VAE weights.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeScaling {
    /// `z_vae = z * latents_std / scaling_factor + latents_mean` (1.0 in releases).
    pub scaling_factor: f32,
    /// Decode timestep given to a timestep-conditioned decoder (LTX-Video
    /// 0.9.5 recommendation: 0.05). Ignored when the VAE is not conditioned.
    pub decode_timestep: f32,
    /// Share of fresh noise mixed into the latents before a conditioned
    /// decode: `z = (1 - s) z + s * noise` (0.9.5 recommendation: 0.025).
    pub decode_noise_scale: f32,
}

/// Everything that fixes the numerics of one model family.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// The preset's name (`tiny`, `ltxv-2b`, `ltxv-13b`, `ltxv-2b-0.9.0`).
    pub name: &'static str,
    /// The transformer.
    pub dit: DitConfig,
    /// The video VAE.
    pub vae: VaeConfig,
    /// The text encoder; its `d_model` equals `dit.caption_channels`.
    pub t5: T5Config,
    /// Latent scaling and decode-timestep settings.
    pub vae_scaling: VaeScaling,
    /// The flow-matching sigma schedule.
    pub scheduler: SchedulerConfig,
    /// Text tokens the prompt is padded / truncated to.
    pub max_text_tokens: usize,
    /// Frame rate assumed when a rung names none (frames per second; it
    /// scales RoPE's time axis).
    pub default_fps: f32,
}

const NAMES: &[&str] = &["tiny", "ltxv-2b", "ltxv-13b", "ltxv-2b-0.9.0"];

/// The names [`preset`] accepts.
pub fn preset_names() -> &'static [&'static str] {
    NAMES
}

/// The preset called `name`.
pub fn preset(name: &str) -> Result<Preset, PresetError> {
    let (dit, vae, t5, max_text_tokens, name) = match name {
        "tiny" => (dit_tiny(), vae_tiny(), t5_tiny(), 32, "tiny"),
        "ltxv-2b" => (dit_2b(), vae_095(), t5_xxl(), 128, "ltxv-2b"),
        "ltxv-13b" => (dit_13b(), vae_095(), t5_xxl(), 128, "ltxv-13b"),
        "ltxv-2b-0.9.0" => (dit_2b(), vae_090(), t5_xxl(), 128, "ltxv-2b-0.9.0"),
        _ => {
            return Err(PresetError {
                name: name.to_string(),
                known: NAMES.join(", "),
            })
        }
    };
    Ok(Preset {
        name,
        vae_scaling: VaeScaling {
            scaling_factor: vae.scaling_factor as f32,
            decode_timestep: 0.05,
            decode_noise_scale: 0.025,
        },
        dit,
        vae,
        t5,
        scheduler: SchedulerConfig::ltx_video(),
        max_text_tokens,
        default_fps: 25.0,
    })
}

fn dit(heads: usize, head_dim: usize, layers: usize, caption: usize) -> DitConfig {
    DitConfig {
        in_channels: 128,
        out_channels: 128,
        patch_size: 1,
        patch_size_t: 1,
        num_attention_heads: heads,
        attention_head_dim: head_dim,
        cross_attention_dim: heads * head_dim,
        num_layers: layers,
        activation_fn: "gelu-approximate".into(),
        qk_norm: "rms_norm_across_heads".into(),
        norm_elementwise_affine: false,
        norm_eps: 1e-6,
        caption_channels: caption,
        attention_bias: true,
        attention_out_bias: true,
    }
}

/// The 2B transformer of LTX-Video 0.9.0 - 0.9.6 (28 blocks, 32 x 64).
pub fn dit_2b() -> DitConfig {
    dit(32, 64, 28, 4096)
}

/// The 13B transformer of LTX-Video 0.9.7 / 0.9.8 (48 blocks, 32 x 128).
pub fn dit_13b() -> DitConfig {
    dit(32, 128, 48, 4096)
}

/// The tiny transformer: 2 blocks, 4 heads x 16 (width 64, so RoPE keeps
/// 64 mod 6 = 4 padding slots), caption channels = tiny T5 width.
pub fn dit_tiny() -> DitConfig {
    dit(4, 16, 2, 64)
}

/// T5 v1.1 XXL, encoder half (4.76 B parameters).
pub fn t5_xxl() -> T5Config {
    T5Config {
        vocab_size: 32128,
        d_model: 4096,
        d_kv: 64,
        d_ff: 10240,
        num_layers: 24,
        num_heads: 64,
        relative_attention_num_buckets: 32,
        relative_attention_max_distance: 128,
        layer_norm_epsilon: 1e-6,
        feed_forward_proj: "gated-gelu".into(),
    }
}

/// The tiny T5: 2 blocks, 4 heads x 16, width 64, vocabulary 512.
pub fn t5_tiny() -> T5Config {
    T5Config {
        vocab_size: 512,
        d_model: 64,
        d_kv: 16,
        d_ff: 128,
        num_layers: 2,
        num_heads: 4,
        relative_attention_num_buckets: 32,
        relative_attention_max_distance: 128,
        layer_norm_epsilon: 1e-6,
        feed_forward_proj: "gated-gelu".into(),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn vae_095_like(
    enc: &[usize],
    enc_layers: &[usize],
    dec: &[usize],
    dec_layers: &[usize],
) -> VaeConfig {
    VaeConfig {
        in_channels: 3,
        out_channels: 3,
        latent_channels: 128,
        block_out_channels: enc.to_vec(),
        down_block_types: strings(&["LTXVideo095DownBlock3D"; 4]),
        decoder_block_out_channels: dec.to_vec(),
        layers_per_block: enc_layers.to_vec(),
        decoder_layers_per_block: dec_layers.to_vec(),
        spatio_temporal_scaling: vec![true; 4],
        decoder_spatio_temporal_scaling: vec![true; 3],
        decoder_inject_noise: vec![false; 4],
        downsample_type: strings(&["spatial", "temporal", "spatiotemporal", "spatiotemporal"]),
        upsample_residual: vec![true; 3],
        upsample_factor: vec![2; 3],
        timestep_conditioning: true,
        patch_size: 4,
        patch_size_t: 1,
        resnet_norm_eps: 1e-6,
        scaling_factor: 1.0,
        encoder_causal: true,
        decoder_causal: false,
        spatial_compression_ratio: Some(32),
        temporal_compression_ratio: Some(8),
    }
}

/// The video VAE of LTX-Video 0.9.5 and later (also 0.9.7 / 0.9.8): decoder
/// with timestep conditioning and residual 2x depth-to-space upsamplers.
pub fn vae_095() -> VaeConfig {
    vae_095_like(
        &[128, 256, 512, 1024, 2048],
        &[4, 6, 6, 2, 2],
        &[256, 512, 1024],
        &[5, 5, 5, 5],
    )
}

/// The tiny VAE in the 0.9.5 layout: widths 64 -> 32 -> 16 -> 8, one resnet
/// per block.
pub fn vae_tiny() -> VaeConfig {
    vae_095_like(
        &[8, 16, 32, 64, 64],
        &[1, 1, 1, 1, 1],
        &[16, 32, 64],
        &[1, 1, 1, 1],
    )
}

/// The video VAE of LTX-Video 0.9.0: no timestep conditioning, plain
/// depth-to-space upsamplers, channel-changing resnets.
pub fn vae_090() -> VaeConfig {
    VaeConfig {
        in_channels: 3,
        out_channels: 3,
        latent_channels: 128,
        block_out_channels: vec![128, 256, 512, 512],
        down_block_types: strings(&["LTXVideoDownBlock3D"; 4]),
        decoder_block_out_channels: vec![128, 256, 512, 512],
        layers_per_block: vec![4, 3, 3, 3, 4],
        decoder_layers_per_block: vec![4, 3, 3, 3, 4],
        spatio_temporal_scaling: vec![true, true, true, false],
        decoder_spatio_temporal_scaling: vec![true, true, true, false],
        decoder_inject_noise: vec![false; 5],
        downsample_type: strings(&["conv"; 4]),
        upsample_residual: vec![false; 4],
        upsample_factor: vec![1; 4],
        timestep_conditioning: false,
        patch_size: 4,
        patch_size_t: 1,
        resnet_norm_eps: 1e-6,
        scaling_factor: 1.0,
        encoder_causal: true,
        decoder_causal: false,
        spatial_compression_ratio: None,
        temporal_compression_ratio: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{dit, t5, vae};
    use crate::weights::spec::param_count;

    #[test]
    fn every_named_preset_resolves_and_validates() {
        for name in preset_names() {
            let p = preset(name).unwrap();
            assert_eq!(p.name, *name);
            p.dit.validate().unwrap();
            p.vae.validate().unwrap();
            p.t5.validate().unwrap();
            assert_eq!(p.t5.d_model, p.dit.caption_channels, "{name}");
            assert_eq!(p.vae.latent_channels, p.dit.in_channels, "{name}");
            assert_eq!(p.vae.spatial_compression(), 32, "{name}");
            assert_eq!(p.vae.temporal_compression(), 8, "{name}");
        }
        let e = preset("ltxv-7b").unwrap_err().to_string();
        assert!(
            e.contains("ltxv-7b") && e.contains("tiny, ltxv-2b, ltxv-13b"),
            "{e}"
        );
    }

    #[test]
    fn dit_parameter_counts_match_the_released_models() {
        assert_eq!(param_count(&dit::tensor_specs(&dit_2b())), 1_923_385_472);
        assert_eq!(param_count(&dit::tensor_specs(&dit_13b())), 13_042_569_344);
    }

    #[test]
    fn vae_decoder_parameter_counts_match_the_released_layouts() {
        assert_eq!(
            param_count(&vae::decoder_tensor_specs(&vae_095())),
            552_814_641
        );
        assert_eq!(
            param_count(&vae::decoder_tensor_specs(&vae_090())),
            238_789_296
        );
    }

    #[test]
    fn t5_xxl_encoder_has_its_4_76b_parameters() {
        assert_eq!(param_count(&t5::tensor_specs(&t5_xxl())), 4_762_310_656);
    }

    #[test]
    fn tiny_preset_is_a_few_megabytes_and_names_are_unique() {
        let p = preset("tiny").unwrap();
        let mut all = dit::tensor_specs(&p.dit);
        all.extend(vae::tensor_specs(&p.vae));
        all.extend(t5::tensor_specs(&p.t5));
        let bytes: usize = all.iter().map(|s| s.nbytes()).sum();
        assert!(bytes < 8 << 20, "tiny weights are {bytes} bytes");
        for specs in [
            dit::tensor_specs(&p.dit),
            vae::tensor_specs(&p.vae),
            t5::tensor_specs(&p.t5),
        ] {
            let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            let n = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), n, "duplicate tensor names");
        }
    }

    #[test]
    fn configs_round_trip_through_their_config_json() {
        let p = preset("ltxv-2b").unwrap();
        let d: DitConfig = serde_json::from_value(p.dit.to_config_json()).unwrap();
        assert_eq!(d, p.dit);
        let v: VaeConfig = serde_json::from_value(p.vae.to_config_json()).unwrap();
        assert_eq!(v, p.vae);
        let t: T5Config = serde_json::from_value(p.t5.to_config_json()).unwrap();
        assert_eq!(t, p.t5);
        assert_eq!(
            p.dit.to_config_json()["_class_name"],
            "LTXVideoTransformer3DModel"
        );
    }
}
