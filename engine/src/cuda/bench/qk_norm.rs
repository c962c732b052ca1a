//! The bench's timing of the forward's q/k norm kernels at the forward's
//! shapes: the one-row pair kernel (`qk_norm_rope_pair`, what the forward
//! runs) against the multi-row kernel (`qk_norm_rope_rows`, bit for bit the
//! same output, `selftest::qk_norm_rows`), in two interleaved rounds on the
//! same buffers. Each row gives both kernels' median device time and the rate
//! of the bytes they must move (every row of q and k read and written once).

use super::time_ms;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::bf16::rb;
use crate::cuda::kit::kernels::RopeArgs;
use crate::cuda::kit::DeviceKit;
use crate::cuda::CudaError;
use crate::models::dit::{QK_NORM_EPS, ROPE_COMPRESSION};
use crate::ops::rope::{rope_freqs, ROPE_BASE};

/// A latent grid (frames, height, width).
type Grid = (usize, usize, usize);

/// (what, width, latent grid, RoPE, text rows when RoPE is off): the
/// self-attention's and the cross-attention's q/k norm of the 2B and 13B
/// forwards at 6144 tokens (rung 2's grid).
const SHAPES: [(&str, usize, Grid, bool, usize); 4] = [
    ("2B self (q+k, rope)", 2048, (16, 16, 24), true, 0),
    (
        "2B cross (q + 128 text rows)",
        2048,
        (16, 16, 24),
        false,
        128,
    ),
    ("13B self (q+k, rope)", 4096, (16, 16, 24), true, 0),
    (
        "13B cross (q + 128 text rows)",
        4096,
        (16, 16, 24),
        false,
        128,
    ),
];

/// Timed runs per kernel per round.
const REPS: usize = 20;

/// Push one row per shape: `pair X ms (R GB/s) vs rows Y ms (S GB/s), ratio`.
pub fn qk_norm_kernels(kit: &DeviceKit, rows_out: &mut Vec<String>) -> Result<(), CudaError> {
    let (k, s) = (&kit.kernels, &kit.gpu.compute);
    let mut rng = Rng::new(0x9c_4a11_0006);
    for (what, d, grid, rope, text) in SHAPES {
        let rows = grid.0 * grid.1 * grid.2;
        let rows_k = if rope { rows } else { text };
        let q = kit.bf16(&rb(&rng.normal(rows * d, 2.0)))?;
        let kk = kit.bf16(&rb(&rng.normal(rows_k * d, 1.5)))?;
        let w = kit.bf16(&rb(&rng.uniform(d, 0.8, 1.2)))?;
        let f = rope_freqs(d);
        let fd = kit.f32(&f)?;
        let args = RopeArgs {
            freqs: fd.ptr(),
            nfreq: f.len(),
            grid,
            scale: [
                (ROPE_COMPRESSION.0 as f64 / 24.0) as f32,
                ROPE_COMPRESSION.1 as f32,
                ROPE_COMPRESSION.1 as f32,
            ],
            base: [ROPE_BASE.0, ROPE_BASE.1, ROPE_BASE.2],
        };
        let args = rope.then_some(&args);
        let qa = (q.ptr(), w.ptr(), rows);
        let ka = (kk.ptr(), w.ptr(), rows_k);
        // Both run in place on the same buffers: the values drift towards the
        // norm's fixed point, which changes neither kernel's work.
        let mut t = [0.0f64; 2];
        for _round in 0..2 {
            t[0] += time_ms(kit, 2, REPS, || {
                k.qk_norm_rope_pair(s, qa, ka, d, QK_NORM_EPS, args, None)
            })? / 2.0;
            t[1] += time_ms(kit, 2, REPS, || {
                k.qk_norm_rope_rows(s, qa, ka, d, QK_NORM_EPS, args, None)
            })? / 2.0;
        }
        let bytes = (2 * (rows + rows_k) * d * 2) as f64;
        let gbps = |ms: f64| bytes / (ms * 1e-3) / 1e9;
        rows_out.push(format!(
            "qk-norm  {what}: pair {:.4} ms ({:.0} GB/s) vs rows {:.4} ms ({:.0} GB/s, {} blocks a tensor): rows/pair {:.3}",
            t[0],
            gbps(t[0]),
            t[1],
            gbps(t[1]),
            k.qk_rows_blocks(rows, rows_k, d),
            t[1] / t[0]
        ));
    }
    Ok(())
}
