//! `engine plan`: the projected peak memory of a render for the chosen lever arms,
//! before running it.
//!
//! # The formula, and why
//!
//! The CPU arm runs one model at a time: the text encoder is loaded, run and
//! dropped before the DiT is loaded, and the DiT is dropped before the VAE is
//! loaded (see [`crate::pipeline`]). So the host peak is the largest of the
//! per-phase peaks, each the sum of what is resident in that phase:
//!
//! - `F_c = 4 * params_c`: the f32 copies of model `c`, resident from its load to
//!   its drop (the CPU arm computes in f32);
//! - `S_c`: the stored (bf16) bytes of `c`. With `widen-f32 = double` the source
//!   bytes are kept in owned memory as long as the f32 copies live, so `S_c` is
//!   added to every phase of `c` (the seed's defect: both copies at once);
//! - during `load.c` the file pages being widened are mapped: with
//!   `release-pages = off` every touched page stays resident until the load ends
//!   (`S_c`); with `on` each tensor's pages are dropped once widened, so at most
//!   the largest tensor's pages are resident (`S_max_c`);
//! - `A_c`: the activations of running `c` at this geometry (below);
//! - `B`: a constant 8 MiB for the binary, the allocator, thread stacks and the
//!   tokenizer (measured: rung 0's first phase peaks at 7.9 MiB with the tiny T5
//!   loaded).
//!
//! `host_peak = max_c max(load_c, run_c)` with `load_c = F_c + d*S_c + page_c + B`
//! and `run_c = F_c + d*S_c + A_c + B`.
//!
//! Activations count the f32 buffers alive at once in the ops as implemented:
//! T5 over `P` prompts (1, or 2 with guidance) of `L` tokens holds about
//! `L*(6 d_model + 4 inner + 3 d_ff) + heads*L*L` floats per prompt; a DiT
//! forward over `N` tokens of width `D` holds the latent state and the velocities
//! (`4*128*N`), about eight `N x D` buffers (stream, normed input, q, k, v,
//! attention output, residual, RoPE tables), the `N x 4D` MLP hidden, the text
//! keys and values (`3*L*D`) and one query block of scores per thread
//! (`threads*64*max(N, L)`); the VAE decode of a temporal chunk of `T` latent
//! frames (plus one frame of context each side) holds about four tensors of the
//! largest stage (`C*t*h*w`, channels times the stage's frames and pixels), plus
//! the whole decoded video (`3*F*H*W` floats) it is assembled into. These are
//! estimates to a factor near 1, not measurements: the render's markers report
//! the measured peaks (`peak_host_bytes`) to compare against.
//!
//! # The CUDA arm
//!
//! With `device = cuda` the DiT lives on the device, so `load.dit` and `denoise`
//! change. On the device the arm allocates exactly (every allocation goes
//! through one tracked allocator, which the markers' `peak_device_bytes` read):
//! the staged weights (`staging = batched`: one arena, each tensor on a 256-byte
//! boundary; `serial`: one allocation per tensor), the cuBLASLt workspace, the
//! RoPE table, one text slot per prompt, the forward's workspace for `N` tokens
//! and `L` text tokens, and the denoise loop's latents and two velocities
//! ([`crate::cuda::denoise::loaded_bytes`], [`crate::cuda::denoise::loop_bytes`]),
//! all of it already in `load.dit`, which readies the loop (the warm-up
//! forwards run there); the projection is that sum, so it
//! matches the measured peak to the byte up to the arena's alignment slack.
//! With `precision = fp8` the DiT loads fp8-resident
//! ([`crate::cuda::models::dit::DeviceDit::load_fp8_resident`]): the staged
//! weights lose the block Linears' bf16 weights
//! ([`crate::cuda::models::dit::DitDims::block_linear_weights`]) and gain their
//! e4m3 codes and scales
//! ([`crate::cuda::models::dit::DeviceDit::fp8_weight_bytes_for`]), the loop
//! the buffers block inputs are quantized into
//! ([`crate::cuda::models::dit::DeviceDit::fp8_act_bytes_for`]) and, with
//! `attention-precision = fp8`, the e4m3 attention operands
//! ([`crate::cuda::models::dit::DeviceDit::fp8_attn_bytes_for`]). With
//! `text-kv = cached` (either precision) the loop gains each prompt's
//! cross-attention keys and values ([`crate::cuda::denoise::text_kv_bytes`]).
//! With `guidance-batch = batched` and guidance, one forward runs both
//! samples: its per-token workspace ([`crate::cuda::denoise::loop_bytes`]) and
//! the FP8 block inputs hold twice the rows. While staging,
//! the cuBLASLt workspace and the bounce buffer the bf16 weights pass through
//! ([`crate::cuda::models::dit::DeviceDit::fp8_bounce_bytes_for`], freed before
//! the loop is readied) sit beside the weights, so `load.dit` holds the larger
//! of (workspace + bounce) and what the readied loop holds. On
//! the host, `load.dit` holds what staging reads through (the registered
//! reader pins the whole mapped file: `S_dit`; the serial method one tensor's
//! pageable copy) plus the CUDA runtime's own host memory (`CUDA_HOST_BYTES`, an
//! estimate), and `denoise` holds the runtime and the latents.
//!
//! With `conditioning = device` (on the CUDA arm) the text encoder is staged in
//! `load.text_encoder` the same way (its tensors, the cuBLASLt workspace, and
//! the forward's workspace for `P` prompts of `L` tokens, allocated by the
//! warm-up forward there: [`crate::cuda::models::t5::loaded_bytes`],
//! [`crate::cuda::models::t5::run_bytes`]) and lives through `conditioning`, which
//! frees it before `load.dit`: both phases project that sum on the device. On
//! the host, `load.text_encoder` holds what staging reads through and the
//! runtime, `conditioning` the runtime and the output states (`4 P L d_model`),
//! never the f32 encoder.
//!
//! With `vae = device` the VAE's phases move too (see `project_device_vae`).

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use evidence::rung::Device;

