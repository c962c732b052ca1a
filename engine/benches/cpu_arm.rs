//! CPU-arm figures, printed one per line (`name: value unit`): GEMM and
//! conv3d throughput on one thread and on the whole rayon pool, the tiny
//! models' forwards, the compute of a rung-0-sized render (tiny preset, 64x64,
//! 9 frames, 4 steps with guidance), and one 2B-shaped transformer block.
//!
//! `cargo bench -p engine --bench cpu_arm` (add `--profile dev` to reuse the
//! optimised dev build). Each figure is the median of several timed runs after
//! one warm-up.

use std::time::Instant;

use engine::models::dit::{self, Transformer};
use engine::models::init;
use engine::models::t5::{self, Keys, T5Encoder};
use engine::models::vae::{self, VaeDecoder};
use engine::ops::conv3d::{Conv3d, TILE_MAX_COLS};
use engine::ops::linear::{gemm, MatRef};
use engine::presets::preset;
use engine::rng::{initial_latents, Gaussian};
use engine::schedule;
use engine::tensor::Tensor;
use engine::weights::VarBuilder;

fn median_s(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[runs / 2]
}

fn on_threads<R: Send>(n: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a rayon pool")
        .install(f)
}

fn main() {
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("threads available: {all}");

    // GEMM 512 x 2048 x 2048 (a 2B linear on 512 tokens).
    let (m, k, n) = (512, 2048, 2048);
    let a = Gaussian::new(1, "a").vec(m * k);
    let b = Gaussian::new(1, "b").vec(k * n);
    let mut c = vec![0.0f32; m * n];
    for th in [1, all] {
        let s = on_threads(th, || {
            median_s(5, || {
                gemm(
                    MatRef::row_major(&a, m, k),
                    MatRef::row_major(&b, k, n),
                    &mut c,
                    n,
                    false,
                )
            })
        });
        println!(
            "gemm_512x2048x2048_threads{th}: {:.1} GFLOP/s",
            2.0 * (m * k * n) as f64 / s / 1e9
        );
    }

    // One conv3d output frame: 128 -> 128 channels, 3x3x3, 64x64.
    let (ci, co, h, w) = (128, 128, 64, 64);
    let conv = Conv3d::new(
        Tensor::new(&[co, ci, 3, 3, 3], Gaussian::new(2, "w").vec(co * ci * 27)).unwrap(),
        vec![0.0; co],
    );
    let frames: Vec<_> = (0..3)
        .map(|i| conv.pad(&Gaussian::new(i, "x").vec(ci * h * w), h, w))
        .collect();
    let window: Vec<_> = frames.iter().collect();
    for th in [1, all] {
        let s = on_threads(th, || median_s(5, || drop(conv.forward_padded(&window))));
        println!(
            "conv3d_frame_128to128_64x64_threads{th}: {:.1} GFLOP/s",
            2.0 * (co * ci * 27 * h * w) as f64 / s / 1e9
        );
    }

    // One conv3d output frame at a decoder-like size (128 -> 128, 3x3x3, 256x384):
    // the accumulator tile bounded (TILE_MAX_COLS) against unbounded, side by side.
    let (ci, co, h, w) = (128, 128, 256, 384);
    let conv = Conv3d::new(
        Tensor::new(&[co, ci, 3, 3, 3], Gaussian::new(3, "w").vec(co * ci * 27)).unwrap(),
        vec![0.0; co],
    );
    let frames: Vec<_> = (0..3)
        .map(|i| conv.pad(&Gaussian::new(10 + i, "x").vec(ci * h * w), h, w))
        .collect();
    let window: Vec<_> = frames.iter().collect();
    let flop = 2.0 * (co * ci * 27 * h * w) as f64;
    let mut rates = Vec::new();
    for cols in [usize::MAX, TILE_MAX_COLS, 2048] {
        let s = median_s(3, || drop(conv.forward_padded_tiled(&window, cols)));
        let label = if cols == usize::MAX {
            "unbounded".to_string()
        } else {
            cols.to_string()
        };
        println!(
            "conv3d_frame_128to128_256x384_threads{all}_tile_cols_{label}: {:.1} GFLOP/s",
            flop / s / 1e9
        );
        rates.push(flop / s);
    }
    println!(
        "conv3d_frame_128to128_256x384 tile {TILE_MAX_COLS} vs unbounded: {:.2}x",
        rates[1] / rates[0]
    );

    // Tiny preset: a rung-0-sized render's compute (weights already in memory).
    let p = preset("tiny").expect("tiny preset");
    let dsrc = init::source(&dit::tensor_specs(&p.dit), 1);
    let tsrc = init::source(&t5::tensor_specs(&p.t5), 1);
    let vsrc = init::source(&vae::tensor_specs(&p.vae), 1);
    let dm = Transformer::load(&VarBuilder::new(&dsrc), &p.dit).unwrap();
    let tm = T5Encoder::load(&VarBuilder::new(&tsrc), &p.t5).unwrap();
    let vm = VaeDecoder::load(&VarBuilder::new(&vsrc), &p.vae).unwrap();
    let l = p.max_text_tokens;
    let ids: Vec<u32> = (0..l as u32).map(|i| (i * 37) % 512).collect();
    let mask: Vec<f32> = (0..l).map(|i| if i < 12 { 1.0 } else { 0.0 }).collect();
    let grid = (2, 2, 2);
    let steps = 4;
    let render = || {
        let text = tm.forward(&ids, Keys::All).unwrap();
        let neg = tm.forward(&ids[..1], Keys::All).unwrap();
        let sig = schedule::sigmas(&p.scheduler, steps, 8).unwrap();
        let mut lat = engine::ops::space::pack_latents(initial_latents(7, 128, grid).data(), 128);
        for i in 0..steps {
            let x = Tensor::new(&[8, 128], lat.clone()).unwrap();
            let vu = dm.forward(&x, sig[i], &neg, &[1.0], grid, 25.0).unwrap();
            let vc = dm.forward(&x, sig[i], &text, &mask, grid, 25.0).unwrap();
            let v = schedule::cfg_combine(vu.data(), vc.data(), 3.0).unwrap();
            schedule::euler_step(&mut lat, &v, sig[i], sig[i + 1]).unwrap();
        }
        let z = Tensor::new(
            &[128, 2, 2, 2],
            engine::ops::space::unpack_latents(&lat, 128),
        )
        .unwrap();
        vm.decode(&z, 0.05).unwrap()
    };
    for th in [1, all] {
        let s = on_threads(th, || median_s(5, || drop(render())));
        println!("tiny_render_64x64x9_4steps_threads{th}: {:.1} ms", s * 1e3);
    }
    let s = median_s(5, || {
        drop(vm.decode(&initial_latents(7, 128, grid), 0.05).unwrap())
    });
    println!("tiny_vae_decode_64x64x9: {:.1} ms", s * 1e3);

    // One 2B-shaped transformer block (plus embeddings) on 256 tokens.
    let cfg = engine::presets::DitConfig {
        num_layers: 1,
        ..engine::presets::dit_2b()
    };
    let src = init::source(&dit::tensor_specs(&cfg), 1);
    let m2 = Transformer::load(&VarBuilder::new(&src), &cfg).unwrap();
    let g2 = (4, 8, 8);
    let x = Tensor::new(&[256, 128], Gaussian::new(3, "x").vec(256 * 128)).unwrap();
    let txt = Tensor::new(&[128, 4096], Gaussian::new(3, "t").vec(128 * 4096)).unwrap();
    let s = median_s(3, || {
        drop(
            m2.forward(&x, 0.5, &txt, &vec![1.0; 128], g2, 25.0)
                .unwrap(),
        )
    });
    println!("dit_2b_one_block_256_tokens: {:.1} ms", s * 1e3);

    // The artifacts phase's host work at rung 2's geometry (768x512, 121 frames):
    // pixels to RGB8 frames, and the y4m written frame by frame (the old path)
    // against the batched parallel writer, side by side in this run.
    let (f, h, w) = (121, 512, 768);
    let px = Tensor::new(&[3, f, h, w], Gaussian::new(5, "px").vec(3 * f * h * w)).unwrap();
    let s = median_s(3, || drop(engine::frames::frames_from_pixels(&px).unwrap()));
    println!("frames_from_pixels_768x512x121: {:.1} ms", s * 1e3);
    let frames = engine::frames::frames_from_pixels(&px).unwrap();
    drop(px);
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("video.y4m");
    let serial = median_s(3, || {
        let mut y = engine::frames::y4m::Y4mWriter::create(&path, w, h, 25.0).unwrap();
        for fr in &frames {
            y.write_frame(fr).unwrap();
        }
        y.finish().unwrap();
    });
    let batched = median_s(3, || {
        let mut y = engine::frames::y4m::Y4mWriter::create(&path, w, h, 25.0).unwrap();
        y.write_frames(&frames).unwrap();
        y.finish().unwrap();
    });
    println!(
        "y4m_768x512x121: frame by frame {:.1} ms, batched {:.1} ms, ratio {:.2}",
        serial * 1e3,
        batched * 1e3,
        batched / serial
    );
    let _ = std::fs::remove_file(&path);
}
