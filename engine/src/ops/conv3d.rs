//! 3-D convolution (stride 1) over channel-first video, the VAE's only heavy op.
//!
//! Space is zero-padded by `k/2` on each side. Time is padded by repeating edge
//! frames: causally (`kt - 1` copies of the first frame before it) or
//! symmetrically (`(kt - 1)/2` copies of the first frame before and of the last
//! after: the released decoders). One output frame depends only on the `kt`
//! input frames it sees, so the kernel is [`Conv3d::forward_padded`] over a
//! window of frames; [`Conv3d::forward`] slides it over a whole clip and the
//! VAE's frame stream slides it as frames arrive.
//!
//! Each output frame is `sum over (dt, dy, dx)` of a GEMM `W[:, :, dt, dy, dx]
//! [co x ci]` times the spatially padded input frame read at offset
//! `dy * Wp + dx` as a `[ci x H * Wp]` matrix (no im2col copy); the `Wp - W`
//! extra columns per row are computed and dropped.

use rayon::prelude::*;

use crate::ops::linear::{gemm_serial, MatRef};
use crate::tensor::Tensor;
use crate::weights::{VarBuilder, WeightError};

/// Padded output columns per tile of [`Conv3d::forward_padded`]: a 64-channel
/// block's accumulator is then at most 1 MiB (`64 * 4096 * 4` bytes), which a core's
/// L2 holds across the kernel's taps.
pub const TILE_MAX_COLS: usize = 4096;

/// Rows per tile: `h` split into `row_tiles` blocks, cut further so that a block's
/// `rows * wp` padded columns stay within `max_cols` (at least one row).
fn row_block(h: usize, wp: usize, row_tiles: usize, max_cols: usize) -> usize {
    h.div_ceil(row_tiles.max(1))
        .min((max_cols / wp.max(1)).max(1))
}

/// How time is padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimePad {
    /// `kt - 1` copies of the first frame before it.
    Causal,
    /// `(kt - 1) / 2` copies of the first frame before and of the last after.
    Replicate,
}

/// A convolution's weights `[co, ci, kt, kh, kw]` and bias `[co]`.
#[derive(Debug, Clone)]
pub struct Conv3d {
    weight: Vec<f32>,
    bias: Vec<f32>,
    co: usize,
    ci: usize,
    k: (usize, usize, usize),
}

/// One input frame `[ci, H, W]` zero-padded to `[ci, H + 2 ph, W + 2 pw]`
/// (plus a short tail so shifted reads stay inside).
#[derive(Debug, Clone)]
pub struct PaddedFrame {
    data: Vec<f32>,
    h: usize,
    w: usize,
}

impl Conv3d {
    /// A convolution from its weight tensor `[co, ci, kt, kh, kw]` and bias.
    ///
    /// # Panics
    /// If the weight is not 5-D, the bias length is not `co`, or a spatial
    /// kernel size is even (bugs in the caller).
    pub fn new(weight: Tensor, bias: Vec<f32>) -> Self {
        let s = weight.shape().to_vec();
        assert_eq!(s.len(), 5, "Conv3d weight must be 5-D, got {s:?}");
        assert_eq!(bias.len(), s[0], "Conv3d bias length");
        assert!(
            s[3] % 2 == 1 && s[4] % 2 == 1,
            "Conv3d spatial kernel must be odd, got {s:?}"
        );
        Conv3d {
            co: s[0],
            ci: s[1],
            k: (s[2], s[3], s[4]),
            weight: weight.into_data(),
            bias,
        }
    }

    /// Loads `{name}.weight [co, ci, k, k, k]` and `{name}.bias [co]`.
    pub fn load(
        vb: &VarBuilder,
        name: &str,
        ci: usize,
        co: usize,
        k: usize,
    ) -> Result<Self, WeightError> {
        let vb = vb.pp(name);
        let w = vb.get("weight", &[co, ci, k, k, k])?;
        let b = vb.get("bias", &[co])?.into_data();
        Ok(Conv3d::new(w, b))
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.co
    }

    /// Input channels.
    pub fn in_channels(&self) -> usize {
        self.ci
    }

    /// Temporal kernel size.
    pub fn kt(&self) -> usize {
        self.k.0
    }

    /// Zero-pads one input frame `[ci, h, w]` for this kernel.
    ///
    /// # Panics
    /// If the frame does not hold `ci * h * w` values (a bug in the caller).
    pub fn pad(&self, frame: &[f32], h: usize, w: usize) -> PaddedFrame {
        assert_eq!(frame.len(), self.ci * h * w, "Conv3d::pad frame size");
        let (ph, pw) = (self.k.1 / 2, self.k.2 / 2);
        let (hp, wp) = (h + 2 * ph, w + 2 * pw);
        let mut data = vec![0.0f32; self.ci * hp * wp + self.k.2];
        for c in 0..self.ci {
            for y in 0..h {
                let src = &frame[(c * h + y) * w..(c * h + y + 1) * w];
                let dst = c * hp * wp + (y + ph) * wp + pw;
                data[dst..dst + w].copy_from_slice(src);
            }
        }
        PaddedFrame { data, h, w }
    }

