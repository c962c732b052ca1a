//! The decode's convolution shapes, without its work: [`ShapeOps`] is a
//! backend of the stream that computes nothing and records every 3x3x3
//! convolution the stream asks for, in call order. The device's cuDNN path
//! builds one plan per distinct shape, at the shape's first use, and runs the
//! algorithm heuristic once per convolution `(ci, co, h, w)` (the other frame
//! counts reuse its algorithm). So [`conv3_shapes`] says, for any latent
//! geometry and chunking, how many plans and heuristic calls each chunk of a
//! decode costs, and in which order, before a GPU is touched: what building
//! the plans ahead of the decode would have to build.

use std::collections::BTreeSet;

use crate::cuda::models::vae::ops::{DecoderW, HasBias, Loc, Mutation, NormOp, VaeOps};
use crate::cuda::models::vae::stream::Stream;
use crate::cuda::CudaError;
use crate::models::vae::VaeConfig;

/// One 3x3x3 convolution as the cuDNN path keys its plans:
/// `(ci, co, frames_in, h, w)`.
pub type ConvShape = (usize, usize, usize, usize, usize);

/// A convolution's channels and kernel, nothing else.
#[derive(Debug, Clone, Copy)]
pub struct ShapeConv {
    ci: usize,
    co: usize,
}

impl HasBias<()> for ShapeConv {
    fn bias(&self) -> &() {
        &()
    }
}

/// The backend that records: buffers are ids, every primitive is a no-op but
/// [`VaeOps::conv3`], which appends its shape, and [`VaeOps::pixels`], which
/// appends how many frames it hands out.
#[derive(Debug, Default)]
pub struct ShapeOps {
    buffers: usize,
    /// The 3x3x3 convolutions asked for so far, in call order (repeats kept).
    pub conv3: Vec<ConvShape>,
    /// The frames of each pixel hand-out so far, in call order.
    pub pixels: Vec<usize>,
}

impl VaeOps for ShapeOps {
    type Vec = ();
    type Conv = ShapeConv;
    type Mod = ();

    fn alloc(&mut self, _elems: usize, _what: &str) -> Result<usize, CudaError> {
        self.buffers += 1;
        Ok(self.buffers - 1)
    }
    fn copy(&mut self, _src: Loc, _dst: Loc, _elems: usize) -> Result<(), CudaError> {
        Ok(())
    }
    fn upload(&mut self, _dst: Loc, _data: &[f32]) -> Result<(), CudaError> {
        Ok(())
    }
    fn conv3(
        &mut self,
        conv: &ShapeConv,
        _x: Loc,
        frames_in: usize,
        h: usize,
        w: usize,
        _y: Loc,
    ) -> Result<(), CudaError> {
        self.conv3.push((conv.ci, conv.co, frames_in, h, w));
        Ok(())
    }
    fn conv1(
        &mut self,
        _conv: &ShapeConv,
        _x: Loc,
        _rows: usize,
        _y: Loc,
    ) -> Result<(), CudaError> {
        Ok(())
    }
    fn norm(
        &mut self,
        _x: Loc,
        _rows: usize,
        _c: usize,
        _bias: Option<&()>,
        _op: &NormOp<'_, Self>,
        _y: Loc,
    ) -> Result<(), CudaError> {
        Ok(())
    }
    fn bias_add(
        &mut self,
        _y: Loc,
        _rows: usize,
        _c: usize,
        _bias: &(),
        _skip: Option<Loc>,
    ) -> Result<(), CudaError> {
        Ok(())
    }
    fn d2s(
        &mut self,
        _y: Loc,
        _frames: usize,
        _h: usize,
        _w: usize,
        _cy: usize,
        _bias: &(),
        _res: Option<(Loc, usize)>,
        _drop: bool,
        _out: Loc,
    ) -> Result<(), CudaError> {
        Ok(())
    }
    fn pixels(
        &mut self,
        _y: Loc,
        frames: usize,
        _h: usize,
        _w: usize,
        _bias: &(),
        _p: usize,
        _first: usize,
    ) -> Result<(), CudaError> {
        self.pixels.push(frames);
        Ok(())
    }
    fn conv_weight(
        &mut self,
        _name: &str,
        ci: usize,
        co: usize,
        _k: usize,
    ) -> Result<ShapeConv, CudaError> {
        Ok(ShapeConv { ci, co })
    }
    fn vector(&mut self, _name: &str, _len: usize) -> Result<(), CudaError> {
        Ok(())
    }
    fn scalar(&mut self, _name: &str) -> Result<f32, CudaError> {
        Ok(1.0)
    }
    fn time_embedding(&mut self, _prefix: &str, _dim: usize, _t: f32) -> Result<(), CudaError> {
        Ok(())
    }
    fn modulation(
        &mut self,
        _table: &str,
        _rows: usize,
        _c: usize,
        _emb: &(),
        _k: usize,
    ) -> Result<(), CudaError> {
        Ok(())
    }
}

/// What one chunk of a decode asks for: its 3x3x3 convolutions in call order
/// (repeats kept) and the frames of each pixel hand-out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkShapes {
    /// The convolutions, `(ci, co, frames_in, h, w)`.
    pub conv3: Vec<ConvShape>,
    /// Frames per [`VaeOps::pixels`] call.
    pub pixels: Vec<usize>,
}

