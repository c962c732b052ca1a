//! `engine selftest-cuda`'s check of the `guidance-batch` lever at the forward:
//! one forward over both samples of a guided step against two batch-1
//! forwards on the same arms and the same text caches, from random latents and
//! two random texts of different lengths (the prompt's and a shorter negative
//! prompt's), every workspace, cache and output byte NaN first.
//!
//! Tolerance, argued before any run. Every kernel computes a row or a head as
//! it does at batch 1 (the q/k norm, RoPE and both attentions run sample by
//! sample on the sample's own rows; the row passes read each row alone); only
//! the GEMMs see `2 n` rows, and cuBLASLt may pick another algorithm for that
//! `m`, whose f32 sums round to the other bf16 neighbour where they sit near a
//! boundary (a relative step of 2^-8 on ~1% of the outputs). On bf16 Linears
//! that moves a forward's velocity by ~5e-4 relative: tolerance
//! [`BATCHED_BF16_TOL`] (5e-3). On FP8 Linears the next Linear requantizes
//! its input, and a value moved across an e4m3 boundary moves by a whole step
//! (~6%): the `fp8-accum` check's argument, tolerance [`BATCHED_FP8_TOL`]
//! (3e-2). A sample that reads the other's text, keys, rows or RoPE positions,
//! or velocities written to the wrong half, move it by O(1). Where cuBLASLt
//! keeps its algorithm the two are bit-identical; the note counts the values
//! that differ.

use super::Check;
use crate::cuda::models::dit::{DeviceDit, ForwardArms, Geometry, GuidanceBatch, TextKvArm};
use crate::cuda::CudaError;

/// Relative tolerance of the batched forward against the pair on bf16 Linears.
pub const BATCHED_BF16_TOL: f64 = 5e-3;
/// Relative tolerance of the batched forward against the pair on FP8 Linears.
pub const BATCHED_FP8_TOL: f64 = 3e-2;

// Each below the gate it sits under: the bf16 forward's against the CPU arm
// (2e-2) and the fp8-accum check's (3e-2).
const _: () = assert!(BATCHED_BF16_TOL < 2e-2 && BATCHED_FP8_TOL <= 3e-2);

/// One sample's text: states f32 \[l, caption_channels\] and its mask \[l\].
pub type Text<'a> = (&'a [f32], &'a [f32]);

/// What the batched forward and the pair both read: the latents f32 [n, 128]
/// at `sigma` over `geo`, and the prompt's and the negative prompt's texts.
#[derive(Clone, Copy)]
pub struct BatchedInputs<'a> {
    /// The latents both samples read.
    pub lat: &'a [f32],
    /// The noise level.
    pub sigma: f32,
    /// The prompt's text, then the negative prompt's.
    pub texts: [Text<'a>; 2],
    /// The latent grid and fps.
    pub geo: Geometry,
}

/// Push the rows of the batched forward on `base` (with the text cache the
/// batched forward needs) against two batch-1 forwards over `inp`: one row
/// per sample, and the refusal of the batched arm without the cache. `what`
/// names the arms in the rows; `tol` is [`BATCHED_BF16_TOL`] or
/// [`BATCHED_FP8_TOL`]. Leaves `dit` on `base`.
pub fn check_batched_forward(
    dit: &mut DeviceDit,
    base: ForwardArms,
    what: &str,
    inp: &BatchedInputs<'_>,
    tol: f64,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let BatchedInputs {
        lat,
        sigma,
        texts,
        geo,
    } = *inp;
    let cached = ForwardArms {
        text_kv: TextKvArm::Cached,
        guidance: GuidanceBatch::Pair,
        ..base
    };
    let batched = ForwardArms {
        guidance: GuidanceBatch::Batched,
        ..cached
    };
    // The pair: each text alone, on the same cache arm.
    let mut pair = Vec::new();
    let mut pair_ms = 0.0;
    let mut pair_err = None;
    dit.set_arms(cached)?;
    for (text, mask) in texts {
        match dit.forward(lat, sigma, text, mask, geo, true) {
            Ok((v, ms)) => {
                pair.push(v);
                pair_ms += ms;
            }
            Err(e) => pair_err = Some(e.to_string()),
        }
    }
    let got = dit
        .set_arms(batched)
        .and_then(|_| dit.forward_batch(lat, sigma, &texts, geo, true));
    // Refused without the cache, before anything runs.
    let refused = dit.set_arms(ForwardArms {
        text_kv: TextKvArm::PerForward,
        ..batched
    });
    dit.set_arms(base)?;
    let samples = ["prompt", "negative prompt"];
    for (j, sample) in samples.iter().enumerate() {
        let name = format!("forward {what}: guidance-batch batched vs pair, {sample} sample");
        let row = match (&got, pair.get(j), &pair_err) {
            (Ok((v, ms)), Some(p), None) => {
                let mut c = Check::new(name, &v[j], p, tol);
                let differ = v[j]
                    .iter()
                    .zip(p)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                c.pass &= v.len() == 2 && v[j].len() == p.len();
                c.note = format!(
                    "{differ} of {} values differ; batched {ms:.2} ms, pair {pair_ms:.2} ms",
                    p.len()
                );
                c
            }
            (Err(e), _, _) => Check::failed(name, format!("the batched forward: {e}")),
            (_, _, Some(e)) => Check::failed(name, format!("a batch-1 forward: {e}")),
            (_, None, None) => Check::failed(name, "no batch-1 forward ran"),
        };
        out.push(row);
    }
    out.push(Check::refused(
        format!("forward {what}: guidance-batch batched without text-kv cached refused"),
        &refused,
        "text-kv=cached",
    ));
    Ok(())
}
