//! The tiny pipeline against golden tensors from the reference implementation
//! (diffusers 0.42.1 / transformers 5.17 on torch 2.11, f32 on the CPU), computed
//! from the very weights and inputs `tests/it/golden_case.rs` regenerates here. How they
//! were made: `examples/golden_inputs.rs` + `tests/goldens/make_goldens.py`;
//! the reference's own log is `tests/goldens/reference_log.txt`.
//!
//! Tolerance: both sides compute in f32 but sum in different orders (blocked
//! SGEMM here, oneDNN / MKL there; softmax and norm reductions likewise) and use
//! different libm implementations of exp / tanh / sin / cos / pow. Each such
//! difference is an ulp or so (~1e-7 relative) per op; through the ~10 dependent
//! stages of a block and a few blocks they grow to ~1e-6 .. 1e-5 relative. We
//! accept `max |engine - reference| <= 1e-4 * max |reference|` per tensor: ten times
//! the expected drift, and still three orders of magnitude below any real
//! defect (a transposed weight, a dropped bias, a wrong RoPE slot or an off-by-
//! one frame all move outputs by O(1e-1) of their scale).

use std::collections::{BTreeMap, HashMap};

use engine::models::dit::Transformer;
use engine::models::t5::{Keys, T5Encoder};
use engine::models::vae::VaeDecoder;
use engine::models::{dit, t5, vae};
use engine::ops::space::{pack_latents, unpack_latents};
use engine::ops::t5::relative_position_bucket;
use engine::presets;
use engine::schedule;
use engine::tensor::Tensor;
use engine::weights::VarBuilder;
use safetensors::SafeTensors;

const REL_TOL: f32 = 1e-4;

struct Goldens(
    HashMap<String, (Vec<usize>, Vec<f32>)>,
    HashMap<String, String>,
);

impl Goldens {
    fn load() -> Goldens {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/goldens/goldens.safetensors"
        );
        let bytes = std::fs::read(path).expect("the committed goldens file");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("a valid safetensors header");
        let meta = header.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).expect("a valid safetensors file");
        let mut m = HashMap::new();
        for (name, view) in st.tensors() {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let data = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            m.insert(name.to_string(), (view.shape().to_vec(), data));
        }
        Goldens(m, meta)
    }

    fn get(&self, name: &str) -> &(Vec<usize>, Vec<f32>) {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("golden '{name}' missing"))
    }
}

/// Asserts `got` matches golden `name` in shape and within the tolerance;
/// returns the relative error for the report.
fn check(g: &Goldens, name: &str, got: &[f32], shape: &[usize]) -> f32 {
    let (s, want) = g.get(name);
    assert_eq!(s.as_slice(), shape, "{name}: shape");
    assert_eq!(got.len(), want.len(), "{name}: length");
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{name}: non-finite output"
    );
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let rel = err / scale.max(1e-12);
    eprintln!("{name:>16}: max |diff| {err:.3e}, scale {scale:.3e}, relative {rel:.3e}");
    assert!(scale > 1e-3, "{name}: golden is trivially small ({scale})");
    assert!(
        rel <= REL_TOL,
        "{name}: relative error {rel:.3e} exceeds {REL_TOL:.0e}"
    );
    rel
}

#[test]
fn transformer_one_step_matches_the_reference() {
    let g = Goldens::load();
    let p = engine::test_kit::golden_case::tiny();
    let src = engine::test_kit::golden_case::source(&dit::tensor_specs(&p.dit));
    let m = Transformer::load(&VarBuilder::new(&src), &p.dit).unwrap();
    let c = engine::test_kit::golden_case::dit_case();
    let rope = engine::ops::rope::ltx_rope(c.grid, c.fps, 8, 32, p.dit.inner_dim());
    check(&g, "dbg_dit_rope_cos", &rope.cos, &[24, 64]);
    check(&g, "dbg_dit_rope_sin", &rope.sin, &[24, 64]);
    let y = m
        .forward(&c.latents, c.sigma, &c.text, &c.mask, c.grid, c.fps)
        .unwrap();
    check(&g, "dit_out", y.data(), &[24, 128]);
}

