//! The cross-attention's text keys and values, computed once per text
//! (lever `text-kv`).
//!
//! Every block's cross-attention projects the same text to its keys (then
//! RMS-normed) and values on every forward: two GEMMs of `l` rows per block
//! (at 2B, 0.73 ms of a 47 ms fp8 forward at 82 TFLOP/s in s33-dev1's bench:
//! `l` = 128 rows use the tensor cores poorly) and the keys' norm. Neither
//! depends on the latents or the timestep. [`TextKvArm::Cached`] computes them
//! once per text ([`DeviceDit::prepare_text`], inside `load.dit` where the
//! denoiser readies its loop) into a [`TextKv`] the slot keeps, and the
//! forwards read it: the caption projection, the fp8 arm's text quantization,
//! the two GEMMs and the keys' norm leave the loop.
//!
//! The values are the per-forward arm's bit for bit: the same GEMMs (the same
//! cached plans, `m` = `l`), and the keys' norm row by row the same kernel (its
//! q side given no rows). The selftest holds the two arms' velocities to
//! tolerance 0. What changes is memory: `layers x 2 x l x D` bf16 per text (at
//! 13B with 128 tokens, 96 MiB a prompt), hence a lever arm and not a silent
//! default (issue 31).

use cudarc::driver::sys::CUdeviceptr;

use super::{slot, text_operand, DeviceDit, DitDims, Epilogue, Precision, QkNormArm, TextSlot};
use crate::cuda::kit::gemm::Accum;
use crate::cuda::kit::memory::{align_up, DeviceBuffer};
use crate::cuda::CudaError;

/// Where the cross-attention's text keys and values come from (lever
/// `text-kv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKvArm {
    /// Projected (and the keys normed) inside every forward.
    PerForward,
    /// Computed once per text by [`DeviceDit::prepare_text`], read by every
    /// forward.
    Cached,
}

impl TextKvArm {
    /// The lever arm's name (`per-forward`, `cached`).
    pub fn name(self) -> &'static str {
        match self {
            TextKvArm::PerForward => "per-forward",
            TextKvArm::Cached => "cached",
        }
    }
}

/// The arms a cache's values depend on: the Linears' number format and
/// accumulation, and the keys' norm kernel (its arms may differ in a last bit);
/// not the attention's precision, which leaves the cross-attention bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Built {
    precision: Precision,
    fp8_accum: Accum,
    qk_norm: QkNormArm,
    l: usize,
}

/// One text's cross-attention keys (after the blocks' key norm) and values for
/// every block: bf16 `[l, D]` each, block i's keys at slot `2i`, its values at
/// `2i + 1`.
pub struct TextKv {
    buf: DeviceBuffer,
    /// Bytes from one `[l, D]` matrix to the next (aligned).
    stride: usize,
    layers: usize,
    built: Built,
}

impl TextKv {
    /// Device bytes of a cache of `l` text tokens on `dims`.
    pub fn bytes_for(dims: &DitDims, l: usize) -> usize {
        2 * dims.layers * align_up(l * dims.dim() * 2)
    }

    /// Block `i`'s keys and values.
    pub(super) fn block(&self, i: usize) -> Result<(CUdeviceptr, CUdeviceptr), CudaError> {
        if i >= self.layers {
            return Err(CudaError::Invalid(format!(
                "the text K/V cache holds {} blocks, asked for block {i}",
                self.layers
            )));
        }
        let at = |j: usize| self.buf.ptr() + (j * self.stride) as u64;
        Ok((at(2 * i), at(2 * i + 1)))
    }
}

impl DeviceDit {
    /// Ready `text` for the forward's arms: with `text-kv = cached`, compute
    /// its cache (every block's keys and values, on the compute stream, the
    /// buffer poisoned with NaN first so a value left unwritten shows); with
    /// `per-forward`, drop any cache it holds. Needs the workspace
    /// ([`DeviceDit::workspace`]) of at least `text.l` tokens. Call again
    /// after [`DeviceDit::set_arms`] changes the precision, the accumulation
    /// or the q/k norm: a forward refuses a cache built under other arms.
    pub fn prepare_text(&self, text: &mut TextSlot) -> Result<(), CudaError> {
        text.kv = None;
        if self.arms.text_kv == TextKvArm::PerForward {
            return Ok(());
        }
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("a text cache before the workspace exists".into()))?;
        let (l, d) = (text.l, self.dims.dim());
        if l > ws.l || text.caption != self.dims.caption_channels {
            return Err(CudaError::Invalid(format!(
                "a text cache of {l} tokens of {} channels does not fit the workspace of {} \
                 tokens of {}",
                text.caption, ws.l, self.dims.caption_channels
            )));
        }
        let layers = self.w.blocks.len();
        let stride = align_up(l * d * 2);
        let buf = DeviceBuffer::alloc(
            &self.gpu,
            (2 * layers * stride).max(1),
            "the text's cross-attention keys and values",
        )?;
        buf.fill_bytes(&self.gpu, 0xFF, &self.gpu.compute)?;
        let kv = TextKv {
            buf,
            stride,
            layers,
            built: self.built(l),
        };
        let fp8 = self.project_text(ws, text)?;
        let text_in = text_operand(ws, fp8.map(|(_, _, text_q)| text_q));
        for (i, b) in self.w.blocks.iter().enumerate() {
            let q8 = match fp8 {
                Some((st, _, _)) => Some(st.block(i)?),
                None => None,
            };
            let (ck, cv) = kv.block(i)?;
            let a2 = &b.attn2;
            let tk = q8.map(|q| q[slot::CROSS_K]);
            let tv = q8.map(|q| q[slot::CROSS_V]);
            self.block_linear(text_in, &a2.to_k, tk, ck, l, Epilogue::Bias)?;
            self.block_linear(text_in, &a2.to_v, tv, cv, l, Epilogue::Bias)?;
            // The keys' norm alone: the forward's q/k norm with no q rows, so
            // each key row is what the per-forward launch writes.
            self.qk_norm((ws.q, a2.norm_q, 0), (ck, a2.norm_k, l), None, None)?;
        }
        text.kv = Some(kv);
        Ok(())
    }

    /// What a cache built now for `l` tokens depends on.
    fn built(&self, l: usize) -> Built {
        Built {
            precision: self.arms.precision,
            fp8_accum: self.arms.fp8_accum,
            qk_norm: self.arms.qk_norm,
            l,
        }
    }

    /// The cache a `text-kv = cached` forward reads: `text`'s, built under
    /// the current arms for its tokens over at least `blocks` blocks; an error
    /// naming what to do otherwise. None on `per-forward`.
    pub(super) fn text_kv<'a>(
        &self,
        text: &'a TextSlot,
        blocks: usize,
    ) -> Result<Option<&'a TextKv>, CudaError> {
        if self.arms.text_kv == TextKvArm::PerForward {
            return Ok(None);
        }
        match &text.kv {
            Some(kv) if kv.built == self.built(text.l) && kv.layers >= blocks => Ok(Some(kv)),
            Some(_) => Err(CudaError::Invalid(
                "text-kv = cached: this text's K/V cache was built under other arms \
                 (precision, fp8-accum or qk-norm); DeviceDit::prepare_text again"
                    .into(),
            )),
            None => Err(CudaError::Invalid(
                "text-kv = cached: this text has no K/V cache; DeviceDit::prepare_text first"
                    .into(),
            )),
        }
    }
}
