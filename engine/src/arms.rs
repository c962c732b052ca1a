//! The render's three arms behind traits: the text encoder ([`TextEncoder`]),
//! the denoise loop ([`crate::denoise::Denoiser`]) and the video decoder
//! ([`Decoder`]). [`crate::pipeline`] drives these, never an arm's own type:
//! the CPU reference arm implements them in [`crate::cpu`], the CUDA arm in
//! `cuda` (`DeviceT5`, `CudaDenoiser`, `DeviceVae`), and the levers pick which
//! one a render loads.

use evidence::marker::Attrs;

use crate::conditioning::{ConditioningError, Encoded, KeyRule};
use crate::frames::Frame;
use crate::tensor::Tensor;
use crate::text::tokenizer::PromptTokenizer;

/// A loaded text encoder: prompts in, encoder states out.
pub trait TextEncoder {
    /// `cpu` or `cuda`.
    fn arm(&self) -> &'static str;

    /// Tokenize `prompts` with `tok` and encode them with `rule`: one
    /// [`Encoded`] per prompt, in order, and on a device the forwards' device
    /// milliseconds (CUDA events).
    fn encode(
        &mut self,
        tok: &PromptTokenizer,
        prompts: &[&str],
        rule: KeyRule,
    ) -> Result<(Vec<Encoded>, Option<f64>), ConditioningError>;
}

/// What a decoder hands to `artifacts.frames`.
pub enum Decoded {
    /// An f32 clip `[3, F, H, W]` in [-1, 1], converted to 8-bit frames by the
    /// pipeline (the CPU arm).
    Pixels(Tensor),
    /// RGB8 frames, converted where they were decoded (the CUDA arm).
    Frames(Vec<Frame>),
}

/// The end of one temporal chunk of a decode, as the decoder reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkEnd {
    /// The chunk (0-based).
    pub index: usize,
    /// Chunks in the decode.
    pub chunks: usize,
    /// The chunk's device milliseconds (CUDA events), on a device.
    pub device_ms: Option<f64>,
    /// Frames the chunk produced, where the decoder counts them per chunk.
    pub frames: Option<usize>,
    /// Where the chunk's host time went, where the decoder splits it (the
    /// device arm).
    pub host: Option<ChunkHost>,
}

/// The host side of one device chunk: what the wall of a `decode.video.chunk`
/// holds besides the device's work, so a bundle tells a host-bound decode from a
/// device-bound one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkHost {
    /// Milliseconds not spent waiting for the device: plans, launches, frame
    /// copies to the host.
    pub enqueue_ms: f64,
    /// Milliseconds blocked waiting for the device.
    pub wait_ms: f64,
    /// cuDNN convolution plans built in the chunk (a shape's first use).
    pub plans_built: usize,
    /// Milliseconds those plans took (inside `enqueue_ms`).
    pub plan_ms: f64,
    /// How many of those plans ran cuDNN's algorithm heuristic; the others reused
    /// the algorithm chosen for the same convolution at another frame count.
    pub plans_searched: usize,
}

impl ChunkEnd {
    /// The attributes of the chunk's `decode.video.chunk` close.
    pub fn attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        if let Some(ms) = self.device_ms {
            a.insert(
                evidence::marker::attr::DEVICE_MS.into(),
                serde_json::Value::from(ms),
            );
        }
        if let Some(f) = self.frames {
            a.insert("frames".into(), serde_json::Value::from(f));
        }
        if let Some(h) = self.host {
            a.insert("enqueue_ms".into(), serde_json::Value::from(h.enqueue_ms));
            a.insert("wait_ms".into(), serde_json::Value::from(h.wait_ms));
            a.insert("plans_built".into(), serde_json::Value::from(h.plans_built));
            a.insert("plan_ms".into(), serde_json::Value::from(h.plan_ms));
            a.insert(
                "plans_searched".into(),
                serde_json::Value::from(h.plans_searched),
            );
        }
        a
    }
}

/// A loaded video VAE decoder.
pub trait Decoder {
    /// `cpu` or `cuda`.
    fn arm(&self) -> &'static str;

    /// The per-channel latent mean and standard deviation its checkpoint
    /// carries (the pipeline denormalizes the latents with them).
    fn latent_stats(&self) -> (&[f32], &[f32]);

    /// Latent frames per temporal chunk.
    fn chunk_latent_frames(&self) -> usize;

    /// What the `decode.video` open says besides the chunking and the arm
    /// (the CUDA arm's convolution path).
    fn open_attrs(&self) -> Attrs {
        Attrs::new()
    }

    /// Decode `z` (`[C, f, h, w]`, denormalized) at `timestep`, calling
    /// `on_chunk` as each temporal chunk ends, in order. Consumes the decoder:
    /// its memory is freed before this returns, inside the phase. Returns the
    /// clip and what the `decode.video` close says of it.
    fn decode_clip(
        self: Box<Self>,
        z: Tensor,
        timestep: f32,
        on_chunk: &mut dyn FnMut(ChunkEnd),
    ) -> anyhow::Result<(Decoded, Attrs)>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device chunk's close carries where its host time went; a host chunk
    /// (no split) carries none of those keys, never zeros.
    #[test]
    fn a_chunk_close_says_where_its_host_time_went_only_when_measured() {
        let mut end = ChunkEnd {
            index: 3,
            chunks: 4,
            device_ms: Some(234.9),
            frames: Some(41),
            host: Some(ChunkHost {
                enqueue_ms: 118.25,
                wait_ms: 236.5,
                plans_built: 7,
                plan_ms: 3.75,
                plans_searched: 2,
            }),
        };
        let a = end.attrs();
        assert_eq!(a["enqueue_ms"], 118.25);
        assert_eq!(a["wait_ms"], 236.5);
        assert_eq!(a["plans_built"], 7);
        assert_eq!(a["plan_ms"], 3.75);
        assert_eq!(a["plans_searched"], 2);
        assert_eq!(a["frames"], 41);
        end.host = None;
        end.device_ms = None;
        let a = end.attrs();
        for k in [
            "enqueue_ms",
            "wait_ms",
            "plans_built",
            "plan_ms",
            "plans_searched",
            "device_ms",
        ] {
            assert!(!a.contains_key(k), "{k} without a measurement: {a:?}");
        }
    }
}
