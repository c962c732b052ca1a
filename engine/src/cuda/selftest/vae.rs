//! `engine selftest-cuda`'s VAE section: every device primitive against the
//! host primitive on the same bf16 values, then the whole device decoder
//! against the CPU arm's [`VaeDecoder`] (the tiny preset's VAE and the real
//! ltxv-2b VAE dims with synthetic weights), then chunked against one piece on
//! the device. Outputs are poisoned first (NaN bytes). With
//! `ENGINE_SELFTEST_MUTATE=skip-modulation` (or `skip-upsample-residual`) the
//! device decoder runs with that defect, and the decoder checks must go red;
//! with `skip-frame-wait` the RGB8-only download reads its pinned host halves
//! without waiting for their copies, and its check must go red.
//!
//! Tolerances (relative L2 error), argued before any run:
//! - convolution, norm, bias/skip add, depth-to-space: the reference sees the
//!   same bf16 inputs and computes in f32; the device accumulates in f32 and
//!   rounds its output to bf16 once (≤ 2^-9 relative per element, ~1.1e-3
//!   RMS), plus f32 reassociation (the conv sums 27 ci products in another
//!   order: ~1e-6). Tolerance 5e-3, as for the DiT's bf16-output kernels.
//! - pixels: bf16 input plus bias in f32 on both sides: bit-exact (0).
//! - the whole decoder against the f32 CPU arm: every layer's output is
//!   rounded to bf16 (conv outputs, norm outputs, the residual stream, the
//!   upsampler outputs, the time embeddings: ~1.1e-3 RMS each). A resnet
//!   rounds ~5 times; its per-voxel RMS norms are scale-invariant and its
//!   convolutions (weights ±1/√fan-in) have gain ~1, so the errors of ~25
//!   stages (20 resnets, 3 upsamplers, conv_in, conv_out) add like a random
//!   walk: √(25 · 5) · 1.1e-3 ≈ 1.2e-2 at worst; expected 5e-3 to 1e-2.
//!   Tolerance 3e-2.
//! - chunked against one piece on the device with the engine's kernel: every
//!   output element is computed by the same instructions in the same order
//!   whatever the chunk (the convolution's K loop and the per-voxel kernels do
//!   not depend on how many frames a launch covers): bit-exact (0). cuDNN may
//!   choose another algorithm per shape: the decoder tolerance (3e-2).
//! - RGB8 conversion kernel (`vae_rgb8`) against its host model
//!   ([`crate::cuda::models::vae::rgb8::rgb8_host`], i.e. [`crate::frames::to_u8`] per value):
//!   the kernel evaluates the host's three IEEE binary32 operations in the
//!   same order, each rounded once to nearest (no contraction), then the
//!   same clamp, NaN rule and round-half-away (the argument is spelled out
//!   at `vae_to_u8` in vae.cu): bit-exact, tolerance 0 differing bytes, on
//!   the probe set (every f32 within 256 steps of each of the 255 rounding
//!   boundaries, specials, random bit patterns) and on a render-sized
//!   launch. Each of [`crate::cuda::models::vae::rgb8::Rgb8Mutation::DEFECTS`] must then turn
//!   the probe red (rint: the even ties; fma: one rounding instead of three;
//!   swapped R/B; an unwritten last frame shows the 0xAB poison); a unit
//!   test shows on the host that each changes the probe's bytes.
//! - the render's download (RGB8 frames only, copied into pinned host halves
//!   with no host wait between conversions) against the checks' download
//!   (f32 and RGB8, waited for at every conversion) of the same decode: the
//!   same kernels write the same device bytes, only the copy differs:
//!   bit-exact (0 differing bytes), one piece and in chunks of 1. The halves
//!   are poisoned before each copy, so a frame read before its copy landed
//!   differs.
//! - RGB8 frames of a decode against `to_u8` of the same decode's f32 clip
//!   (both downloaded): the same argument, tolerance 0, in one piece and in
//!   chunks of 1 and 2 (the RGB8 staging re-poisoned before every chunk, so
//!   a frame the kernel skips shows as 0xAB and one never copied fails the
//!   decode). Red: channels swapped or frames misplaced in the kernel or the
//!   copy, a conversion that is not `to_u8`.
//! - RGB8 frames of a decode against the CPU arm's frames: per byte,
//!   |code_dev - code_cpu| <= 127.5 |v_dev - v_cpu| + 1 + 1e-3, where v are
//!   the two arms' f32 values (the f32 check above bounds those): the map
//!   v -> 255 clamp((v + 1) / 2) has slope 127.5 and clamps only shrink
//!   differences, each rounding moves a code by <= 0.5, and the f32
//!   evaluation is within 1e-4 of exact; a byte outside that is a layout or
//!   conversion bug (NaN on either side fails). Red: channel swap, frame order.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use crate::cuda::fixtures::rgb8::probe_values;
use crate::cuda::fixtures::synth_source;
use crate::cuda::fixtures::write_synth_safetensors;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::memory::{download, upload, DeviceBuffer};
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::vae::cudnn::CudnnConv;
use crate::cuda::models::vae::device::{launch_rgb8, ConvPath, DevConv, DevMod, DevVec, DeviceOps};
use crate::cuda::models::vae::host::{HostConv, HostOps};
use crate::cuda::models::vae::ops::{Loc, Mutation, NormOp, VaeOps};
use crate::cuda::models::vae::rgb8::{
    mismatches, rgb8_bytes, rgb8_host, Rgb8Mutation, RGB8_POISON,
};
use crate::cuda::models::vae::{shapes, DecodeOptions, DecodeOutcome, DeviceVae, Download};
use crate::cuda::selftest::Check;
use crate::cuda::staging::{self, DeviceWeights, StagingMethod, StagingOptions};
use crate::cuda::CudaError;
use crate::frames::{frames_from_pixels, to_u8, Frame};
use crate::models::vae::decoder_read_specs;
use crate::models::vae::{VaeConfig, VaeDecoder};
use crate::tensor::Tensor;
use crate::weights::{MapSource, VarBuilder};

