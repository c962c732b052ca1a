//! The `engine` command line: argument structs and the
//! dispatch `main` calls. Exit codes: 0 success, 1 a render (or synthesis)
//! failed, 2 bad arguments or input (rung, levers, preset, weights, prompt files).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use evidence::attrs;
use evidence::marker::Emitter;
use evidence::rung::{Device, Profile, Rung};

use crate::levers::{self, LeverSet};
use crate::oracle::encode_text;
use crate::phase::Recorder;
use crate::pipeline::{self, BadInput, RenderRequest};
use crate::plan::{self, Geometry};
use crate::presets;
use crate::synth_weights::{self as synth, SynthOptions};

/// Success.
pub const EXIT_OK: i32 = 0;
/// The render (or synthesis) failed.
pub const EXIT_FAILED: i32 = 1;
/// Bad arguments or input.
pub const EXIT_BAD_INPUT: i32 = 2;

/// The LTX-Video render engine (CPU reference arm and device-resident CUDA arm).
#[derive(Debug, Parser)]
#[command(name = "engine", version, about, long_about = None)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Lever profile on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProfileArg {
    /// Every lever in its best arm.
    Default,
    /// Every lever in its old arm.
    Baseline,
}

/// Device on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    /// The CPU reference arm.
    Cpu,
    /// The CUDA arm.
    Cuda,
}

/// Lever selection shared by `render` and `plan`.
#[derive(Debug, Clone, clap::Args)]
pub struct LeverArgs {
    /// A lever arm, `NAME=ARM`, overriding the profile and the rung (repeatable).
    #[arg(long = "lever", value_name = "NAME=ARM")]
    pub levers: Vec<String>,
    /// Lever profile; overrides the rung's.
    #[arg(long, value_enum)]
    pub profile: Option<ProfileArg>,
}

/// Tokenize and encode a prompt set with one arm's text encoder, as the
/// render conditions, and write ids, masks and hidden states to a
/// safetensors file (the engine's side of `scripts/t5_check.py`).
#[derive(Debug, clap::Args)]
pub struct EncodeTextArgs {
    /// Weights: a diffusers directory (`tokenizer/`, `text_encoder/`).
    #[arg(long)]
    pub weights: PathBuf,
    /// The preset whose text encoder and token budget apply.
    #[arg(long, default_value = "ltxv-2b")]
    pub preset: String,
    /// A JSON file holding an array of prompt strings.
    #[arg(long)]
    pub prompts: PathBuf,
    /// The arm: the host's f32 encoder or the device's bf16 one.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// Which keys the encoder attends to (default: what `render` does).
    #[arg(long, value_enum)]
    pub keys: Option<crate::conditioning::KeyRule>,
    /// Also write the outputs of the first N blocks (host arm only).
    #[arg(long, default_value_t = 0)]
    pub blocks: usize,
    /// Host threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The safetensors file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// Render a rung into --out (video.y4m, first/middle/last.png).
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// The rung file.
    #[arg(long)]
    pub rung: PathBuf,
    /// Weights: a diffusers directory or a Lightricks single file (default: the rung's).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Output directory for the frames (default: $HARNESS_FRAMES_DIR).
    #[arg(long, env = "HARNESS_FRAMES_DIR")]
    pub out: PathBuf,
    /// Levers and profile.
    #[command(flatten)]
    pub levers: LeverArgs,
    /// Device; overrides the rung's.
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Also write every frame as frame_NNNNN.png.
    #[arg(long)]
    pub all_frames: bool,
    /// Host threads, overriding the host-threads lever's pool size.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Precomputed prompt embeddings (`embeds` \[L, C\], `mask` \[L\], and for
    /// guidance > 1 `negative_embeds`, `negative_mask`) instead of T5.
    #[arg(long)]
    pub prompt_embeds: Option<PathBuf>,
}

/// A part of `selftest-cuda` that can run alone (`--only`): the command
/// line's names for the checks' sections, which live inside the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SelftestSection {
    /// Staging, the DiT's kernels, GEMMs, attention and forwards (and their benchmarks).
    Dit,
    /// The T5 encoder's kernels and forwards (and its benchmark).
    T5,
    /// The `denoise-graph` lever: graph vs eager loops (with --bench the loop
    /// benchmark only).
    Graph,
    /// The video VAE decoder's primitives and whole decodes (and its benchmark).
    Vae,
    /// The attention kernels alone (bf16 and FP8; part of `dit`), in seconds.
    Attention,
    /// The GEMM algorithm choice alone (lever `gemm-algo`; part of `dit`).
    Gemm,
    /// Staging's host-side variants (with --bench the staging sweep).
    Staging,
}

