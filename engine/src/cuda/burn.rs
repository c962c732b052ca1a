//! `engine burn --seconds S`: a known bf16 GEMM load (8192³ products on random
//! operands, back to back on the compute stream) for the harness's
//! GPU-utilization control. Reports the achieved rate from CUDA events.
//!
//! Through the marker protocol it says when the load runs, so a control samples
//! inside the load and not around it: `burn.setup` (the context, the kernels,
//! the operands and [`WARM_UP`] GEMMs waited for: first-use costs and the clock
//! ramp-up) then `burn.load` (the S seconds of load; its close carries
//! `gemms`, `device_ms` and `tflops`).

use std::time::Instant;

use crate::cuda::kit::context::Timer;
use crate::cuda::kit::gemm::{flops, Epilogue};
use crate::cuda::kit::kernels::NULL;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::DeviceKit;
use crate::cuda::CudaError;
use crate::phase::Recorder;
use evidence::attrs;

/// What a burn did.
#[derive(Debug, Clone)]
pub struct BurnReport {
    /// GEMMs run.
    pub gemms: usize,
    /// Wall seconds.
    pub wall_s: f64,
    /// Device milliseconds summed from events.
    pub device_ms: f64,
    /// Achieved TFLOP/s over the device time.
    pub tflops: f64,
}

/// Matrix side of the burn GEMM.
pub const N: usize = 8192;
/// GEMMs between host checks of the clock.
const BATCH: usize = 16;
/// GEMMs run and waited for inside `burn.setup`, before the load is announced.
pub const WARM_UP: usize = 8;

/// Run the load for at least `seconds` of wall time (batches of 16 GEMMs)
/// after setting up and warming up, marking both through `rec`.
pub fn burn(seconds: f64, rec: &Recorder) -> Result<BurnReport, CudaError> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(CudaError::Invalid(format!(
            "burn seconds must be positive, got {seconds}"
        )));
    }
    let setup = rec.phase("burn.setup", attrs! {"warm_up_gemms" => WARM_UP});
    let kit = DeviceKit::open()?;
    rec.attach_device(kit.gpu.mem.clone());
    let (g, k, s) = (&kit.gemm, &kit.kernels, &kit.gpu.compute);
    let a = DeviceBuffer::alloc(&kit.gpu, N * N * 2, "burn operand A")?;
    let b = DeviceBuffer::alloc(&kit.gpu, N * N * 2, "burn operand B")?;
    let c = DeviceBuffer::alloc(&kit.gpu, N * N * 2, "burn output")?;
    k.fill_uniform_bf16(s, a.ptr(), N * N, 0xb0, 1.0)?;
    k.fill_uniform_bf16(s, b.ptr(), N * N, 0xb1, 1.0)?;
    let timer = Timer::new(&kit.gpu)?;
    timer.start(s)?;
    for _ in 0..WARM_UP {
        g.linear(s, a.ptr(), b.ptr(), NULL, c.ptr(), N, N, N, Epilogue::None)?;
    }
    timer.stop(s)?;
    let warm_ms = timer.elapsed_ms()?;
    setup.finish(attrs! {
        "warm_up_device_ms" => warm_ms,
        "warm_up_tflops" => WARM_UP as f64 * flops(N, N, N) / (warm_ms * 1e9),
    });
    let load = rec.phase("burn.load", attrs! {"seconds" => seconds});
    let t0 = Instant::now();
    let (mut gemms, mut device_ms) = (0usize, 0.0f64);
    while t0.elapsed().as_secs_f64() < seconds {
        timer.start(s)?;
        for _ in 0..BATCH {
            g.linear(s, a.ptr(), b.ptr(), NULL, c.ptr(), N, N, N, Epilogue::None)?;
        }
        timer.stop(s)?;
        device_ms += timer.elapsed_ms()?;
        gemms += BATCH;
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let tflops = gemms as f64 * flops(N, N, N) / (device_ms * 1e9);
    load.finish(attrs! {"gemms" => gemms, "device_ms" => device_ms, "tflops" => tflops});
    Ok(BurnReport {
        gemms,
        wall_s,
        device_ms,
        tflops,
    })
}