/// Tolerance of the bf16-output primitives.
const PRIM_TOL: f64 = 5e-3;
/// Tolerance of the whole decoder against the CPU arm (and of cuDNN's chunking).
pub const DECODER_TOL: f64 = 3e-2;

/// The mutation the environment asks for (`ENGINE_SELFTEST_MUTATE`).
pub fn mutation_from_env() -> Result<Mutation, CudaError> {
    let v = std::env::var("ENGINE_SELFTEST_MUTATE").unwrap_or_default();
    Mutation::parse(&v).ok_or_else(|| {
        CudaError::Invalid(format!(
            "ENGINE_SELFTEST_MUTATE={v}: expected none, skip-modulation, skip-upsample-residual \
             or skip-frame-wait"
        ))
    })
}

fn empty_weights(kit: &DeviceKit) -> Result<DeviceWeights, CudaError> {
    Ok(DeviceWeights::from_arena(
        DeviceBuffer::alloc(&kit.gpu, 256, "no weights")?,
        HashMap::new(),
        "<none>",
    ))
}

/// The convolution paths to check: the engine's kernels, and cuDNN when it loads.
fn paths(cudnn: &Option<CudnnConv>) -> Vec<ConvPath> {
    ConvPath::ALL
        .into_iter()
        .filter(|p| *p != ConvPath::Cudnn || cudnn.is_some())
        .collect()
}

/// Runs `f` on a fresh device backend of `path` (its buffers freed after).
fn with_dev<T>(
    kit: &DeviceKit,
    none: &DeviceWeights,
    path: ConvPath,
    cudnn: &mut Option<CudnnConv>,
    f: impl FnOnce(&mut DeviceOps<'_>) -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    let c = if path == ConvPath::Cudnn {
        cudnn.as_mut()
    } else {
        None
    };
    let mut ops = DeviceOps::new(&kit.gpu, &kit.kernels, &kit.gemm, none, path, c)?;
    f(&mut ops)
}

/// Allocates and fills buffers on a device backend, every byte poisoned first.
fn dev_bufs(
    ops: &mut DeviceOps<'_>,
    data: &[&[f32]],
    outs: &[usize],
) -> Result<Vec<Loc>, CudaError> {
    let mut v = Vec::new();
    for d in data {
        v.push(Loc {
            buf: ops.alloc(d.len(), "a check input")?,
            off: 0,
        });
    }
    for n in outs {
        v.push(Loc {
            buf: ops.alloc(*n, "a check output")?,
            off: 0,
        });
    }
    ops.poison_from(0)?;
    for (l, d) in v.iter().zip(data) {
        ops.upload(*l, d)?;
    }
    Ok(v)
}

fn host_bufs(
    ops: &mut HostOps<'_>,
    data: &[&[f32]],
    outs: &[usize],
) -> Result<Vec<Loc>, CudaError> {
    let mut v = Vec::new();
    for d in data {
        let l = Loc {
            buf: ops.alloc(d.len(), "in")?,
            off: 0,
        };
        ops.upload(l, d)?;
        v.push(l);
    }
    for n in outs {
        v.push(Loc {
            buf: ops.alloc(*n, "out")?,
            off: 0,
        });
    }
    Ok(v)
}

fn dvec(ops: &DeviceOps<'_>, at: Loc, len: usize) -> Result<DevVec, CudaError> {
    Ok(DevVec {
        ptr: ops.ptr(at)?,
        len,
    })
}

/// Every primitive on the device against the host primitive.
fn check_primitives(
    kit: &DeviceKit,
    rng: &mut Rng,
    cudnn: &mut Option<CudnnConv>,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    check_convolutions(kit, rng, cudnn, out)?;
    check_voxel_norms(kit, rng, cudnn, out)?;
    check_bias_skip(kit, rng, cudnn, out)?;
    check_depth_to_space(kit, rng, cudnn, out)?;
    check_unpatchify(kit, rng, cudnn, out)?;
    Ok(())
}