/// Every command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render a rung into --out (video.y4m, first/middle/last.png).
    Render(RenderArgs),
    /// Write deterministic synthetic weights of a preset in the diffusers layout.
    SynthWeights {
        /// Preset name (tiny, ltxv-2b, ltxv-13b).
        #[arg(long)]
        preset: String,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Projected peak memory of a render for the chosen lever arms.
    Plan {
        /// The rung file.
        #[arg(long)]
        rung: PathBuf,
        /// Levers and profile.
        #[command(flatten)]
        levers: LeverArgs,
        /// Device; overrides the rung's.
        #[arg(long, value_enum)]
        device: Option<DeviceArg>,
        /// Print JSON (the contract's form).
        #[arg(long)]
        json: bool,
    },
    /// Every lever with its arms, default arm and baseline arm.
    Levers {
        /// Print JSON (the contract's form).
        #[arg(long)]
        json: bool,
    },
    /// Check every CUDA kernel and the device DiT forward against the f32 host
    /// reference; with --bench also run the device benchmarks (`just bench-gpu`).
    SelftestCuda {
        /// Also run the benchmarks.
        #[arg(long)]
        bench: bool,
        /// Scratch directory for synthetic weight files (durable, a few GB free).
        #[arg(long, default_value = "target/selftest-cuda")]
        scratch: PathBuf,
        /// Run one section only (its checks, and with --bench its benchmark).
        #[arg(long, value_enum)]
        only: Option<SelftestSection>,
    },
    /// Tokenize and encode a prompt set with one arm's text encoder, as the
    /// render conditions, and write ids, masks and hidden states to a
    /// safetensors file (the engine's side of `scripts/t5_check.py`).
    EncodeText(EncodeTextArgs),
    /// Write a rung's initial latents and decode noise, `[1, C, F', H', W']`
    /// f32, as the reference draws them (the engine's side of
    /// `scripts/render_oracle.py`).
    Noise {
        /// The rung file (its preset, geometry and seed).
        #[arg(long)]
        rung: PathBuf,
        /// The safetensors file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// A known bf16 GEMM load for S seconds (the harness's GPU-utilization
    /// control), announced through the marker protocol: `burn.setup` (context,
    /// kernels, warm-up) then `burn.load` while the load runs.
    Burn {
        /// Seconds of load, after the setup and warm-up.
        #[arg(long)]
        seconds: f64,
    },
}

fn bad(msg: impl Into<String>) -> anyhow::Error {
    BadInput(msg.into()).into()
}

/// The exit code for an error that ended a command.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    let no_device = err.chain().any(|e| {
        matches!(
            e.downcast_ref::<crate::cuda::CudaError>(),
            Some(crate::cuda::CudaError::NotAvailable(_) | crate::cuda::CudaError::Invalid(_))
        )
    });
    if no_device || err.chain().any(|e| e.is::<BadInput>()) {
        EXIT_BAD_INPUT
    } else {
        EXIT_FAILED
    }
}

fn load_rung(path: &Path) -> anyhow::Result<Rung> {
    Rung::load(path).map_err(|e| bad(e.to_string()))
}

/// Profile (command line over rung), then the rung's `[levers]`, then `--lever`.
/// An unknown lever or arm names where it came from (the rung file or the flag).
fn resolve_levers(rung: &Rung, rung_path: &Path, args: &LeverArgs) -> anyhow::Result<LeverSet> {
    let profile = match args.profile {
        Some(ProfileArg::Default) => Profile::Default,
        Some(ProfileArg::Baseline) => Profile::Baseline,
        None => rung.profile,
    };
    let from_rung = rung.levers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    LeverSet::resolve(profile, from_rung.clone())
        .map_err(|e| bad(format!("{}: [levers]: {e}", rung_path.display())))?;
    let mut flags = Vec::new();
    for s in &args.levers {
        flags.push(levers::parse_setting(s).map_err(|e| bad(format!("--lever: {e}")))?);
    }
    LeverSet::resolve(
        profile,
        from_rung.chain(flags.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
    )
    .map_err(|e| bad(format!("--lever: {e}")))
}

/// The command line's device over the rung's.
fn resolve_device(arg: Option<DeviceArg>, rung: &Rung) -> Device {
    match arg {
        Some(DeviceArg::Cpu) => Device::Cpu,
        Some(DeviceArg::Cuda) => Device::Cuda,
        None => rung.device,
    }
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Run one parsed command; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::SelftestCuda {
            bench,
            scratch,
            only,
        } => selftest_cuda(bench, scratch, only),
        Command::Burn { seconds } => burn(seconds),
        Command::Levers { json } => list_levers(json),
        Command::EncodeText(a) => encode_text(a),
        Command::Noise { rung, out } => noise(rung, out),
        Command::SynthWeights { preset, out } => synth_weights(preset, out),
        Command::Plan {
            rung,
            levers,
            device,
            json,
        } => plan(rung, levers, device, json),
        Command::Render(a) => render(a),
    }
}

