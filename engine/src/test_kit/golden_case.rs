//! The golden cases: tiny weights and inputs regenerated deterministically
//! from fixed seeds. Shared by `examples/golden_inputs.rs`, which writes them
//! for the reference implementation, and `tests/it/goldens.rs`, which compares
//! the engine against what the reference produced from them.

use crate::models::{dit, init, t5, vae};
use crate::presets::{preset, Preset, VaeConfig};
use crate::rng::Gaussian;
use crate::tensor::Tensor;
use crate::weights::{MapSource, TensorSpec};

/// Seed of every golden weight tensor.
pub const WEIGHT_SEED: u64 = 20_241_130;
/// Seed of every golden input.
pub const INPUT_SEED: u64 = 7_001;

/// The tiny preset.
pub fn tiny() -> Preset {
    preset("tiny").expect("tiny preset exists")
}

/// A tiny VAE in the 0.9.0 layout (no timestep conditioning, channel-changing
/// resnets, plain depth-to-space).
pub fn vae090_tiny() -> VaeConfig {
    let mut c = crate::presets::vae_090();
    c.block_out_channels = vec![8, 16, 32, 32];
    c.layers_per_block = vec![1, 1, 1, 1, 1];
    c.decoder_block_out_channels = vec![8, 16, 32, 32];
    c.decoder_layers_per_block = vec![1, 1, 1, 1, 1];
    c
}

/// The named weight sets: (directory, tensor specs).
pub fn weight_sets() -> Vec<(&'static str, Vec<TensorSpec>)> {
    let p = tiny();
    vec![
        ("transformer", dit::tensor_specs(&p.dit)),
        ("vae", vae::tensor_specs(&p.vae)),
        ("vae090", vae::tensor_specs(&vae090_tiny())),
        ("text_encoder", t5::tensor_specs(&p.t5)),
    ]
}

/// The in-memory weights of a set.
pub fn source(specs: &[TensorSpec]) -> MapSource {
    init::source(specs, WEIGHT_SEED)
}

fn normal(name: &str, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(shape, Gaussian::new(INPUT_SEED, name).vec(n)).expect("shape and length agree")
}

/// One transformer forward.
pub struct DitCase {
    /// Latent tokens `[tokens, 128]`, (f, h, w) raster order.
    pub latents: Tensor,
    /// The noise level.
    pub sigma: f32,
    /// Text encoder states `[L, caption_channels]`.
    pub text: Tensor,
    /// `L` values: 1 for a real token, 0 for padding.
    pub mask: Vec<f32>,
    /// Latent grid (frames, height, width).
    pub grid: (usize, usize, usize),
    /// Frames per second (RoPE's time scale).
    pub fps: f32,
}

/// Grid 3x2x4 (24 tokens: RoPE over every axis), 12 text tokens of which the
/// last 3 are padding, sigma 0.62, 24 fps (8/24 is not a short binary fraction).
pub fn dit_case() -> DitCase {
    let grid = (3, 2, 4);
    let mut mask = vec![1.0; 12];
    mask[9..].iter_mut().for_each(|m| *m = 0.0);
    DitCase {
        latents: normal("dit_latents", &[24, 128]),
        sigma: 0.62,
        text: normal("dit_text", &[12, tiny().dit.caption_channels]),
        mask,
        grid,
        fps: 24.0,
    }
}

/// T5 token ids (12, last 4 padding with id 0) and mask.
pub fn t5_case() -> (Vec<u32>, Vec<f32>) {
    let ids = vec![37, 5, 301, 88, 2, 511, 140, 1, 0, 0, 0, 0];
    let mask = ids
        .iter()
        .enumerate()
        .map(|(i, _)| if i < 8 { 1.0 } else { 0.0 })
        .collect();
    (ids, mask)
}

/// VAE decode of latents [128, 3, 2, 2] at decode timestep 0.05.
pub fn vae_case() -> (Tensor, f32) {
    (normal("vae_latents", &[128, 3, 2, 2]), 0.05)
}

/// 0.9.0-layout decode of latents [128, 2, 1, 1] (no timestep).
pub fn vae090_case() -> Tensor {
    normal("vae090_latents", &[128, 2, 1, 1])
}