/// Convolutions: a 128-wide output, a narrow one whose 8-channel chunks span several taps per k block, a wide one, a K tail (ci = 8).
fn check_convolutions(
    kit: &DeviceKit,
    rng: &mut Rng,
    cudnn: &mut Option<CudnnConv>,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let none = empty_weights(kit)?;
    let src = MapSource::new();
    let host = |geom| HostOps::new(&src, geom);
    for (ci, co, tin, h, w) in [
        (64usize, 128usize, 5usize, 6usize, 10usize),
        (16, 48, 4, 5, 7),
        (256, 256, 3, 9, 13),
        (8, 64, 3, 4, 4),
        (128, 384, 4, 7, 9),
    ] {
        let x = rng.normal_bf16(tin * h * w * ci, 1.0);
        let bound = 1.0 / ((27 * ci) as f32).sqrt();
        let wt: Vec<f32> = rng
            .normal_bf16(co * 27 * ci, 1.0)
            .iter()
            .map(|v| crate::cuda::kit::bf16::rb(&[v * bound])[0])
            .collect();
        let b = rng.normal_bf16(co, 0.1);
        // Host weight [taps][ci][co] from the device order [co][taps][ci].
        let mut hw = vec![0.0f32; wt.len()];
        for o in 0..co {
            for t in 0..27 {
                for i in 0..ci {
                    hw[(t * ci + i) * co + o] = wt[(o * 27 + t) * ci + i];
                }
            }
        }
        let hc = HostConv {
            w: hw,
            b: b.clone(),
            ci,
            co,
            k: 3,
        };
        let nout = (tin - 2) * h * w * co;
        let mut ho = host((3, 1, 1, 1));
        let hl = host_bufs(&mut ho, &[&x], &[nout])?;
        ho.conv3(&hc, hl[0], tin, h, w, hl[1])?;
        let want = ho.buffer(hl[1].buf).to_vec();
        for path in paths(cudnn) {
            let got = with_dev(kit, &none, path, cudnn, |ops| {
                let l = dev_bufs(ops, &[&x, &wt, &b], &[nout])?;
                let conv = DevConv {
                    w: ops.ptr(l[1])?,
                    b: dvec(ops, l[2], co)?,
                    ci,
                    co,
                    k: 3,
                };
                let t0 = Instant::now();
                ops.conv3(&conv, l[0], tin, h, w, l[3])?;
                let r = ops.read(l[3], nout)?;
                Ok((r, t0.elapsed().as_secs_f64() * 1e3))
            })?;
            let mut c = Check::new(
                format!("vae conv3 {} {ci}->{co} frames {tin} {h}x{w}", path.name()),
                &got.0,
                &want,
                PRIM_TOL,
            );
            c.note = format!("{:.1} ms incl. first-use setup", got.1);
            out.push(c);
        }
    }
    Ok(())
}

/// Per-voxel norms: RMS with and without modulation (and a bias first), LayerNorm.
fn check_voxel_norms(
    kit: &DeviceKit,
    rng: &mut Rng,
    cudnn: &mut Option<CudnnConv>,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let none = empty_weights(kit)?;
    let src = MapSource::new();
    let host = |geom| HostOps::new(&src, geom);
    for c in [1024usize, 128, 8] {
        let rows = 301;
        let x: Vec<f32> = rng
            .normal_bf16(rows * c, 2.0)
            .iter()
            .map(|v| crate::cuda::kit::bf16::rb(&[v + 0.3])[0])
            .collect();
        let bias = rng.normal_bf16(c, 0.3);
        let t: Vec<Vec<f32>> = (0..4).map(|_| rng.normal_bf16(c, 0.3)).collect();
        let shift: Vec<f32> = t[0].iter().zip(&t[1]).map(|(a, b)| a + b).collect();
        let scale: Vec<f32> = t[2].iter().zip(&t[3]).map(|(a, b)| a + b).collect();
        let hmod = (shift, scale);
        for (kind, use_bias) in [
            ("rms+mod+silu", true),
            ("rms+silu", false),
            ("layernorm", false),
        ] {
            let mut ho = host((3, 1, 1, 1));
            let hl = host_bufs(&mut ho, &[&x], &[rows * c])?;
            let hb = bias.clone();
            let op = match kind {
                "rms+mod+silu" => NormOp::RmsSilu(Some(&hmod)),
                "rms+silu" => NormOp::RmsSilu(None),
                _ => NormOp::LayerNorm {
                    weight: &t[0],
                    bias: &t[1],
                    eps: 1e-6,
                },
            };
            ho.norm(hl[0], rows, c, use_bias.then_some(&hb), &op, hl[1])?;
            let want = ho.buffer(hl[1].buf).to_vec();
            let got = with_dev(kit, &none, ConvPath::Igemm, cudnn, |ops| {
                let l = dev_bufs(ops, &[&x, &bias, &t[0], &t[1], &t[2], &t[3]], &[rows * c])?;
                let v: Vec<DevVec> = (1..6)
                    .map(|i| dvec(ops, l[i], c))
                    .collect::<Result<_, _>>()?;
                let m = DevMod {
                    shift: (v[1].ptr, v[2].ptr),
                    scale: (v[3].ptr, v[4].ptr),
                };
                let op = match kind {
                    "rms+mod+silu" => NormOp::RmsSilu(Some(&m)),
                    "rms+silu" => NormOp::RmsSilu(None),
                    _ => NormOp::LayerNorm {
                        weight: &v[1],
                        bias: &v[2],
                        eps: 1e-6,
                    },
                };
                ops.norm(l[0], rows, c, use_bias.then_some(&v[0]), &op, l[6])?;
                ops.read(l[6], rows * c)
            })?;
            out.push(Check::new(
                format!("vae norm {kind} c={c} rows={rows}"),
                &got,
                &want,
                PRIM_TOL,
            ));
        }
    }
    Ok(())
}

