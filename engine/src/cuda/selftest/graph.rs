//! `engine selftest-cuda`'s check of the `denoise-graph` lever: the whole
//! device-resident loop ([`run_loop`]) with every forward replayed from a
//! captured CUDA graph against the same loop launched eagerly, from the same
//! random latents (normal, never zeros) and random text states, with the
//! velocities and the forward's workspace poisoned (0xFF bytes = NaN) after
//! `begin` so a step that fails to write them ends in NaN latents (a failing
//! check, not a pass).
//!
//! Tolerance, argued before any run: **0** (bit-identical final latents). The
//! two arms enqueue the same kernels in the same order on one stream with the
//! same launch shapes and arguments: the timestep kernels differ only in where
//! t comes from, share one non-inlined body, and get the same f32 (the host's
//! `sigma * 1000.0` either way); the GEMMs run the algorithm cached per shape
//! (built by the warm-up that readies the loop, before capture) with the same workspace; no
//! kernel uses atomics, so nothing depends on the order blocks finish. Two
//! controls make the 0 meaningful: eager against eager again must be 0 too (if
//! the device were not deterministic, the graph check could not be exact), and
//! the mutant (graph steps that do not write their t: every step replays the
//! warm-up's sigma 1) must differ, i.e. the tolerance-0 check turns red on it.
//!
//! The batched cases run the guided pair as one forward over both samples
//! (lever `guidance-batch`, with the `text-kv = cached` it needs): graph
//! against eager at tolerance 0 as above (one forward span a step), and the
//! batched loop against the pair's (the same loop with two batch-1 forwards a
//! step) at [`BATCHED_LOOP_TOL`].

use std::sync::Arc;

use crate::cuda::bench::device_weights;
use crate::cuda::denoise::{run_loop, CudaDenoiser, Dispatch, LoopRun};
use crate::cuda::fixtures::rel_err;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::{
    DeviceDit, DitDims, ForwardArms, Geometry, GuidanceBatch, TextKvArm, LATENT_CHANNELS,
};
use crate::cuda::selftest::Check;
use crate::cuda::staging::DeviceWeights;
use crate::cuda::CudaError;
use crate::denoise::{Conditioning, TextCond};
use crate::schedule::{sigmas, SchedulerConfig};
use crate::tensor::Tensor;

/// One loop configuration of the check.
#[derive(Debug, Clone, Copy)]
pub struct GraphCase {
    /// Label in the check's name.
    pub label: &'static str,
    /// The model (weights generated on the device).
    pub dims: DitDims,
    /// Latent grid (frames, height, width).
    pub grid: (usize, usize, usize),
    /// Text tokens of the prompt.
    pub l: usize,
    /// Text tokens of the negative prompt; `None` = no guidance (1 forward/step).
    pub l_uncond: Option<usize>,
    /// Denoising steps.
    pub steps: usize,
    /// The guided pair as one batched forward (lever `guidance-batch`).
    pub batched: bool,
}

/// Relative tolerance of the batched loop's final latents against the pair's,
/// argued before any run: every kernel computes a row or a head as at batch 1,
/// but each GEMM sees twice the rows and cuBLASLt may pick another algorithm
/// for them, so an f32 sum may round to the other bf16 neighbour (a relative
/// step of 2^-8): with ~1% of a GEMM's outputs that close to a boundary, a
/// velocity moves by ~5e-4 relative, and 3-4 steps of `dt` ~0.25 carry a
/// fraction of that into the latents, which the noise dominates. 5e-3 is ten
/// times that; a sample reading the other's text, rows or RoPE positions moves
/// the velocity by O(1) and the latents by ~0.1.
pub const BATCHED_LOOP_TOL: f64 = 5e-3;

/// The forward's arms of a case: the engine's own kernels, and with `batched`
/// the batched pair on the text cache it needs.
fn case_arms(case: &GraphCase, guidance: GuidanceBatch) -> ForwardArms {
    if case.batched {
        ForwardArms {
            text_kv: TextKvArm::Cached,
            guidance,
            ..ForwardArms::OWN
        }
    } else {
        ForwardArms::OWN
    }
}

/// The cases `engine selftest-cuda` runs: the tiny DiT with and without
/// guidance, and a 2-block ltxv-2b with guidance (flash attention, the real
/// widths and GEMM shapes).
pub fn cases() -> Result<Vec<GraphCase>, CudaError> {
    let tiny = DitDims::from_config(&crate::presets::dit_tiny())?;
    Ok(vec![
        GraphCase {
            label: "tiny guided",
            dims: tiny,
            grid: (2, 2, 3),
            l: 32,
            l_uncond: Some(24),
            steps: 4,
            batched: false,
        },
        GraphCase {
            label: "tiny guided batched",
            dims: tiny,
            grid: (2, 2, 3),
            l: 32,
            l_uncond: Some(8),
            steps: 4,
            batched: true,
        },
        GraphCase {
            label: "tiny unguided",
            dims: tiny,
            grid: (2, 2, 3),
            l: 32,
            l_uncond: None,
            steps: 3,
            batched: false,
        },
        GraphCase {
            label: "ltxv-2b x2 blocks guided",
            dims: DitDims::LTXV_2B.with_layers(2),
            grid: (3, 8, 12),
            l: 128,
            l_uncond: Some(100),
            steps: 4,
            batched: false,
        },
        GraphCase {
            label: "ltxv-2b x2 blocks guided batched",
            dims: DitDims::LTXV_2B.with_layers(2),
            grid: (3, 8, 12),
            l: 128,
            l_uncond: Some(20),
            steps: 4,
            batched: true,
        },
    ])
}

