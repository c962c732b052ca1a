//! The decoder's primitives on the host, f32 throughout, channels-last: the
//! reference each device primitive is checked against, and the backend that
//! lets the stream's bookkeeping be tested against
//! [`crate::models::vae::VaeDecoder`] without a GPU.

use rayon::prelude::*;

use crate::cuda::models::vae::ops::{HasBias, Loc, NormOp, VaeOps, SINUSOID};
use crate::cuda::CudaError;
pub use crate::models::vae::PIXEL_NORM_EPS;
use crate::ops::activation::silu;
use crate::ops::embed::timestep_embedding;
use crate::ops::linear::Linear;
use crate::weights::{TensorSource, VarBuilder};

/// A host convolution: weight `[taps][ci][co]` (co contiguous), bias `[co]`.
#[derive(Debug, Clone)]
pub struct HostConv {
    /// Weight, `[taps][ci][co]`.
    pub w: Vec<f32>,
    /// Bias.
    pub b: Vec<f32>,
    /// Input channels.
    pub ci: usize,
    /// Output channels.
    pub co: usize,
    /// Kernel size (3 or 1).
    pub k: usize,
}

impl HasBias<Vec<f32>> for HostConv {
    fn bias(&self) -> &Vec<f32> {
        &self.b
    }
}

impl HostConv {
    /// From a checkpoint weight `[co, ci, k, k, k]` and bias.
    pub fn from_checkpoint(w: &[f32], b: Vec<f32>, ci: usize, co: usize, k: usize) -> HostConv {
        let taps = k * k * k;
        let mut t = vec![0.0f32; w.len()];
        for o in 0..co {
            for i in 0..ci {
                for tap in 0..taps {
                    t[(tap * ci + i) * co + o] = w[(o * ci + i) * taps + tap];
                }
            }
        }
        HostConv { w: t, b, ci, co, k }
    }
}

/// The host backend: buffers are `Vec<f32>`, weights come from a tensor
/// source, pixels land in a channel-first clip `[3, F, H, W]`.
pub struct HostOps<'a> {
    bufs: Vec<Vec<f32>>,
    src: &'a dyn TensorSource,
    /// The decoded clip `[c, frames, h, w]`.
    pub out: Vec<f32>,
    /// (channels, frames, height, width) of `out`.
    pub geom: (usize, usize, usize, usize),
}

