//! `engine selftest-cuda`: every device kernel and the device DiT forward
//! against the CPU reference arm (`crate::ops`, `crate::schedule` and
//! `crate::models::dit::Transformer`, all f32), on random inputs (never zeros),
//! with every output poisoned (0xFF bytes = NaN) before the kernel runs, so an
//! element left unwritten fails the check as NaN. The reference sees exactly the
//! bf16 values the device sees (inputs rounded through bf16 first, see `rb`).
//!
//! Tolerances (relative L2 error ‖dev − ref‖ / ‖ref‖), argued once here:
//! - bf16 outputs of f32 math: rounding to bf16 is ≤ 2⁻⁹ relative per element,
//!   ~1.1e-3 RMS; tolerance 5e-3 (8e-3 for q/k norm + RoPE, which rounds twice:
//!   after the norm, as a bf16 model does, and after the rotation).
//! - f32 elementwise (residual add): only reassociation; tolerance 1e-5. The
//!   denoise step (guidance + Euler) rounds each operation as the CPU arm does:
//!   tolerance 0 (bit-exact).
//! - GEMMs and attention with bf16 operands and fp32 accumulation: operand
//!   rounding (the reference sees the same bf16 values), output rounding, and
//!   in flash attention the bf16 probabilities: expected ~3e-3; tolerance 1e-2.
//! - a whole forward: a chain of ~5 such roundings per block with the residual
//!   stream kept in f32: expected ~5e-3 to 1e-2; tolerance 2e-2 (runs 1-4 of
//!   `reports/device-notes.md` measured below the expectation).
//! - staging: byte-identical (tolerance 0).
//! - the `precision = fp8` arm: its quantizer bit-exact against the host's
//!   definition, its GEMMs against exact products of the same e4m3 operands,
//!   its forwards as a sanity gate (argued at `dit::check_fp8` and
//!   `dit::check_forward`); its fp8-resident load bit for bit the kept path
//!   (`dit::check_fp8_resident`).
//! - the `attention-precision = fp8` arm: its operand pass bit-exact against the
//!   host's definition, cuDNN's FP8 attention within 0.10 of the CPU arm's and
//!   of cuDNN's bf16 attention (argued at [`fp8_attention`]).
//!
//! Layout: [`dit`] (staging, kernels, GEMMs, attention, forwards),
//! [`gemm_tune`] (the GEMM algorithm choice), [`fp8_attention`], [`t5`], [`vae`],
//! [`graph`] (graph-replayed vs eager loops); this module holds the report
//! ([`Check`]) and the runner of `engine selftest-cuda`. Nothing outside the
//! command line imports this folder (`tests/it/layout.rs` holds that).

pub mod dit;
pub mod fp8_attention;
pub mod gemm_tune;
pub mod graph;
pub mod guidance_batch;
pub mod residual;
pub mod row_step;
pub mod staging_variants;
pub mod t5;
pub mod vae;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use self::dit::{
    check_attention, check_attention_long, check_forward, check_fp8, check_fp8_resident,
    check_gemms, check_kernels, check_sharded_staging, check_staging,
};
use crate::cuda::fixtures::{rel_err, write_synth_safetensors, Rng};
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::DitDims;
use crate::cuda::staging::{self, StagingMethod, StagingOptions};
use crate::cuda::CudaError;

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Relative L2 error (NaN when an output was not finite / not written).
    pub rel: f64,
    /// Largest absolute error.
    pub max_abs: f64,
    /// The tolerance on `rel`.
    pub tol: f64,
    /// Whether it passed.
    pub pass: bool,
    /// Extra facts (timings, sizes).
    pub note: String,
}

impl Check {
    /// A check of `dev` against `reference` at tolerance `tol` on the relative
    /// L2 error; fails on a non-finite output and on an all-zero reference.
    pub fn new(name: impl Into<String>, dev: &[f32], reference: &[f32], tol: f64) -> Check {
        let (rel, max_abs) = rel_err(dev, reference);
        let nontrivial = reference.iter().any(|v| *v != 0.0);
        Check {
            name: name.into(),
            rel,
            max_abs,
            tol,
            pass: rel.is_finite() && rel <= tol && nontrivial,
            note: if nontrivial {
                String::new()
            } else {
                "reference is all zeros".into()
            },
        }
    }