fn text(rng: &mut Rng, l: usize, c: usize) -> Result<TextCond, CudaError> {
    let states = Tensor::new(&[l, c], rng.normal(l * c, 1.0))
        .map_err(|e| CudaError::Invalid(format!("text states: {e}")))?;
    let mask = (0..l)
        .map(|j| if j < l * 3 / 4 { 1.0 } else { 0.0 })
        .collect();
    Ok(TextCond { states, mask })
}

/// `loops` poisoned loops of `case` on `weights` with `dispatch` (and the
/// mutant), one after the other on one denoiser (readied once, at open), its
/// forward on `arms`.
#[allow(clippy::too_many_arguments)]
fn one_loop(
    kit: &DeviceKit,
    case: &GraphCase,
    weights: &Arc<DeviceWeights>,
    cond: &Conditioning,
    latents: &Tensor,
    sigmas: &[f32],
    (dispatch, arms): (Dispatch, ForwardArms),
    mutant: bool,
    loops: usize,
) -> Result<Vec<LoopRun>, String> {
    let mut dit = DeviceDit::new(
        kit.gpu.clone(),
        kit.kernels.clone(),
        kit.gemm.clone(),
        case.dims,
        weights.clone(),
    )
    .map_err(|e| e.to_string())?;
    dit.set_arms(arms).map_err(|e| e.to_string())?;
    let geo = Geometry {
        grid: case.grid,
        fps: 25.0,
    };
    let mut den =
        CudaDenoiser::new(kit.clone(), dit, cond, geo, dispatch).map_err(|e| e.to_string())?;
    if mutant {
        den.mutate_skip_timestep_write();
    }
    (0..loops)
        .map(|_| run_loop(&mut den, latents.clone(), sigmas, true).map_err(|e| e.to_string()))
        .collect()
}

