//! f32 host references for the device checks: each kernel's function and the
//! whole DiT forward, written plainly from the architecture note so the device
//! arm is compared with an independent computation. Weights and inputs are the
//! same bf16 values the device sees, widened exactly to f32; only the device's
//! own rounding differs.

use std::collections::HashMap;

use half::bf16;
use rayon::prelude::*;

use super::dit::{rope_freqs, DitDims, LATENT_CHANNELS, MASK_BIAS, NORM_EPS, QK_EPS, TIMESTEP_DIM};

/// bf16 bits to f32 (exact).
pub fn widen(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect()
}

/// f32 to bf16 bits, round to nearest even (what the device's cvt.rn does).
pub fn narrow(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect()
}

/// y[m, n] = x[m, k] · w[n, k]ᵀ + b.
pub fn linear(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, b: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    // SAFETY: slices of exactly m*k, n*k and m*n elements with the strides given.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            y.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    if let Some(b) = b {
        y.par_chunks_mut(n)
            .for_each(|r| r.iter_mut().zip(b).for_each(|(v, bb)| *v += bb));
    }
    y
}

/// tanh-approximated GELU.
pub fn gelu_tanh(v: f32) -> f32 {
    0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh())
}

/// x · sigmoid(x).
pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// Per row of d: norm(x) * (1 + scale) + shift; `center` LayerNorm else RMS.
pub fn ada_norm_mod(
    x: &[f32],
    d: usize,
    eps: f32,
    center: bool,
    shift: &[f32],
    scale: &[f32],
) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(yr, xr)| {
            let mean = if center {
                xr.iter().map(|v| *v as f64).sum::<f64>() / d as f64
            } else {
                0.0
            };
            let var = xr.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let r = 1.0 / (var + eps as f64).sqrt();
            for c in 0..d {
                yr[c] = ((xr[c] as f64 - mean) * r) as f32 * (1.0 + scale[c]) + shift[c];
            }
        });
    y
}

/// Weighted RMS norm per row of d.
pub fn rms_norm_w(x: &[f32], d: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(yr, xr)| {
            let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
            let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
            for c in 0..d {
                yr[c] = xr[c] * r * w[c];
            }
        });
    y
}

/// LTX interleaved RoPE over rows of d for tokens of `grid` in raster order.
pub fn rope(x: &mut [f32], d: usize, grid: (usize, usize, usize), fps: f32) {
    let freqs = rope_freqs(d);
    let nf = freqs.len();
    let pad_pairs = (d - 6 * nf) / 2;
    let (_, gh, gw) = grid;
    let scale = [8.0f32 / fps, 32.0, 32.0];
    let base = [20.0f32, 2048.0, 2048.0];
    x.par_chunks_mut(d).enumerate().for_each(|(t, row)| {
        let idx = [t / (gh * gw), (t / gw) % gh, t % gw];
        let pos: Vec<f32> = (0..3)
            .map(|a| (idx[a] as f32 * scale[a]) / base[a] * 2.0 - 1.0)
            .collect();
        for p in pad_pairs..d / 2 {
            let i = p - pad_pairs;
            let ang = freqs[i / 3] * pos[i % 3];
            let (s, c) = ang.sin_cos();
            let (a, b) = (row[2 * p], row[2 * p + 1]);
            row[2 * p] = a * c - b * s;
            row[2 * p + 1] = b * c + a * s;
        }
    });
}

/// Multi-head attention, rows [n, heads * hd]; `kbias` per key.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    nq: usize,
    nk: usize,
    heads: usize,
    hd: usize,
    kbias: Option<&[f32]>,
) -> Vec<f32> {
    let d = heads * hd;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut o = vec![0.0f32; nq * d];
    o.par_chunks_mut(d).enumerate().for_each(|(i, orow)| {
        let mut s = vec![0.0f64; nk];
        for h in 0..heads {
            let qi = &q[i * d + h * hd..][..hd];
            let mut mx = f64::NEG_INFINITY;
            for (j, sj) in s.iter_mut().enumerate() {
                let kj = &k[j * d + h * hd..][..hd];
                let mut acc = 0.0f64;
                for c in 0..hd {
                    acc += qi[c] as f64 * kj[c] as f64;
                }
                *sj = acc * scale + kbias.map(|b| b[j] as f64).unwrap_or(0.0);
                mx = mx.max(*sj);
            }
            let mut sum = 0.0;
            for sj in s.iter_mut() {
                *sj = (*sj - mx).exp();
                sum += *sj;
            }
            for c in 0..hd {
                let mut acc = 0.0f64;
                for (j, sj) in s.iter().enumerate() {
                    acc += sj * v[j * d + h * hd + c] as f64;
                }
                orow[h * hd + c] = (acc / sum) as f32;
            }
        }
    });
    o
}