/// What a decode of `latent` (frames, height, width) in chunks of `chunk`
/// latent frames asks for, one entry per chunk, plus the stream's pixel cap
/// (the most frames one hand-out may carry, what the device sizes its pixel
/// staging and pinned halves by). An invalid config or geometry is the
/// stream's error.
pub fn decode_shapes(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
    chunk: usize,
) -> Result<(Vec<ChunkShapes>, usize), CudaError> {
    if chunk == 0 {
        return Err(CudaError::Invalid(
            "VAE convolution shapes in chunks of 0 latent frames: the chunk must be >= 1".into(),
        ));
    }
    let mut ops = ShapeOps::default();
    let w = DecoderW::bind(&mut ops, cfg, 0.0)?;
    let mut st = Stream::new(cfg, latent, chunk, Mutation::None, &mut |n, what| {
        ops.alloc(n, what)
    })?;
    let per_frame = latent.1 * latent.2 * cfg.latent_channels;
    let zeros = vec![0.0f32; chunk * per_frame];
    let mut out = Vec::new();
    let mut t0 = 0;
    while t0 < latent.0 {
        let n = chunk.min(latent.0 - t0);
        let (c0, p0) = (ops.conv3.len(), ops.pixels.len());
        st.push_chunk(&mut ops, &w, n, &zeros[..n * per_frame])?;
        out.push(ChunkShapes {
            conv3: ops.conv3[c0..].to_vec(),
            pixels: ops.pixels[p0..].to_vec(),
        });
        t0 += n;
    }
    Ok((out, st.pixel_frames_cap()))
}

/// The 3x3x3 convolutions of [`decode_shapes`], one list per chunk.
pub fn conv3_shapes(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
    chunk: usize,
) -> Result<Vec<Vec<ConvShape>>, CudaError> {
    Ok(decode_shapes(cfg, latent, chunk)?
        .0
        .into_iter()
        .map(|c| c.conv3)
        .collect())
}

/// Per chunk: (plans a fresh cuDNN path builds, heuristic calls it makes),
/// counting a shape at its first use and a convolution `(ci, co, h, w)` at its
/// first shape, as [`crate::cuda::models::vae::cudnn::CudnnConv`] does.
pub fn plans_per_chunk(chunks: &[Vec<ConvShape>]) -> Vec<(usize, usize)> {
    let mut shapes = BTreeSet::new();
    let mut keys = BTreeSet::new();
    chunks
        .iter()
        .map(|c| {
            let mut built = 0;
            let mut searched = 0;
            for &(ci, co, f, h, w) in c {
                if shapes.insert((ci, co, f, h, w)) {
                    built += 1;
                    if keys.insert((ci, co, h, w)) {
                        searched += 1;
                    }
                }
            }
            (built, searched)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rung-2 decode (ltxv-2b VAE, 768x512x121: latent 16 x 16 x 24, chunks
    /// of 4 latent frames) on the device built 3, 3, 0 and 59 cuDNN plans in its
    /// four chunks and ran the heuristic 2, 0, 0 and 7 times (the chunk markers
    /// of bundles f1f90d571fe7 and 9ffc78d4fe51, H100, 2026-12-06). Counting
    /// the shapes without a GPU gives the same, so the recorder sees every
    /// convolution the device path plans. Dropping the frame count from the
    /// plan key, or recording conv1 as a conv3, turns it red.
    #[test]
    fn the_rung_2_decode_plans_what_the_device_built() {
        let cfg = crate::presets::vae_095();
        let chunks = conv3_shapes(&cfg, (16, 16, 24), 4).unwrap();
        assert_eq!(chunks.len(), 4);
        assert_eq!(plans_per_chunk(&chunks), [(3, 2), (3, 0), (0, 0), (59, 7)]);
        let all: BTreeSet<_> = chunks.iter().flatten().collect();
        assert_eq!(all.len(), 65);
        // Every shape is a valid 3x3x3 convolution of the stream: at least
        // three input frames, channels in multiples of 8.
        assert!(all
            .iter()
            .all(|&&(ci, co, f, _, _)| f >= 3 && ci % 8 == 0 && co % 8 == 0));
    }

    /// The rung-2 decode hands its 121 frames out in its last chunk alone, in
    /// pieces of 12, 32, 32, 32 and 13 (the device's chunk markers say 0, 0, 0
    /// and 121 frames, s30-dev2): the non-causal convolutions' look-ahead
    /// spans more than the first three chunks' 12 latent frames, so chunking
    /// bounds memory, not latency. Every piece fits the stream's cap of 33
    /// frames, which sizes the pixel staging and the two pinned halves.
    #[test]
    fn the_rung_2_decode_hands_out_every_frame_in_its_last_chunk() {
        let (chunks, cap) = decode_shapes(&crate::presets::vae_095(), (16, 16, 24), 4).unwrap();
        let pieces: Vec<Vec<usize>> = chunks.into_iter().map(|c| c.pixels).collect();
        assert_eq!(pieces, [vec![], vec![], vec![], vec![12, 32, 32, 32, 13]]);
        assert_eq!(cap, 33);
    }

    /// A chunk of 0 frames is an error, not an endless loop.
    #[test]
    fn a_chunk_of_zero_frames_is_refused() {
        let e = conv3_shapes(&crate::presets::vae_095(), (16, 4, 6), 0).unwrap_err();
        assert!(e.to_string().contains("chunks of 0"), "{e}");
    }

    /// The chunking changes which frame counts the convolutions see, not which
    /// convolutions there are: one piece and chunks of 1 have the same
    /// `(ci, co, h, w)` set as chunks of 4.
    #[test]
    fn every_chunking_asks_for_the_same_convolutions() {
        let cfg = crate::presets::vae_095();
        let keys = |chunk| -> BTreeSet<(usize, usize, usize, usize)> {
            conv3_shapes(&cfg, (16, 4, 6), chunk)
                .unwrap()
                .into_iter()
                .flatten()
                .map(|(ci, co, _, h, w)| (ci, co, h, w))
                .collect()
        };
        let four = keys(4);
        assert!(!four.is_empty());
        assert_eq!(keys(16), four);
        assert_eq!(keys(1), four);
    }
}
