//! The FP8 GEMM rates the `precision` and `fp8-accum` levers depend on, beside
//! bf16, at the block Linears' shapes of a 6144-token forward: per-row
//! (outer-vector) scales as the engine runs them and per-tensor scales, each
//! with cuBLASLt's default accumulation and with `FAST_ACCUM` ([`Accum`]).
//!
//! Operands are random bf16 values quantized on the device by the engine's own
//! kernel, so the codes are realistic (no NaN codes, full e4m3 range). The GEMM
//! cells time the GEMM alone (the forward rows say what the arm does); the
//! input's quantize pass is timed on its own beside them, in GB/s at 3 bytes an
//! element (the bf16 row read once, its codes written), to read against the
//! `ceiling  d2d copy` row of the same call.

use crate::cuda::bench::{push, time_ms};
use crate::cuda::kit::fp8::Fp8Rows;
use crate::cuda::kit::gemm::{flops, Accum, Epilogue, Fp8Scaling};
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::DitDims;
use crate::cuda::CudaError;

/// Tokens of the reference geometry (768x512x121).
const TOKENS: usize = 6144;

/// (label, n, k, epilogue) of a block's Linears at width `d`: the fused q|k|v,
/// an attention output (d x d), the feed-forward up (with its GELU) and down.
fn shapes(d: usize) -> [(&'static str, usize, usize, Epilogue); 4] {
    [
        ("q|k|v", 3 * d, d, Epilogue::Bias),
        ("out", d, d, Epilogue::Bias),
        ("ff up+gelu", 4 * d, d, Epilogue::BiasGelu),
        ("ff down", d, 4 * d, Epilogue::Bias),
    ]
}

/// One row per model and shape: TFLOP/s of bf16, fp8 row-scaled exact and
/// fast, fp8 tensor-scaled exact and fast, and the fast/exact speedup of the
/// row-scaled product (the `fp8-accum` lever's GEMM-level effect). A
/// configuration cuBLASLt refuses prints as `refused` with the reason after
/// the table row; the other rows still run.
pub fn fp8_gemms(kit: &DeviceKit, rows: &mut Vec<String>) -> Result<(), CudaError> {
    if kit.gpu.capability < crate::cuda::kit::fp8::MIN_CAPABILITY {
        push(
            rows,
            format!(
                "fp8gemm  not run: compute capability {}.{} has no FP8 tensor cores",
                kit.gpu.capability.0, kit.gpu.capability.1
            ),
        );
        return Ok(());
    }
    let (gpu, g, kn, s) = (&kit.gpu, &kit.gemm, &kit.kernels, &kit.gpu.compute);
    for (model, dims) in [
        ("ltxv-2b", DitDims::LTXV_2B),
        ("ltxv-13b", DitDims::LTXV_13B),
    ] {
        let d = dims.dim();
        for (label, n, k, ep) in shapes(d) {
            let m = TOKENS;
            let x = DeviceBuffer::alloc(gpu, m * k * 2, "an fp8 bench input")?;
            let w = DeviceBuffer::alloc(gpu, n * k * 2, "an fp8 bench weight")?;
            let b = DeviceBuffer::alloc(gpu, n * 2, "an fp8 bench bias")?;
            let y = DeviceBuffer::alloc(gpu, m * n * 2, "an fp8 bench output")?;
            kn.fill_uniform_bf16(s, x.ptr(), m * k, 11, 1.0)?;
            kn.fill_uniform_bf16(s, w.ptr(), n * k, 12, 1.0 / (k as f32).sqrt())?;
            kn.fill_uniform_bf16(s, b.ptr(), n, 13, 0.1)?;
            let (xq, wq) = (
                Fp8Rows::new(gpu, m, k, "an fp8 bench input")?,
                Fp8Rows::new(gpu, n, k, "an fp8 bench weight")?,
            );
            let xo = xq.quantize(gpu, kn, x.ptr(), m, k)?;
            let wo = wq.quantize(gpu, kn, w.ptr(), n, k)?;
            let quantize_ms = time_ms(kit, 3, 10, || {
                xq.quantize(gpu, kn, x.ptr(), m, k).map(|_| ())
            })?;
            let f = flops(m, n, k);
            let rate = |ms: f64| f / ms / 1e9;
            let bf16 = time_ms(kit, 3, 10, || {
                g.linear(s, x.ptr(), w.ptr(), b.ptr(), y.ptr(), m, n, k, ep)
            })?;
            // Row-scaled and tensor-scaled (the first scale of each row buffer
            // stands for the whole tensor), each exact and fast.
            let mut cells = Vec::new();
            let mut notes = Vec::new();
            let mut row_ms = [f64::NAN; 2];
            for scaling in [Fp8Scaling::Row, Fp8Scaling::Tensor] {
                let tensor = scaling == Fp8Scaling::Tensor;
                for (i, accum) in [Accum::Exact, Accum::Fast].into_iter().enumerate() {
                    let r = time_ms(kit, 3, 10, || {
                        let (bp, yp) = (b.ptr(), y.ptr());
                        g.linear_fp8_scaled(s, xo, wo, bp, yp, (m, n, k), ep, (scaling, accum))
                            .map(|_| ())
                    });
                    let name =
                        format!("{}/{}", if tensor { "tensor" } else { "row" }, accum.name());
                    match r {
                        Ok(ms) => {
                            if !tensor {
                                row_ms[i] = ms;
                            }
                            // A refused fast plan runs exact: say so in the cell.
                            let ran_exact = accum == Accum::Fast
                                && g.fast_refused(scaling).contains(&(m, n, k));
                            cells.push(format!(
                                "{name} {:>5.0}{}",
                                rate(ms),
                                if ran_exact { " (ran exact)" } else { "" }
                            ));
                        }
                        Err(e) => {
                            cells.push(format!("{name} refused"));
                            notes.push(format!("{name}: {e}"));
                        }
                    }
                }
            }
            push(
                rows,
                format!(
                    "fp8gemm  {model} {label:<10} m={m} n={n} k={k}: TFLOP/s bf16 {:>5.0} | {} | \
                     row fast/exact time {:.3} | input quantize {:.3} ms, {:.0} GB/s",
                    rate(bf16),
                    cells.join(" | "),
                    row_ms[1] / row_ms[0],
                    quantize_ms,
                    3.0 * (m * k) as f64 / quantize_ms / 1e6
                ),
            );
            for n in notes {
                push(rows, format!("fp8gemm  {model} {label}: {n}"));
            }
        }
    }
    Ok(())
}
