//! Writes the golden cases for the reference implementation: the tiny weights
//! in the diffusers / transformers directory layout (f32 files holding
//! bf16-exact values), the inputs, and the configs of the released models
//! whose tensor layouts the reference should list.
//!
//! `cargo run -p engine --example golden_inputs -- DIR`, then on a machine with
//! PyTorch: `python3 engine/tests/goldens/make_goldens.py DIR OUT`.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use engine::presets;
use engine::tensor::Tensor;
use engine::test_kit::golden_case;
use safetensors::{Dtype, View};

struct F32(Vec<usize>, Vec<u8>);

impl View for &F32 {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.0
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.1)
    }
    fn data_len(&self) -> usize {
        self.1.len()
    }
}

fn f32_view(shape: &[usize], v: &[f32]) -> F32 {
    F32(
        shape.to_vec(),
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
}

fn write_tensors(path: &Path, tensors: &[(String, F32)]) -> Result<()> {
    let items: Vec<(&str, &F32)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::serialize_to_file(
        items,
        Some(HashMap::from([("format".to_string(), "pt".to_string())])),
        path,
    )
    .with_context(|| format!("writing {}", path.display()))
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn main() -> Result<()> {
    let dir = std::env::args()
        .nth(1)
        .context("usage: golden_inputs DIR")?;
    let dir = Path::new(&dir);
    let p = golden_case::tiny();
    for (name, specs) in golden_case::weight_sets() {
        let d = dir.join(name);
        std::fs::create_dir_all(&d)?;
        let src = golden_case::source(&specs);
        let tensors: Vec<(String, F32)> = specs
            .iter()
            .map(|s| {
                let t = engine::models::init::tensor(s, golden_case::WEIGHT_SEED);
                (s.name.clone(), f32_view(&s.shape, t.data()))
            })
            .collect();
        drop(src);
        let (file, config) = match name {
            "transformer" => (
                "diffusion_pytorch_model.safetensors",
                p.dit.to_config_json(),
            ),
            "vae" => (
                "diffusion_pytorch_model.safetensors",
                p.vae.to_config_json(),
            ),
            "vae090" => (
                "diffusion_pytorch_model.safetensors",
                golden_case::vae090_tiny().to_config_json(),
            ),
            _ => ("model.safetensors", p.t5.to_config_json()),
        };
        write_tensors(&d.join(file), &tensors)?;
        write_json(&d.join("config.json"), &config)?;
    }
    std::fs::create_dir_all(dir.join("scheduler"))?;
    write_json(
        &dir.join("scheduler/scheduler_config.json"),
        &p.scheduler.to_config_json(),
    )?;

    let mut inputs: Vec<(String, F32)> = Vec::new();
    let mut put = |n: &str, t: &Tensor| inputs.push((n.to_string(), f32_view(t.shape(), t.data())));
    let dc = golden_case::dit_case();
    put("dit_latents", &dc.latents);
    put("dit_text", &dc.text);
    put("dit_mask", &Tensor::new(&[dc.mask.len()], dc.mask.clone())?);
    let (ids, mask) = golden_case::t5_case();
    put(
        "t5_ids",
        &Tensor::new(&[ids.len()], ids.iter().map(|i| *i as f32).collect())?,
    );
    put("t5_mask", &Tensor::new(&[mask.len()], mask)?);
    let (z, _) = golden_case::vae_case();
    put("vae_latents", &z);
    put("vae090_latents", &golden_case::vae090_case());
    let pc = golden_case::pipe_case();
    put("pipe_noise", &pc.noise);
    put("pipe_prompt", &pc.prompt);
    put(
        "pipe_prompt_mask",
        &Tensor::new(&[pc.prompt_mask.len()], pc.prompt_mask.clone())?,
    );
    put("pipe_negative", &pc.negative);
    put(
        "pipe_negative_mask",
        &Tensor::new(&[pc.negative_mask.len()], pc.negative_mask.clone())?,
    );
    // The whole render: its noise streams as the reference draws them, and
    // the synthesized tiny weights directory both sides load.
    let rc = golden_case::render_case();
    let (gf, gh, gw) = rc.grid();
    let shape = [1, 128, gf, gh, gw];
    put(
        "render_latents",
        &Tensor::new(
            &shape,
            engine::rng::initial_latents(rc.seed, 128, (gf, gh, gw)).into_data(),
        )?,
    );
    put(
        "render_decode_noise",
        &Tensor::new(
            &shape,
            engine::rng::decode_noise(rc.seed, 128, (gf, gh, gw)).into_data(),
        )?,
    );
    write_tensors(&dir.join("inputs.safetensors"), &inputs)?;
    let report = engine::synth_weights::synthesize(
        &p,
        &dir.join("render_weights"),
        &engine::synth_weights::SynthOptions::default(),
    )?;

    let (_, vt) = golden_case::vae_case();
    let cases = serde_json::json!({
        "dit": {"sigma": dc.sigma, "grid": [dc.grid.0, dc.grid.1, dc.grid.2], "fps": dc.fps},
        "vae": {"timestep": vt},
        "pipe": {"width": pc.width, "height": pc.height, "frames": pc.frames, "steps": pc.steps,
                 "guidance": pc.guidance, "fps": pc.fps, "decode_timestep": pc.decode_timestep},
        "schedules": golden_case::SCHEDULES,
        "render": {"width": rc.width, "height": rc.height, "frames": rc.frames, "steps": rc.steps,
                   "guidance": rc.guidance, "seed": rc.seed, "fps": rc.fps, "prompt": rc.prompt,
                   "negative": rc.negative, "max_tokens": p.max_text_tokens,
                   "decode_timestep": p.vae_scaling.decode_timestep,
                   "decode_noise_scale": p.vae_scaling.decode_noise_scale,
                   "weights_digest": report.digest},
    });
    write_json(&dir.join("cases.json"), &cases)?;

    // Configs of the released models, for the reference to list their layouts.
    let layouts = dir.join("layouts");
    std::fs::create_dir_all(&layouts)?;
    write_json(
        &layouts.join("dit_2b.json"),
        &presets::dit_2b().to_config_json(),
    )?;
    write_json(
        &layouts.join("dit_13b.json"),
        &presets::dit_13b().to_config_json(),
    )?;
    write_json(
        &layouts.join("vae_095.json"),
        &presets::vae_095().to_config_json(),
    )?;
    write_json(
        &layouts.join("vae_090.json"),
        &presets::vae_090().to_config_json(),
    )?;
    write_json(
        &layouts.join("t5_xxl.json"),
        &presets::t5_xxl().to_config_json(),
    )?;
    println!("golden inputs written to {}", dir.display());
    Ok(())
}