/// Bias + skip, in place.
fn check_bias_skip(
    kit: &DeviceKit,
    rng: &mut Rng,
    cudnn: &mut Option<CudnnConv>,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let none = empty_weights(kit)?;
    let src = MapSource::new();
    let host = |geom| HostOps::new(&src, geom);
    {
        let (rows, c) = (513usize, 256usize);
        let y = rng.normal_bf16(rows * c, 1.0);
        let s = rng.normal_bf16(rows * c, 1.0);
        let b = rng.normal_bf16(c, 0.5);
        let mut ho = host((3, 1, 1, 1));
        let hl = host_bufs(&mut ho, &[&y, &s], &[])?;
        ho.bias_add(hl[0], rows, c, &b, Some(hl[1]))?;
        let want = ho.buffer(hl[0].buf).to_vec();
        let got = with_dev(kit, &none, ConvPath::Igemm, cudnn, |ops| {
            let l = dev_bufs(ops, &[&y, &s, &b], &[])?;
            let bv = dvec(ops, l[2], c)?;
            ops.bias_add(l[0], rows, c, &bv, Some(l[1]))?;
            ops.read(l[0], rows * c)
        })?;
        out.push(Check::new(
            format!("vae bias+skip rows={rows} c={c}"),
            &got,
            &want,
            PRIM_TOL,
        ));
    }
    Ok(())
}

/// Depth-to-space with the residual repeated twice, first frame dropped or not.
fn check_depth_to_space(
    kit: &DeviceKit,
    rng: &mut Rng,
    cudnn: &mut Option<CudnnConv>,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let none = empty_weights(kit)?;
    let src = MapSource::new();
    let host = |geom| HostOps::new(&src, geom);
    for drop in [true, false] {
        let (frames, h, w, cy, cr) = (3usize, 5usize, 7usize, 64usize, 32usize);
        let y = rng.normal_bf16(frames * h * w * cy, 1.0);
        let r = rng.normal_bf16(frames * h * w * cr, 1.0);
        let b = rng.normal_bf16(cy, 0.5);
        let nout = (2 * frames - usize::from(drop)) * 4 * h * w * (cy / 8);
        let mut ho = host((3, 1, 1, 1));
        let hl = host_bufs(&mut ho, &[&y, &r], &[nout])?;
        ho.d2s(hl[0], frames, h, w, cy, &b, Some((hl[1], cr)), drop, hl[2])?;
        let want = ho.buffer(hl[2].buf).to_vec();
        let got = with_dev(kit, &none, ConvPath::Igemm, cudnn, |ops| {
            let l = dev_bufs(ops, &[&y, &r, &b], &[nout])?;
            let bv = dvec(ops, l[2], cy)?;
            ops.d2s(l[0], frames, h, w, cy, &bv, Some((l[1], cr)), drop, l[3])?;
            ops.read(l[3], nout)
        })?;
        out.push(Check::new(
            format!("vae depth-to-space+residual drop={drop}"),
            &got,
            &want,
            PRIM_TOL,
        ));
    }
    Ok(())
}

/// Unpatchify to f32 pixels, at frame 1 of a 4-frame clip.
fn check_unpatchify(
    kit: &DeviceKit,
    rng: &mut Rng,
    cudnn: &mut Option<CudnnConv>,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let none = empty_weights(kit)?;
    let src = MapSource::new();
    let host = |geom| HostOps::new(&src, geom);
    {
        let (frames, h, w, p) = (2usize, 3usize, 5usize, 4usize);
        let geom = (3, 4, h * p, w * p);
        let y = rng.normal_bf16(frames * h * w * 3 * p * p, 1.0);
        let b = rng.normal_bf16(3 * p * p, 0.5);
        let mut ho = host(geom);
        let hl = host_bufs(&mut ho, &[&y], &[])?;
        ho.pixels(hl[0], frames, h, w, &b, p, 1)?;
        let want: Vec<f32> = ho.out.clone();
        let got = with_dev(kit, &none, ConvPath::Igemm, cudnn, |ops| {
            ops.pixel_sink(frames, geom, Download::F32, Mutation::None)?;
            let l = dev_bufs(ops, &[&y, &b], &[])?;
            let bv = dvec(ops, l[1], 3 * p * p)?;
            ops.pixels(l[0], frames, h, w, &bv, p, 1)?;
            ops.take_pixels()
                .ok_or_else(|| CudaError::Invalid("no pixels came back".into()))
        })?;
        // Frames 0 and 3 are never written: compare frames 1..3 only.
        let plane = geom.2 * geom.3;
        let pick = |v: &[f32]| -> Vec<f32> {
            (0..3)
                .flat_map(|c| v[(c * 4 + 1) * plane..(c * 4 + 3) * plane].to_vec())
                .collect()
        };
        out.push(Check::new(
            "vae pixels (unpatchify, f32) frames 1-2 of 4",
            &pick(&got),
            &pick(&want),
            0.0,
        ));
    }
    Ok(())
}

/// One decoder config with synthetic weights: staged on the device and loaded
/// into the CPU arm.
struct Model {
    vae: DeviceVae,
    host: VaeDecoder,
}

fn model(
    kit: &DeviceKit,
    scratch: &Path,
    label: &str,
    cfg: &VaeConfig,
    seed: u64,
) -> Result<Model, CudaError> {
    let specs = decoder_read_specs(cfg);
    let file = scratch.join(format!("vae-{label}.safetensors"));
    write_synth_safetensors(&file, &specs, seed)?;
    let (w, _) = staging::stage_file(
        &kit.gpu,
        &file,
        &StagingOptions::new(StagingMethod::Batched),
    )?;
    let _ = std::fs::remove_file(&file);
    let src = synth_source(&specs, seed)?;
    let host = VaeDecoder::load(&VarBuilder::new(&src), cfg)
        .map_err(|e| CudaError::Invalid(format!("CPU arm VAE: {e}")))?;
    Ok(Model {
        vae: DeviceVae::new(kit.share(), cfg, w, ConvPath::Igemm)?,
        host,
    })
}