    /// A failed check that has no values, saying `why` (its run failed).
    pub fn failed(name: impl Into<String>, why: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            rel: f64::NAN,
            max_abs: f64::NAN,
            tol: 0.0,
            pass: false,
            note: why.into(),
        }
    }

    /// A check that `result` was refused with an error containing `needle`
    /// (the arms a render must not run); its note is the error, or
    /// `accepted`.
    pub fn refused<T, E: std::fmt::Display>(
        name: impl Into<String>,
        result: &Result<T, E>,
        needle: &str,
    ) -> Check {
        let why = match result {
            Ok(_) => "accepted".to_string(),
            Err(e) => e.to_string(),
        };
        Check {
            name: name.into(),
            rel: 0.0,
            max_abs: 0.0,
            tol: 0.0,
            pass: result.is_err() && why.contains(needle),
            note: why,
        }
    }

    /// One table row.
    pub fn row(&self) -> String {
        format!(
            "{:<4} {:<52} rel={:<10.3e} max_abs={:<10.3e} tol={:<8.1e} {}",
            if self.pass { "ok" } else { "FAIL" },
            self.name,
            self.rel,
            self.max_abs,
            self.tol,
            self.note
        )
    }
}
/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// Scratch directory for weight files (must be durable and large enough:
    /// a few GB with `bench`, ~10 GB with the T5 benchmark).
    pub scratch: PathBuf,
    /// Run the benchmarks after the checks.
    pub bench: bool,
    /// Run one section only (every section when `None`).
    pub only: Option<Section>,
}

/// A part of the selftest that can run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Staging, the DiT's kernels, GEMMs, attention and forwards (and their benchmarks).
    Dit,
    /// The T5 encoder's kernels and forwards (and its benchmark).
    T5,
    /// The `denoise-graph` lever: graph vs eager loops, and with `bench` the
    /// loop benchmark only ([`crate::cuda::bench::graph::denoise_graph`]).
    Graph,
    /// The video VAE decoder's primitives and whole decodes (and its benchmark).
    Vae,
    /// The attention kernels alone (part of [`Section::Dit`]): the engine's
    /// own and cuDNN's bf16 attention, and cuDNN's FP8 attention with its
    /// operand pass. No benchmark.
    Attention,
    /// The `gemm-algo` lever's checks alone (part of [`Section::Dit`]): tuned
    /// products against the heuristic's, the machine's cache read back. No
    /// benchmark.
    Gemm,
    /// Staging's host-side variants (readers, ring memory, teardown) placing
    /// a file's bytes exactly, and with `bench` the staging sweep
    /// ([`crate::cuda::bench::staging_sweep::sweep`]).
    Staging,
}