/// `engine selftest-cuda`: every device check (and with `--bench` the benchmarks).
fn selftest_cuda(
    bench: bool,
    scratch: PathBuf,
    only: Option<SelftestSection>,
) -> anyhow::Result<i32> {
    use crate::cuda::selftest::Section;
    let opts = crate::cuda::selftest::SelftestOptions {
        scratch,
        bench,
        only: only.map(|s| match s {
            SelftestSection::Dit => Section::Dit,
            SelftestSection::T5 => Section::T5,
            SelftestSection::Graph => Section::Graph,
            SelftestSection::Vae => Section::Vae,
            SelftestSection::Attention => Section::Attention,
            SelftestSection::Gemm => Section::Gemm,
            SelftestSection::Staging => Section::Staging,
        }),
    };
    let all_passed = crate::cuda::selftest::run(&opts)?;
    Ok(if all_passed { EXIT_OK } else { EXIT_FAILED })
}

/// `engine burn`: a known GEMM load for the GPU-utilization control, marked
/// (`burn.setup`, `burn.load`) when run with a marker channel.
fn burn(seconds: f64) -> anyhow::Result<i32> {
    let emitter = Emitter::from_env().map_err(|e| bad(e.to_string()))?;
    let rec = Recorder::new(emitter);
    rec.emitter().hello(
        "engine",
        env!("CARGO_PKG_VERSION"),
        attrs! {"command" => "burn"},
    );
    let r = crate::cuda::burn::burn(seconds, &rec)?;
    println!(
        "burn: {} GEMMs of {n}x{n}x{n} bf16 in {:.2} s wall, {:.1} ms device, {:.1} TFLOP/s",
        r.gemms,
        r.wall_s,
        r.device_ms,
        r.tflops,
        n = crate::cuda::burn::N
    );
    Ok(EXIT_OK)
}

/// `engine levers`: every lever with its arms.
fn list_levers(json: bool) -> anyhow::Result<i32> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&levers::registry_json())?
        );
    } else {
        for l in levers::registry() {
            println!(
                "{:<14} arms {:<14} default {:<7} baseline {:<7} ({:?}) {}",
                l.id,
                l.arms.join("|"),
                l.default,
                l.baseline,
                l.applies_to,
                l.doc
            );
        }
    }
    Ok(EXIT_OK)
}

/// `engine encode-text`: a prompt set through one arm's text encoder.
fn encode_text(a: EncodeTextArgs) -> anyhow::Result<i32> {
    let EncodeTextArgs {
        weights,
        preset,
        prompts,
        device,
        keys,
        blocks,
        threads,
        out,
    } = a;
    let p = presets::preset(&preset).map_err(|e| bad(format!("--preset: {e}")))?;
    if threads == Some(0) {
        return Err(bad("--threads must be at least 1"));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or_else(cores))
        .build_global()
        .context("building the host thread pool")?;
    let req = encode_text::EncodeTextRequest {
        weights,
        preset: p,
        prompts: encode_text::read_prompts(&prompts)?,
        device: match device {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
        },
        keys: keys.unwrap_or(crate::conditioning::PIPELINE_KEYS),
        blocks,
    };
    let outcome = encode_text::encode_text(&req)?;
    encode_text::write(&req, &outcome, &out)?;
    eprintln!(
        "engine: encoded {} prompts ({} keys) in {:.2} s after a {:.2} s load{}; wrote {}",
        outcome.encoded.len(),
        req.keys.name(),
        outcome.encode_s,
        outcome.load_s,
        outcome
            .device_ms
            .map(|ms| format!(" ({ms:.2} ms on the device)"))
            .unwrap_or_default(),
        out.display()
    );
    Ok(EXIT_OK)
}

/// `engine noise`: a rung's noise streams.
fn noise(rung: PathBuf, out: PathBuf) -> anyhow::Result<i32> {
    let r = load_rung(&rung)?;
    let p = presets::preset(&r.preset)
        .map_err(|e| bad(format!("{}: field 'preset': {e}", rung.display())))?;
    let (f, h, w) = r.latent_grid();
    let grid = (f as usize, h as usize, w as usize);
    crate::oracle::noise::write_noise(r.seed, p.dit.in_channels, grid, &out)?;
    eprintln!(
        "engine: wrote the latents and decode noise of seed {} over {f}x{h}x{w} into {}",
        r.seed,
        out.display()
    );
    Ok(EXIT_OK)
}

