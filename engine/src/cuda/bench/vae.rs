//! The VAE benchmark of `engine selftest-cuda --bench` (`just bench-gpu`):
//! the ltxv-2b decoder at 768x512x121 (latent 16x16x24, timestep
//! conditioning on) with weights generated on the device, every conv path and
//! a few chunk sizes, the median device time of a few decodes after a
//! warm-up, the device peak; and
//! the heaviest convolution shapes alone, per path; and the wall time to the
//! host's frames with the f32 download and the host's conversion against the
//! device's RGB8 frames.

use std::collections::HashMap;
use std::time::Instant;

use crate::cuda::bench::{generate_weights, median};
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::context::Timer;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::vae::cudnn::CudnnConv;
use crate::cuda::models::vae::device::{ConvPath, DevConv, DevVec, DeviceOps};
use crate::cuda::models::vae::ops::{Loc, Mutation, VaeOps};
use crate::cuda::models::vae::{DecodeOptions, DeviceVae, Download};
use crate::cuda::staging::DeviceWeights;
use crate::cuda::CudaError;
use crate::frames::frames_from_pixels;
use crate::models::vae::decoder_read_specs;
use crate::models::vae::VaeConfig;
use crate::tensor::Tensor;

/// PyTorch's figure for the same decode is not a constant here: a comparison is
/// made on the same card in the same call, so `scripts/bench-gpu.sh`'s `ref:`
/// step times diffusers' `vae.decode` beside this bench, and its `table` step
/// prints the ratio.
/// Latent grid of 768x512 at 121 frames.
pub const LATENT_768X512X121: (usize, usize, usize) = (16, 16, 24);

/// FLOPs of the decoder's convolutions over `latent` (2 per multiply-add).
pub fn decode_flops(cfg: &VaeConfig, latent: (usize, usize, usize)) -> f64 {
    let (first, mid, plan) = cfg.decoder_plan();
    let (mut t, mut h, mut w) = latent;
    let conv = |vox: usize, ci: usize, co: usize, k: usize| 2.0 * (vox * k * ci * co) as f64;
    let mut vox = t * h * w;
    let mut f = conv(vox, cfg.latent_channels, first, 27);
    f += (2 * mid) as f64 * conv(vox, first, first, 27);
    let mut c = first;
    for b in &plan {
        if b.in_channels != b.out_channels {
            f += conv(vox, c, b.out_channels, 27)
                + conv(vox, b.out_channels, b.out_channels, 27)
                + conv(vox, c, b.out_channels, 1);
            c = b.out_channels;
        }
        if b.upsample {
            let up_in = b.out_channels * b.factor;
            f += conv(vox, up_in, up_in * 8 / b.factor, 27);
            (t, h, w) = (2 * t - 1, 2 * h, 2 * w);
            vox = t * h * w;
            c = b.out_channels;
        }
        f += (2 * b.layers) as f64 * conv(vox, c, c, 27);
    }
    let p = cfg.patch_size;
    f + conv(vox, c, cfg.out_channels * p * p, 27)
}

/// Weights of `cfg`'s decoder generated on the device (uniform, scaled so
/// activations stay O(1)): for timing only.
pub fn device_weights(
    kit: &DeviceKit,
    cfg: &VaeConfig,
    seed: u64,
) -> Result<DeviceWeights, CudaError> {
    generate_weights(kit, &decoder_read_specs(cfg), seed, "VAE", |s| {
        match s.shape.len() {
            5 | 2 => 1.0 / (s.shape[1..].iter().product::<usize>() as f32).sqrt(),
            0 => 1.0,
            _ => 0.1,
        }
    })
}