/// Sections 1-3: staging, kernels, GEMMs, attention, whole DiT forwards.
fn run_dit_sections(
    kit: &DeviceKit,
    opts: &SelftestOptions,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let report = |checks: &Vec<Check>, from: usize| {
        for c in &checks[from..] {
            eprintln!("{}", c.row());
        }
    };
    // 1. Staging first: the tiny model's weights through both arms.
    let tiny = DitDims::from_config(&crate::presets::dit_tiny())?;
    let tiny_file = opts.scratch.join("tiny-dit.safetensors");
    write_synth_safetensors(&tiny_file, &tiny.tensor_specs(), 11)?;
    let tiny_w = Arc::new(check_staging(kit, &tiny_file, checks)?);
    check_sharded_staging(
        kit,
        &opts.scratch,
        &tiny.tensor_specs(),
        11,
        &tiny_w,
        checks,
    )?;
    report(checks, 0);
    let mut from = checks.len();
    // 2. Kernels, GEMMs, attention.
    check_kernels(kit, rng, checks)?;
    check_gemms(kit, rng, checks)?;
    gemm_tune::check_gemm_tuning(kit, &opts.scratch, checks)?;
    check_fp8(kit, rng, checks)?;
    check_attention(kit, rng, checks)?;
    check_attention_long(kit, checks)?;
    fp8_attention::check_fp8_attention(kit, rng, checks)?;
    report(checks, from);
    from = checks.len();
    // 3. Whole forwards: tiny (2 blocks), one ltxv-2b block, one ltxv-13b block.
    check_forward(kit, rng, "tiny", tiny, tiny_w, 11, (2, 2, 3), 32, checks)?;
    // The fp8 arm's resident load of the same tiny weights against the kept path.
    check_fp8_resident(kit, rng, &tiny_file, tiny, checks)?;
    for (label, dims, seed) in [
        ("ltxv-2b x1 block", DitDims::LTXV_2B.with_layers(1), 21u64),
        ("ltxv-13b x1 block", DitDims::LTXV_13B.with_layers(1), 31u64),
    ] {
        let f = opts
            .scratch
            .join(format!("{}-1block.safetensors", dims.head_dim));
        write_synth_safetensors(&f, &dims.tensor_specs(), seed)?;
        let (w, _) =
            staging::stage_file(&kit.gpu, &f, &StagingOptions::new(StagingMethod::Batched))?;
        check_forward(
            kit,
            rng,
            label,
            dims,
            Arc::new(w),
            seed,
            (3, 8, 12),
            128,
            checks,
        )?;
        let _ = std::fs::remove_file(&f);
    }
    report(checks, from);
    Ok(())
}

/// Run every check (and the benchmarks with `bench`), printing one line per
/// check as it completes and the table last. Returns whether all passed.
pub fn run(opts: &SelftestOptions) -> Result<bool, CudaError> {
    std::fs::create_dir_all(&opts.scratch).map_err(|source| CudaError::Io {
        path: opts.scratch.clone(),
        source,
    })?;
    let t0 = Instant::now();
    let kit = DeviceKit::open()?;
    eprintln!(
        "selftest-cuda: {} (sm_{}{}, {} SMs); kernels {:?}; setup {:.2} s",
        kit.gpu.name,
        kit.gpu.capability.0,
        kit.gpu.capability.1,
        kit.gpu.sms,
        kit.kernels.report.modules,
        t0.elapsed().as_secs_f64()
    );
    let mut checks = Vec::new();
    let mut rng = Rng::new(0x5eed_cafe);
    let report = |checks: &Vec<Check>, from: usize| {
        for c in &checks[from..] {
            eprintln!("{}", c.row());
        }
    };
    let all = opts.only.is_none();
    let wants = |s: Section| all || opts.only == Some(s);
    let mut bench_rows = Vec::new();
    // A benchmark that stops on an error says so in its rows; the checks go on.
    let bench = |rows: &mut Vec<String>, what: &str, r: Result<Vec<String>, CudaError>| match r {
        Ok(v) => rows.extend(v),
        Err(e) => rows.push(format!("{what} bench FAILED: {e}")),
    };
    // 1-3. Staging, kernels, GEMMs, attention, whole DiT forwards.
    if wants(Section::Dit) {
        run_dit_sections(&kit, opts, &mut rng, &mut checks)?;
    }
    // The attention kernels alone (run inside section 2 otherwise).
    if opts.only == Some(Section::Attention) {
        let from = checks.len();
        check_attention(&kit, &mut rng, &mut checks)?;
        check_attention_long(&kit, &mut checks)?;
        fp8_attention::check_fp8_attention(&kit, &mut rng, &mut checks)?;
        report(&checks, from);
    }
    // The GEMM algorithm choice alone (run inside section 2 otherwise).
    if opts.only == Some(Section::Gemm) {
        let from = checks.len();
        gemm_tune::check_gemm_tuning(&kit, &opts.scratch, &mut checks)?;
        report(&checks, from);
    }
    // Staging's host-side variants alone (the default reader is checked in
    // section 1 too).
    if opts.only == Some(Section::Staging) {
        let from = checks.len();
        staging_variants::check_staging_variants(&kit, &opts.scratch, &mut checks)?;
        report(&checks, from);
        if opts.bench {
            bench(
                &mut bench_rows,
                "staging",
                crate::cuda::bench::staging_sweep::sweep(&kit, &opts.scratch),
            );
        }
    }
    // 4. The denoise loop replayed from CUDA graphs against the eager loop.
    if wants(Section::Graph) {
        let from = checks.len();
        crate::cuda::selftest::graph::check_graphs(&kit, &mut rng, &mut checks)?;
        report(&checks, from);
    }
    if opts.bench {
        if all || opts.only == Some(Section::Dit) {
            // Staging, forwards and the graph on/off loop (bench::run).
            bench(
                &mut bench_rows,
                "dit",
                crate::cuda::bench::run(&kit, &opts.scratch),
            );
        } else if opts.only == Some(Section::Graph) {
            let mut rows = Vec::new();
            let r = crate::cuda::bench::graph::denoise_graph(&kit, &mut rows).map(|_| rows);
            bench(&mut bench_rows, "graph", r);
        }
    }
    // 5. The T5 encoder.
    if wants(Section::T5) {
        let from = checks.len();
        crate::cuda::selftest::t5::check_t5(&kit, &mut rng, &opts.scratch, &mut checks)?;
        report(&checks, from);
        if opts.bench {
            bench(
                &mut bench_rows,
                "t5",
                crate::cuda::bench::run_t5(&kit, &opts.scratch),
            );
        }
    }
    // 6. The VAE decoder.
    if wants(Section::Vae) {
        let from = checks.len();
        crate::cuda::selftest::vae::check_vae(&kit, &opts.scratch, &mut checks)?;
        report(&checks, from);
        if opts.bench {
            bench(
                &mut bench_rows,
                "vae",
                crate::cuda::bench::vae::bench_vae(&kit),
            );
        }
    }
    Ok(summary(&kit, &checks, &bench_rows, t0))
}

