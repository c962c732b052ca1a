//! The bench's timing of the `guidance-batch` lever: a guided step's two
//! forwards as one forward over both samples against two batch-1 forwards, on
//! the same arms and the same text caches, in two interleaved rounds (the
//! selftest holds the two to the batched tolerance; here only their device
//! time). The negative prompt is the prompt's states under a shorter mask, as
//! an empty negative prompt is shorter than a prompt.

use cudarc::driver::sys::CUdeviceptr;

use super::time_ms;
use crate::cuda::fixtures::negative_mask;
use crate::cuda::kit::memory::DeviceBuffer;
use crate::cuda::kit::DeviceKit;
use crate::cuda::models::dit::{
    DeviceDit, ForwardArms, Geometry, GuidanceBatch, TextKvArm, TextSlot, Timestep, LATENT_CHANNELS,
};
use crate::cuda::CudaError;

/// Device milliseconds of one guided step's forwards on `arms` (with
/// `text-kv = cached`): `[batched, pair]`, each the mean of two interleaved
/// rounds' medians of `reps` runs, over the latents at `lat` (f32 [n, 128])
/// and the prompt `text`/`mask`. Leaves `dit` on `arms` with a workspace of
/// two samples.
pub fn batched_vs_pair_ms(
    kit: &DeviceKit,
    dit: &mut DeviceDit,
    (lat, geo): (CUdeviceptr, Geometry),
    (text, mask): (&[f32], &[f32]),
    arms: ForwardArms,
    reps: usize,
) -> Result<[f64; 2], CudaError> {
    let gpu = &kit.gpu;
    let dims = *dit.dims();
    let n = geo.grid.0 * geo.grid.1 * geo.grid.2;
    let mut cond = TextSlot::upload(gpu, &dims, text, mask)?;
    let mut neg = TextSlot::upload(gpu, &dims, text, &negative_mask(mask.len()))?;
    dit.workspace_for(n, mask.len(), 2)?;
    let per = (n * LATENT_CHANNELS * 4) as u64;
    let out = DeviceBuffer::alloc(gpu, 2 * per as usize, "the guided pair's velocities")?;
    let guidance = [GuidanceBatch::Batched, GuidanceBatch::Pair];
    let mut t = [0.0f64; 2];
    for _round in 0..2 {
        for (i, ti) in t.iter_mut().enumerate() {
            dit.set_arms(ForwardArms {
                text_kv: TextKvArm::Cached,
                guidance: guidance[i],
                ..arms
            })?;
            dit.prepare_text(&mut cond)?;
            dit.prepare_text(&mut neg)?;
            let (d, c, u) = (&*dit, &cond, &neg);
            let ts = Timestep::Sigma(0.5);
            *ti += time_ms(kit, 2, reps, || match guidance[i] {
                GuidanceBatch::Batched => d.enqueue_batch_at(lat, ts, geo, &[c, u], out.ptr()),
                GuidanceBatch::Pair => {
                    d.enqueue_at(lat, ts, geo, u, out.ptr() + per)?;
                    d.enqueue_at(lat, ts, geo, c, out.ptr())
                }
            })? / 2.0;
        }
    }
    dit.set_arms(arms)?;
    Ok(t)
}
