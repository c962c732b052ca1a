//! The CPU reference arm's video decoder: the `models` VAE decoder in f32 on
//! the host, behind [`Decoder`], in temporal chunks of
//! [`DECODE_CHUNK_LATENT_FRAMES`] latent frames.

use anyhow::Context;
use evidence::attrs;
use evidence::marker::Attrs;

use crate::arms::{ChunkEnd, Decoded, Decoder};
use crate::models::vae::VaeDecoder;
use crate::tensor::Tensor;

/// Latent frames the host decodes per temporal chunk.
pub const DECODE_CHUNK_LATENT_FRAMES: usize = 1;

/// The host VAE decoder and the stored bytes `widen-f32 = double` keeps
/// beside its f32 copies while it lives (empty under `single`).
pub struct HostVae {
    model: VaeDecoder,
    kept: Vec<Vec<u8>>,
}

impl HostVae {
    /// Decode with `model`, keeping `kept` alive as long as it.
    pub fn new(model: VaeDecoder, kept: Vec<Vec<u8>>) -> HostVae {
        HostVae { model, kept }
    }
}

impl Decoder for HostVae {
    fn arm(&self) -> &'static str {
        "cpu"
    }

    fn latent_stats(&self) -> (&[f32], &[f32]) {
        (self.model.latents_mean(), self.model.latents_std())
    }

    fn chunk_latent_frames(&self) -> usize {
        DECODE_CHUNK_LATENT_FRAMES
    }

    fn decode_clip(
        self: Box<Self>,
        z: Tensor,
        timestep: f32,
        on_chunk: &mut dyn FnMut(ChunkEnd),
    ) -> anyhow::Result<(Decoded, Attrs)> {
        let chunks = z
            .shape()
            .get(1)
            .copied()
            .unwrap_or(0)
            .div_ceil(DECODE_CHUNK_LATENT_FRAMES);
        let mut report = |index: usize| {
            on_chunk(ChunkEnd {
                index,
                chunks,
                device_ms: None,
                frames: None,
                host: None,
            })
        };
        let HostVae { model, kept } = *self;
        let px = model
            .decode_chunked(&z, timestep, DECODE_CHUNK_LATENT_FRAMES, &mut report)
            .context("VAE decode")?;
        // Freeing the model is the last chunk's work too.
        drop(model);
        drop(kept);
        drop(z);
        let frames = px.shape().get(1).copied().unwrap_or(0);
        Ok((Decoded::Pixels(px), attrs! {"frames" => frames}))
    }
}