/// Print the table (every check, then the benchmark rows); whether all passed.
fn summary(kit: &DeviceKit, checks: &[Check], bench_rows: &[String], t0: Instant) -> bool {
    let passed = checks.iter().filter(|c| c.pass).count();
    println!(
        "== selftest-cuda: {} on {} ({:.1} s) ==",
        if passed == checks.len() {
            "PASS"
        } else {
            "FAIL"
        },
        kit.gpu.name,
        t0.elapsed().as_secs_f64()
    );
    for c in checks {
        println!("{}", c.row());
    }
    println!("{passed} passed, {} failed", checks.len() - passed);
    for r in bench_rows {
        println!("{r}");
    }
    passed == checks.len()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_fails_on_nan_and_on_all_zero_references() {
        assert!(!Check::new("x", &[f32::NAN, 1.0], &[1.0, 1.0], 1.0).pass);
        assert!(!Check::new("x", &[0.0, 0.0], &[0.0, 0.0], 1.0).pass);
        assert!(Check::new("x", &[1.0, 2.0], &[1.0, 2.0], 0.0).pass);
        assert!(!Check::new("x", &[1.1, 2.0], &[1.0, 2.0], 1e-3).pass);
    }

    /// Red on: a refusal row passing when the arms were accepted or refused
    /// for another reason, or a failed row that passes.
    #[test]
    fn a_refusal_row_passes_only_on_the_named_refusal() {
        let why = Err::<(), _>("guidance-batch = batched needs --lever text-kv=cached");
        let c = Check::refused("r", &why, "text-kv=cached");
        assert!(c.pass && c.note.contains("needs"), "{c:?}");
        assert!(!Check::refused("r", &why, "head dim").pass);
        let ok: Result<(), &str> = Ok(());
        let c = Check::refused("r", &ok, "text-kv=cached");
        assert!(!c.pass && c.note == "accepted", "{c:?}");
        let f = Check::failed("f", "no cuDNN");
        assert!(!f.pass && f.rel.is_nan() && f.note == "no cuDNN");
    }
}