/// Run `case` eager, eager again, with graphs, and as the mutant, and push
/// the three rows (graph vs eager, the determinism control, the mutant).
pub fn check_graph(
    kit: &DeviceKit,
    rng: &mut Rng,
    case: &GraphCase,
    seed: u64,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let n = case.grid.0 * case.grid.1 * case.grid.2;
    let c = case.dims.caption_channels;
    let weights = Arc::new(device_weights(kit, &case.dims, seed)?);
    let cond = Conditioning {
        cond: text(rng, case.l, c)?,
        uncond: case.l_uncond.map(|l| text(rng, l, c)).transpose()?,
        guidance: 3.0,
    };
    // One forward span a step where the guided pair runs batched.
    let fwd = if case.batched && cond.uncond.is_some() {
        1
    } else {
        cond.forwards_per_step()
    };
    let arms = case_arms(case, GuidanceBatch::Batched);
    let latents = Tensor::new(&[n, LATENT_CHANNELS], rng.normal(n * LATENT_CHANNELS, 1.0))
        .map_err(|e| CudaError::Invalid(format!("latents: {e}")))?;
    let sig = sigmas(&SchedulerConfig::ltx_video(), case.steps, n)
        .map_err(|e| CudaError::Invalid(format!("sigmas: {e}")))?;
    let runs_on = |d: Dispatch, arms: ForwardArms, mutant: bool, loops: usize| {
        let how = (d, arms);
        one_loop(
            kit, case, &weights, &cond, &latents, &sig, how, mutant, loops,
        )
    };
    let runs = |d: Dispatch, mutant: bool, loops: usize| runs_on(d, arms, mutant, loops);
    let run = |d: Dispatch, mutant: bool| {
        runs(d, mutant, 1).and_then(|mut v| v.pop().ok_or_else(|| "no loop ran".to_string()))
    };
    let what = format!("{} {} steps x {fwd} fwd", case.label, case.steps);
    let spans = |r: &LoopRun| r.forward_ms.len() == case.steps * fwd;
    let eager = match run(Dispatch::Eager, false) {
        Ok(r) => r,
        Err(e) => {
            out.push(Check::failed(format!("graph check {what}: eager loop"), e));
            return Ok(());
        }
    };
    let cmp =
        |name: String, r: &LoopRun| Check::new(name, r.latents.data(), eager.latents.data(), 0.0);
    // The graph arm: bit-identical, and every forward still timed by events.
    let name = format!("graph vs eager {what} (bit-exact)");
    out.push(match run(Dispatch::Graph, false) {
        Ok(g) => {
            let mut ck = cmp(name, &g);
            let timed = spans(&g) && g.step_ms.len() == case.steps;
            ck.pass &= timed && g.capture_ms.is_some();
            ck.note = format!(
                "capture {:.2} ms; {} forward and {} step spans{}",
                g.capture_ms.unwrap_or(f64::NAN),
                g.forward_ms.len(),
                g.step_ms.len(),
                if timed { "" } else { " (MISSING spans)" }
            );
            ck
        }
        Err(e) => Check::failed(name, e),
    });
    // The loop is readied once at open: a second loop on the same denoiser
    // replays the same graphs over the same buffer (its latents uploaded
    // again) and must land on the first's latents exactly.
    let name = format!("graph loop 2 vs eager {what} (graphs reused, bit-exact)");
    out.push(match runs(Dispatch::Graph, false, 2) {
        Ok(v) if v.len() == 2 => cmp(name, &v[1]),
        Ok(v) => Check::failed(name, format!("{} loops ran, 2 asked", v.len())),
        Err(e) => Check::failed(name, e),
    });
    let name = format!("eager vs eager {what} (determinism control)");
    out.push(match run(Dispatch::Eager, false) {
        Ok(e2) => cmp(name, &e2),
        Err(e) => Check::failed(name, e),
    });
    // The mutant must turn the tolerance-0 check red.
    let name = format!("mutant graph (t never written) {what} must differ");
    out.push(match run(Dispatch::Graph, true) {
        Ok(m) => {
            let (rel, max_abs) = rel_err(m.latents.data(), eager.latents.data());
            Check {
                name,
                rel,
                max_abs,
                tol: 0.0,
                pass: rel.is_finite() && rel > 0.0,
                note: "pass = the graph-vs-eager check fails on the mutant".into(),
            }
        }
        Err(e) => Check::failed(name, e),
    });
    // The batched pair against two batch-1 forwards a step, eager both, on
    // the same text cache (red when a sample reads the other's text or rows,
    // when v_cond and v_uncond are swapped, or when the batched step still
    // reports two forward spans).
    if case.batched {
        let name = format!("batched vs pair {what} (guidance-batch)");
        let pair = case_arms(case, GuidanceBatch::Pair);
        let d = Dispatch::Eager;
        out.push(match runs_on(d, pair, false, 1) {
            Ok(mut v) => match v.pop() {
                Some(p) => {
                    let mut ck = Check::new(
                        name,
                        eager.latents.data(),
                        p.latents.data(),
                        BATCHED_LOOP_TOL,
                    );
                    ck.pass &= spans(&eager) && p.forward_ms.len() == 2 * case.steps;
                    ck.note = format!(
                        "{} batched and {} pair forward spans; batched {:.2} ms, pair {:.2} \
                             ms of forwards",
                        eager.forward_ms.len(),
                        p.forward_ms.len(),
                        eager.forward_ms.iter().sum::<f64>(),
                        p.forward_ms.iter().sum::<f64>()
                    );
                    ck
                }
                None => Check::failed(name, "no loop ran"),
            },
            Err(e) => Check::failed(name, e),
        });
    }
    Ok(())
}

/// Every case of [`cases`] (device-generated weights, seeds 41 on, one a case).
pub fn check_graphs(kit: &DeviceKit, rng: &mut Rng, out: &mut Vec<Check>) -> Result<(), CudaError> {
    for (i, case) in cases()?.iter().enumerate() {
        check_graph(kit, rng, case, 41 + i as u64, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_both_forward_counts_and_the_real_widths() {
        let c = cases().unwrap();
        assert!(c.iter().any(|k| k.l_uncond.is_none()));
        assert!(c.iter().any(|k| k.l_uncond.is_some()));
        assert!(c.iter().any(|k| k.dims.dim() == DitDims::LTXV_2B.dim()));
        // The batched pair at the tiny and the real widths, guided both.
        let batched: Vec<_> = c.iter().filter(|k| k.batched).collect();
        assert_eq!(batched.len(), 2);
        assert!(batched.iter().all(|k| k.l_uncond.is_some()));
        assert!(batched
            .iter()
            .any(|k| k.dims.dim() == DitDims::LTXV_2B.dim()));
        let arms = case_arms(batched[0], GuidanceBatch::Batched);
        assert_eq!(arms.conflict(), None);
        for k in &c {
            assert!((3..=4).contains(&k.steps), "{}", k.label);
            // Text lengths differ with guidance: both slots' GEMM shapes are
            // built in the warm-up, before capture.
            if let Some(lu) = k.l_uncond {
                assert_ne!(lu, k.l, "{}", k.label);
            }
        }
    }
}
