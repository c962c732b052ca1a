//! The `denoise-graph` benchmark (part of `engine selftest-cuda --bench`, alone
//! with `--only graph`): the device-resident denoise loop of the full ltxv-2b
//! DiT (28 blocks, weights generated on the device) with steps launched eagerly
//! and replayed from captured graphs, the two arms interleaved (ABAB... with the
//! order swapped every round, after one discarded round per arm), at rung 2's
//! grid (16x16x24 = 6144 tokens, guidance on: 2 forwards per step) and rung 1's
//! (4x10x16 = 640 tokens, 1 forward per step, where dispatch weighs most).
//!
//! Per arm and round: wall per step (first enqueue to the last wait, as the
//! pipeline drives the loop; `begin`'s warm-up and capture excluded, the
//! capture reported beside), the GPU-busy share (sum of the forwards' event
//! milliseconds over that wall, the campaign's metric; and the steps' spans
//! over it), and the host time spent inside `enqueue` per step. That last one
//! is the dispatch cost only while the GPU keeps up: when it is behind, the
//! driver blocks the host inside the launch calls (backpressure), and the figure
//! becomes waiting time (most of a step at rung 2's grid on both arms in device
//! run graph1, `reports/device-notes.md`).

use std::sync::Arc;

use crate::cuda::bench::{device_weights, median, GRID_6144};
use crate::cuda::denoise::{run_loop, CudaDenoiser, Dispatch, LoopRun};
use crate::cuda::fixtures::rel_err;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::{DeviceDit, DitDims, Geometry, LATENT_CHANNELS};
use crate::cuda::staging::DeviceWeights;
use crate::cuda::CudaError;
use crate::denoise::{Conditioning, TextCond};
use crate::schedule::{sigmas, SchedulerConfig};
use crate::tensor::Tensor;

/// One benchmarked loop shape.
#[derive(Debug, Clone, Copy)]
pub struct LoopCase {
    /// Which rung's grid.
    pub label: &'static str,
    /// Latent grid (frames, height, width).
    pub grid: (usize, usize, usize),
    /// Guidance on (2 forwards per step).
    pub guided: bool,
    /// Steps per loop.
    pub steps: usize,
    /// Measured rounds (each runs both arms).
    pub rounds: usize,
}

/// The two shapes: rung 2's grid guided, rung 1's unguided.
pub const CASES: [LoopCase; 2] = [
    LoopCase {
        label: "rung 2 grid",
        grid: GRID_6144,
        guided: true,
        steps: 8,
        rounds: 3,
    },
    LoopCase {
        label: "rung 1 grid",
        grid: (4, 10, 16),
        guided: false,
        steps: 20,
        rounds: 5,
    },
];

/// Figures of one arm over the measured rounds.
#[derive(Debug, Default)]
struct ArmFigures {
    wall_per_step_ms: Vec<f64>,
    busy: Vec<f64>,
    step_busy: Vec<f64>,
    enqueue_us: Vec<f64>,
    forward_ms: Vec<f64>,
    capture_ms: Vec<f64>,
}

impl ArmFigures {
    fn add(&mut self, r: &LoopRun, steps: usize) {
        let wall_ms = r.wall_s * 1e3;
        self.wall_per_step_ms.push(wall_ms / steps as f64);
        self.busy.push(r.forward_ms.iter().sum::<f64>() / wall_ms);
        self.step_busy.push(r.step_ms.iter().sum::<f64>() / wall_ms);
        self.enqueue_us.push(r.enqueue_s * 1e6 / steps as f64);
        self.forward_ms.extend(&r.forward_ms);
        self.capture_ms.extend(r.capture_ms);
    }

    fn row(&self, name: &str) -> String {
        let rounds: Vec<String> = self
            .wall_per_step_ms
            .iter()
            .map(|v| format!("{v:.2}"))
            .collect();
        format!(
            "  {name}: {:>8.2} ms/step (rounds {}), forward {:.2} ms, GPU-busy {:.1}% forwards / {:.1}% steps, \
             host in enqueue {:.0} us/step{}",
            median(self.wall_per_step_ms.clone()),
            rounds.join(" "),
            median(self.forward_ms.clone()),
            100.0 * median(self.busy.clone()),
            100.0 * median(self.step_busy.clone()),
            median(self.enqueue_us.clone()),
            if self.capture_ms.is_empty() {
                String::new()
            } else {
                format!(", capture {:.1} ms", median(self.capture_ms.clone()))
            }
        )
    }
}