/// A whole tiny text-to-video run from given embeddings and noise.
pub struct PipeCase {
    /// Initial latents [128, F', H', W'] (channel-first, as the reference draws them).
    pub noise: Tensor,
    /// Prompt embeddings `[L, caption_channels]`.
    pub prompt: Tensor,
    /// The prompt's mask (1 real, 0 padding).
    pub prompt_mask: Vec<f32>,
    /// Negative-prompt embeddings `[L, caption_channels]`.
    pub negative: Tensor,
    /// The negative prompt's mask.
    pub negative_mask: Vec<f32>,
    /// Frame width, pixels.
    pub width: usize,
    /// Frame height, pixels.
    pub height: usize,
    /// Frames.
    pub frames: usize,
    /// Denoise steps.
    pub steps: usize,
    /// Guidance scale.
    pub guidance: f32,
    /// Frames per second.
    pub fps: f32,
    /// The VAE's decode timestep.
    pub decode_timestep: f32,
}

/// 64x64, 9 frames (latent 2x2x2), 3 steps, guidance 3, 25 fps, decode
/// timestep 0.05 with no decode noise.
pub fn pipe_case() -> PipeCase {
    let c = tiny().dit.caption_channels;
    let mut pm = vec![1.0; 10];
    pm[7..].iter_mut().for_each(|m| *m = 0.0);
    let mut nm = vec![0.0; 10];
    nm[0] = 1.0;
    PipeCase {
        noise: normal("pipe_noise", &[128, 2, 2, 2]),
        prompt: normal("pipe_prompt", &[10, c]),
        prompt_mask: pm,
        negative: normal("pipe_negative", &[10, c]),
        negative_mask: nm,
        width: 64,
        height: 64,
        frames: 9,
        steps: 3,
        guidance: 3.0,
        fps: 25.0,
        decode_timestep: 0.05,
    }
}

/// (steps, video tokens) pairs whose sigma schedules are compared.
pub const SCHEDULES: &[(usize, usize)] = &[
    (2, 8),
    (3, 8),
    (8, 1024),
    (20, 2560),
    (30, 6144),
    (50, 4096),
];

/// A whole tiny render from the prompt through the engine's own render path
/// (tokenizer, T5, DiT, scheduler, decode noise, VAE, frames) on the weights
/// `engine synth-weights --preset tiny` writes, against diffusers'
/// `LTXPipeline.from_pretrained` on that same directory, from the same noise.
pub struct RenderCase {
    /// Frame width, pixels.
    pub width: usize,
    /// Frame height, pixels.
    pub height: usize,
    /// Frames.
    pub frames: usize,
    /// Denoise steps.
    pub steps: usize,
    /// Guidance scale.
    pub guidance: f64,
    /// The render's seed (noise streams).
    pub seed: u64,
    /// Frames per second.
    pub fps: f64,
    /// The prompt.
    pub prompt: &'static str,
    /// The negative prompt.
    pub negative: &'static str,
}

/// 64x64, 9 frames, 3 steps, guidance 3 (prompt and empty negative prompt),
/// seed 42, 25 fps: rung 0's shape with one step fewer.
pub fn render_case() -> RenderCase {
    RenderCase {
        width: 64,
        height: 64,
        frames: 9,
        steps: 3,
        guidance: 3.0,
        seed: 42,
        fps: 25.0,
        prompt: "a red fox trotting through fresh snow at sunrise, cinematic",
        negative: "",
    }
}

impl RenderCase {
    /// The case as a rung file the engine renders on the CPU arm.
    pub fn rung_toml(&self) -> String {
        format!(
            "preset = \"tiny\"\nwidth = {}\nheight = {}\nframes = {}\nsteps = {}\nguidance = {}\n\
             seed = {}\nfps = {}\ndevice = \"cpu\"\nprompt = {:?}\nnegative_prompt = {:?}\n",
            self.width,
            self.height,
            self.frames,
            self.steps,
            self.guidance,
            self.seed,
            self.fps,
            self.prompt,
            self.negative
        )
    }

    /// The latent grid (F', H', W').
    pub fn grid(&self) -> (usize, usize, usize) {
        ((self.frames - 1) / 8 + 1, self.height / 32, self.width / 32)
    }
}
