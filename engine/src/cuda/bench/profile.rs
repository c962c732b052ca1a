//! The forward's time by operation class, measured in place: one whole forward
//! with a CUDA event recorded after each of its operations
//! ([`DeviceDit::enqueue_profiled`]), the device time between consecutive events
//! summed per class. Unlike the parts measured alone (a GEMM shape timed in a
//! loop of itself), this sees each kernel where it runs, after the kernels that
//! run before it (caches, clocks), so "other" is split into its row passes and
//! the cross-attention instead of being a remainder. The events add a few
//! microseconds per operation; the row says the probed forward's total beside
//! the unprobed one.

use std::cell::RefCell;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaEvent;

use crate::cuda::bench::median;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::{DeviceDit, DitDims, Geometry, TextSlot};
use crate::cuda::{CudaError, DriverContext};

/// Device milliseconds per operation class of one forward, in the order the
/// classes first run (the median over the measured forwards, per class).
pub type Profile = Vec<(&'static str, f64)>;

/// One forward of `dit` with an event after each operation, `reps` times after
/// one warm-up: per class, the median of its per-forward sum (ms).
pub fn forward_profile(
    kit: &DeviceKit,
    dit: &DeviceDit,
    (lat, out): (CUdeviceptr, CUdeviceptr),
    geo: Geometry,
    text: &TextSlot,
    reps: usize,
) -> Result<Profile, CudaError> {
    let gpu = &kit.gpu;
    let mut per: Vec<(&'static str, Vec<f64>)> = Vec::new();
    for rep in 0..=reps {
        let marks: RefCell<Vec<(&'static str, CudaEvent)>> = RefCell::new(Vec::new());
        let start = gpu.event()?;
        start
            .record(&gpu.compute)
            .ctx("recording the profile's start")?;
        let probe = |class: &'static str| -> Result<(), CudaError> {
            let e = gpu.event()?;
            e.record(&gpu.compute).ctx("recording a profile event")?;
            marks.borrow_mut().push((class, e));
            Ok(())
        };
        dit.enqueue_profiled(lat, 0.5, geo, text, out, &probe)?;
        gpu.sync_compute()?;
        if rep == 0 {
            continue;
        }
        let marks = marks.into_inner();
        let mut sums: Vec<(&'static str, f64)> = Vec::new();
        let mut from = &start;
        for (class, e) in &marks {
            let ms = from.elapsed_ms(e).ctx("reading a profile event")? as f64;
            match sums.iter_mut().find(|(c, _)| c == class) {
                Some(s) => s.1 += ms,
                None => sums.push((class, ms)),
            }
            from = e;
        }
        for (class, ms) in sums {
            match per.iter_mut().find(|(c, _)| *c == class) {
                Some(p) => p.1.push(ms),
                None => per.push((class, vec![ms])),
            }
        }
    }
    Ok(per.into_iter().map(|(c, v)| (c, median(v))).collect())
}

/// The work one forward of `dims` over `n` tokens and `l` text tokens does in
/// `class`: FLOPs for GEMMs and attention, bytes moved for the row passes
/// (reads + writes, the kernels' own traffic); `None` for a class without a
/// simple count.
pub fn class_work(dims: &DitDims, n: usize, l: usize, class: &str) -> Option<Work> {
    let (d, layers) = (dims.dim() as f64, dims.layers as f64);
    let (n, l) = (n as f64, l as f64);
    let gemm = |rows: f64, out: f64, inp: f64, count: f64| {
        Work::Flop(2.0 * rows * out * inp * count * layers)
    };
    let (_, sa, ca) = dims.forward_flops(n as usize, l as usize);
    Some(match class {
        "gemm q|k|v" => gemm(n, d, d, 3.0),
        "gemm out" => gemm(n, d, d, 2.0),
        "gemm q (cross)" => gemm(n, d, d, 1.0),
        "gemm k|v (text)" => gemm(l, d, d, 2.0),
        "gemm ff up + gelu" => gemm(n, 4.0 * d, d, 1.0),
        "gemm ff down" => gemm(n, d, 4.0 * d, 1.0),
        "self-attention" => Work::Flop(sa),
        "cross-attention" => Work::Flop(ca),
        // x f32 read and written, y bf16 read, h bf16 written: 12 bytes per
        // element, three passes per block. Counted for bf16 h: the fp8 arm's
        // fused steps write 1-byte codes (11 bytes: their GB/s reads ~8% low);
        // its separate path (`NormQuantize::Separate`) runs the quantize pass
        // inside this class too (~5 bytes more, not counted).
        "residual + norm" => Work::Bytes(3.0 * 12.0 * n * d * layers),
        // q and k: bf16 read twice (the norm's sum, then the scaled write; the
        // second read from cache) and written once: counted 4 bytes each.
        "q/k norm + rope" => Work::Bytes(2.0 * 4.0 * n * d * layers),
        "q/k norm (cross)" => Work::Bytes(4.0 * (n + l) * d * layers),
        // `attention-precision = fp8`: v bf16 read by the amax pass (q's and
        // k's amax come from the q/k norm, `OperandAmax::Folded`), q, k, v read
        // by the quantize pass (8 bytes), their codes written (3). The slots'
        // zeroing is in the q/k norm's class.
        "fp8 attention operands" => Work::Bytes(11.0 * n * d * layers),
        _ => return None,
    })
}

/// What a class does per forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// Floating-point operations.
    Flop(f64),
    /// Bytes read and written by the kernels.
    Bytes(f64),
}

/// One line per class: ms per forward, share of the probed total, and the
/// rate (TFLOP/s or GB/s) where [`class_work`] counts the work.
pub fn profile_rows(
    label: &str,
    dims: &DitDims,
    (n, l): (usize, usize),
    prof: &Profile,
    unprobed_ms: f64,
) -> Vec<String> {
    let total: f64 = prof.iter().map(|(_, ms)| ms).sum();
    let mut rows = vec![format!(
        "forward  {label} in place (an event after each op): {total:.1} ms probed vs {unprobed_ms:.1} ms unprobed"
    )];
    for (class, ms) in prof {
        let rate = match class_work(dims, n, l, class) {
            Some(Work::Flop(f)) => format!("{:.0} TFLOP/s", f / ms / 1e9),
            Some(Work::Bytes(b)) => format!("{:.0} GB/s", b / ms / 1e6),
            None => String::new(),
        };
        rows.push(format!(
            "forward  {label} in place: {class:<36} {ms:>8.2} ms {:>5.1}%  {rate}",
            100.0 * ms / total
        ));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_work_counts_the_forward_flops() {
        // The GEMM classes sum to the forward's linear FLOPs less the
        // input/output projections and the embeddings (counted apart).
        let d = DitDims::LTXV_2B;
        let (n, l) = (6144, 128);
        let (lin, sa, ca) = d.forward_flops(n, l);
        let classes = [
            "gemm q|k|v",
            "gemm out",
            "gemm q (cross)",
            "gemm k|v (text)",
            "gemm ff up + gelu",
            "gemm ff down",
        ];
        let gemms: f64 = classes
            .iter()
            .map(|c| match class_work(&d, n, l, c) {
                Some(Work::Flop(f)) => f,
                other => panic!("{c}: {other:?}"),
            })
            .sum();
        assert!(gemms < lin && gemms > 0.97 * lin, "{gemms} vs {lin}");
        assert_eq!(class_work(&d, n, l, "self-attention"), Some(Work::Flop(sa)));
        assert_eq!(
            class_work(&d, n, l, "cross-attention"),
            Some(Work::Flop(ca))
        );
        assert!(matches!(
            class_work(&d, n, l, "residual + norm"),
            Some(Work::Bytes(b)) if b == 36.0 * (n * d.dim() * d.layers) as f64
        ));
        assert_eq!(class_work(&d, n, l, "output projection"), None);
    }

    #[test]
    fn rows_give_each_class_its_share_and_rate() {
        let d = DitDims::LTXV_2B;
        let prof: Profile = vec![("gemm q|k|v", 6.0), ("residual + norm", 4.0)];
        let rows = profile_rows("ltxv-2b mma", &d, (6144, 128), &prof, 9.5);
        assert!(
            rows[0].contains("10.0 ms probed vs 9.5 ms unprobed"),
            "{}",
            rows[0]
        );
        assert!(rows[1].contains("60.0%"), "{}", rows[1]);
        assert!(
            rows[2].contains("40.0%") && rows[2].contains("GB/s"),
            "{}",
            rows[2]
        );
        // 3 x 2 x 6144 x 2048² x 28 FLOP in 6 ms.
        let tflops = 3.0 * 2.0 * 6144.0 * 2048.0f64.powi(2) * 28.0 / 6.0 / 1e9;
        assert!(
            rows[1].contains(&format!("{tflops:.0} TFLOP/s")),
            "{}",
            rows[1]
        );
    }
}
