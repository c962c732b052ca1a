//! The multi-row q/k norm kernel (`qk_norm_rope_rows4`/`8`,
//! [`crate::cuda::kit::kernels::Kernels::qk_norm_rope_rows`]) against the
//! one-row pair kernel the forward runs, on the same inputs: tolerance 0,
//! argued before any run. The two share the thread-to-pair mapping, every sum's
//! order and every expression; only which block takes which row, and when its
//! loads are issued, differ. So every written bf16 value, and the q and k amax
//! slots, must be equal bit for bit, and the rows past k's poisoned tail must
//! stay poisoned.
//!
//! The row counts are above the kernel's grid (at most the blocks the card
//! holds at once: 1056 on a 132-SM card at 8 a multiprocessor, half of them
//! for each tensor when both have many rows) so each block runs its loop
//! several times, the last trip without a next row to prefetch. Red when a block skips or repeats a
//! row, prefetches past the last row into the tail, loses a row's amax, or
//! reads a row's next values into the current row's sum.
//!
//! The inputs come from this module's own random stream ([`SEED`]), so adding
//! or changing these cases moves no other check's inputs.

use super::dit::amax_check;
use super::Check;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::bf16::{narrow, rb, widen};
use crate::cuda::kit::fp8::Fp8Attn;
use crate::cuda::kit::kernels::RopeArgs;
use crate::cuda::kit::memory::{download, upload, DeviceBuffer};
use crate::cuda::kit::DeviceKit;
use crate::cuda::CudaError;
use crate::models::dit::{QK_NORM_EPS, ROPE_COMPRESSION};
use crate::ops::rope::{rope_freqs, ROPE_BASE};

/// This module's random stream.
const SEED: u64 = 0x9c_4a11_0005;

/// A latent grid (frames, height, width).
type Grid = (usize, usize, usize);

/// (width, q grid (f, h, w), RoPE, k rows when RoPE is off): the 2B and 13B
/// widths at row counts past the kernel's grid, a tiny width, and the
/// cross-attention's shape (q rows of the latent grid, a few text key rows).
const CASES: [(usize, Grid, bool, usize); 4] = [
    (64, (2, 3, 4), true, 0),
    (2048, (5, 24, 25), true, 0),
    (4096, (3, 24, 25), true, 0),
    (2048, (4, 20, 31), false, 37),
];

/// One case's tensors, poisoned past their rows.
struct Pair {
    q: DeviceBuffer,
    k: DeviceBuffer,
    slots: DeviceBuffer,
}

fn load(
    kit: &DeviceKit,
    (q0, k0): (&[f32], &[f32]),
    (rows, rows_k, d): (usize, usize, usize),
) -> Result<Pair, CudaError> {
    let q = kit.poisoned((rows + 2) * d * 2)?;
    upload(&kit.gpu, q.ptr(), &narrow(q0))?;
    let k = kit.poisoned((rows_k + 2) * d * 2)?;
    upload(&kit.gpu, k.ptr(), &narrow(k0))?;
    let slots = kit.poisoned(Fp8Attn::SLOT_BYTES)?;
    kit.kernels
        .fp8_attention_zero_amax(&kit.gpu.compute, slots.ptr())?;
    Ok(Pair { q, k, slots })
}

/// The multi-row kernel bit for bit against the pair kernel (module doc).
pub fn check_qk_norm_rows(kit: &DeviceKit, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (k, s) = (&kit.kernels, &kit.gpu.compute);
    let mut rng = Rng::new(SEED);
    for (d, grid, rope, k_rows) in CASES {
        let rows = grid.0 * grid.1 * grid.2;
        let rows_k = if rope { rows } else { k_rows };
        let q0 = rb(&rng.normal(rows * d, 2.0));
        let k0 = rb(&rng.normal(rows_k * d, 1.5));
        let wq = kit.bf16(&rb(&rng.uniform(d, 0.8, 1.2)))?;
        let wk = kit.bf16(&rb(&rng.uniform(d, 0.7, 1.3)))?;
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
        let shape = (rows, rows_k, d);
        let one = load(kit, (&q0, &k0), shape)?;
        let many = load(kit, (&q0, &k0), shape)?;
        k.qk_norm_rope_pair(
            s,
            (one.q.ptr(), wq.ptr(), rows),
            (one.k.ptr(), wk.ptr(), rows_k),
            d,
            QK_NORM_EPS,
            args,
            Some(one.slots.ptr()),
        )?;
        k.qk_norm_rope_rows(
            s,
            (many.q.ptr(), wq.ptr(), rows),
            (many.k.ptr(), wk.ptr(), rows_k),
            d,
            QK_NORM_EPS,
            args,
            Some(many.slots.ptr()),
        )?;
        let read = |p: &Pair| -> Result<(Vec<u16>, Vec<u16>), CudaError> {
            Ok((
                download::<u16>(&kit.gpu, p.q.ptr(), (rows + 2) * d)?,
                download::<u16>(&kit.gpu, p.k.ptr(), (rows_k + 2) * d)?,
            ))
        };
        let (one_q, one_k) = read(&one)?;
        let (many_q, many_k) = read(&many)?;
        let (nq, nk) = (rows * d, rows_k * d);
        let differ = one_q[..nq]
            .iter()
            .zip(&many_q[..nq])
            .chain(one_k[..nk].iter().zip(&many_k[..nk]))
            .filter(|(a, b)| a != b)
            .count();
        let tail_touched = many_q[nq..]
            .iter()
            .chain(&many_k[nk..])
            .filter(|b| **b != 0xFFFF)
            .count();
        let label = format!(
            "qk_norm{}_rows d={d} rows {rows}+{rows_k}",
            if rope { "+rope" } else { "" }
        );
        let mut c = Check::new(
            format!("{label} vs pair kernel (bit-exact)"),
            &widen(&[&many_q[..nq], &many_k[..nk]].concat()),
            &widen(&[&one_q[..nq], &one_k[..nk]].concat()),
            0.0,
        );
        c.pass &= differ == 0 && tail_touched == 0;
        c.note = format!(
            "{differ} of {} bf16 values differ; {tail_touched} poisoned values past the rows written",
            nq + nk
        );
        out.push(c);
        let slots = kit.read_f32(many.slots.ptr(), 12)?;
        let pair_slots = kit.read_f32(one.slots.ptr(), 12)?;
        let mut a = amax_check(
            format!("{label}: q/k amax raised (bit-exact)"),
            &slots,
            &many_q[..nq],
            &many_k[..nk],
        );
        let same = slots
            .iter()
            .zip(&pair_slots)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        a.pass &= same;
        a.note = format!("{}; the pair kernel's slots equal: {same}", a.note);
        out.push(a);
    }
    Ok(())
}