    /// One output frame `[co, h, w]` from the `kt` (time-padded) input frames
    /// it sees, oldest first.
    ///
    /// # Panics
    /// If the window length is not `kt` or the frames differ in size (bugs).
    pub fn forward_padded(&self, window: &[&PaddedFrame]) -> Vec<f32> {
        self.forward_padded_tiled(window, TILE_MAX_COLS)
    }

    /// [`Conv3d::forward_padded`] with tiles of at most `max_cols` padded output
    /// columns (whole rows; at least one row): the tile's accumulator is
    /// `out-channel block x max_cols` f32 and is read and written once per kernel
    /// tap, so it should stay in a core's cache. The result does not depend on it
    /// (each output element sums the same products in the same order); the
    /// benchmark compares settings.
    pub fn forward_padded_tiled(&self, window: &[&PaddedFrame], max_cols: usize) -> Vec<f32> {
        let (kt, kh, kw) = self.k;
        assert_eq!(
            window.len(),
            kt,
            "Conv3d window of {} frames, kernel {kt}",
            window.len()
        );
        let (h, w) = (window[0].h, window[0].w);
        assert!(
            window.iter().all(|f| f.h == h && f.w == w),
            "Conv3d window frames differ in size"
        );
        let (ph, pw) = (kh / 2, kw / 2);
        let (hp, wp) = (h + 2 * ph, w + 2 * pw);
        let plane = hp * wp;
        let kvol = kt * kh * kw;
        let (co, ci) = (self.co, self.ci);

        // Tiles over output channels and rows, ~2 per thread when the frame is large.
        let threads = rayon::current_num_threads();
        let work = co * ci * kvol * h * w;
        let want_tiles = if work < (1 << 21) { 1 } else { 2 * threads };
        let cb = if want_tiles > 1 && co > 64 { 64 } else { co };
        let co_tiles = co.div_ceil(cb);
        let row_tiles = want_tiles.div_ceil(co_tiles).clamp(1, h);
        let rb = row_block(h, wp, row_tiles, max_cols);
        let row_tiles = h.div_ceil(rb);

        let tiles: Vec<(usize, usize, Vec<f32>)> = (0..co_tiles * row_tiles)
            .into_par_iter()
            .map(|t| {
                let (c0, r0) = ((t / row_tiles) * cb, (t % row_tiles) * rb);
                let (cn, rn) = (cb.min(co - c0), rb.min(h - r0));
                let cols = rn * wp;
                let mut acc = vec![0.0f32; cn * cols];
                let mut first = true;
                for (dt, frame) in window.iter().enumerate() {
                    for dy in 0..kh {
                        for dx in 0..kw {
                            let wofs = c0 * ci * kvol + (dt * kh + dy) * kw + dx;
                            let a = MatRef::new(&self.weight[wofs..], cn, ci, ci * kvol, kvol);
                            let b =
                                MatRef::new(&frame.data[(r0 + dy) * wp + dx..], ci, cols, plane, 1);
                            gemm_serial(a, b, &mut acc, cols, !first);
                            first = false;
                        }
                    }
                }
                (c0, r0, acc)
            })
            .collect();

        let mut out = vec![0.0f32; co * h * w];
        for (c0, r0, acc) in tiles {
            let cols = acc.len() / cb.min(co - c0);
            let rn = cols / wp;
            for c in 0..cb.min(co - c0) {
                let b = self.bias[c0 + c];
                for r in 0..rn {
                    let src = &acc[c * cols + r * wp..c * cols + r * wp + w];
                    let dst =
                        &mut out[((c0 + c) * h + r0 + r) * w..((c0 + c) * h + r0 + r + 1) * w];
                    dst.iter_mut().zip(src).for_each(|(d, s)| *d = s + b);
                }
            }
        }
        out
    }

    /// The input frame index each slot of output frame `t`'s window reads, for
    /// a clip of `frames` frames: edge frames repeat past either end.
    pub fn window_indices(&self, t: usize, frames: usize, pad: TimePad) -> Vec<usize> {
        let kt = self.k.0 as i64;
        let left = match pad {
            TimePad::Causal => kt - 1,
            TimePad::Replicate => (kt - 1) / 2,
        };
        (0..kt)
            .map(|d| (t as i64 + d - left).clamp(0, frames as i64 - 1) as usize)
            .collect()
    }