/// One decode of the checks: `z` at `t` through `path`, in chunks of `chunk`
/// latent frames, with `mutation`.
#[derive(Clone, Copy)]
struct Case<'a> {
    path: ConvPath,
    z: &'a Tensor,
    t: f32,
    chunk: usize,
    mutation: Mutation,
}

impl Case<'_> {
    /// The same decode in chunks of `chunk`.
    fn chunked(self, chunk: usize) -> Self {
        Case { chunk, ..self }
    }

    /// Runs it poisoned, downloading what `download` says.
    fn run(&self, m: &mut Model, download: Download) -> Result<DecodeOutcome, CudaError> {
        m.vae.set_path(self.path);
        let opts = DecodeOptions {
            chunk: self.chunk,
            download,
            poison: true,
            mutation: self.mutation,
        };
        m.vae.decode(self.z, self.t, &opts, &mut |_| {})
    }
}

/// One poisoned decode with both downloads: (f32 clip, RGB8 frames, device
/// ms, workspace bytes).
fn decode(m: &mut Model, case: Case) -> Result<(Vec<f32>, Vec<Frame>, f64, u64), CudaError> {
    let o = case.run(m, Download::Both)?;
    let px = o
        .pixels
        .ok_or_else(|| CudaError::Invalid("no pixels came back".into()))?;
    let frames = o
        .frames
        .ok_or_else(|| CudaError::Invalid("no RGB8 frames came back".into()))?;
    Ok((px.into_data(), frames, o.device_ms, o.workspace_bytes))
}

/// One poisoned decode downloading the RGB8 frames only, as the render does
/// (no host wait between conversions).
fn decode_frames(m: &mut Model, case: Case) -> Result<Vec<Frame>, CudaError> {
    let o = case.run(m, Download::Rgb8)?;
    if o.pixels.is_some() {
        return Err(CudaError::Invalid(
            "an RGB8-only decode downloaded the f32 clip".into(),
        ));
    }
    o.frames
        .ok_or_else(|| CudaError::Invalid("no RGB8 frames came back".into()))
}

/// The cuDNN plans this model's decodes built, and the heuristic calls they
/// made, against what [`shapes`] counts without a GPU for the same decodes in
/// the same order (one piece, chunks of 1, chunks of 2; the RGB8-only decodes
/// after them add no shape): equal, or the recorder misses a convolution the
/// device plans (the rung-2 render's chunks matched it, s30-dev2).
fn plans_check(
    m: &Model,
    cfg: &VaeConfig,
    label: &str,
    latent: (usize, usize, usize),
) -> Result<Check, CudaError> {
    let mut chunks = Vec::new();
    for chunk in [latent.0, 1, 2] {
        chunks.extend(shapes::conv3_shapes(cfg, latent, chunk)?);
    }
    let want = shapes::plans_per_chunk(&chunks)
        .into_iter()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let got = m.vae.cudnn_plans().unwrap_or((0, 0));
    Ok(Check {
        name: format!("vae decode {label} cudnn plans and heuristic calls == vae::shapes' count"),
        rel: (got.0.abs_diff(want.0) + got.1.abs_diff(want.1)) as f64,
        max_abs: 0.0,
        tol: 0.0,
        pass: got == want && want.0 > 0,
        note: format!(
            "built {} searched {}; counted {} and {}",
            got.0, got.1, want.0, want.1
        ),
    })
}