/// The 256-wide sinusoidal timestep embedding of `t`, cosines first.
pub fn timestep_sinusoid(t: f32) -> Vec<f32> {
    let half = TIMESTEP_DIM / 2;
    let mut out = vec![0.0f32; TIMESTEP_DIM];
    for i in 0..half {
        let e = (i as f32 * -9.210_340_4f32 / half as f32).exp();
        let a = t * e;
        out[i] = a.cos();
        out[half + i] = a.sin();
    }
    out
}

/// f32 weights by checkpoint name.
pub type HostWeights = HashMap<String, Vec<f32>>;

fn get<'a>(w: &'a HostWeights, name: &str) -> &'a [f32] {
    w.get(name)
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("host reference: missing tensor {name}"))
}

/// The DiT forward in f32 (architecture note semantics). `latents` [n, 128],
/// `text` [l, caption_channels], `mask` [l]; returns the velocity [n, 128].
#[allow(clippy::too_many_arguments)]
pub fn dit_forward(
    w: &HostWeights,
    dims: &DitDims,
    latents: &[f32],
    sigma: f32,
    text: &[f32],
    mask: &[f32],
    grid: (usize, usize, usize),
    fps: f32,
) -> Vec<f32> {
    let d = dims.dim();
    let n = grid.0 * grid.1 * grid.2;
    let l = mask.len();
    let lin = |x: &[f32], m: usize, name: &str, out: usize, inp: usize| -> Vec<f32> {
        linear(
            x,
            m,
            inp,
            get(w, &format!("{name}.weight")),
            out,
            Some(get(w, &format!("{name}.bias"))),
        )
    };
    let mut x = lin(latents, n, "proj_in", d, LATENT_CHANNELS);
    let ts = timestep_sinusoid(sigma * 1000.0);
    let t1: Vec<f32> = lin(
        &ts,
        1,
        "time_embed.emb.timestep_embedder.linear_1",
        d,
        TIMESTEP_DIM,
    )
    .into_iter()
    .map(silu)
    .collect();
    let emb = lin(&t1, 1, "time_embed.emb.timestep_embedder.linear_2", d, d);
    let emb_s: Vec<f32> = emb.iter().map(|v| silu(*v)).collect();
    let temb = lin(&emb_s, 1, "time_embed.linear", 6 * d, d);
    let cap: Vec<f32> = lin(
        text,
        l,
        "caption_projection.linear_1",
        d,
        dims.caption_channels,
    )
    .into_iter()
    .map(gelu_tanh)
    .collect();
    let text_p = lin(&cap, l, "caption_projection.linear_2", d, d);
    let kbias: Vec<f32> = mask.iter().map(|m| (1.0 - m) * MASK_BIAS).collect();
    for i in 0..dims.layers {
        let b = format!("transformer_blocks.{i}");
        let sst = get(w, &format!("{b}.scale_shift_table"));
        let m =
            |j: usize| -> Vec<f32> { (0..d).map(|c| sst[j * d + c] + temb[j * d + c]).collect() };
        // Self-attention.
        let h = ada_norm_mod(&x, d, NORM_EPS, false, &m(0), &m(1));
        let mut q = rms_norm_w(
            &lin(&h, n, &format!("{b}.attn1.to_q"), d, d),
            d,
            get(w, &format!("{b}.attn1.norm_q.weight")),
            QK_EPS,
        );
        let mut k = rms_norm_w(
            &lin(&h, n, &format!("{b}.attn1.to_k"), d, d),
            d,
            get(w, &format!("{b}.attn1.norm_k.weight")),
            QK_EPS,
        );
        let v = lin(&h, n, &format!("{b}.attn1.to_v"), d, d);
        rope(&mut q, d, grid, fps);
        rope(&mut k, d, grid, fps);
        let a = attention(&q, &k, &v, n, n, dims.heads, dims.head_dim, None);
        let y = lin(&a, n, &format!("{b}.attn1.to_out.0"), d, d);
        let gate = m(2);
        x.par_chunks_mut(d)
            .zip(y.par_chunks(d))
            .for_each(|(xr, yr)| {
                xr.iter_mut()
                    .zip(yr)
                    .zip(&gate)
                    .for_each(|((xv, yv), g)| *xv += yv * g)
            });
        // Cross-attention.
        let q = rms_norm_w(
            &lin(&x, n, &format!("{b}.attn2.to_q"), d, d),
            d,
            get(w, &format!("{b}.attn2.norm_q.weight")),
            QK_EPS,
        );
        let k = rms_norm_w(
            &lin(&text_p, l, &format!("{b}.attn2.to_k"), d, d),
            d,
            get(w, &format!("{b}.attn2.norm_k.weight")),
            QK_EPS,
        );
        let v = lin(&text_p, l, &format!("{b}.attn2.to_v"), d, d);
        let a = attention(&q, &k, &v, n, l, dims.heads, dims.head_dim, Some(&kbias));
        let y = lin(&a, n, &format!("{b}.attn2.to_out.0"), d, d);
        x.iter_mut().zip(&y).for_each(|(xv, yv)| *xv += yv);
        // Feed-forward.
        let h = ada_norm_mod(&x, d, NORM_EPS, false, &m(3), &m(4));
        let f: Vec<f32> = lin(&h, n, &format!("{b}.ff.net.0.proj"), 4 * d, d)
            .into_iter()
            .map(gelu_tanh)
            .collect();
        let y = lin(&f, n, &format!("{b}.ff.net.2"), d, 4 * d);
        let gate = m(5);
        x.par_chunks_mut(d)
            .zip(y.par_chunks(d))
            .for_each(|(xr, yr)| {
                xr.iter_mut()
                    .zip(yr)
                    .zip(&gate)
                    .for_each(|((xv, yv), g)| *xv += yv * g)
            });
    }
    let sst = get(w, "scale_shift_table");
    let shift: Vec<f32> = (0..d).map(|c| sst[c] + emb[c]).collect();
    let scale: Vec<f32> = (0..d).map(|c| sst[d + c] + emb[c]).collect();
    let h = ada_norm_mod(&x, d, NORM_EPS, true, &shift, &scale);
    lin(&h, n, "proj_out", LATENT_CHANNELS, d)
}

