//! Layout ops: the VAE's depth-to-space upsampling (with its first-frame drop
//! and residual), the final pixel unpatchify, and the transformer's latent
//! packing.
//!
//! Depth-to-space with stride (2, 2, 2): input channel `c * 8 + a * 4 + b * 2 + d`
//! of frame `t` at `(y, x)` becomes channel `c` of frame `2t + a` at
//! `(2y + b, 2x + d)`; the first of the `2T` frames is then dropped, leaving
//! `2T - 1`. Frame by frame: input frame 0 yields one frame (`a = 1`), every
//! later input frame two (`a = 0`, then `a = 1`).

/// The two sub-frames (`a = 0`, `a = 1`) of one depth-to-space input frame
/// `[c * 8, h, w]`, each `[c, 2h, 2w]`.
///
/// # Panics
/// If the channel count is not a multiple of 8 (a bug in the caller).
pub fn depth_to_space_frame(y: &[f32], ch: usize, h: usize, w: usize) -> [Vec<f32>; 2] {
    assert!(
        ch % 8 == 0 && y.len() == ch * h * w,
        "depth_to_space_frame: {ch} channels"
    );
    let c_out = ch / 8;
    let (h2, w2) = (2 * h, 2 * w);
    let mut out = [vec![0.0f32; c_out * h2 * w2], vec![0.0f32; c_out * h2 * w2]];
    for (a, o) in out.iter_mut().enumerate() {
        for c in 0..c_out {
            for b in 0..2 {
                for d in 0..2 {
                    let src = &y[(c * 8 + a * 4 + b * 2 + d) * h * w..][..h * w];
                    for r in 0..h {
                        let row = &mut o[(c * h2 + 2 * r + b) * w2..][..w2];
                        for x in 0..w {
                            row[2 * x + d] = src[r * w + x];
                        }
                    }
                }
            }
        }
    }
    out
}

/// The frames depth-to-space emits for input frame `t`: for `t = 0` only the
/// `a = 1` sub-frame (the `a = 0` one is the dropped first frame), otherwise both.
pub fn depth_to_space_emit(t: usize, y: &[f32], ch: usize, h: usize, w: usize) -> Vec<Vec<f32>> {
    let [f0, f1] = depth_to_space_frame(y, ch, h, w);
    if t == 0 {
        vec![f1]
    } else {
        vec![f0, f1]
    }
}

/// Whole-clip depth-to-space: `[c * 8, t, h, w]` to `[c, 2t - 1, 2h, 2w]`.
pub fn depth_to_space(y: &[f32], ch: usize, t: usize, h: usize, w: usize) -> Vec<f32> {
    let hw = h * w;
    let mut frames = Vec::new();
    for ti in 0..t {
        let mut f = vec![0.0f32; ch * hw];
        for c in 0..ch {
            f[c * hw..(c + 1) * hw].copy_from_slice(&y[(c * t + ti) * hw..(c * t + ti + 1) * hw]);
        }
        frames.extend(depth_to_space_emit(ti, &f, ch, h, w));
    }
    stack_frames(&frames, ch / 8)
}

/// Repeats the channel block of a frame `[c, s]` `times` times: channel
/// `r * c + i` equals channel `i` (torch `repeat` along channels).
pub fn repeat_channels(x: &[f32], times: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len() * times);
    for _ in 0..times {
        out.extend_from_slice(x);
    }
    out
}

/// Frames `[c, s]` stacked along time into `[c, frames, s]`.
pub fn stack_frames(frames: &[Vec<f32>], c: usize) -> Vec<f32> {
    let n = frames.len();
    let s = frames.first().map(|f| f.len() / c.max(1)).unwrap_or(0);
    let mut out = vec![0.0f32; c * n * s];
    for (t, f) in frames.iter().enumerate() {
        for ch in 0..c {
            out[(ch * n + t) * s..(ch * n + t + 1) * s].copy_from_slice(&f[ch * s..(ch + 1) * s]);
        }
    }
    out
}

/// One frame of pixel patches `[c * p * p, h, w]` to pixels `[c, h p, w p]`:
/// channel `c * p^2 + ws * p + hs` lands at `(h p + hs, w p + ws)`.
///
/// # Panics
/// If the channel count is not a multiple of `p^2` (a bug in the caller).
pub fn unpatchify_frame(y: &[f32], ch: usize, h: usize, w: usize, p: usize) -> Vec<f32> {
    assert!(
        ch % (p * p) == 0 && y.len() == ch * h * w,
        "unpatchify_frame: {ch} channels, patch {p}"
    );
    let c_out = ch / (p * p);
    let (hp, wp) = (h * p, w * p);
    let mut out = vec![0.0f32; c_out * hp * wp];
    for c in 0..c_out {
        for ws in 0..p {
            for hs in 0..p {
                let src = &y[(c * p * p + ws * p + hs) * h * w..][..h * w];
                for r in 0..h {
                    for x in 0..w {
                        out[(c * hp + r * p + hs) * wp + x * p + ws] = src[r * w + x];
                    }
                }
            }
        }
    }
    out
}

/// Latents `[c, f, h, w]` (channel-first) to tokens `[f * h * w, c]` in
/// `(f, h, w)` raster order (patch 1).
pub fn pack_latents(z: &[f32], c: usize) -> Vec<f32> {
    let n = z.len() / c.max(1);
    let mut out = vec![0.0f32; z.len()];
    for ch in 0..c {
        for i in 0..n {
            out[i * c + ch] = z[ch * n + i];
        }
    }
    out
}

