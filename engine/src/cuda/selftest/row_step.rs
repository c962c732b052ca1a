//! What the row step's checks share (`residual_norm` over an f32 stream in
//! `dit::check_residual_norm`, over a bf16 stream in `residual`): the cases
//! (widths, modes, with and without a gated residual), their random inputs
//! (normal, never zeros) on the host and the device, one launch of the step,
//! and the CPU arm's expression of it.

use cudarc::driver::sys::CUdeviceptr;

use crate::cuda::fixtures::Rng;
use crate::cuda::kit::bf16::rb;
use crate::cuda::kit::kernels::{ResidualStream, RowMode, RowOut, NULL};
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::DeviceKit;
use crate::cuda::CudaError;
use crate::models::dit::OUT_NORM_EPS;
use crate::ops::norm::{layer_norm_rows, modulate_rows, rms_norm_rows};

/// Epsilon of the blocks' RMS norms in the released configs (`norm_eps`).
pub fn block_norm_eps() -> f32 {
    crate::presets::dit_2b().norm_eps as f32
}

/// The CPU arm's modulated norm of `x` rows: `norm(x) * (1 + scale) + shift`
/// (LayerNorm with the output norm's epsilon when `center`, else RMS with
/// the blocks'; no affine).
pub fn ref_norm_mod(x: &[f32], d: usize, center: bool, shift: &[f32], scale: &[f32]) -> Vec<f32> {
    let mut h = x.to_vec();
    if center {
        layer_norm_rows(&mut h, d, OUT_NORM_EPS, None, None);
    } else {
        rms_norm_rows(&mut h, d, None, block_norm_eps());
    }
    modulate_rows(&mut h, scale, shift);
    h
}

/// One configuration of the row step.
#[derive(Debug, Clone, Copy)]
pub struct RowCase {
    /// Row width.
    pub d: usize,
    /// What h is.
    pub mode: RowMode,
    /// The mode's name in the checks' names.
    pub name: &'static str,
    /// Whether a residual y is added.
    pub with_y: bool,
    /// Whether that residual is gated.
    pub gated: bool,
}

impl RowCase {
    /// The checks' name prefix.
    pub fn tag(&self) -> String {
        format!(
            "{} d={} y={} gate={}",
            self.name, self.d, self.with_y, self.gated
        )
    }

    fn eps(&self) -> f32 {
        if self.mode == RowMode::LayerNorm {
            OUT_NORM_EPS
        } else {
            block_norm_eps()
        }
    }
}

/// Every mode at widths 64, 2048 and 4096, with a gated residual, an ungated
/// one and (except the cast, which then does nothing) none.
pub fn row_cases() -> Vec<RowCase> {
    let mut v = Vec::new();
    for d in [64usize, 2048, 4096] {
        for (mode, name) in [
            (RowMode::Cast, "cast"),
            (RowMode::Rms, "rms"),
            (RowMode::LayerNorm, "layernorm"),
        ] {
            for (with_y, gated) in [(true, true), (true, false), (false, false)] {
                if !with_y && mode == RowMode::Cast {
                    continue;
                }
                v.push(RowCase {
                    d,
                    mode,
                    name,
                    with_y,
                    gated,
                });
            }
        }
    }
    v
}

/// One case's random inputs: 19 rows of x (normal, offset 0.2; rounded to
/// bf16 for a bf16 stream), y (bf16) and the six bf16 table rows (shift,
/// scale, their embedding halves, the gate's two halves), with y and the
/// tables on the device.
pub struct RowInputs {
    /// The case.
    pub case: RowCase,
    /// Rows.
    pub rows: usize,
    /// The stream before the step.
    pub x: Vec<f32>,
    y: Vec<f32>,
    t: Vec<Vec<f32>>,
    yd: DeviceBuffer,
    td: Vec<DeviceBuffer>,
}

impl RowInputs {
    /// Draw a case's inputs from `rng` (x, then y, then the tables).
    pub fn new(
        kit: &DeviceKit,
        rng: &mut Rng,
        case: RowCase,
        stream: ResidualStream,
    ) -> Result<RowInputs, CudaError> {
        let (rows, d) = (19, case.d);
        let mut x: Vec<f32> = rng.normal(rows * d, 1.5).iter().map(|v| v + 0.2).collect();
        if stream == ResidualStream::Bf16 {
            x = rb(&x);
        }
        let y = rb(&rng.normal(rows * d, 1.0));
        let t: Vec<Vec<f32>> = (0..6).map(|_| rb(&rng.uniform(d, -0.5, 0.5))).collect();
        let yd = kit.bf16(&y)?;
        let td = t.iter().map(|v| kit.bf16(v)).collect::<Result<_, _>>()?;
        Ok(RowInputs {
            case,
            rows,
            x,
            y,
            t,
            yd,
            td,
        })
    }

    /// One step of the case over the stream `x` into `out`.
    pub fn step(
        &self,
        kit: &DeviceKit,
        x: (CUdeviceptr, ResidualStream),
        out: RowOut,
    ) -> Result<(), CudaError> {
        let c = &self.case;
        let td = &self.td;
        let gate = if c.gated {
            (td[4].ptr(), td[5].ptr())
        } else {
            (NULL, NULL)
        };
        kit.kernels.residual_norm(
            &kit.gpu.compute,
            x,
            if c.with_y { self.yd.ptr() } else { NULL },
            gate,
            self.rows,
            c.d,
            c.mode,
            c.eps(),
            (td[0].ptr(), td[2].ptr()),
            (td[1].ptr(), td[3].ptr()),
            out,
        )
    }

    /// The CPU arm's stream after the step: x + y · gate in f32 (unrounded).
    pub fn host_sum(&self) -> Vec<f32> {
        let (c, t) = (&self.case, &self.t);
        let mut rx = self.x.clone();
        if c.with_y {
            for (i, v) in rx.iter_mut().enumerate() {
                let g = if c.gated {
                    t[4][i % c.d] + t[5][i % c.d]
                } else {
                    1.0
                };
                *v += self.y[i] * g;
            }
        }
        rx
    }

    /// The CPU arm's h of the stream `rx`: itself (cast) or its modulated norm.
    pub fn host_h(&self, rx: &[f32]) -> Vec<f32> {
        let (c, t) = (&self.case, &self.t);
        match c.mode {
            RowMode::Cast => rx.to_vec(),
            _ => {
                let shift: Vec<f32> = (0..c.d).map(|j| t[0][j] + t[2][j]).collect();
                let scale: Vec<f32> = (0..c.d).map(|j| t[1][j] + t[3][j]).collect();
                ref_norm_mod(rx, c.d, c.mode == RowMode::LayerNorm, &shift, &scale)
            }
        }
    }
}