#[test]
fn t5_encoder_matches_the_reference() {
    let g = Goldens::load();
    let p = engine::test_kit::golden_case::tiny();
    let src = engine::test_kit::golden_case::source(&t5::tensor_specs(&p.t5));
    let m = T5Encoder::load(&VarBuilder::new(&src), &p.t5).unwrap();
    let (ids, mask) = engine::test_kit::golden_case::t5_case();
    let y = m.forward(&ids, Keys::Masked(&mask)).unwrap();
    check(&g, "t5_out", y.data(), &[12, 64]);
    // Called as the reference pipeline calls it: token ids alone.
    let y = m.forward(&ids, Keys::All).unwrap();
    check(&g, "t5_out_all_keys", y.data(), &[12, 64]);
    for (name, bidirectional) in [("t5_buckets_bi", true), ("t5_buckets_uni", false)] {
        let (_, want) = g.get(name);
        for (i, w) in want.iter().enumerate() {
            let rel = i as i64 - 300;
            assert_eq!(
                relative_position_bucket(rel, bidirectional, 32, 128) as f32,
                *w,
                "{name} at {rel}"
            );
        }
    }
}

#[test]
fn vae_decoders_match_the_reference() {
    let g = Goldens::load();
    let p = engine::test_kit::golden_case::tiny();
    let src = engine::test_kit::golden_case::source(&vae::tensor_specs(&p.vae));
    let d = VaeDecoder::load(&VarBuilder::new(&src), &p.vae).unwrap();
    let (z, t) = engine::test_kit::golden_case::vae_case();
    let y = d.decode(&z, t).unwrap();
    check(&g, "vae_out", y.data(), &[3, 17, 64, 64]);
    // Chunked decoding is exact, so it meets the same golden.
    let y2 = d.decode_chunked(&z, t, 1, &mut |_| {}).unwrap();
    assert_eq!(y, y2);

    let cfg = engine::test_kit::golden_case::vae090_tiny();
    let src = engine::test_kit::golden_case::source(&vae::tensor_specs(&cfg));
    let d = VaeDecoder::load(&VarBuilder::new(&src), &cfg).unwrap();
    let y = d
        .decode(&engine::test_kit::golden_case::vae090_case(), 0.0)
        .unwrap();
    check(&g, "vae090_out", y.data(), &[3, 9, 32, 32]);
}

#[test]
fn sigma_schedules_match_the_reference() {
    let g = Goldens::load();
    let cfg = engine::test_kit::golden_case::tiny().scheduler;
    for &(steps, tokens) in engine::test_kit::golden_case::SCHEDULES {
        let got = schedule::sigmas(&cfg, steps, tokens).unwrap();
        let (_, want) = g.get(&format!("sched_{steps}_{tokens}"));
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(want) {
            // numpy / torch f32 with the same operation order: equal to an ulp or two.
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON,
                "{steps} steps, {tokens} tokens: {got:?} vs {want:?}"
            );
        }
    }
}