/// Tokens `[n, c]` back to channel-first latents `[c, n]` (`n = f * h * w`).
pub fn unpack_latents(tokens: &[f32], c: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let n = tokens.len() / c.max(1);
    let mut out = vec![0.0f32; tokens.len()];
    if n == 0 {
        return out;
    }
    // One output channel per task: sequential writes, strided reads.
    out.par_chunks_mut(n)
        .take(c)
        .enumerate()
        .for_each(|(ch, plane)| {
            for (i, v) in plane.iter_mut().enumerate() {
                *v = tokens[i * c + ch];
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_to_space_by_hand() {
        // One output channel, one input frame of 1x1: channels 0..8 = a*4 + b*2 + d.
        let y: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let [f0, f1] = depth_to_space_frame(&y, 8, 1, 1);
        assert_eq!(f0, vec![0., 1., 2., 3.]);
        assert_eq!(f1, vec![4., 5., 6., 7.]);
        // Two input frames (values +100 in the second): 2*2 - 1 = 3 frames; the first
        // (a = 0 of frame 0) is dropped.
        let mut clip = vec![0.0; 16];
        for c in 0..8 {
            clip[c * 2] = c as f32;
            clip[c * 2 + 1] = 100.0 + c as f32;
        }
        let out = depth_to_space(&clip, 8, 2, 1, 1);
        assert_eq!(
            out,
            vec![4., 5., 6., 7., 100., 101., 102., 103., 104., 105., 106., 107.]
        );
        // Spatial placement with h = 1, w = 2: channel d = 1 goes to odd columns.
        let y: Vec<f32> = (0..16).map(|v| v as f32).collect(); // channel k = (2k, 2k+1)
        let [f0, _] = depth_to_space_frame(&y, 8, 1, 2);
        // Row 0 (b = 0): x0 d0 = ch0[0]=0, x0 d1 = ch1[0]=2, x1 d0 = ch0[1]=1, x1 d1 = ch1[1]=3.
        assert_eq!(&f0[..4], &[0., 2., 1., 3.]);
        assert_eq!(&f0[4..], &[4., 6., 5., 7.]);
    }

    #[test]
    fn residual_upsample_by_hand() {
        // The 0.9.5 upsampler with factor 2 on an 8-channel 1x1 input frame t = 1: the conv
        // output (here 32 channels: c * 8 + a * 4 + b * 2 + d for c in 0..4) goes through
        // depth-to-space to 4 channels, the input itself to 1 channel repeated 8 / 2 = 4
        // times, and the two add. Sub-frame a = 1, pixel (b, d) = (1, 0) of channel 2:
        // conv channel 2*8 + 4 + 2 = 22, input channel 4 + 2 = 6.
        let conv_out: Vec<f32> = (0..32).map(|v| 100.0 * v as f32).collect();
        let input: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let up = depth_to_space_emit(1, &conv_out, 32, 1, 1);
        let res = depth_to_space_emit(1, &input, 8, 1, 1);
        assert_eq!((up.len(), res.len()), (2, 2));
        let rep = repeat_channels(&res[1], 4);
        let sum: Vec<f32> = up[1].iter().zip(&rep).map(|(a, b)| a + b).collect();
        // Channel 2 of the a = 1 sub-frame is the 2x2 block [[c20, c21], [c22, c23]] + [[4, 5], [6, 7]].
        assert_eq!(&sum[8..12], &[2004.0, 2105.0, 2206.0, 2307.0]);
        // Frame 0 emits only its a = 1 sub-frame (the first frame of the clip is dropped).
        assert_eq!(
            depth_to_space_emit(0, &input, 8, 1, 1),
            vec![vec![4.0, 5.0, 6.0, 7.0]]
        );
    }

    #[test]
    fn unpatchify_by_hand() {
        // p = 2, one colour channel, one 1x1 frame: channel ws*2 + hs -> (hs, ws).
        let out = unpatchify_frame(&[0., 1., 2., 3.], 4, 1, 1, 2);
        assert_eq!(out, vec![0., 2., 1., 3.]);
        // Two colour channels: the second takes channels 4..8.
        let out = unpatchify_frame(&[0., 1., 2., 3., 10., 11., 12., 13.], 8, 1, 1, 2);
        assert_eq!(out, vec![0., 2., 1., 3., 10., 12., 11., 13.]);
    }

    #[test]
    fn repeat_stack_pack_round_trip() {
        assert_eq!(repeat_channels(&[1., 2.], 3), vec![1., 2., 1., 2., 1., 2.]);
        // Two frames of [c=2, s=1] -> [c, t, s].
        assert_eq!(
            stack_frames(&[vec![1., 2.], vec![3., 4.]], 2),
            vec![1., 3., 2., 4.]
        );
        let z: Vec<f32> = (0..12).map(|v| v as f32).collect(); // c = 3, n = 4
        let t = pack_latents(&z, 3);
        assert_eq!(&t[..6], &[0., 4., 8., 1., 5., 9.]);
        assert_eq!(unpack_latents(&t, 3), z);
        // Fewer values than channels: nothing to unpack (the tail stays 0), as
        // before the per-channel tasks.
        assert_eq!(unpack_latents(&[1., 2.], 3), vec![0., 0.]);
    }
}