impl<'a> HostOps<'a> {
    /// A backend reading weights from `src`, writing a clip of `geom`
    /// (channels, frames, height, width).
    pub fn new(src: &'a dyn TensorSource, geom: (usize, usize, usize, usize)) -> HostOps<'a> {
        HostOps {
            bufs: Vec::new(),
            src,
            out: vec![0.0; geom.0 * geom.1 * geom.2 * geom.3],
            geom,
        }
    }

    /// The values of buffer `id`.
    pub fn buffer(&self, id: usize) -> &[f32] {
        &self.bufs[id]
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CudaError> {
        Ok(VarBuilder::new(self.src).get(name, shape)?.into_data())
    }

    fn slice(&self, at: Loc, n: usize) -> &[f32] {
        &self.bufs[at.buf][at.off..at.off + n]
    }
}

/// `silu(rms(v) * (1 + scale) + shift)` of one voxel, as the CPU arm computes it.
pub fn rms_mod_silu(v: &mut [f32], m: Option<&(Vec<f32>, Vec<f32>)>) {
    let c = v.len();
    crate::ops::norm::rms_norm_channels(v, c, PIXEL_NORM_EPS);
    if let Some((shift, scale)) = m {
        for (i, x) in v.iter_mut().enumerate() {
            *x = *x * (1.0 + scale[i]) + shift[i];
        }
    }
    silu(v);
}

impl VaeOps for HostOps<'_> {
    type Vec = Vec<f32>;
    type Conv = HostConv;
    type Mod = (Vec<f32>, Vec<f32>);

    fn alloc(&mut self, elems: usize, _what: &str) -> Result<usize, CudaError> {
        self.bufs.push(vec![f32::NAN; elems]);
        Ok(self.bufs.len() - 1)
    }

    fn copy(&mut self, src: Loc, dst: Loc, elems: usize) -> Result<(), CudaError> {
        let v = self.slice(src, elems).to_vec();
        self.bufs[dst.buf][dst.off..dst.off + elems].copy_from_slice(&v);
        Ok(())
    }

    fn upload(&mut self, dst: Loc, data: &[f32]) -> Result<(), CudaError> {
        self.bufs[dst.buf][dst.off..dst.off + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn conv3(
        &mut self,
        conv: &HostConv,
        x: Loc,
        frames_in: usize,
        h: usize,
        w: usize,
        y: Loc,
    ) -> Result<(), CudaError> {
        let (ci, co) = (conv.ci, conv.co);
        let input = self.slice(x, frames_in * h * w * ci).to_vec();
        let tout = frames_in - 2;
        let mut out = vec![0.0f32; tout * h * w * co];
        out.par_chunks_mut(co).enumerate().for_each(|(v, acc)| {
            let (t, r) = (v / (h * w), v % (h * w));
            let (yy, xx) = (r / w, r % w);
            for dt in 0..3 {
                for dy in 0..3 {
                    let iy = yy as i64 + dy as i64 - 1;
                    if iy < 0 || iy >= h as i64 {
                        continue;
                    }
                    for dx in 0..3 {
                        let ix = xx as i64 + dx as i64 - 1;
                        if ix < 0 || ix >= w as i64 {
                            continue;
                        }
                        let tap = (dt * 3 + dy) * 3 + dx;
                        let src =
                            &input[(((t + dt) * h + iy as usize) * w + ix as usize) * ci..][..ci];
                        for (i, xv) in src.iter().enumerate() {
                            let wr = &conv.w[(tap * ci + i) * co..][..co];
                            for (a, wv) in acc.iter_mut().zip(wr) {
                                *a += xv * wv;
                            }
                        }
                    }
                }
            }
        });
        self.bufs[y.buf][y.off..y.off + out.len()].copy_from_slice(&out);
        Ok(())
    }

    fn conv1(&mut self, conv: &HostConv, x: Loc, rows: usize, y: Loc) -> Result<(), CudaError> {
        let (ci, co) = (conv.ci, conv.co);
        let input = self.slice(x, rows * ci).to_vec();
        let mut out = vec![0.0f32; rows * co];
        out.par_chunks_mut(co).enumerate().for_each(|(r, acc)| {
            acc.copy_from_slice(&conv.b);
            for (i, xv) in input[r * ci..(r + 1) * ci].iter().enumerate() {
                for (a, wv) in acc.iter_mut().zip(&conv.w[i * co..(i + 1) * co]) {
                    *a += xv * wv;
                }
            }
        });
        self.bufs[y.buf][y.off..y.off + out.len()].copy_from_slice(&out);
        Ok(())
    }

    fn norm(
        &mut self,
        x: Loc,
        rows: usize,
        c: usize,
        bias: Option<&Vec<f32>>,
        op: &NormOp<'_, Self>,
        y: Loc,
    ) -> Result<(), CudaError> {
        let mut v = self.slice(x, rows * c).to_vec();
        v.par_chunks_mut(c).for_each(|row| {
            if let Some(b) = bias {
                row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            }
            match op {
                NormOp::RmsSilu(m) => rms_mod_silu(row, *m),
                NormOp::LayerNorm { weight, bias, eps } => {
                    crate::ops::norm::layer_norm_channels(row, c, *eps, weight, bias)
                }
            }
        });
        self.bufs[y.buf][y.off..y.off + v.len()].copy_from_slice(&v);
        Ok(())
    }

    fn bias_add(
        &mut self,
        y: Loc,
        rows: usize,
        c: usize,
        bias: &Vec<f32>,
        skip: Option<Loc>,
    ) -> Result<(), CudaError> {
        let s = skip.map(|s| self.slice(s, rows * c).to_vec());
        let out = &mut self.bufs[y.buf][y.off..y.off + rows * c];
        for (i, v) in out.iter_mut().enumerate() {
            *v += bias[i % c];
            if let Some(s) = &s {
                *v += s[i];
            }
        }
        Ok(())
    }

    fn d2s(
        &mut self,
        y: Loc,
        frames: usize,
        h: usize,
        w: usize,
        cy: usize,
        bias: &Vec<f32>,
        res: Option<(Loc, usize)>,
        drop: bool,
        out: Loc,
    ) -> Result<(), CudaError> {
        let co = cy / 8;
        let input = self.slice(y, frames * h * w * cy).to_vec();
        let r = res.map(|(r, cr)| (self.slice(r, frames * h * w * cr).to_vec(), cr));
        let (h2, w2) = (2 * h, 2 * w);
        let o = &mut self.bufs[out.buf][out.off..];
        for j in 0..frames {
            for yy in 0..h {
                for xx in 0..w {
                    let v = (j * h + yy) * w + xx;
                    for c in 0..co {
                        for a in 0..2 {
                            if drop && j == 0 && a == 0 {
                                continue;
                            }
                            let fo = 2 * j + a - usize::from(drop);
                            for b in 0..2 {
                                for d in 0..2 {
                                    let q = c * 8 + a * 4 + b * 2 + d;
                                    let mut val = input[v * cy + q] + bias[q];
                                    if let Some((rv, cr)) = &r {
                                        let cc = c % (cr / 8);
                                        val += rv[v * cr + cc * 8 + a * 4 + b * 2 + d];
                                    }
                                    o[((fo * h2 + 2 * yy + b) * w2 + 2 * xx + d) * co + c] = val;
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn pixels(
        &mut self,
        y: Loc,
        frames: usize,
        h: usize,
        w: usize,
        bias: &Vec<f32>,
        p: usize,
        first: usize,
    ) -> Result<(), CudaError> {
        let (oc, total, hh, ww) = self.geom;
        let cy = oc * p * p;
        if first + frames > total || h * p != hh || w * p != ww {
            return Err(CudaError::Invalid(format!(
                "VAE pixels: frames {first}+{frames} of {total} at {}x{} into {hh}x{ww}",
                h * p,
                w * p
            )));
        }
        let input = self.slice(y, frames * h * w * cy).to_vec();
        for j in 0..frames {
            for yy in 0..h {
                for xx in 0..w {
                    let v = (j * h + yy) * w + xx;
                    for c in 0..oc {
                        for ws in 0..p {
                            for hs in 0..p {
                                let q = c * p * p + ws * p + hs;
                                self.out[((c * total + first + j) * hh + yy * p + hs) * ww
                                    + xx * p
                                    + ws] = input[v * cy + q] + bias[q];
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn conv_weight(
        &mut self,
        name: &str,
        ci: usize,
        co: usize,
        k: usize,
    ) -> Result<HostConv, CudaError> {
        let w = self.get(&format!("{name}.weight"), &[co, ci, k, k, k])?;
        let b = self.get(&format!("{name}.bias"), &[co])?;
        Ok(HostConv::from_checkpoint(&w, b, ci, co, k))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, CudaError> {
        self.get(name, &[len])
    }

    fn scalar(&mut self, name: &str) -> Result<f32, CudaError> {
        Ok(self.get(name, &[])?[0])
    }

    fn time_embedding(&mut self, prefix: &str, dim: usize, t: f32) -> Result<Vec<f32>, CudaError> {
        let vb = VarBuilder::new(self.src);
        let vb = vb.pp(prefix).pp("time_embedder.timestep_embedder");
        let l1 = Linear::load(&vb, "linear_1", dim, SINUSOID, true)?;
        let l2 = Linear::load(&vb, "linear_2", dim, dim, true)?;
        let mut h = l1.forward(&timestep_embedding(t, SINUSOID), 1);
        silu(&mut h);
        Ok(l2.forward(&h, 1))
    }

    fn modulation(
        &mut self,
        table: &str,
        rows: usize,
        c: usize,
        emb: &Vec<f32>,
        k: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let t = self.get(table, &[rows, c])?;
        let row = |r: usize| (0..c).map(|i| t[r * c + i] + emb[r * c + i]).collect();
        Ok((row(2 * k), row(2 * k + 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::models::vae::ops::{DecoderW, Mutation};
    use crate::cuda::models::vae::stream::{latent_frames, output_geometry, Stream};
    use crate::models::init;
    use crate::models::vae::{tensor_specs, VaeConfig, VaeDecoder};
    use crate::rng::Gaussian;
    use crate::tensor::Tensor;
    use crate::weights::MapSource;

    fn tiny_090() -> VaeConfig {
        let mut c = crate::presets::vae_090();
        c.block_out_channels = vec![8, 16, 32, 32];
        c.layers_per_block = vec![1, 1, 1, 1, 1];
        c.decoder_block_out_channels = vec![8, 16, 32, 32];
        c.decoder_layers_per_block = vec![1, 1, 1, 1, 1];
        c
    }

    fn stream_decode(
        cfg: &VaeConfig,
        src: &MapSource,
        z: &Tensor,
        t: f32,
        chunk: usize,
        mutation: Mutation,
    ) -> (Vec<f32>, Vec<usize>) {
        let s = z.shape();
        let latent = (s[1], s[2], s[3]);
        let mut ops = HostOps::new(src, output_geometry(cfg, latent));
        let w = DecoderW::bind(&mut ops, cfg, t).unwrap();
        let mut st = Stream::new(cfg, latent, chunk, mutation, &mut |n, what| {
            ops.alloc(n, what)
        })
        .unwrap();
        let mut per_chunk = Vec::new();
        let mut t0 = 0;
        while t0 < latent.0 {
            let n = chunk.min(latent.0 - t0);
            let data = latent_frames(z.data(), s[0], s[1], s[2] * s[3], t0, n);
            per_chunk.push(st.push_chunk(&mut ops, &w, n, &data).unwrap());
            t0 += n;
        }
        assert_eq!(st.emitted(), output_geometry(cfg, latent).1);
        (ops.out, per_chunk)
    }

    fn rel(a: &[f32], b: &[f32]) -> f64 {
        let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (num / den).sqrt()
    }

    /// The stream (every chunk size, both layouts) reproduces the CPU arm's
    /// decoder; skipping the modulation or the upsampler residual does not.
    #[test]
    fn the_stream_matches_the_cpu_decoder_in_every_chunking() {
        for (cfg, t) in [(crate::presets::vae_tiny(), 0.05f32), (tiny_090(), 0.0)] {
            let src = init::source(&tensor_specs(&cfg), 31);
            let dec = VaeDecoder::load(&VarBuilder::new(&src), &cfg).unwrap();
            let z = Tensor::new(&[128, 4, 2, 1], Gaussian::new(5, "z").vec(128 * 8)).unwrap();
            let want = dec.decode(&z, t).unwrap();
            for chunk in [1, 2, 3, 4, 9] {
                let (got, per) = stream_decode(&cfg, &src, &z, t, chunk, Mutation::None);
                let e = rel(&got, want.data());
                assert!(e < 1e-5, "chunk {chunk}: rel {e}");
                assert_eq!(per.len(), 4usize.div_ceil(chunk));
                assert_eq!(per.iter().sum::<usize>(), 25);
            }
            if cfg.timestep_conditioning {
                for m in [Mutation::SkipModulation, Mutation::SkipUpsampleResidual] {
                    let (got, _) = stream_decode(&cfg, &src, &z, t, 2, m);
                    assert!(rel(&got, want.data()) > 1e-2, "{m:?} went unnoticed");
                }
            }
        }
    }

    #[test]
    fn a_single_latent_frame_streams_to_one_frame() {
        let cfg = crate::presets::vae_tiny();
        let src = init::source(&tensor_specs(&cfg), 32);
        let dec = VaeDecoder::load(&VarBuilder::new(&src), &cfg).unwrap();
        let z = Tensor::new(&[128, 1, 1, 2], Gaussian::new(6, "z").vec(256)).unwrap();
        let want = dec.decode(&z, 0.3).unwrap();
        let (got, per) = stream_decode(&cfg, &src, &z, 0.3, 4, Mutation::None);
        assert_eq!(per, vec![1]);
        assert!(rel(&got, want.data()) < 1e-5);
    }

    #[test]
    fn buffers_grow_with_the_chunk_not_the_clip() {
        let cfg = crate::presets::vae_095();
        let total = |lf: usize, chunk: usize| -> usize {
            crate::cuda::models::vae::stream::buffer_elems(&cfg, (lf, 16, 24), chunk)
                .unwrap()
                .iter()
                .sum()
        };
        assert_eq!(total(16, 2), total(40, 2));
        assert!(total(16, 4) > total(16, 2));
    }
}