/// The whole tiny text-to-video run (CFG, Euler over the LTX schedule, latent
/// denormalisation, timestep-conditioned decode) from the same noise and
/// embeddings as the reference's `LTXPipeline`.
#[test]
fn whole_tiny_pipeline_matches_the_reference() {
    let g = Goldens::load();
    let p = engine::test_kit::golden_case::tiny();
    let c = engine::test_kit::golden_case::pipe_case();
    let dsrc = engine::test_kit::golden_case::source(&dit::tensor_specs(&p.dit));
    let dit_m = Transformer::load(&VarBuilder::new(&dsrc), &p.dit).unwrap();
    let vsrc = engine::test_kit::golden_case::source(&vae::tensor_specs(&p.vae));
    let vae_m = VaeDecoder::load(&VarBuilder::new(&vsrc), &p.vae).unwrap();
    let grid = ((c.frames - 1) / 8 + 1, c.height / 32, c.width / 32);
    let n = grid.0 * grid.1 * grid.2;
    let sig = schedule::sigmas(&p.scheduler, c.steps, n).unwrap();
    let mut lat = pack_latents(c.noise.data(), 128);
    for i in 0..c.steps {
        let x = Tensor::new(&[n, 128], lat.clone()).unwrap();
        let vu = dit_m
            .forward(&x, sig[i], &c.negative, &c.negative_mask, grid, c.fps)
            .unwrap();
        let vc = dit_m
            .forward(&x, sig[i], &c.prompt, &c.prompt_mask, grid, c.fps)
            .unwrap();
        let v = schedule::cfg_combine(vu.data(), vc.data(), c.guidance).unwrap();
        schedule::euler_step(&mut lat, &v, sig[i], sig[i + 1]).unwrap();
        check(&g, &format!("dbg_pipe_step_{i}"), &lat, &[n, 128]);
    }
    check(&g, "pipe_latents", &lat, &[n, 128]);
    let mut z = unpack_latents(&lat, 128);
    schedule::denormalize_latents(
        &mut z,
        vae_m.latents_mean(),
        vae_m.latents_std(),
        p.vae_scaling.scaling_factor,
    )
    .unwrap();
    let z = Tensor::new(&[128, grid.0, grid.1, grid.2], z).unwrap();
    let video = vae_m.decode(&z, c.decode_timestep).unwrap();
    // The reference returns [F, C, H, W] in [0, 1]: (x / 2 + 0.5) clamped.
    let (f, hw) = (c.frames, c.height * c.width);
    let mut frames = vec![0.0f32; video.numel()];
    for ch in 0..3 {
        for t in 0..f {
            for i in 0..hw {
                let v = video.data()[(ch * f + t) * hw + i];
                frames[(t * 3 + ch) * hw + i] = (v / 2.0 + 0.5).clamp(0.0, 1.0);
            }
        }
    }
    check(&g, "pipe_video", &frames, &[f, 3, c.height, c.width]);
}