/// ‖a − b‖₂ / ‖b‖₂ and max |a − b|; NaN when any element of `a` is not finite.
pub fn rel_err(a: &[f32], b: &[f32]) -> (f64, f64) {
    if a.len() != b.len() || a.iter().any(|v| !v.is_finite()) {
        return (f64::NAN, f64::NAN);
    }
    let (mut num, mut den, mut mx) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let e = (*x as f64 - *y as f64).abs();
        num += e * e;
        den += (*y as f64).powi(2);
        mx = mx.max(e);
    }
    ((num / den.max(1e-300)).sqrt(), mx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_a_hand_computed_product() {
        // x = [[1, 2], [3, 4]], w = [[1, 0], [1, 1], [0, 2]], b = [0.5, 0, -1]
        let y = linear(
            &[1., 2., 3., 4.],
            2,
            2,
            &[1., 0., 1., 1., 0., 2.],
            3,
            Some(&[0.5, 0., -1.]),
        );
        assert_eq!(y, vec![1.5, 3., 3., 3.5, 7., 7.]);
    }

    #[test]
    fn attention_of_one_key_returns_its_value_and_masking_hides_a_key() {
        let q = [1.0, 0.0];
        let k = [1.0, 0.0, 0.5, 0.5];
        let v = [2.0, 3.0, -4.0, 8.0];
        let o = attention(&q, &k[..2], &v[..2], 1, 1, 1, 2, None);
        assert_eq!(o, vec![2.0, 3.0]);
        let o = attention(&q, &k, &v, 1, 2, 1, 2, Some(&[0.0, -10000.0]));
        assert!(
            (o[0] - 2.0).abs() < 1e-6 && (o[1] - 3.0).abs() < 1e-6,
            "{o:?}"
        );
        // Unmasked: softmax([1, 0.5] / sqrt 2) weights.
        let o = attention(&q, &k, &v, 1, 2, 1, 2, None);
        let (s0, s1) = ((1.0f64 / 2f64.sqrt()).exp(), (0.5f64 / 2f64.sqrt()).exp());
        let want = (2.0 * s0 - 4.0 * s1) / (s0 + s1);
        assert!((o[0] as f64 - want).abs() < 1e-6);
    }

    #[test]
    fn rope_leaves_padding_and_rotates_pairs() {
        // d = 8: one frequency per axis, 2 padding channels.
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 + 1.0).collect();
        let orig = x.clone();
        rope(&mut x, 8, (1, 1, 2), 25.0);
        assert_eq!(&x[..2], &orig[..2]);
        // Norms of rotated pairs are kept.
        for p in 1..4 {
            let a = orig[2 * p].hypot(orig[2 * p + 1]);
            let b = x[2 * p].hypot(x[2 * p + 1]);
            assert!((a - b).abs() < 1e-5);
        }
        // Token 0, axis h: pos = -1, freq = pi/2 -> rotation by -pi/2: (a, b) -> (b, -a).
        assert!(
            (x[4] - orig[5]).abs() < 1e-5 && (x[5] + orig[4]).abs() < 1e-5,
            "{x:?}"
        );
    }

    #[test]
    fn norms_match_hand_values() {
        let y = ada_norm_mod(&[3.0, 4.0], 2, 0.0, false, &[1.0, 0.0], &[0.0, 1.0]);
        // rms = sqrt(12.5): (3/3.5355 + 1, 4/3.5355 * 2)
        assert!(
            (y[0] - 1.848_528).abs() < 1e-5 && (y[1] - 2.262_742).abs() < 1e-5,
            "{y:?}"
        );
        let y = ada_norm_mod(&[1.0, 3.0], 2, 0.0, true, &[0.0, 0.0], &[0.0, 0.0]);
        assert!((y[0] + 1.0).abs() < 1e-6 && (y[1] - 1.0).abs() < 1e-6);
        let t = timestep_sinusoid(0.0);
        assert!(t[..128].iter().all(|v| *v == 1.0) && t[128..].iter().all(|v| *v == 0.0));
    }
}