use crate::cuda::denoise::{loaded_bytes, loop_bytes, text_kv_bytes};
use crate::cuda::models::dit::{AttnPrecision, DeviceDit, DitDims, Precision, TextKvArm};
use crate::cuda::staging::StagingMethod;
use crate::levers::LeverSet;
use crate::models::{dit, t5, vae};
use crate::presets::Preset;
use crate::weights::safetensors::Widen;
use crate::weights::spec::{param_count, TensorSpec};

/// Fixed overhead of the process (binary, allocator, thread stacks), bytes.
pub const BASE_BYTES: u64 = 8 << 20;

/// Host memory of the CUDA runtime (driver context, loaded kernel modules,
/// cuBLASLt), bytes: an estimate, checked against the measured peaks of the
/// device renders.
pub const CUDA_HOST_BYTES: u64 = 512 << 20;

/// The geometry a projection is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Output frames (8k+1).
    pub frames: usize,
    /// Output height in pixels.
    pub height: usize,
    /// Output width in pixels.
    pub width: usize,
    /// Whether each step runs two forwards (and two prompts are encoded).
    pub guidance: bool,
    /// Host threads.
    pub threads: usize,
    /// Latent frames per decode chunk.
    pub chunk_latent_frames: usize,
    /// The DiT's arm.
    pub device: Device,
}

/// A projection, as `engine plan --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Projection {
    /// Projected host peak in bytes (the max of `phases`).
    pub host_peak_bytes: u64,
    /// Projected device peak in bytes (0 on the CPU arm).
    pub device_peak_bytes: u64,
    /// Stored bytes of the tensors the render loads (all three models).
    pub weights_bytes: u64,
    /// The lever arms the projection is for.
    pub levers: BTreeMap<String, String>,
    /// Projected host peak of each phase, bytes.
    pub phases: BTreeMap<String, u64>,
    /// Projected device peak of each phase on the CUDA arm, bytes (empty on the CPU).
    pub device_phases: BTreeMap<String, u64>,
}

fn stored(specs: &[TensorSpec]) -> u64 {
    specs.iter().map(|s| s.nbytes() as u64).sum()
}

fn largest(specs: &[TensorSpec]) -> u64 {
    specs.iter().map(|s| s.nbytes() as u64).max().unwrap_or(0)
}