    /// The whole clip `x [ci, frames, h, w]` to `[co, frames, h, w]`.
    ///
    /// # Panics
    /// If `x` does not hold `ci * frames * h * w` values (a bug in the caller).
    pub fn forward(&self, x: &[f32], frames: usize, h: usize, w: usize, pad: TimePad) -> Vec<f32> {
        assert_eq!(
            x.len(),
            self.ci * frames * h * w,
            "Conv3d::forward input size"
        );
        let hw = h * w;
        let padded: Vec<PaddedFrame> = (0..frames)
            .map(|t| {
                let mut f = vec![0.0f32; self.ci * hw];
                for c in 0..self.ci {
                    f[c * hw..(c + 1) * hw]
                        .copy_from_slice(&x[(c * frames + t) * hw..(c * frames + t + 1) * hw]);
                }
                self.pad(&f, h, w)
            })
            .collect();
        let mut out = vec![0.0f32; self.co * frames * hw];
        for t in 0..frames {
            let idx = self.window_indices(t, frames, pad);
            let window: Vec<&PaddedFrame> = idx.iter().map(|i| &padded[*i]).collect();
            let y = self.forward_padded(&window);
            for c in 0..self.co {
                out[(c * frames + t) * hw..(c * frames + t + 1) * hw]
                    .copy_from_slice(&y[c * hw..(c + 1) * hw]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Gaussian;

    #[test]
    fn box_kernel_by_hand_causal_and_replicate() {
        // 1 -> 1 channel, 3x3x3 ones, bias 0.5; two 2x2 frames summing to 10 and 100.
        // Every 3x3 window of a 2x2 frame covers the whole frame.
        let conv = Conv3d::new(Tensor::from_fn(&[1, 1, 3, 3, 3], |_| 1.0), vec![0.5]);
        let x = vec![1., 2., 3., 4., 10., 20., 30., 40.];
        // Replicate: t0 sees (f0, f0, f1) = 120; t1 sees (f0, f1, f1) = 210.
        let y = conv.forward(&x, 2, 2, 2, TimePad::Replicate);
        assert_eq!(
            y,
            vec![120.5, 120.5, 120.5, 120.5, 210.5, 210.5, 210.5, 210.5]
        );
        // Causal: t0 sees (f0, f0, f0) = 30; t1 sees (f0, f0, f1) = 120.
        let y = conv.forward(&x, 2, 2, 2, TimePad::Causal);
        assert_eq!(y, vec![30.5, 30.5, 30.5, 30.5, 120.5, 120.5, 120.5, 120.5]);
    }

    #[test]
    fn spatial_orientation_by_hand() {
        // kt = 1, 3x3 kernel K[dy][dx] = 10 dy + dx + 1 (1..3, 11..13, 21..23), no bias.
        // Frame 2x3 [[1, 2, 3], [4, 5, 6]]. Output (0, 0) reads input rows -1..1, cols -1..1:
        // K[1][1]*1 + K[1][2]*2 + K[2][1]*4 + K[2][2]*5 = 12 + 26 + 88 + 115 = 241.
        // Output (1, 2): K[0][0]*2 + K[0][1]*3 + K[1][0]*5 + K[1][1]*6 = 2 + 6 + 55 + 72 = 135.
        let k = Tensor::from_fn(&[1, 1, 1, 3, 3], |i| (10 * (i / 3) + i % 3 + 1) as f32);
        let conv = Conv3d::new(k, vec![0.0]);
        let y = conv.forward(&[1., 2., 3., 4., 5., 6.], 1, 2, 3, TimePad::Replicate);
        assert_eq!(y[0], 241.0);
        assert_eq!(y[5], 135.0);
    }

    #[allow(clippy::too_many_arguments)]
    fn naive(
        w: &[f32],
        b: &[f32],
        x: &[f32],
        s: [usize; 5],
        frames: usize,
        h: usize,
        wd: usize,
        pad: TimePad,
    ) -> Vec<f32> {
        let [co, ci, kt, kh, kw] = s;
        let left = if pad == TimePad::Causal {
            kt - 1
        } else {
            (kt - 1) / 2
        } as i64;
        let mut y = vec![0.0f32; co * frames * h * wd];
        for o in 0..co {
            for t in 0..frames {
                for r in 0..h {
                    for c in 0..wd {
                        let mut acc = b[o] as f64;
                        for i in 0..ci {
                            for dt in 0..kt {
                                let tt = (t as i64 + dt as i64 - left).clamp(0, frames as i64 - 1)
                                    as usize;
                                for dy in 0..kh {
                                    for dx in 0..kw {
                                        let (rr, cc) = (
                                            r as i64 + dy as i64 - (kh / 2) as i64,
                                            c as i64 + dx as i64 - (kw / 2) as i64,
                                        );
                                        if rr < 0 || cc < 0 || rr >= h as i64 || cc >= wd as i64 {
                                            continue;
                                        }
                                        let xv = x[((i * frames + tt) * h + rr as usize) * wd
                                            + cc as usize];
                                        let wv = w[(((o * ci + i) * kt + dt) * kh + dy) * kw + dx];
                                        acc += (xv * wv) as f64;
                                    }
                                }
                            }
                        }
                        y[((o * frames + t) * h + r) * wd + c] = acc as f32;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn matches_a_naive_convolution_on_random_data() {
        // Includes a case large enough to be tiled over channels and rows.
        for (n, &(co, ci, k, frames, h, w)) in [
            (3, 2, 3, 3, 4, 5),
            (5, 4, 1, 2, 3, 3),
            (70, 16, 3, 2, 24, 20),
            (8, 3, 3, 1, 1, 1),
        ]
        .iter()
        .enumerate()
        {
            let s = [co, ci, k, k, k];
            let wt = Gaussian::new(n as u64, "w").vec(co * ci * k * k * k);
            let b = Gaussian::new(n as u64, "b").vec(co);
            let x = Gaussian::new(n as u64, "x").vec(ci * frames * h * w);
            let conv = Conv3d::new(Tensor::new(&s, wt.clone()).unwrap(), b.clone());
            for pad in [TimePad::Causal, TimePad::Replicate] {
                let got = conv.forward(&x, frames, h, w, pad);
                let want = naive(&wt, &b, &x, s, frames, h, w, pad);
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                        "case {n} {pad:?}: {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn row_blocks_respect_the_column_bound() {
        // A 768-wide decoder layer (wp 770) over 512 rows in 32 tiles: 16 rows is
        // 12320 columns, cut to 5 rows (3850 <= 4096).
        assert_eq!(row_block(512, 770, 32, TILE_MAX_COLS), 5);
        assert_eq!(row_block(512, 770, 32, usize::MAX), 16);
        // Narrow frames keep the split over threads; a row wider than the bound
        // still gets one row.
        assert_eq!(row_block(64, 66, 4, TILE_MAX_COLS), 16);
        assert_eq!(row_block(8, 5000, 1, TILE_MAX_COLS), 1);
    }

    #[test]
    fn the_tile_width_does_not_change_a_single_bit() {
        // 70 output channels (two channel blocks) over 24 rows: one row per tile,
        // three rows, and unbounded must give identical bits, since each output
        // element sums the same products in the same order whatever the tiling.
        // Mutation that turns this red: a tile whose rows overlap or skip (rb
        // rounding), or a column offset that ignores the tile's first row.
        let (co, ci, h, w) = (70usize, 16usize, 24usize, 20usize);
        let (wt, b) = (
            Gaussian::new(9, "w").vec(co * ci * 27),
            Gaussian::new(9, "b").vec(co),
        );
        let conv = Conv3d::new(
            Tensor::new(&[co, ci, 3, 3, 3], wt.clone()).unwrap(),
            b.clone(),
        );
        let xs: Vec<Vec<f32>> = (0..3)
            .map(|i| Gaussian::new(20 + i, "x").vec(ci * h * w))
            .collect();
        let frames: Vec<_> = xs.iter().map(|x| conv.pad(x, h, w)).collect();
        let window: Vec<_> = frames.iter().collect();
        let want = conv.forward_padded_tiled(&window, usize::MAX);
        // The reference itself is right: the window is frames 0, 1, 2, i.e. the
        // causal convolution's output frame 2 of that 3-frame clip.
        let hw = h * w;
        let mut clip = vec![0.0f32; ci * 3 * hw];
        for (t, x) in xs.iter().enumerate() {
            for c in 0..ci {
                clip[(c * 3 + t) * hw..(c * 3 + t + 1) * hw]
                    .copy_from_slice(&x[c * hw..(c + 1) * hw]);
            }
        }
        let full = naive(&wt, &b, &clip, [co, ci, 3, 3, 3], 3, h, w, TimePad::Causal);
        assert_eq!(want.len(), co * hw);
        for o in 0..co {
            for (g, e) in want[o * hw..(o + 1) * hw]
                .iter()
                .zip(&full[(o * 3 + 2) * hw..(o * 3 + 3) * hw])
            {
                assert!((g - e).abs() < 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
            }
        }
        for cols in [1, w + 2, 3 * (w + 2), TILE_MAX_COLS] {
            let got = conv.forward_padded_tiled(&window, cols);
            assert_eq!(got.len(), want.len());
            let same = got
                .iter()
                .zip(&want)
                .all(|(g, e)| g.to_bits() == e.to_bits());
            assert!(same, "max_cols {cols} changed the result");
        }
    }
}