/// Runs the VAE benchmark; returns its table rows.
pub fn bench_vae(kit: &DeviceKit) -> Result<Vec<String>, CudaError> {
    let mut rows = Vec::new();
    let push = |rows: &mut Vec<String>, r: String| {
        eprintln!("{r}");
        rows.push(r);
    };
    let gpu = &kit.gpu;
    let cfg = crate::presets::vae_095();
    let latent = LATENT_768X512X121;
    let flops = decode_flops(&cfg, latent);
    let w = device_weights(kit, &cfg, 77)?;
    let mut vae = DeviceVae::new(kit.share(), &cfg, w, ConvPath::Igemm)?;
    let mut rng = Rng::new(123);
    let n = 128 * latent.0 * latent.1 * latent.2;
    let z = Tensor::new(&[128, latent.0, latent.1, latent.2], rng.normal(n, 1.0))
        .map_err(|e| CudaError::Invalid(e.to_string()))?;
    for path in ConvPath::ALL {
        if vae.set_path(path) != path {
            push(
                &mut rows,
                format!(
                    "vae      {} not measured: {}",
                    path.name(),
                    vae.cudnn_error.clone().unwrap_or_default()
                ),
            );
            continue;
        }
        for chunk in [16usize, 4, 2] {
            let opts = DecodeOptions {
                chunk,
                download: Download::None,
                poison: false,
                mutation: Mutation::None,
            };
            let warm = vae.decode(&z, 0.05, &opts, &mut |_| {})?;
            gpu.mem.reset_peak();
            let mut ms = Vec::new();
            for _ in 0..3 {
                ms.push(vae.decode(&z, 0.05, &opts, &mut |_| {})?.device_ms);
            }
            let m = median(ms);
            push(
                &mut rows,
                format!(
                    "vae      ltxv-2b decode 768x512x121 {:<10} chunk {chunk:>2}: {m:>7.1} ms ({:.0} TFLOP/s conv) (PyTorch: the ref step of the same call); peak device {:.2} GiB (decode buffers {:.2} GiB)",
                    path.name(),
                    flops / m / 1e9,
                    gpu.mem.peak() as f64 / (1u64 << 30) as f64,
                    warm.workspace_bytes as f64 / (1u64 << 30) as f64,
                ),
            );
        }
    }
    // The render's decode to host frames: the f32 clip and the host's
    // conversion (what decode.video + artifacts.frames paid before) against
    // the device's RGB8 frames, host wall clock, after the warm-ups above.
    let path = vae.set_path(crate::cuda::models::vae::RENDER_CONV_PATH);
    let chunk = crate::cuda::models::vae::DEVICE_CHUNK_LATENT_FRAMES;
    for (label, download) in [
        ("f32 + host to_u8", Download::F32),
        ("rgb8 from device", Download::Rgb8),
    ] {
        let opts = DecodeOptions {
            chunk,
            download,
            poison: false,
            mutation: Mutation::None,
        };
        let (mut wall, mut dev) = (Vec::new(), Vec::new());
        let mut n = 0;
        for _ in 0..3 {
            let t0 = Instant::now();
            let o = vae.decode(&z, 0.05, &opts, &mut |_| {})?;
            let frames = match (o.frames, o.pixels) {
                (Some(f), _) => f,
                (None, Some(p)) => {
                    frames_from_pixels(&p).map_err(|e| CudaError::Invalid(e.to_string()))?
                }
                (None, None) => {
                    return Err(CudaError::Invalid("the decode returned nothing".into()))
                }
            };
            wall.push(t0.elapsed().as_secs_f64() * 1e3);
            dev.push(o.device_ms);
            n = frames.len();
        }
        push(
            &mut rows,
            format!(
                "vae      ltxv-2b decode 768x512x121 {} chunk {chunk} to {n} host frames, {label:<16}: {:>7.1} ms wall ({:.1} ms device)",
                path.name(),
                median(wall),
                median(dev),
            ),
        );
    }
    if let Some((v, algos)) = vae.cudnn_report() {
        eprintln!("bench: cuDNN {v} algorithms: {algos:?}");
    }
    drop(vae);
    // The heaviest convolutions alone (whole-clip shapes of each stage).
    let mut cudnn = CudnnConv::open(gpu).ok();
    let none = DeviceWeights::from_arena(
        DeviceBuffer::alloc(gpu, 256, "no weights")?,
        HashMap::new(),
        "<none>",
    );
    for (ci, co, tin, h, wd) in [
        (1024usize, 1024usize, 18usize, 16usize, 24usize),
        (1024, 4096, 18, 16, 24),
        (512, 512, 33, 32, 48),
        (256, 256, 63, 64, 96),
        (128, 128, 123, 128, 192),
        (128, 48, 123, 128, 192),
    ] {
        let f = 2.0 * ((tin - 2) * h * wd * 27 * ci * co) as f64;
        let mut cells = Vec::new();
        for path in ConvPath::ALL {
            let c = if path == ConvPath::Cudnn {
                match cudnn.as_mut() {
                    Some(c) => Some(c),
                    None => continue,
                }
            } else {
                None
            };
            let mut ops = DeviceOps::new(gpu, &kit.kernels, &kit.gemm, &none, path, c)?;
            let x = Loc {
                buf: ops.alloc(tin * h * wd * ci, "bench x")?,
                off: 0,
            };
            let wt = Loc {
                buf: ops.alloc(co * 27 * ci, "bench w")?,
                off: 0,
            };
            let y = Loc {
                buf: ops.alloc((tin - 2) * h * wd * co, "bench y")?,
                off: 0,
            };
            let s = &gpu.compute;
            kit.kernels
                .fill_uniform_bf16(s, ops.ptr(x)?, tin * h * wd * ci, 1, 1.0)?;
            kit.kernels.fill_uniform_bf16(
                s,
                ops.ptr(wt)?,
                co * 27 * ci,
                2,
                1.0 / ((27 * ci) as f32).sqrt(),
            )?;
            let conv = DevConv {
                w: ops.ptr(wt)?,
                b: DevVec { ptr: 0, len: co },
                ci,
                co,
                k: 3,
            };
            for _ in 0..2 {
                ops.conv3(&conv, x, tin, h, wd, y)?;
            }
            let t = Timer::new(gpu)?;
            let mut v = Vec::new();
            for _ in 0..5 {
                t.start(s)?;
                ops.conv3(&conv, x, tin, h, wd, y)?;
                t.stop(s)?;
                v.push(t.elapsed_ms()?);
            }
            let m = median(v);
            cells.push(format!("{} {m:.2} ms {:.0} TF/s", path.name(), f / m / 1e9));
        }
        push(
            &mut rows,
            format!(
                "vae      conv {ci:>4}->{co:<4} {tin}x{h}x{wd}: {}",
                cells.join(" | ")
            ),
        );
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoders_flops_match_a_hand_count() {
        // ltxv-2b at latent 16x16x24: ~60 TFLOP (hand count in the bench notes).
        let f = decode_flops(&crate::presets::vae_095(), LATENT_768X512X121);
        assert!((f / 1e12 - 60.5).abs() < 1.0, "{}", f / 1e12);
        // One 1x1x1 latent frame of the tiny decoder by hand:
        // conv_in 128->64, mid 2 x 64->64, up0 64->256 then (t, h, w) = (1, 2, 2),
        // 2 x 32->32, up1 32->128 at 4 voxels -> (1, 4, 4), 2 x 16->16, up2
        // 16->64 at 16 voxels -> (1, 8, 8), 2 x 8->8, conv_out 8->48 at 64 voxels.
        let t = decode_flops(&crate::presets::vae_tiny(), (1, 1, 1));
        let want = 54.0
            * (128.0 * 64.0
                + 2.0 * 64.0 * 64.0
                + 64.0 * 256.0
                + 4.0 * 2.0 * 32.0 * 32.0
                + 4.0 * 32.0 * 128.0
                + 16.0 * 2.0 * 16.0 * 16.0
                + 16.0 * 16.0 * 64.0
                + 64.0 * 2.0 * 8.0 * 8.0
                + 64.0 * 8.0 * 48.0);
        assert_eq!(t, want);
    }
}