/// `engine synth-weights`: deterministic synthetic weights of a preset.
fn synth_weights(preset: String, out: PathBuf) -> anyhow::Result<i32> {
    let p = presets::preset(&preset).map_err(|e| bad(e.to_string()))?;
    let started = std::time::Instant::now();
    let report = synth::synthesize(&p, &out, &SynthOptions::default())
        .with_context(|| format!("synthesizing {preset} into {}", out.display()))?;
    eprintln!(
        "engine: wrote {} files, {} of weights, in {:.1}s on {} threads",
        report.files.len(),
        evidence::marker::human_bytes(report.weight_bytes),
        started.elapsed().as_secs_f64(),
        report.threads_used
    );
    println!("{}", report.digest);
    Ok(EXIT_OK)
}

/// `engine plan`: the projected peak memory of a render.
fn plan(
    rung: PathBuf,
    levers: LeverArgs,
    device: Option<DeviceArg>,
    json: bool,
) -> anyhow::Result<i32> {
    let r = load_rung(&rung)?;
    let set = resolve_levers(&r, &rung, &levers)?;
    let device = resolve_device(device, &r);
    let p =
        presets::preset(&r.preset).map_err(|e| bad(format!("{}: preset: {e}", rung.display())))?;
    let g = Geometry {
        frames: r.frames as usize,
        height: r.height as usize,
        width: r.width as usize,
        guidance: r.uses_guidance(),
        threads: set.host_threads(cores()),
        chunk_latent_frames: crate::cpu::decode::DECODE_CHUNK_LATENT_FRAMES,
        device,
    };
    let proj = plan::project(&p, &g, &set);
    if json {
        println!("{}", serde_json::to_string_pretty(&proj)?);
    } else {
        for (k, v) in &proj.phases {
            println!("{k:<18} {}", evidence::marker::human_bytes(*v));
        }
        println!(
            "host peak {}  device peak {}  weights {}",
            evidence::marker::human_bytes(proj.host_peak_bytes),
            evidence::marker::human_bytes(proj.device_peak_bytes),
            evidence::marker::human_bytes(proj.weights_bytes)
        );
    }
    Ok(EXIT_OK)
}

/// `engine render`: render a rung under the marker protocol.
fn render(a: RenderArgs) -> anyhow::Result<i32> {
    let RenderArgs {
        rung,
        weights,
        out,
        levers,
        device,
        all_frames,
        threads,
        prompt_embeds,
    } = a;
    let r = load_rung(&rung)?;
    let set = resolve_levers(&r, &rung, &levers)?;
    let device = resolve_device(device, &r);
    let p = presets::preset(&r.preset)
        .map_err(|e| bad(format!("{}: field 'preset': {e}", rung.display())))?;
    let weights = weights.or_else(|| r.weights.clone()).ok_or_else(|| {
        bad(format!(
            "no weights: pass --weights DIR or set 'weights' in {} \
                 (`engine synth-weights --preset {} --out DIR` writes synthetic ones)",
            rung.display(),
            r.preset
        ))
    })?;
    if threads == Some(0) {
        return Err(bad("--threads must be at least 1"));
    }
    let n = threads.unwrap_or_else(|| set.host_threads(cores()));
    std::fs::create_dir_all(&out).map_err(|e| {
        bad(format!(
            "--out {}: cannot create the output directory: {e}",
            out.display()
        ))
    })?;
    // The global pool, so the render runs on this thread and hands only
    // its data-parallel loops to the pool (no hand-off gap between phases).
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .context("building the host thread pool")?;
    let emitter = Emitter::from_env().map_err(|e| bad(e.to_string()))?;
    let rec = Recorder::new(emitter);
    rec.emitter().hello(
        "engine",
        env!("CARGO_PKG_VERSION"),
        attrs! {
            "device" => match device {
                Device::Cpu => "cpu",
                Device::Cuda => "cuda",
            },
            "preset" => p.name,
            "levers" => set.arms(),
            "threads" => n,
            "weights" => weights.display().to_string(),
            "rung" => rung.display().to_string(),
        },
    );
    let req = RenderRequest {
        rung: r,
        preset: p,
        weights,
        out,
        levers: set,
        threads: n,
        device,
        all_frames,
        prompt_embeds,
    };
    let outcome = pipeline::render(&req, &rec)?;
    eprintln!(
        "engine: wrote {} frames of {}x{} into {}",
        outcome.frames_written,
        outcome.width,
        outcome.height,
        req.out.display()
    );
    Ok(EXIT_OK)
}