/// A decode whose buffers, pinned halves and cuDNN plans were made ahead
/// ([`DeviceVae::prepare`], lever `vae-prepare = load`) against the same
/// decode made at first use (`want`: its RGB8-only frames). Tolerance 0
/// differing bytes: the same kernels on the same inputs, and on the cuDNN
/// path the same algorithms (the plans are built in the decode's own order
/// on a fresh handle, so the heuristic sees the same sequence). The decode
/// is poisoned first, pooled buffers included, so a pooled buffer the
/// decode reads before writing, or a pixel sink carried over with a stale
/// frame, shows. Beside the bytes: every buffer request served from the
/// pool with none missed, dropped or left, the pixel sink reused, and on the
/// cuDNN path the plans built by `prepare` equal to what `vae::shapes`
/// counts for this decode, with none built inside it. Then a preparation for
/// another chunking must be discarded, not used: the decode that follows
/// reports no pool and still gives the same bytes.
fn prepared_checks(
    m: &mut Model,
    cfg: &VaeConfig,
    case: Case,
    want: &[Frame],
    label: &str,
) -> Result<Vec<Check>, CudaError> {
    let s = case.z.shape();
    let latent = (s[1], s[2], s[3]);
    m.vae.set_path(case.path);
    let fresh = m.vae.reopen_cudnn();
    let opts = DecodeOptions {
        chunk: case.chunk,
        download: Download::Rgb8,
        poison: true,
        mutation: case.mutation,
    };
    let rep = m.vae.prepare(latent, case.t, &opts)?;
    let before = m.vae.cudnn_plans();
    let o = m.vae.decode(case.z, case.t, &opts, &mut |_| {})?;
    let during = match (before, m.vae.cudnn_plans()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0,
    };
    let frames = o
        .frames
        .ok_or_else(|| CudaError::Invalid("no RGB8 frames came back".into()))?;
    let want_plans = if case.path == ConvPath::Cudnn && fresh {
        shapes::plans_per_chunk(&shapes::conv3_shapes(cfg, latent, case.chunk)?)
            .iter()
            .map(|p| p.0)
            .sum()
    } else {
        0
    };
    let pool = o.prepared;
    let name = format!(
        "vae decode {label} {} prepared at load == made at first use, chunks of {}",
        case.path.name(),
        case.chunk
    );
    let mut c = bytes_check(
        name,
        &frame_bytes(&frames),
        &frame_bytes(want),
        &format!(
            "; pool {pool:?}; plans built by prepare {} (counted {want_plans}), in the decode \
             {during}; prepare {:.1} ms plans + {:.1} ms buffers ({:.1} ms the pixel sink), {:.1} MB device, \
             {:.1} MB pinned",
            rep.plans,
            rep.plan_ms,
            rep.alloc_ms,
            rep.sink_ms,
            rep.device_bytes as f64 / 1e6,
            rep.pinned_bytes as f64 / 1e6
        ),
    );
    c.pass &= pool.is_some_and(|p| p.complete())
        && rep.plans == want_plans
        && during == 0
        && frames.len() == want.len();
    let mut out = vec![c];
    // Prepared for another chunking: discarded, and the bytes unchanged.
    let other = DecodeOptions {
        chunk: if case.chunk == latent.0 { 1 } else { latent.0 },
        ..opts
    };
    m.vae.prepare(latent, case.t, &other)?;
    let o = m.vae.decode(case.z, case.t, &opts, &mut |_| {})?;
    let frames = o
        .frames
        .ok_or_else(|| CudaError::Invalid("no RGB8 frames came back".into()))?;
    let mut c = bytes_check(
        format!(
            "vae decode {label} {} prepared for chunks of {} is not used by chunks of {}",
            case.path.name(),
            other.chunk,
            case.chunk
        ),
        &frame_bytes(&frames),
        &frame_bytes(want),
        &format!("; pool {:?}", o.prepared),
    );
    c.pass &= o.prepared.is_none();
    out.push(c);
    Ok(out)
}

/// The frames' RGB bytes end to end, in frame order.
fn frame_bytes(frames: &[Frame]) -> Vec<u8> {
    frames.iter().flat_map(|f| f.rgb.iter().copied()).collect()
}

/// A check that `got` equals `want` byte for byte (tolerance 0): `rel` is
/// the fraction of bytes that differ, `max_abs` the largest code difference.
fn bytes_check(name: String, got: &[u8], want: &[u8], note: &str) -> Check {
    let (n, max) = mismatches(got, want);
    Check {
        name,
        rel: n as f64 / want.len().max(1) as f64,
        max_abs: max as f64,
        tol: 0.0,
        pass: n == 0 && !want.is_empty(),
        note: format!("{n} of {} bytes differ{note}", want.len()),
    }
}

/// The RGB8 conversion kernel alone against its host model (see the module
/// doc: tolerance 0), then each defect must turn the probe red.
fn check_rgb8_kernel(
    kit: &DeviceKit,
    rng: &mut Rng,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let gpu = &kit.gpu;
    let run = |src: &[f32], frames: usize, h: usize, w: usize, m: Rgb8Mutation| {
        let n = rgb8_bytes(frames, h, w);
        let x = DeviceBuffer::alloc(gpu, src.len() * 4, "an RGB8 check input")?;
        let y = DeviceBuffer::alloc(gpu, n, "an RGB8 check output")?;
        y.fill_bytes(gpu, RGB8_POISON, &gpu.compute)?;
        upload(gpu, x.ptr(), src)?;
        launch_rgb8(&kit.kernels, gpu, x.ptr(), frames, h, w, m, y.ptr())?;
        download::<u8>(gpu, y.ptr(), n)
    };
    let model = |src: &[f32], frames: usize, h: usize, w: usize, m: Rgb8Mutation| {
        rgb8_host(src, frames, h, w, m)
            .ok_or_else(|| CudaError::Invalid("RGB8 check: input of the wrong size".into()))
    };
    // The probe as frames of 37 x 64 (odd rows), padded with values in range.
    let (h, w) = (37usize, 64usize);
    let mut probe = probe_values(rng, 1 << 16);
    let frame = 3 * h * w;
    let frames = probe.len().div_ceil(frame);
    let pad = rng.uniform(frames * frame - probe.len(), -1.25, 1.25);
    probe.extend(pad);
    let want = model(&probe, frames, h, w, Rgb8Mutation::None)?;
    let got = run(&probe, frames, h, w, Rgb8Mutation::None)?;
    out.push(bytes_check(
        format!("vae rgb8 kernel == to_u8, probe of {} values", probe.len()),
        &got,
        &want,
        ": ties, clamp, NaN, random bits",
    ));
    // A render-sized launch: every thread strides over several pixels.
    let (f2, h2, w2) = (3usize, 512usize, 768usize);
    let big = rng.uniform(f2 * 3 * h2 * w2, -1.2, 1.2);
    out.push(bytes_check(
        format!("vae rgb8 kernel == to_u8, {f2} frames {w2}x{h2}"),
        &run(&big, f2, h2, w2, Rgb8Mutation::None)?,
        &model(&big, f2, h2, w2, Rgb8Mutation::None)?,
        "",
    ));
    // Each defect must differ from to_u8 on the probe (and match its own
    // host model, so the check knows what it caught).
    for m in Rgb8Mutation::DEFECTS {
        let bad = run(&probe, frames, h, w, m)?;
        let (n, max) = mismatches(&bad, &want);
        let (own, _) = mismatches(&bad, &model(&probe, frames, h, w, m)?);
        out.push(Check {
            name: format!("vae rgb8 kernel MUTATED {} goes red", m.name()),
            rel: n as f64 / want.len() as f64,
            max_abs: max as f64,
            tol: 0.0,
            pass: n > 0,
            note: format!(
                "{n} bytes differ from to_u8 (0 would mean the check cannot see it); \
                 {own} from the defect's host model"
            ),
        });
    }
    Ok(())
}

