//! The guidance pair as one batch-2 forward (lever `guidance-batch`).
//!
//! With classifier-free guidance every step runs the transformer twice over
//! the same latents and timestep: once cross-attending to the prompt, once to
//! the negative prompt. [`GuidanceBatch::Pair`] runs them as two batch-1
//! forwards, one after the other (two graphs, two `dit.forward` ticks a
//! step). [`GuidanceBatch::Batched`] runs them as one forward over both
//! samples, as diffusers does: the rows of the two samples sit one after the
//! other in every per-token buffer (`2 n` rows), so each Linear is one GEMM of
//! `2 n` rows instead of two of `n` (arithmetic, not a measurement: with
//! 128 x 256 output tiles a 2B GEMM of N = 2048 at `n` = 6144 rows is 384 tiles,
//! ~2.9 waves of an H100's 132 SMs, and ~5.8 at `2 n`; every row pass and small
//! launch is issued once a step instead of twice). The bench's `guidance-batch
//! batched vs pair` row measures what that is worth. What is per
//! sample stays per sample: the q/k norm with RoPE (its positions are a token's
//! index in one sample's grid), the self-attention and the cross-attention to
//! that sample's own text (its length, key bias and cached keys and values).
//! The input projection and the timestep embedding are computed once: both
//! samples read the same latents at the same noise level.
//!
//! The batched forward reads each text's keys and values from its cache, so it
//! needs `text-kv = cached` ([`super::ForwardArms::conflict`] says so): the
//! text's projection has no place in a forward whose two samples attend to
//! texts of different lengths, and the cache computes the same values bit for
//! bit once per prompt.
//!
//! Numerics: every kernel computes a row or a head the same way at either
//! batch; only the GEMMs see `2 n` rows instead of `n`, and cuBLASLt may pick
//! another algorithm (tile shape, split) for that `m`, whose sums may differ in
//! their last bits. Hence a lever arm, `numerics = "changing"` in
//! `specs/levers.toml`, judged by the fidelity rule; the selftest holds the
//! batched velocities to the pair's at the GEMM-reordering tolerance.
//! Memory: the per-token workspace (and on `precision = fp8` the block inputs'
//! FP8 buffer) doubles; the FP8 attention's operands are reused sample by
//! sample.

/// How a guided step runs its two forwards (lever `guidance-batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuidanceBatch {
    /// Two batch-1 forwards, the negative prompt's first.
    Pair,
    /// One forward over both samples (the prompt's rows first, then the
    /// negative prompt's); needs `text-kv = cached`.
    Batched,
}

impl GuidanceBatch {
    /// The lever arm's name (`pair`, `batched`).
    pub fn name(self) -> &'static str {
        match self {
            GuidanceBatch::Pair => "pair",
            GuidanceBatch::Batched => "batched",
        }
    }

    /// Samples in one forward of a step with `prompts` prompts (1 without
    /// guidance, 2 with): 2 only when batched and guided.
    pub fn samples(self, prompts: usize) -> usize {
        match self {
            GuidanceBatch::Batched if prompts >= 2 => 2,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_batched_guided_step_runs_two_samples_in_one_forward() {
        assert_eq!(GuidanceBatch::Batched.samples(2), 2);
        assert_eq!(GuidanceBatch::Batched.samples(1), 1);
        assert_eq!(GuidanceBatch::Pair.samples(2), 1);
        assert_eq!(GuidanceBatch::Pair.samples(1), 1);
        assert_eq!(GuidanceBatch::Pair.name(), "pair");
        assert_eq!(GuidanceBatch::Batched.name(), "batched");
    }
}