fn text(rng: &mut Rng, real: usize) -> Result<TextCond, CudaError> {
    let (l, c) = (128, DitDims::LTXV_2B.caption_channels);
    let states = Tensor::new(&[l, c], rng.normal(l * c, 1.0))
        .map_err(|e| CudaError::Invalid(format!("text states: {e}")))?;
    let mask = (0..l).map(|j| if j < real { 1.0 } else { 0.0 }).collect();
    Ok(TextCond { states, mask })
}

/// Both arms of `case`, interleaved; the rows of the table.
pub fn bench_case(
    kit: &DeviceKit,
    weights: &Arc<DeviceWeights>,
    case: &LoopCase,
) -> Result<Vec<String>, CudaError> {
    let dims = DitDims::LTXV_2B;
    let n = case.grid.0 * case.grid.1 * case.grid.2;
    let mut rng = Rng::new(0x6a7f ^ n as u64);
    let cond = Conditioning {
        cond: text(&mut rng, 100)?,
        uncond: if case.guided {
            Some(text(&mut rng, 20)?)
        } else {
            None
        },
        guidance: 3.0,
    };
    let geo = Geometry {
        grid: case.grid,
        fps: 25.0,
    };
    let latents = Tensor::new(&[n, LATENT_CHANNELS], rng.normal(n * LATENT_CHANNELS, 1.0))
        .map_err(|e| CudaError::Invalid(format!("latents: {e}")))?;
    let sig = sigmas(&SchedulerConfig::ltx_video(), case.steps, n)
        .map_err(|e| CudaError::Invalid(format!("sigmas: {e}")))?;
    let arm = |d: Dispatch| -> Result<CudaDenoiser, CudaError> {
        let dit = DeviceDit::new(
            kit.gpu.clone(),
            kit.kernels.clone(),
            kit.gemm.clone(),
            dims,
            weights.clone(),
        )?;
        CudaDenoiser::new(kit.clone(), dit, &cond, geo, d)
    };
    let mut dens = [arm(Dispatch::Eager)?, arm(Dispatch::Graph)?];
    let mut figs = [ArmFigures::default(), ArmFigures::default()];
    let mut last: [Option<Tensor>; 2] = [None, None];
    for round in 0..=case.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let r = run_loop(&mut dens[i], latents.clone(), &sig, false).map_err(|e| {
                CudaError::Invalid(format!("{} loop: {e}", dens[i].dispatch().name()))
            })?;
            if round > 0 {
                figs[i].add(&r, case.steps);
            }
            last[i] = Some(r.latents);
        }
    }
    let (off, on) = (
        median(figs[0].wall_per_step_ms.clone()),
        median(figs[1].wall_per_step_ms.clone()),
    );
    let same = match (&last[0], &last[1]) {
        (Some(a), Some(b)) => {
            let (rel, _) = rel_err(b.data(), a.data());
            format!(
                "final latents on vs off: rel {rel:.3e} ({})",
                if a.data() == b.data() {
                    "bit-identical"
                } else {
                    "DIFFER"
                }
            )
        }
        _ => "no latents".into(),
    };
    Ok(vec![
        format!(
            "denoise-graph {} {:?} = {n} tok, {} fwd/step, {} steps, {} rounds interleaved (ltxv-2b, 28 blocks):",
            case.label,
            case.grid,
            cond.forwards_per_step(),
            case.steps,
            case.rounds
        ),
        figs[0].row("off (eager)"),
        figs[1].row("on (graph) "),
        format!(
            "  on/off wall per step {:.4} ({:+.2}% saving); {same}",
            on / off,
            100.0 * (1.0 - on / off)
        ),
    ])
}

/// Every case of [`CASES`] on one set of device-generated ltxv-2b weights; a
/// case that fails becomes a row saying so (the other still runs).
pub fn denoise_graph(kit: &DeviceKit, rows: &mut Vec<String>) -> Result<(), CudaError> {
    let weights = Arc::new(device_weights(kit, &DitDims::LTXV_2B, 7)?);
    for case in &CASES {
        let r = bench_case(kit, &weights, case)
            .unwrap_or_else(|e| vec![format!("denoise-graph {} FAILED: {e}", case.label)]);
        for row in r {
            eprintln!("{row}");
            rows.push(row);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_rung_2_and_rung_1_grids() {
        let tokens = |c: &LoopCase| c.grid.0 * c.grid.1 * c.grid.2;
        assert_eq!(tokens(&CASES[0]), 6144);
        assert!(CASES[0].guided);
        assert_eq!(tokens(&CASES[1]), 640);
        assert!(!CASES[1].guided);
    }

    #[test]
    fn median_takes_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert!(median(Vec::new()).is_nan());
    }
}