/// Bytes of the device's RGB8 `frames` that differ from `to_u8` of the same
/// decode's f32 clip `px` (`[3, F, H, W]`), bytes compared, and whether
/// every f32 value is finite (NaN maps to 0 on both sides, so a NaN clip
/// would otherwise pass). A frame count or size that differs counts as
/// `usize::MAX` differing bytes.
fn rgb8_vs_own_f32(
    frames: &[Frame],
    px: &[f32],
    shape: &[usize],
) -> Result<(usize, usize, bool), CudaError> {
    let t = Tensor::new(shape, px.to_vec()).map_err(|e| CudaError::Invalid(e.to_string()))?;
    let want = frames_from_pixels(&t).map_err(|e| CudaError::Invalid(e.to_string()))?;
    let finite = px.iter().all(|v| v.is_finite());
    if want.len() != frames.len() {
        return Ok((usize::MAX, 0, finite));
    }
    let mut n = 0;
    let mut bytes = 0;
    for (g, w) in frames.iter().zip(&want) {
        if (g.width, g.height) != (w.width, w.height) {
            return Ok((usize::MAX, bytes, finite));
        }
        n += mismatches(&g.rgb, &w.rgb).0;
        bytes += w.rgb.len();
    }
    Ok((n, bytes, finite))
}

/// The device's RGB8 frames against the CPU arm's, per byte within what the
/// two arms' f32 values allow (see the module doc).
fn rgb8_vs_cpu(
    name: String,
    frames: &[Frame],
    got: &[f32],
    want: &[f32],
    shape: &[usize],
) -> Check {
    let (f, h, w) = (shape[1], shape[2], shape[3]);
    let plane = h * w;
    let (mut bad, mut max, mut num, mut den) = (0usize, 0u8, 0.0f64, 0.0f64);
    let shaped = frames.len() == f
        && got.len() == want.len()
        && want.len() == 3 * f * plane
        && frames.iter().all(|fr| fr.rgb.len() == 3 * plane);
    if shaped {
        for (fi, fr) in frames.iter().enumerate() {
            for p in 0..plane {
                for c in 0..3 {
                    let i = (c * f + fi) * plane + p;
                    let (dev, cpu) = (fr.rgb[3 * p + c], to_u8(want[i]));
                    let d = dev.abs_diff(cpu);
                    let allowed = 127.5 * (got[i] as f64 - want[i] as f64).abs() + 1.0 + 1e-3;
                    // NaN on either side: the comparison is false.
                    let within = (d as f64) <= allowed;
                    if !within {
                        bad += 1;
                    }
                    max = max.max(d);
                    num += (d as f64).powi(2);
                    den += (cpu as f64 - 127.5).powi(2);
                }
            }
        }
    }
    let n = want.len().max(1);
    Check {
        name,
        rel: if shaped { bad as f64 / n as f64 } else { 1.0 },
        max_abs: max as f64,
        tol: 0.0,
        pass: shaped && bad == 0,
        note: if shaped {
            format!(
                "{bad} of {n} bytes outside 127.5|dv| + 1; code diffs L2 {:.2e} of the codes'",
                (num / den.max(1e-300)).sqrt()
            )
        } else {
            "frame count or size differs".into()
        },
    }
}