/// The whole tiny render from the prompt, through the real `engine render`
/// on the CPU arm, against diffusers' `LTXPipeline.from_pretrained` on the
/// same synthesized directory (tokenizer, T5 called as the pipeline calls it,
/// DiT with guidance, scheduler, decode noise, timestep-conditioned VAE),
/// from the same noise streams.
///
/// Tolerances: the conditioning (both prompts' encoder states) at the 1e-4
/// relative tolerance of every other golden (two f32 implementations, two
/// T5 blocks); its mask exactly. The frames are 8-bit: both sides compute in
/// f32 and quantize round(255 * clamp((x + 1) / 2)), so a value differs only
/// where f32 drift (~1e-5 relative here, 0.003 of a level) straddles a
/// rounding boundary: at most 1 level anywhere and on at most 1% of the
/// values (expected ~0.3%); PSNR is reported beside it. Any real defect
/// (a T5 constant, the mask handed to the encoder, the decode noise) moves
/// the conditioning past 1e-4 or the frames by several levels.
#[test]
fn whole_tiny_render_from_the_prompt_matches_the_reference() {
    use engine::conditioning::PIPELINE_KEYS;
    use engine::cpu::text::encode_host;
    use engine::text::tokenizer::PromptTokenizer;
    use engine::weights::layout::{Component, Layout};
    use engine::weights::safetensors::LoadOptions;

    let g = Goldens::load();
    let rc = engine::test_kit::golden_case::render_case();
    let p = engine::test_kit::golden_case::tiny();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_engine"));
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("goldens-render");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let weights = dir.join("weights");
    let digest = crate::common::synth_weights(bin, "tiny", &weights);
    assert_eq!(
        digest.lines().last().unwrap_or(""),
        g.1.get("render_weights_digest")
            .map(String::as_str)
            .unwrap_or("?"),
        "the tiny synthesized weights are not the ones the goldens were made from: \
         regenerate them (tests/goldens/make_goldens.py)"
    );

    // The conditioning, as the render computes it.
    let layout = Layout::resolve(&weights).unwrap();
    let tok = PromptTokenizer::from_file(
        &layout.tokenizer_json().unwrap(),
        p.max_text_tokens,
        p.t5.vocab_size,
    )
    .unwrap();
    let src = layout
        .component(Component::TextEncoder)
        .unwrap()
        .open(LoadOptions::default())
        .unwrap();
    let t5m = T5Encoder::load(&VarBuilder::new(&src), &p.t5).unwrap();
    let enc = encode_host(&t5m, &tok, &[rc.prompt, rc.negative], PIPELINE_KEYS, 0).unwrap();
    let l = p.max_text_tokens;
    for (e, name) in enc.iter().zip(["prompt", "negative"]) {
        let (_, mask) = g.get(&format!("render_{name}_mask"));
        assert_eq!(&e.mask, mask, "{name}: tokenizer mask");
        check(
            &g,
            &format!("render_{name}_embeds"),
            e.states.data(),
            &[l, p.t5.d_model],
        );
    }

    // The whole render through the binary.
    let rung = dir.join("render.toml");
    std::fs::write(&rung, rc.rung_toml()).unwrap();
    let frames_dir = dir.join("frames");
    let _one = crate::common::exclusive();
    let args = crate::common::render_args(&rung, &weights, &frames_dir, &["--all-frames"]);
    let r = crate::common::run_with_markers(bin, &args, &dir);
    assert!(
        r.out.status.success(),
        "{}",
        String::from_utf8_lossy(&r.out.stderr)
    );
    let (shape, want) = g.get("render_frames");
    assert_eq!(shape, &[rc.frames, rc.height, rc.width, 3]);
    let (mut differ, mut worst, mut se) = (0usize, 0i32, 0.0f64);
    for f in 0..rc.frames {
        let png =
            engine::frames::png::read_png(&frames_dir.join(format!("frame_{f:05}.png"))).unwrap();
        let plane = rc.height * rc.width * 3;
        for (i, got) in png.rgb.iter().enumerate() {
            let w = (want[f * plane + i].clamp(0.0, 1.0) * 255.0).round() as i32;
            let d = (*got as i32 - w).abs();
            differ += usize::from(d != 0);
            worst = worst.max(d);
            se += (d * d) as f64;
        }
    }
    let n = want.len();
    let psnr = 10.0 * (255.0f64.powi(2) / (se / n as f64).max(1e-12)).log10();
    eprintln!(
        "render frames: {differ} of {n} values differ, by at most {worst}; PSNR {psnr:.1} dB"
    );
    assert!(
        worst <= 1,
        "a frame value is {worst} levels from the reference's"
    );
    assert!(
        differ * 100 <= n,
        "{differ} of {n} frame values differ from the reference's (at most 1% allowed)"
    );
    assert!(psnr >= 45.0, "PSNR {psnr:.1} dB");
}

/// The released configs' tensor layouts as the reference builds them (on the
/// meta device) equal `tensor_specs`: every name, every shape, nothing extra.
#[test]
fn released_layouts_match_the_reference() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/layouts.json");
    let all: BTreeMap<String, BTreeMap<String, Vec<usize>>> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ours = [
        ("dit_2b", dit::tensor_specs(&presets::dit_2b())),
        ("dit_13b", dit::tensor_specs(&presets::dit_13b())),
        ("vae_095", vae::tensor_specs(&presets::vae_095())),
        ("vae_090", vae::tensor_specs(&presets::vae_090())),
        ("t5_xxl", t5::tensor_specs(&presets::t5_xxl())),
    ];
    for (name, specs) in ours {
        let mut want = all[name].clone();
        // transformers' state dict lists the tied embedding under both names.
        if name == "t5_xxl" {
            assert_eq!(
                want.remove(t5::EMBED_ALIAS),
                want.get("shared.weight").cloned()
            );
        }
        let got: BTreeMap<String, Vec<usize>> = specs
            .iter()
            .map(|s| (s.name.clone(), s.shape.clone()))
            .collect();
        let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{name}: missing {missing:?}, extra {extra:?}"
        );
        for (k, s) in &want {
            assert_eq!(&got[k], s, "{name}: {k}");
        }
    }
}
