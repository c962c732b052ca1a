//! The `gemm-algo` lever's checks ([`crate::cuda::kit::gemm_tune`]), on the 2B
//! and 13B forwards' bf16 products at 6144 rows (12288 for the batched guided
//! pair, 333 for a ragged count), random operands, every output poisoned first:
//!
//! - the tuned product against the heuristic's on the same operands: where the
//!   tuned choice kept the heuristic's first answer, bit-exact (the same
//!   algorithm on the same bytes; tolerance 0); where it took another, within
//!   5e-3 (argued before any run: both sum the same exact products of bf16
//!   operands in f32, in another order, and round once to bf16: ~2⁻⁹ relative
//!   on the values whose rounding flips, ~1e-3 RMS at most; a wrong or
//!   half-written algorithm is O(1) or NaN). The heuristic's own accuracy
//!   against the CPU arm is `check_gemms`'.
//! - the machine's cache: a second handle on the same cache file reads every
//!   choice back (none timed again) and its products are bit-exact with the
//!   first tuned handle's; a damaged line appended to the file is counted and
//!   skipped, the other choices still read.
//!
//! Each row's note says which candidate was kept and its gain over the
//! heuristic's first (the device's answer to the lever's hypothesis, before any
//! campaign).

use super::dit::gemm_weight;
use super::Check;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::bf16::rb;
use crate::cuda::kit::gemm::{Epilogue, Gemm};
use crate::cuda::kit::gemm_tune::AlgoChoice;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::DeviceKit;
use crate::cuda::CudaError;

/// (m, n, k, epilogue, what): the DiT forwards' bf16 products.
const SHAPES: [(usize, usize, usize, Epilogue, &str); 8] = [
    (6144, 6144, 2048, Epilogue::Bias, "2B q|k|v"),
    (6144, 2048, 2048, Epilogue::Bias, "2B out / q cross"),
    (6144, 8192, 2048, Epilogue::BiasGelu, "2B ff up"),
    (6144, 2048, 8192, Epilogue::Bias, "2B ff down"),
    (12288, 2048, 2048, Epilogue::Bias, "2B out, batched pair"),
    (333, 2048, 2048, Epilogue::Bias, "2B out, ragged rows"),
    (6144, 12288, 4096, Epilogue::Bias, "13B q|k|v"),
    (6144, 4096, 16384, Epilogue::Bias, "13B ff down"),
];

/// The tolerance of a tuned product that took another algorithm (module doc).
const OTHER_ALGO_TOL: f64 = 5e-3;

/// One shape's operands on the device.
struct Operands {
    x: DeviceBuffer,
    w: DeviceBuffer,
    b: DeviceBuffer,
}

fn run(
    kit: &DeviceKit,
    g: &Gemm,
    op: &Operands,
    (m, n, k, ep): (usize, usize, usize, Epilogue),
) -> Result<Vec<f32>, CudaError> {
    let y = kit.poisoned(m * n * 2)?;
    g.linear(
        &kit.gpu.compute,
        op.x.ptr(),
        op.w.ptr(),
        op.b.ptr(),
        y.ptr(),
        m,
        n,
        k,
        ep,
    )?;
    kit.gpu.sync_compute()?;
    kit.read_bf16(y.ptr(), m * n)
}

/// The seed of this check's operands: its own stream, so adding or removing it
/// leaves the inputs of every check after it as they were (s38-dev1 drew them
/// from the shared stream and moved a later check's inputs).
const SEED: u64 = 0x6e33_a160;

/// The checks of the module doc; the cache file lives in `scratch`.
pub fn check_gemm_tuning(
    kit: &DeviceKit,
    scratch: &std::path::Path,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let rng = &mut Rng::new(SEED);
    let cache = scratch.join("gemm-algos").join("selftest.tsv");
    let _ = std::fs::remove_file(&cache);
    let tuned_handle = || -> Result<Gemm, CudaError> {
        let g = Gemm::new(&kit.gpu)?;
        g.set_tune_cache(Some(cache.clone()));
        g.set_choice(AlgoChoice::Tuned);
        Ok(g)
    };
    let heuristic = Gemm::new(&kit.gpu)?;
    let first = tuned_handle()?;
    let mut tuned_outputs = Vec::new();
    for (m, n, k, ep, what) in SHAPES {
        let op = Operands {
            x: kit.bf16(&rb(&rng.uniform(m * k, -1.0, 1.0)))?,
            w: kit.bf16(&gemm_weight(rng, n, k))?,
            b: kit.bf16(&rb(&rng.uniform(n, -0.5, 0.5)))?,
        };
        let shape = (m, n, k, ep);
        let h = run(kit, &heuristic, &op, shape)?;
        let t = run(kit, &first, &op, shape)?;
        let report = first.tune_report();
        let key = format!("m{m} n{n} k{k} {ep:?} Bf16");
        let (index, gain) = match report.choices.get(&key) {
            Some((i, _, g)) => (*i, *g),
            None => {
                out.push(Check::failed(
                    format!("gemm-algo tuned {what} m={m} n={n} k={k}"),
                    format!("no tuned choice recorded under {key:?}"),
                ));
                continue;
            }
        };
        let tol = if index == 0 { 0.0 } else { OTHER_ALGO_TOL };
        let mut c = Check::new(
            format!("gemm-algo tuned vs heuristic {what} m={m} n={n} k={k}"),
            &t,
            &h,
            tol,
        );
        c.note = match gain {
            Some(g) => format!("kept #{index} ({:+.1}% time)", -g * 100.0),
            None => format!("kept #{index} (untimed)"),
        };
        out.push(c);
        tuned_outputs.push((op, shape, t));
    }
    let r = first.tune_report();
    let mut c = Check::new(
        "gemm-algo tuning report (tuned, cached, rejected)",
        &[r.tuned as f32, r.from_cache as f32, r.cache_rejected as f32],
        &[SHAPES.len() as f32, 0.0, 0.0],
        0.0,
    );
    c.note = format!(
        "{} ms timing; {} not the first; cache {}{}",
        r.tune_ms.round(),
        r.not_first,
        r.cache_file
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none".into()),
        r.cache_error
            .as_deref()
            .map(|e| format!("; NOT WRITTEN: {e}"))
            .unwrap_or_default()
    );
    c.pass &= r.cache_error.is_none();
    out.push(c);
    // A damaged line appended: counted and skipped; every choice read back.
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&cache) {
        use std::io::Write as _;
        let _ = writeln!(f, "v1\tdamaged line");
    }
    let second = tuned_handle()?;
    let mut worst = 0.0f64;
    let mut differ = 0usize;
    for (op, shape, t) in &tuned_outputs {
        let again = run(kit, &second, op, *shape)?;
        let c = Check::new("", &again, t, 0.0);
        worst = worst.max(if c.rel.is_finite() {
            c.rel
        } else {
            f64::INFINITY
        });
        differ += usize::from(!c.pass);
    }
    let r2 = second.tune_report();
    let mut c = Check::new(
        "gemm-algo cache read back (cached, timed, rejected, shapes differing)",
        &[
            r2.from_cache as f32,
            r2.tuned as f32,
            r2.cache_rejected as f32,
            differ as f32,
        ],
        &[tuned_outputs.len() as f32, 0.0, 1.0, 0.0],
        0.0,
    );
    c.note = format!(
        "worst rel {worst:.1e} against the first tuned handle; digests {}",
        if r2.digest() == first.tune_report().digest() {
            "equal"
        } else {
            "DIFFER"
        }
    );
    c.pass &= r2.digest() == first.tune_report().digest();
    out.push(c);
    Ok(())
}