/// The VAE section: primitives, the tiny and the ltxv-2b decoders against the
/// CPU arm with every conv path, chunked against one piece.
pub fn check_vae(kit: &DeviceKit, scratch: &Path, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let mutation = mutation_from_env()?;
    let mut rng = Rng::new(0x0005_eed0_0fae);
    let mut cudnn = match CudnnConv::open(&kit.gpu) {
        Ok(c) => {
            eprintln!("selftest-cuda: cuDNN {} loaded", c.version);
            Some(c)
        }
        Err(e) => {
            eprintln!("selftest-cuda: cuDNN arm not checked: {e}");
            None
        }
    };
    check_primitives(kit, &mut rng, &mut cudnn, out)?;
    // Its own generator: the decoder checks below keep their inputs.
    check_rgb8_kernel(kit, &mut Rng::new(0x0005_eed0_0b8e), out)?;
    let have_cudnn = cudnn.is_some();
    drop(cudnn);
    let t = 0.05f32;
    for (label, cfg, latent, seed) in [
        (
            "tiny",
            crate::presets::vae_tiny(),
            (3usize, 2usize, 3usize),
            41u64,
        ),
        ("ltxv-2b", crate::presets::vae_095(), (3, 4, 6), 42),
    ] {
        let mut m = model(kit, scratch, label, &cfg, seed)?;
        let n = 128 * latent.0 * latent.1 * latent.2;
        let z = Tensor::new(
            &[128, latent.0, latent.1, latent.2],
            rng.normal_bf16(n, 1.0),
        )
        .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let t0 = Instant::now();
        let want = m
            .host
            .decode(&z, t)
            .map_err(|e| CudaError::Invalid(format!("CPU arm decode: {e}")))?;
        let shape = want.shape().to_vec();
        let want = want.into_data();
        let cpu_s = t0.elapsed().as_secs_f64();
        for path in ConvPath::ALL {
            if path == ConvPath::Cudnn && !have_cudnn {
                continue;
            }
            let case = Case {
                path,
                z: &z,
                t,
                chunk: latent.0,
                mutation,
            };
            let (got, frames, ms, bytes) = decode(&mut m, case)?;
            if m.vae.path != path {
                return Err(CudaError::Invalid(format!(
                    "conv path {} asked, {} in effect ({:?})",
                    path.name(),
                    m.vae.path.name(),
                    m.vae.cudnn_error
                )));
            }
            let mut c = Check::new(
                format!(
                    "vae decode {label} latent {latent:?} {} vs the CPU arm{}",
                    path.name(),
                    if mutation == Mutation::None {
                        String::new()
                    } else {
                        format!(" MUTATED {mutation:?}")
                    }
                ),
                &got,
                &want,
                DECODER_TOL,
            );
            c.note = format!(
                "device {ms:.1} ms, CPU arm {cpu_s:.1} s, workspace {:.1} MB",
                bytes as f64 / 1e6
            );
            out.push(c);
            // The plan's projection of the decode's buffers is exact.
            let proj = crate::cuda::models::vae::decode_bytes(&cfg, latent, latent.0)?;
            out.push(Check {
                name: format!(
                    "vae decode {label} {} bytes == plan's decode_bytes",
                    path.name()
                ),
                rel: (proj as f64 - bytes as f64).abs(),
                max_abs: 0.0,
                tol: 0.0,
                pass: proj == bytes,
                note: format!("measured {bytes}, projected {proj}"),
            });
            out.push(rgb8_vs_cpu(
                format!(
                    "vae decode {label} {} rgb8 vs the CPU arm's frames",
                    path.name()
                ),
                &frames,
                &got,
                &want,
                &shape,
            ));
            let mut exact = vec![(
                "one piece".to_string(),
                rgb8_vs_own_f32(&frames, &got, &shape)?,
            )];
            // Chunked against one piece, on the device.
            let one = got;
            let mut both_frames = vec![(latent.0, frames)];
            for chunk in [1usize, 2] {
                let (ch, chf, _, cbytes) = decode(&mut m, case.chunked(chunk))?;
                exact.push((
                    format!("chunks of {chunk}"),
                    rgb8_vs_own_f32(&chf, &ch, &shape)?,
                ));
                if chunk == 1 {
                    both_frames.push((chunk, chf));
                }
                let tol = if path == ConvPath::Cudnn {
                    DECODER_TOL
                } else {
                    0.0
                };
                let mut c = Check::new(
                    format!(
                        "vae decode {label} {} chunks of {chunk} == one piece",
                        path.name()
                    ),
                    &ch,
                    &one,
                    tol,
                );
                c.note = format!(
                    "workspace {:.1} MB (one piece {:.1} MB)",
                    cbytes as f64 / 1e6,
                    bytes as f64 / 1e6
                );
                out.push(c);
            }
            // The RGB8 frames of all three decodes against to_u8 of their own f32 clip.
            let bad: usize = exact.iter().map(|e| e.1 .0).fold(0, usize::saturating_add);
            let bytes: usize = exact.iter().map(|e| e.1 .1).sum();
            let finite = exact.iter().all(|e| e.1 .2);
            out.push(Check {
                name: format!(
                    "vae decode {label} {} rgb8 == to_u8(device f32), 3 chunkings",
                    path.name()
                ),
                rel: bad as f64 / bytes.max(1) as f64,
                max_abs: if bad == 0 { 0.0 } else { f64::NAN },
                tol: 0.0,
                pass: bad == 0 && bytes > 0 && finite,
                note: exact
                    .iter()
                    .map(|(k, (n, b, fin))| {
                        format!(
                            "{k}: {n} of {b} differ{}",
                            if *fin { "" } else { ", f32 NaN" }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            });
            // The render's download (RGB8 only, no waits) against the checks'.
            for (chunk, want) in &both_frames {
                let got = decode_frames(&mut m, case.chunked(*chunk))?;
                let sizes_ok = got.len() == want.len()
                    && got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| (a.width, a.height) == (b.width, b.height));
                let mut c = bytes_check(
                    format!(
                        "vae decode {label} {} rgb8-only download == both downloads, chunks of {chunk}",
                        path.name()
                    ),
                    &frame_bytes(&got),
                    &frame_bytes(want),
                    &format!("; {} frames of {}", got.len(), want.len()),
                );
                c.pass &= sizes_ok;
                out.push(c);
            }
            if path == ConvPath::Cudnn {
                out.push(plans_check(&m, &cfg, label, latent)?);
            }
            if let Some((chunk, want)) = both_frames.last() {
                out.extend(prepared_checks(
                    &mut m,
                    &cfg,
                    case.chunked(*chunk),
                    want,
                    label,
                )?);
            }
        }
        if let Some(r) = m.vae.cudnn_report() {
            eprintln!(
                "selftest-cuda: cuDNN {} algorithms ({label}): {:?}",
                r.0, r.1
            );
        }
    }
    Ok(())
}
