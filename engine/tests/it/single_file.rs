//! The Lightricks single-file layout loads to exactly the tensors of the
//! diffusers layout: a `.safetensors` holding the transformer under
//! `model.diffusion_model.` (original names) and the VAE under `vae.`
//! (original block indices), with `text_encoder/` and `tokenizer/` beside it.

use std::path::PathBuf;

use engine::models::{dit, vae};
use engine::presets::preset;
use engine::synth_weights::{self as synth, header_bytes, unit_bytes, FilePlan, SynthOptions};
use engine::weights::layout::{Component, Layout, NameMap, VaeVersion};
use engine::weights::safetensors::LoadOptions;
use engine::weights::spec::TensorSpec;
use engine::weights::TensorSource;

/// Test-side inverse of the reference conversion: diffusers name -> original.
fn original_dit(n: &str) -> String {
    format!(
        "model.diffusion_model.{}",
        n.replace("proj_in", "patchify_proj")
            .replace("time_embed", "adaln_single")
            .replace("norm_q", "q_norm")
            .replace("norm_k", "k_norm")
    )
}

fn original_vae(n: &str) -> String {
    match n {
        "latents_mean" => return "vae.per_channel_statistics.mean-of-means".into(),
        "latents_std" => return "vae.per_channel_statistics.std-of-means".into(),
        _ => {}
    }
    let parts: Vec<&str> = n.split('.').collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let p = parts[i];
        let next_is = |k: usize, s: &str| parts.get(i + k).copied() == Some(s);
        if p == "mid_block" {
            out.push(if parts[0] == "decoder" {
                "up_blocks.0".into()
            } else {
                "down_blocks.8".into()
            });
        } else if p == "up_blocks" || p == "down_blocks" {
            let k: usize = parts[i + 1].parse().unwrap();
            let sampler = if p == "up_blocks" {
                "upsamplers"
            } else {
                "downsamplers"
            };
            if next_is(2, sampler) && next_is(3, "0") {
                out.push(format!("{p}.{}", 2 * k + 1));
                i += 4;
                continue;
            }
            let idx = if p == "up_blocks" { 2 * k + 2 } else { 2 * k };
            out.push(format!("{p}.{idx}"));
            i += 2;
            continue;
        } else if p == "resnets" {
            out.push("res_blocks".into());
        } else {
            out.push(p.to_string());
        }
        i += 1;
    }
    let s = out.join(".");
    let s = s
        .replace("decoder.time_embedder", "decoder.last_time_embedder")
        .replace(
            "decoder.scale_shift_table",
            "decoder.last_scale_shift_table",
        )
        .replace("conv_shortcut.conv", "conv_shortcut")
        .replace("norm3", "norm3.norm");
    format!("vae.{s}")
}

#[test]
fn single_file_loads_the_same_tensors_as_the_diffusers_layout() {
    let p = preset("tiny").unwrap();
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("single_file");
    let _ = std::fs::remove_dir_all(&root);
    let diff = root.join("diffusers");
    synth::synthesize(&p, &diff, &SynthOptions::default()).unwrap();

    // The single file: transformer and VAE, original names, synthetic values of
    // the diffusers-named tensor each original name stands for.
    let dit_specs = dit::tensor_specs(&p.dit);
    let vae_specs = vae::tensor_specs(&p.vae);
    let mut renamed: Vec<TensorSpec> = Vec::new();
    let mut values: Vec<u8> = Vec::new();
    for (s, orig) in dit_specs
        .iter()
        .map(|s| (s, original_dit(&s.name)))
        .chain(vae_specs.iter().map(|s| (s, original_vae(&s.name))))
    {
        renamed.push(TensorSpec::new(orig, &s.shape, s.dtype));
        values.extend(unit_bytes(s, 0, s.numel()));
    }
    let single_dir = root.join("single");
    std::fs::create_dir_all(&single_dir).unwrap();
    let file = single_dir.join("ltx-video-tiny.safetensors");
    let mut bytes = header_bytes(&FilePlan {
        rel: "x".into(),
        tensors: renamed,
    });
    bytes.extend(values);
    std::fs::write(&file, bytes).unwrap();
    for sub in ["text_encoder", "tokenizer"] {
        let st = std::process::Command::new("cp")
            .arg("-r")
            .arg(diff.join(sub))
            .arg(&single_dir)
            .status()
            .unwrap();
        assert!(st.success());
    }

    let single = Layout::resolve(&file).unwrap();
    assert!(matches!(single, Layout::SingleFile { .. }));
    let reference = Layout::resolve(&diff).unwrap();
    assert_eq!(
        single.tokenizer_json().unwrap(),
        single_dir.join("tokenizer/tokenizer.json")
    );
    let t = single.component(Component::Transformer).unwrap();
    assert_eq!(t.names, NameMap::LightricksDit);
    let v = single.component(Component::Vae).unwrap();
    assert!(matches!(
        v.names,
        NameMap::LightricksVae(VaeVersion::V091 | VaeVersion::V095)
    ));

    let opts = LoadOptions::default();
    let mut vae_loaded = vae::decoder_tensor_specs(&p.vae);
    vae_loaded.extend(
        vae_specs
            .iter()
            .filter(|s| !s.name.starts_with("encoder.") && !s.name.starts_with("decoder."))
            .cloned(),
    );
    for (c, specs, extra) in [
        (Component::Transformer, dit_specs.clone(), false),
        (Component::Vae, vae_loaded, true),
    ] {
        let a = single.component(c).unwrap().open(opts).unwrap();
        let b = reference.component(c).unwrap().open(opts).unwrap();
        a.validate(&specs, &|n| extra && n.starts_with("encoder."))
            .unwrap();
        for s in &specs {
            assert_eq!(
                a.load_f32(&s.name, &s.shape).unwrap(),
                b.load_f32(&s.name, &s.shape).unwrap(),
                "{}",
                s.name
            );
        }
    }
    // The transformer view of the single file sees no VAE tensor and vice versa.
    let a = single
        .component(Component::Transformer)
        .unwrap()
        .open(opts)
        .unwrap();
    assert_eq!(a.names().count(), dit_specs.len());
    let te = single.component(Component::TextEncoder).unwrap();
    assert_eq!(te.names, NameMap::Identity);
}
