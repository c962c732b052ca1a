//! A rung-0-shaped render (tiny preset, 64x64, 9 frames, 4 steps with guidance)
//! on the synthetic weights, through the models alone: the frames it yields must
//! look like a video to the harness's pixel check (not near-black, not
//! near-uniform, every frame distinct, adjacent frames moving), for several
//! weight seeds, and the same seed must give the same pixels.

use engine::models::dit::{self, Transformer};
use engine::models::init;
use engine::models::t5::{self, Keys, T5Encoder};
use engine::models::vae::{self, VaeDecoder};
use engine::ops::space::{pack_latents, unpack_latents};
use engine::presets::preset;
use engine::rng::{decode_noise, initial_latents};
use engine::schedule;
use engine::tensor::Tensor;
use engine::weights::VarBuilder;

/// 8-bit RGB frames `[F][H*W*3]` of a render with weight seed `wseed` and noise seed `seed`.
fn render(wseed: u64, seed: u64) -> Vec<Vec<u8>> {
    let _one = crate::common::exclusive();
    let p = preset("tiny").unwrap();
    let (dsrc, tsrc, vsrc) = (
        init::source(&dit::tensor_specs(&p.dit), wseed),
        init::source(&t5::tensor_specs(&p.t5), wseed),
        init::source(&vae::tensor_specs(&p.vae), wseed),
    );
    let dm = Transformer::load(&VarBuilder::new(&dsrc), &p.dit).unwrap();
    let tm = T5Encoder::load(&VarBuilder::new(&tsrc), &p.t5).unwrap();
    let vm = VaeDecoder::load(&VarBuilder::new(&vsrc), &p.vae).unwrap();
    let l = p.max_text_tokens;
    let ids: Vec<u32> = (0..l as u32)
        .map(|i| if i < 9 { 3 + i * 41 % 500 } else { 0 })
        .collect();
    let mask: Vec<f32> = (0..l).map(|i| if i < 9 { 1.0 } else { 0.0 }).collect();
    let mut neg_mask = vec![0.0; l];
    neg_mask[0] = 1.0;
    let text = tm.forward(&ids, Keys::All).unwrap();
    let neg = tm.forward(&vec![1; l], Keys::All).unwrap();
    let grid = (2, 2, 2);
    let n = 8;
    let sig = schedule::sigmas(&p.scheduler, 4, n).unwrap();
    let mut lat = pack_latents(initial_latents(seed, 128, grid).data(), 128);
    for i in 0..4 {
        let x = Tensor::new(&[n, 128], lat.clone()).unwrap();
        let vu = dm
            .forward(&x, sig[i], &neg, &neg_mask, grid, p.default_fps)
            .unwrap();
        let vc = dm
            .forward(&x, sig[i], &text, &mask, grid, p.default_fps)
            .unwrap();
        let v = schedule::cfg_combine(vu.data(), vc.data(), 3.0).unwrap();
        schedule::euler_step(&mut lat, &v, sig[i], sig[i + 1]).unwrap();
    }
    let mut z = unpack_latents(&lat, 128);
    schedule::denormalize_latents(
        &mut z,
        vm.latents_mean(),
        vm.latents_std(),
        p.vae_scaling.scaling_factor,
    )
    .unwrap();
    let s = &p.vae_scaling;
    schedule::mix_decode_noise(
        &mut z,
        decode_noise(seed, 128, grid).data(),
        s.decode_noise_scale,
    )
    .unwrap();
    let video = vm
        .decode(&Tensor::new(&[128, 2, 2, 2], z).unwrap(), s.decode_timestep)
        .unwrap();
    let (f, hw) = (9, 64 * 64);
    (0..f)
        .map(|t| {
            (0..hw)
                .flat_map(|i| (0..3).map(move |c| c * f * hw + t * hw + i))
                .map(|k| ((video.data()[k] / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round() as u8)
                .collect()
        })
        .collect()
}

fn luma(frame: &[u8]) -> Vec<f64> {
    frame
        .chunks(3)
        .map(|p| 0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64)
        .collect()
}

#[test]
fn synthetic_renders_look_like_a_video() {
    for wseed in [0, 1, 42] {
        let frames = render(wseed, 5);
        assert_eq!(frames.len(), 9);
        for (k, f) in frames.iter().enumerate() {
            let y = luma(f);
            let mean = y.iter().sum::<f64>() / y.len() as f64;
            let std = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / y.len() as f64).sqrt();
            assert!(
                (16.0..=240.0).contains(&mean),
                "weights {wseed} frame {k}: mean luma {mean:.1}"
            );
            assert!(std > 8.0, "weights {wseed} frame {k}: luma std {std:.1}");
            if k > 0 {
                let prev = luma(&frames[k - 1]);
                let motion =
                    y.iter().zip(&prev).map(|(a, b)| (a - b).abs()).sum::<f64>() / y.len() as f64;
                assert!(
                    motion > 1.0,
                    "weights {wseed} frames {}..{k}: motion {motion:.2}",
                    k - 1
                );
            }
            for (j, other) in frames[..k].iter().enumerate() {
                assert_ne!(
                    other, f,
                    "weights {wseed}: frames {j} and {k} are identical"
                );
            }
        }
    }
}

#[test]
fn same_seed_same_pixels_other_seed_other_pixels() {
    let a = render(0, 5);
    assert_eq!(a, render(0, 5));
    let b = render(0, 6);
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
}
