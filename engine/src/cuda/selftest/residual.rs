//! `engine selftest-cuda`'s check of the row step over a bf16 residual stream
//! (lever `residual = bf16`: `residual_norm_bf16x` and
//! `residual_norm_e4m3_bf16x` in `kernels/elementwise.cu`), from random rows
//! (normal, never zeros), against the CPU arm's arithmetic.
//!
//! Tolerances, argued before any run:
//! - the stream x after the step, against `bf16(x + y · gate)` computed on
//!   the host: **1e-3** relative. The device takes the sum as one fused
//!   multiply-add in f32 and rounds it once to bf16; the host rounds the
//!   product and the sum in f32, then to bf16, so a sum within an f32 ulp of a
//!   bf16 rounding boundary may land on the other neighbour (a relative step
//!   of 2^-8 on a few values in a million: ~1e-5 RMS). A step that skips the
//!   rounding writes f32 bits into a bf16 buffer (O(1)); one that skips the
//!   add is off by y (O(1)).
//! - h, the modulated norm of the rounded row, against the host's norm of its
//!   own rounded row: **5e-3**, the f32 stream's tolerance for the same
//!   expression (bf16 output rounding, 2^-9 RMS relative).
//! - the e4m3 step against the bf16 step's h quantized by
//!   `quantize_rows_e4m3`: **0** (one expression for h in both kernels), as
//!   on the f32 stream; and its x against the bf16 step's x: **0**.

use super::row_step::{row_cases, RowInputs};
use super::Check;
use crate::cuda::fixtures::Rng;
use crate::cuda::kit::bf16::rb;
use crate::cuda::kit::kernels::{ResidualStream, RowOut};
use crate::cuda::kit::memory::{download, DeviceBuffer};
use crate::cuda::kit::DeviceKit;
use crate::cuda::CudaError;

/// Relative tolerance of the bf16 stream after a step (see the module doc).
pub const STREAM_TOL: f64 = 1e-3;

/// Every mode, with and without a (gated) residual, at three widths.
pub fn check_residual_norm_bf16x(
    kit: &DeviceKit,
    rng: &mut Rng,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let (k, s) = (&kit.kernels, &kit.gpu.compute);
    for case in row_cases() {
        let inp = RowInputs::new(kit, rng, case, ResidualStream::Bf16)?;
        let (rows, d) = (inp.rows, case.d);
        let bf16_stream = |x: &DeviceBuffer| (x.ptr(), ResidualStream::Bf16);
        let (xa, ha) = (kit.bf16(&inp.x)?, kit.poisoned(rows * d * 2)?);
        inp.step(kit, bf16_stream(&xa), RowOut::Bf16(ha.ptr()))?;
        let xb = kit.bf16(&inp.x)?;
        let (qb, sb) = (kit.poisoned(rows * d)?, kit.poisoned(rows * 4)?);
        inp.step(
            kit,
            bf16_stream(&xb),
            RowOut::E4m3 {
                codes: qb.ptr(),
                scales: sb.ptr(),
            },
        )?;
        let (qa, sa) = (kit.poisoned(rows * d)?, kit.poisoned(rows * 4)?);
        k.quantize_rows_e4m3(s, ha.ptr(), rows, d, qa.ptr(), sa.ptr())?;
        // The host: the sum in f32, rounded once to bf16 (no add, no rounding:
        // x is bf16 already), and the norm of the rounded row.
        let rx = rb(&inp.host_sum());
        let rh = inp.host_h(&rx);
        let tag = format!("residual_norm bf16 stream {}", case.tag());
        let x_after = kit.read_bf16(xa.ptr(), rows * d)?;
        out.push(Check::new(format!("{tag} x"), &x_after, &rx, STREAM_TOL));
        out.push(Check::new(
            format!("{tag} h"),
            &kit.read_bf16(ha.ptr(), rows * d)?,
            &rh,
            5e-3,
        ));
        let codes = |q: &DeviceBuffer| download::<u8>(&kit.gpu, q.ptr(), rows * d);
        let (wc, gc) = (codes(&qa)?, codes(&qb)?);
        let differ = wc.iter().zip(&gc).filter(|(a, b)| a != b).count();
        let (ws, gs) = (kit.read_f32(sa.ptr(), rows)?, kit.read_f32(sb.ptr(), rows)?);
        let mut c = Check::new(format!("{tag} e4m3 scales (bit-exact)"), &gs, &ws, 0.0);
        c.pass &= differ == 0;
        c.note = format!("{differ} of {} codes differ", rows * d);
        out.push(c);
        out.push(Check::new(
            format!("{tag} e4m3 step's x vs the bf16 step's (bit-exact)"),
            &kit.read_bf16(xb.ptr(), rows * d)?,
            &x_after,
            0.0,
        ));
    }
    Ok(())
}