/// The tensors the render loads from each model (the VAE: decoder and latent
/// statistics, not the encoder).
pub fn loaded_specs(p: &Preset) -> [(&'static str, Vec<TensorSpec>); 3] {
    let mut v = vae::decoder_tensor_specs(&p.vae);
    v.extend(
        vae::tensor_specs(&p.vae)
            .into_iter()
            .filter(|s| s.name == "latents_mean" || s.name == "latents_std"),
    );
    [
        ("text_encoder", t5::tensor_specs(&p.t5)),
        ("dit", dit::tensor_specs(&p.dit)),
        ("vae", v),
    ]
}

/// Activation floats of the T5 pass over `prompts` prompts.
fn t5_floats(p: &Preset, prompts: usize) -> u64 {
    let c = &p.t5;
    let l = p.max_text_tokens as u64;
    prompts as u64
        * (l * (6 * c.d_model as u64 + 4 * c.inner_dim() as u64 + 3 * c.d_ff as u64)
            + c.num_heads as u64 * l * l)
}

/// Activation floats of one DiT forward (plus the denoise loop's latent buffers).
fn dit_floats(p: &Preset, g: &Geometry) -> u64 {
    let (f, h, w) = latent_grid(g);
    let n = (f * h * w) as u64;
    let d = p.dit.inner_dim() as u64;
    let l = p.max_text_tokens as u64;
    4 * 128 * n + 8 * n * d + 4 * n * d + 3 * l * d + g.threads as u64 * 64 * n.max(l)
}

/// Activation floats of decoding one temporal chunk, plus the whole video.
fn vae_floats(p: &Preset, g: &Geometry) -> u64 {
    let (f, h, w) = latent_grid(g);
    let (first, _, blocks) = p.vae.decoder_plan();
    let chunk = g.chunk_latent_frames.max(1).min(f) + 2;
    let (mut t, mut hh, mut ww) = (chunk as u64, h as u64, w as u64);
    let mut peak = 4 * first as u64 * t * hh * ww;
    for b in &blocks {
        if b.upsample {
            t = 2 * t - 1;
            hh *= 2;
            ww *= 2;
        }
        peak = peak.max(4 * b.out_channels.max(b.in_channels) as u64 * t * hh * ww);
    }
    let patch = p.vae.patch_size as u64;
    let out_ch = 3 * patch * patch;
    peak = peak.max(2 * out_ch * t * hh * ww);
    peak + 3 * (g.frames * g.height * g.width) as u64
}

/// Latent grid (frames, height, width) of a geometry.
pub fn latent_grid(g: &Geometry) -> (usize, usize, usize) {
    ((g.frames - 1) / 8 + 1, g.height / 32, g.width / 32)
}

/// Project the host (and on the CUDA arm, device) peak of rendering `g` with
/// preset `p` under `levers`.
pub fn project(p: &Preset, g: &Geometry, levers: &LeverSet) -> Projection {
    let double = levers.widen() == Widen::Double;
    let release = levers.release_pages();
    let prompts = if g.guidance { 2 } else { 1 };
    let acts = [
        ("conditioning", 4 * t5_floats(p, prompts)),
        ("denoise", 4 * dit_floats(p, g)),
        ("decode.video", 4 * vae_floats(p, g)),
    ];
    let mut phases = BTreeMap::new();
    let mut weights_bytes = 0;
    for ((model, specs), (run_phase, act)) in loaded_specs(p).iter().zip(acts) {
        let s = stored(specs);
        weights_bytes += s;
        let f32_bytes = 4 * param_count(specs);
        let kept = f32_bytes + if double { s } else { 0 } + BASE_BYTES;
        let pages = if release { largest(specs) } else { s };
        phases.insert(format!("load.{model}"), kept + pages);
        phases.insert(run_phase.to_string(), kept + act);
    }
    let mut device_phases = BTreeMap::new();
    if g.device == Device::Cuda {
        let specs = dit::tensor_specs(&p.dit);
        let method = levers.staging().method;
        let read_through = |specs: &[TensorSpec]| match method {
            StagingMethod::Batched => stored(specs),
            StagingMethod::Serial => largest(specs),
        };
        let staged_bytes = |specs: &[TensorSpec]| match method {
            StagingMethod::Batched => specs.iter().map(|t| align_up(t.nbytes()) as u64).sum(),
            StagingMethod::Serial => specs.iter().map(|t| t.nbytes().max(1) as u64).sum::<u64>(),
        };
        if levers.conditioning_on_device() {
            let t5_specs = t5::tensor_specs(&p.t5);
            let l = p.max_text_tokens;
            let held = staged_bytes(&t5_specs)
                + crate::cuda::models::t5::loaded_bytes()
                + crate::cuda::models::t5::run_bytes(&p.t5, prompts, l);
            device_phases.insert("load.text_encoder".into(), held);
            device_phases.insert("conditioning".into(), held);
            phases.insert(
                "load.text_encoder".into(),
                BASE_BYTES + CUDA_HOST_BYTES + read_through(&t5_specs),
            );
            phases.insert(
                "conditioning".into(),
                BASE_BYTES + CUDA_HOST_BYTES + 4 * (prompts * l * p.t5.d_model) as u64,
            );
        }
        phases.insert(
            "load.dit".into(),
            BASE_BYTES + CUDA_HOST_BYTES + read_through(&specs),
        );
        let (f, h, w) = latent_grid(g);
        let n = f * h * w;
        phases.insert(
            "denoise".into(),
            BASE_BYTES + CUDA_HOST_BYTES + 4 * 128 * n as u64,
        );
        // A config the device arm refuses fails the render at load; project
        // the weights alone then.
        let dims = DitDims::from_config(&p.dit).ok();
        let fp8 = levers.forward_arms().precision == Precision::Fp8;
        // precision = fp8 loads fp8-resident: the block Linears' weights never
        // stay in bf16, only their e4m3 copies do.
        let resident: Vec<TensorSpec> = match (&dims, fp8) {
            (Some(d), true) => {
                let moving: HashSet<String> = d
                    .block_linear_weights()
                    .into_iter()
                    .map(|(n, _, _)| n)
                    .collect();
                specs
                    .iter()
                    .filter(|t| !moving.contains(&t.name))
                    .cloned()
                    .collect()
            }
            _ => specs.clone(),
        };
        let staged = staged_bytes(&resident);
        let (loaded, looping, fp8_weights, fp8_acts, bounce) = dims
            .map(|d| {
                let l = p.max_text_tokens;
                // Samples a forward runs (guidance-batch = batched with
                // guidance: 2): the per-token workspace and block inputs.
                let samples = levers.forward_arms().guidance.samples(prompts);
                let (w, a, b) = if fp8 {
                    let attn = match levers.forward_arms().attn_precision {
                        AttnPrecision::Fp8 => DeviceDit::fp8_attn_bytes_for(&d, n),
                        AttnPrecision::Bf16 => 0,
                    };
                    (
                        DeviceDit::fp8_weight_bytes_for(&d) as u64,
                        (DeviceDit::fp8_act_bytes_for(&d, n * samples, l) + attn) as u64,
                        DeviceDit::fp8_bounce_bytes_for(&d) as u64,
                    )
                } else {
                    (0, 0, 0)
                };
                let kv = match levers.forward_arms().text_kv {
                    TextKvArm::Cached => text_kv_bytes(&d, l, prompts),
                    TextKvArm::PerForward => 0,
                };
                (
                    loaded_bytes(&d, l, prompts),
                    loop_bytes(&d, n, l, samples) + kv,
                    w,
                    a,
                    b,
                )
            })
            .unwrap_or((0, 0, 0, 0, 0));
        // Staging holds the cuBLASLt workspace (opened before it) and, on fp8,
        // the bounce buffer, freed before the RoPE table, the text slots and
        // the loop (readied inside load.dit: workspace, loop buffer, warm-up).
        let staging_peak = crate::cuda::kit::gemm::WORKSPACE_BYTES as u64 + bounce;
        let ready = loaded + looping + fp8_acts;
        device_phases.insert(
            "load.dit".into(),
            staged + fp8_weights + staging_peak.max(ready),
        );
        device_phases.insert("denoise".into(), staged + fp8_weights + ready);
        if levers.vae_on_device() {
            let at_load = levers.vae_prepare_at_load();
            project_device_vae(p, g, method, at_load, &mut phases, &mut device_phases);
        }
    }
    Projection {
        host_peak_bytes: phases.values().copied().max().unwrap_or(0),
        device_peak_bytes: device_phases.values().copied().max().unwrap_or(0),
        weights_bytes,
        levers: levers.arms().clone(),
        phases,
        device_phases,
    }
}

/// The VAE on the device (`vae = device`): `load.vae` holds the staged
/// decoder (and latent statistics), the cuBLASLt workspace and, while the
/// convolution weights are reordered, a copy of the largest one; `decode.video`
/// the staged weights, the workspace and the decode's buffers for chunks of
/// [`crate::cuda::models::vae::DEVICE_CHUNK_LATENT_FRAMES`] latent frames
/// ([`crate::cuda::models::vae::decode_bytes`]: exact, every buffer the stream
/// allocates; measured equal on the device) and, on the cuDNN path, an
/// allowance for cuDNN's workspace ([`crate::cuda::models::vae::CUDNN_WORKSPACE_ALLOWANCE`],
/// an estimate: the device runs of `reports/device-notes.md` measured load.vae
/// equal to the projection and decode.video under it by about the allowance). On the host, `load.vae` reads the file through (the registered
/// reader pins it) and `decode.video` holds the latents, their noise, the
/// decoded clip as RGB8 frames (converted on the device: no f32 clip comes
/// back) and (on the cuDNN path) an allowance for cuDNN's libraries.
fn project_device_vae(
    p: &Preset,
    g: &Geometry,
    method: StagingMethod,
    prepare_at_load: bool,
    phases: &mut BTreeMap<String, u64>,
    device_phases: &mut BTreeMap<String, u64>,
) {
    let specs = &loaded_specs(p)[2].1;
    let s = stored(specs);
    let staged: u64 = match method {
        StagingMethod::Batched => specs.iter().map(|t| align_up(t.nbytes()) as u64).sum(),
        StagingMethod::Serial => specs.iter().map(|t| t.nbytes().max(1) as u64).sum(),
    };
    let read_through = match method {
        StagingMethod::Batched => s,
        StagingMethod::Serial => largest(specs),
    };
    let ws = crate::cuda::kit::gemm::WORKSPACE_BYTES as u64;
    let (f, h, w) = latent_grid(g);
    let chunk = crate::cuda::models::vae::DEVICE_CHUNK_LATENT_FRAMES;
    let mut decode = crate::cuda::models::vae::decode_bytes(&p.vae, (f, h, w), chunk).unwrap_or(0);
    let mut host_libs = 0;
    if crate::cuda::models::vae::RENDER_CONV_PATH
        == crate::cuda::models::vae::device::ConvPath::Cudnn
    {
        decode += crate::cuda::models::vae::CUDNN_WORKSPACE_ALLOWANCE;
        host_libs = crate::cuda::models::vae::CUDNN_HOST_ALLOWANCE;
    }
    let reorder = crate::cuda::models::vae::reorder_bytes(&p.vae);
    // `vae-prepare = load`: the decode's buffers (and cuDNN's workspace) are
    // made in load.vae, after the reordering's transient is freed, and the two
    // pinned RGB8 halves are host memory from then on.
    let (load_device, load_pinned) = if prepare_at_load {
        let pinned = crate::cuda::models::vae::pinned_bytes(&p.vae, (f, h, w), chunk).unwrap_or(0);
        (staged + ws + reorder.max(decode), pinned)
    } else {
        (staged + ws + reorder, 0)
    };
    device_phases.insert("load.vae".into(), load_device);
    device_phases.insert("decode.video".into(), staged + ws + decode);
    let latents = 2 * 4 * 128 * (f * h * w) as u64;
    let clip = 3 * (g.frames * g.height * g.width) as u64;
    phases.insert(
        "load.vae".into(),
        BASE_BYTES + CUDA_HOST_BYTES + read_through + load_pinned,
    );
    phases.insert(
        "decode.video".into(),
        BASE_BYTES + CUDA_HOST_BYTES + host_libs + latents + clip,
    );
}

fn align_up(n: usize) -> usize {
    crate::cuda::kit::memory::align_up(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;
    use evidence::rung::Profile;

    fn g() -> Geometry {
        Geometry {
            frames: 121,
            height: 512,
            width: 768,
            guidance: true,
            threads: 2,
            chunk_latent_frames: 2,
            device: Device::Cpu,
        }
    }

    #[test]
    fn the_cuda_arm_projects_the_device_peak_from_weights_and_workspace() {
        let p = preset("ltxv-2b").unwrap();
        // The DiT alone on the device (the text encoder on the host).
        let host_t5 = ("conditioning", "host");
        let l = LeverSet::resolve(Profile::Default, [host_t5]).unwrap();
        let serial = LeverSet::resolve(Profile::Default, [("staging", "serial"), host_t5]).unwrap();
        // Rung 1: 512x320x25, one prompt.
        let g1 = Geometry {
            frames: 25,
            height: 320,
            width: 512,
            guidance: false,
            device: Device::Cuda,
            ..g()
        };
        let a = project(&p, &g1, &l);
        let stored = 2 * 1_923_385_472u64;
        let n = 4 * 10 * 16;
        let d = DitDims::LTXV_2B;
        // Weights (plus at most 256 bytes of alignment per tensor) + runtime.
        let run = loaded_bytes(&d, 128, 1) + loop_bytes(&d, n, 128, 1);
        let slack = a.device_peak_bytes - stored - run;
        assert!(slack < 256 * 715, "{slack}");
        assert_eq!(a.device_peak_bytes, a.device_phases["denoise"]);
        // load.dit readies the loop: it holds the loop's bytes already.
        assert_eq!(a.device_phases["denoise"], a.device_phases["load.dit"]);
        assert!(a.device_phases["load.dit"] - stored >= run);
        // Serial allocates each tensor exactly.
        let b = project(&p, &g1, &serial);
        assert_eq!(b.device_peak_bytes, stored + run);
        // precision = fp8 loads fp8-resident: the block Linears' bf16 weights
        // leave the staged bytes, their e4m3 codes and scales and the input
        // buffers come in, and while staging the bounce buffer sits beside the
        // cuBLASLt workspace (red on: the bf16 block weights still counted, the
        // fp8 bytes or the bounce left out).
        let fp8 = LeverSet::resolve(
            Profile::Default,
            [("staging", "serial"), host_t5, ("precision", "fp8")],
        )
        .unwrap();
        let blocks_bf16: u64 = dit::tensor_specs(&p.dit)
            .iter()
            .filter(|t| t.name.starts_with("transformer_blocks.") && t.shape.len() == 2)
            .filter(|t| t.name.contains(".to_") || t.name.contains(".ff."))
            .map(|t| t.nbytes() as u64)
            .sum();
        assert_eq!(blocks_bf16, 28 * 16 * 2048 * 2048 * 2);
        let codes = DeviceDit::fp8_weight_bytes_for(&d) as u64;
        assert_eq!(codes, 28 * (16 * 2048 * 2048 + 13 * 2048 * 4));
        let acts = DeviceDit::fp8_act_bytes_for(&d, n, 128) as u64;
        let bounce = DeviceDit::fp8_bounce_bytes_for(&d) as u64;
        assert_eq!(bounce, 1 << 30);
        let f = project(&p, &g1, &fp8);
        let weights = stored - blocks_bf16 + codes;
        assert_eq!(f.device_phases["denoise"], weights + run + acts);
        let ws = crate::cuda::kit::gemm::WORKSPACE_BYTES as u64;
        assert_eq!(
            f.device_phases["load.dit"],
            weights + (ws + bounce).max(run + acts)
        );
        // At 640 tokens the bounce outweighs the readied loop: load.dit peaks.
        assert_eq!(f.device_peak_bytes, weights + ws + bounce);
        assert!(f.device_peak_bytes < b.device_peak_bytes);
        // attention-precision = fp8 adds its e4m3 q, k, v and slots to the loop
        // (red on: left out, or counted on the bf16 attention arm).
        let fa = LeverSet::resolve(
            Profile::Default,
            [
                ("staging", "serial"),
                host_t5,
                ("precision", "fp8"),
                ("attention-precision", "fp8"),
            ],
        )
        .unwrap();
        let attn = DeviceDit::fp8_attn_bytes_for(&d, n) as u64;
        assert_eq!(attn, 3 * (n as u64) * 2048 + 256);
        assert_eq!(
            project(&p, &g1, &fa).device_phases["denoise"],
            weights + run + acts + attn
        );
        // text-kv = cached adds each prompt's keys and values to the loop (red
        // on: left out, or counted on per-forward).
        let kv = LeverSet::resolve(
            Profile::Default,
            [
                ("staging", "serial"),
                host_t5,
                ("precision", "fp8"),
                ("text-kv", "cached"),
            ],
        )
        .unwrap();
        let cache = text_kv_bytes(&d, p.max_text_tokens, 1);
        assert_eq!(cache, 28 * 2 * (p.max_text_tokens as u64) * 2048 * 2);
        assert_eq!(
            project(&p, &g1, &kv).device_phases["denoise"],
            weights + run + acts + cache
        );
        // Guidance adds one text slot; the CPU arm projects no device bytes.
        let g2 = Geometry {
            guidance: true,
            ..g1
        };
        assert!(project(&p, &g2, &l).device_peak_bytes > a.device_peak_bytes);
        // guidance-batch = batched doubles the per-token workspace and the
        // FP8 block inputs of a guided loop, and changes nothing without
        // guidance (red on: the samples left out of either, or counted on the
        // pair arm or on an unguided render).
        let arms = |batched: bool| {
            let gb = ("guidance-batch", if batched { "batched" } else { "pair" });
            let levers = [("staging", "serial"), host_t5, ("precision", "fp8"), gb];
            let mut with_kv = levers.to_vec();
            with_kv.push(("text-kv", "cached"));
            LeverSet::resolve(Profile::Default, with_kv).unwrap()
        };
        let (pair, both) = (arms(false), arms(true));
        let grow = |g: &Geometry| {
            project(&p, g, &both).device_phases["denoise"]
                - project(&p, g, &pair).device_phases["denoise"]
        };
        assert_eq!(grow(&g1), 0);
        let twice = loop_bytes(&d, n, 128, 2) - loop_bytes(&d, n, 128, 1)
            + (DeviceDit::fp8_act_bytes_for(&d, 2 * n, 128)
                - DeviceDit::fp8_act_bytes_for(&d, n, 128)) as u64;
        assert_eq!(grow(&g2), twice);
        // Per token: f32 stream, six bf16 [n, d], the feed-forward's 4 d, the
        // bf16 output; the FP8 block inputs' 4 d codes and a scale.
        let per_token = (2048 * 4 + 6 * 2048 * 2 + 4 * 2048 * 2 + 128 * 2 + 4 * 2048 + 4) as u64;
        let slack = twice - per_token * n as u64;
        assert!(slack < 16 * 256, "{twice} vs {} per token", per_token);
        let cpu = project(
            &p,
            &Geometry {
                device: Device::Cpu,
                ..g1
            },
            &l,
        );
        assert_eq!(cpu.device_peak_bytes, 0);
        assert!(cpu.device_phases.is_empty());
        // On the device the host no longer holds the f32 transformer.
        assert!(a.phases["denoise"] < cpu.phases["denoise"] / 4);
    }

    /// Issue 36: at 13B and 6144 tokens the fp8 arm holds less than the bf16
    /// arm by the bf16 block Linears less their e4m3 copies and the input
    /// buffers (it held 12.10 GiB more while the bf16 copies stayed). Red on:
    /// the bf16 block weights counted on fp8.
    #[test]
    fn the_fp8_arm_projects_its_block_linears_halved_at_13b() {
        let p = preset("ltxv-13b").unwrap();
        let d = DitDims::LTXV_13B;
        let arm = |precision| {
            LeverSet::resolve(
                Profile::Default,
                [("conditioning", "host"), ("precision", precision)],
            )
            .unwrap()
        };
        let g3 = Geometry {
            frames: 121,
            height: 512,
            width: 768,
            guidance: true,
            device: Device::Cuda,
            ..g()
        };
        let n = 16 * 16 * 24;
        let (bf, f8) = (
            project(&p, &g3, &arm("bf16")),
            project(&p, &g3, &arm("fp8")),
        );
        let blocks_bf16 = 48 * 16 * 4096 * 4096 * 2u64;
        let codes = DeviceDit::fp8_weight_bytes_for(&d) as u64;
        assert_eq!(codes, 48 * (16 * 4096 * 4096 + 13 * 4096 * 4));
        let acts = DeviceDit::fp8_act_bytes_for(&d, n, 128) as u64;
        // The batched arena aligns each tensor: the 480 weights that leave it
        // are multiples of 256 bytes, so exactly their bytes leave.
        assert_eq!(
            bf.device_phases["denoise"] - f8.device_phases["denoise"],
            blocks_bf16 - codes - acts
        );
        assert!(f8.device_peak_bytes < bf.device_peak_bytes - (11u64 << 30));
    }

    #[test]
    fn a_device_text_encoder_is_projected_in_its_two_phases_only() {
        let p = preset("ltxv-2b").unwrap();
        let dev = LeverSet::resolve(Profile::Default, []).unwrap();
        let host = LeverSet::resolve(Profile::Default, [("conditioning", "host")]).unwrap();
        let g1 = Geometry {
            frames: 25,
            height: 320,
            width: 512,
            guidance: true,
            device: Device::Cuda,
            ..g()
        };
        let (a, b) = (project(&p, &g1, &dev), project(&p, &g1, &host));
        let t5_specs = t5::tensor_specs(&p.t5);
        let stored_t5: u64 = t5_specs.iter().map(|s| s.nbytes() as u64).sum();
        let held = crate::cuda::models::t5::loaded_bytes()
            + crate::cuda::models::t5::run_bytes(&p.t5, 2, 128);
        for ph in ["load.text_encoder", "conditioning"] {
            let d = a.device_phases[ph];
            assert!(
                d >= stored_t5 + held && d < stored_t5 + held + 256 * 290,
                "{ph} {d}"
            );
            assert!(!b.device_phases.contains_key(ph), "{ph}");
        }
        // T5-XXL (9.5 GB) outweighs the 2B transformer: it sets the device peak.
        assert_eq!(a.device_peak_bytes, a.device_phases["conditioning"]);
        assert_eq!(a.device_phases["denoise"], b.device_phases["denoise"]);
        // The host no longer holds the f32 encoder (19 GB).
        assert!(
            a.phases["conditioning"] < (1u64 << 30),
            "{}",
            a.phases["conditioning"]
        );
        assert!(b.phases["conditioning"] > 4 * 4_762_310_656);
        assert!(a.host_peak_bytes < b.host_peak_bytes);
        // On the CPU arm the lever is inert.
        let cpu = |l: &LeverSet| {
            project(
                &p,
                &Geometry {
                    device: Device::Cpu,
                    ..g1
                },
                l,
            )
        };
        assert_eq!(cpu(&dev).phases, cpu(&host).phases);
        assert!(cpu(&dev).device_phases.is_empty());
    }

    #[test]
    fn the_device_vae_projects_its_phases_and_the_host_arm_is_untouched() {
        let p = preset("ltxv-2b").unwrap();
        // T5 on the host in both, so the VAE's phases are compared alone; the
        // decode's buffers made at first use (the default makes them at load).
        let dev = LeverSet::resolve(
            Profile::Default,
            [("conditioning", "host"), ("vae-prepare", "decode")],
        )
        .unwrap();
        let host = LeverSet::resolve(
            Profile::Default,
            [("conditioning", "host"), ("vae", "host")],
        )
        .unwrap();
        let g1 = Geometry {
            frames: 25,
            height: 320,
            width: 512,
            guidance: false,
            device: Device::Cuda,
            ..g()
        };
        let a = project(&p, &g1, &dev);
        let b = project(&p, &g1, &host);
        assert!(!b.device_phases.contains_key("decode.video"));
        let dec = a.device_phases["decode.video"];
        let decode = crate::cuda::models::vae::decode_bytes(
            &p.vae,
            (4, 10, 16),
            crate::cuda::models::vae::DEVICE_CHUNK_LATENT_FRAMES,
        )
        .unwrap();
        assert!(dec > decode && dec - decode < 2 << 30, "{dec} {decode}");
        assert!(a.device_phases["load.vae"] < dec);
        // `vae-prepare = load` holds the decode's buffers from load.vae on.
        let at_load = LeverSet::resolve(
            Profile::Default,
            [("conditioning", "host"), ("vae-prepare", "load")],
        )
        .unwrap();
        let c = project(&p, &g1, &at_load);
        assert_eq!(
            c.device_phases["load.vae"],
            a.device_phases["load.vae"].max(dec)
        );
        assert_eq!(c.device_phases["decode.video"], dec);
        let pinned = crate::cuda::models::vae::pinned_bytes(&p.vae, (4, 10, 16), 4).unwrap();
        assert!(pinned > 0);
        assert_eq!(c.phases["load.vae"], a.phases["load.vae"] + pinned);
        // The DiT still sets the device peak; the host no longer holds the f32 VAE.
        assert_eq!(a.device_peak_bytes, a.device_phases["denoise"]);
        assert!(a.phases["decode.video"] < b.phases["decode.video"]);
        // On the CPU arm the lever is inert.
        let cpu = Geometry {
            device: Device::Cpu,
            ..g1
        };
        assert_eq!(
            project(&p, &cpu, &dev).phases,
            project(&p, &cpu, &host).phases
        );
    }

    #[test]
    fn double_widening_adds_the_stored_bytes_of_the_largest_model() {
        let p = preset("ltxv-2b").unwrap();
        let single = LeverSet::resolve(Profile::Default, []).unwrap();
        let double = LeverSet::resolve(Profile::Default, [("widen-f32", "double")]).unwrap();
        let a = project(&p, &g(), &single);
        let b = project(&p, &g(), &double);
        let dit_stored = 2 * 1_923_385_472u64;
        // The DiT phase holds the peak: f32 copies of 1.92 B params.
        assert!(a.host_peak_bytes > 4 * 1_923_385_472);
        assert!(b.phases["denoise"] - a.phases["denoise"] == dit_stored);
        assert_eq!(a.weights_bytes, b.weights_bytes);
        assert_eq!(a.device_peak_bytes, 0);
    }

    #[test]
    fn released_pages_lower_the_load_phase_only() {
        let p = preset("ltxv-2b").unwrap();
        let on = LeverSet::resolve(Profile::Default, []).unwrap();
        let off = LeverSet::resolve(Profile::Default, [("release-pages", "off")]).unwrap();
        let a = project(&p, &g(), &on);
        let b = project(&p, &g(), &off);
        assert!(b.phases["load.dit"] > a.phases["load.dit"] + 3_000_000_000);
        assert_eq!(a.phases["denoise"], b.phases["denoise"]);
    }

    #[test]
    fn activations_grow_with_geometry_and_weights_match_specs() {
        let p = preset("tiny").unwrap();
        let l = LeverSet::resolve(Profile::Default, []).unwrap();
        let small = project(
            &p,
            &Geometry {
                frames: 9,
                height: 64,
                width: 64,
                guidance: true,
                threads: 2,
                chunk_latent_frames: 1,
                device: Device::Cpu,
            },
            &l,
        );
        let big = project(&p, &g(), &l);
        assert!(big.phases["decode.video"] > 10 * small.phases["decode.video"]);
        let stored: u64 = loaded_specs(&p)
            .iter()
            .flat_map(|(_, s)| s)
            .map(|s| s.nbytes() as u64)
            .sum();
        assert_eq!(small.weights_bytes, stored);
    }
}
