//! The device's conversion of decoded pixels to 8-bit frames (`vae_rgb8` in
//! `kernels/vae.cu`), modelled on the host: the layout it writes, the defects
//! its check must catch ([`Rgb8Mutation`]), the host result of each (the
//! reference of the selftest), and the probe values that tell them apart.
//!
//! Layouts: the pixel staging the decoder writes is f32 `[frames][3][h][w]`
//! (one plane per colour); the kernel writes RGB8 `[frames][h][w][3]` (one
//! [`crate::frames::Frame`]'s `rgb` per frame, back to back).

use crate::frames::to_u8;

/// The byte the checks fill the device's RGB8 staging with first: a frame
/// the kernel never writes comes back as 0xAB, which no decoded pixel maps to
/// everywhere (and NaN pixels map to 0, not 0xAB).
pub const RGB8_POISON: u8 = 0xAB;

/// A deliberate defect of the conversion kernel (its `mutate` argument), so
/// the kernel check can show that it goes red.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rgb8Mutation {
    /// The conversion as specified (the render's).
    None,
    /// `rintf` instead of `roundf`: ties to even, so every exact `k + 0.5`
    /// with `k` even rounds down.
    Rint,
    /// `fmaf(v, 127.5, 127.5)`, one rounding instead of the host's three
    /// (a tempting shortcut): differs from the host near the rounding boundaries.
    Fma,
    /// R and B swapped.
    SwapRb,
    /// The last frame of a launch is not written (the poison shows).
    SkipLastFrame,
}

impl Rgb8Mutation {
    /// The defects, in a stable order (without [`Rgb8Mutation::None`]).
    pub const DEFECTS: [Rgb8Mutation; 4] = [
        Rgb8Mutation::Rint,
        Rgb8Mutation::Fma,
        Rgb8Mutation::SwapRb,
        Rgb8Mutation::SkipLastFrame,
    ];

    /// The kernel's `mutate` code (`RGB8_MUT_*` in `vae.cu`).
    pub fn code(self) -> i32 {
        match self {
            Rgb8Mutation::None => 0,
            Rgb8Mutation::Rint => 1,
            Rgb8Mutation::Fma => 2,
            Rgb8Mutation::SwapRb => 3,
            Rgb8Mutation::SkipLastFrame => 4,
        }
    }

    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            Rgb8Mutation::None => "none",
            Rgb8Mutation::Rint => "rint",
            Rgb8Mutation::Fma => "fma",
            Rgb8Mutation::SwapRb => "swap-rb",
            Rgb8Mutation::SkipLastFrame => "skip-last-frame",
        }
    }
}

/// The code value of one pixel as the kernel computes it under `m`
/// ([`to_u8`] itself without a defect).
pub fn code(v: f32, m: Rgb8Mutation) -> u8 {
    match m {
        Rgb8Mutation::Rint => {
            let x = ((v + 1.0) * 0.5).clamp(0.0, 1.0) * 255.0;
            if x.is_nan() {
                0
            } else {
                x.round_ties_even() as u8
            }
        }
        // NaN: fmaxf gives 0 on the device, NaN as u8 is 0 here.
        Rgb8Mutation::Fma => v.mul_add(127.5, 127.5).clamp(0.0, 255.0).round() as u8,
        _ => to_u8(v),
    }
}

/// Bytes of the RGB8 frames of `frames` frames of `h x w` pixels.
pub fn rgb8_bytes(frames: usize, h: usize, w: usize) -> usize {
    frames * h * w * 3
}

/// Index in the f32 staging `[frames][3][h][w]` of colour `c` of pixel `p`
/// (`y * w + x`) of frame `f`, with `plane = h * w`.
pub fn staging_index(f: usize, c: usize, p: usize, plane: usize) -> usize {
    (f * 3 + c) * plane + p
}

/// Index in the RGB8 frames `[frames][h][w][3]` of colour `c` of pixel `p` of
/// frame `f`, with `plane = h * w`.
pub fn rgb8_index(f: usize, c: usize, p: usize, plane: usize) -> usize {
    (f * plane + p) * 3 + c
}

/// What the kernel writes from the f32 staging `src` (`[frames][3][h][w]`)
/// under `m`, into a buffer poisoned with [`RGB8_POISON`] (the host reference
/// of the kernel check). `None` when `src` does not hold `frames * 3 * h * w` values.
pub fn rgb8_host(
    src: &[f32],
    frames: usize,
    h: usize,
    w: usize,
    m: Rgb8Mutation,
) -> Option<Vec<u8>> {
    let plane = h * w;
    if src.len() != frames * 3 * plane {
        return None;
    }
    let mut out = vec![RGB8_POISON; rgb8_bytes(frames, h, w)];
    let written = if m == Rgb8Mutation::SkipLastFrame {
        frames.saturating_sub(1)
    } else {
        frames
    };
    for f in 0..written {
        for p in 0..plane {
            for c in 0..3 {
                let to = if m == Rgb8Mutation::SwapRb { 2 - c } else { c };
                out[rgb8_index(f, to, p, plane)] = code(src[staging_index(f, c, p, plane)], m);
            }
        }
    }
    Some(out)
}

/// Orders f32 values by their bits: consecutive integers are adjacent f32
/// values, through zero (both zeros map to 0).
fn ordered(v: f32) -> i64 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        -((b & 0x7fff_ffff) as i64)
    } else {
        b as i64
    }
}

fn from_ordered(o: i64) -> f32 {
    if o < 0 {
        f32::from_bits(0x8000_0000 | (-o) as u32)
    } else {
        f32::from_bits(o as u32)
    }
}

/// The value `d` f32 steps from `v` (finite `v`, small `d`).
pub fn nudge(v: f32, d: i64) -> f32 {
    from_ordered(ordered(v) + d)
}

/// The f32 steps each side of a rounding boundary the probe covers.
pub const PROBE_ULPS: i64 = 256;

/// Positions where `got` and `want` differ, and the largest difference.
pub fn mismatches(got: &[u8], want: &[u8]) -> (usize, u8) {
    if got.len() != want.len() {
        return (got.len().max(want.len()), u8::MAX);
    }
    got.iter()
        .zip(want)
        .filter(|(a, b)| a != b)
        .fold((0, 0), |(n, m), (a, b)| (n + 1, m.max(a.abs_diff(*b))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::fixtures::rgb8::probe_values;
    use crate::cuda::fixtures::Rng;

    #[test]
    fn layouts_interleave_the_planes_of_each_frame() {
        // 2 frames of 2x3: plane 6.
        assert_eq!(staging_index(0, 0, 0, 6), 0);
        assert_eq!(staging_index(0, 2, 5, 6), 17);
        assert_eq!(staging_index(1, 1, 4, 6), 28);
        assert_eq!(rgb8_index(0, 2, 0, 6), 2);
        assert_eq!(rgb8_index(0, 0, 5, 6), 15);
        assert_eq!(rgb8_index(1, 1, 4, 6), 31);
        assert_eq!(rgb8_bytes(2, 2, 3), 36);
        // Every staging value lands once, at a distinct byte.
        let (f, h, w) = (3usize, 2usize, 5usize);
        let n = f * 3 * h * w;
        let src: Vec<f32> = (0..n).map(|i| i as f32 / n as f32 * 2.0 - 1.0).collect();
        let out = rgb8_host(&src, f, h, w, Rgb8Mutation::None).unwrap();
        for fi in 0..f {
            for p in 0..h * w {
                for c in 0..3 {
                    let want = to_u8(src[staging_index(fi, c, p, h * w)]);
                    assert_eq!(out[rgb8_index(fi, c, p, h * w)], want, "{fi} {p} {c}");
                }
            }
        }
        assert!(rgb8_host(&src[1..], f, h, w, Rgb8Mutation::None).is_none());
    }

    #[test]
    fn the_unmutated_code_is_the_hosts_mapping() {
        for v in [-1.5f32, -1.0, 0.0, 0.5, 1.0, 2.0, f32::NAN, -0.0] {
            assert_eq!(code(v, Rgb8Mutation::None), to_u8(v));
        }
    }

    #[test]
    fn nudge_steps_through_zero_and_the_edges() {
        assert_eq!(nudge(0.0, 1), f32::from_bits(1));
        assert_eq!(nudge(0.0, -1), -f32::from_bits(1));
        assert_eq!(nudge(f32::from_bits(1), -2), -f32::from_bits(1));
        assert_eq!(nudge(1.0, 1), 1.0 + f32::EPSILON);
        assert_eq!(nudge(1.0, -1), 1.0 - f32::EPSILON / 2.0);
        assert_eq!(nudge(-1.0, 1), -1.0 + f32::EPSILON / 2.0);
        assert_eq!(nudge(-1.0, -1), -1.0 - f32::EPSILON);
    }

    #[test]
    fn the_probe_holds_exact_ties_and_every_code() {
        let p = probe_values(&mut Rng::new(7), 1000);
        // Exact x = k + 0.5 where an f32 gives one (191 of the 255
        // boundaries: x's grid is coarser than v's near the low codes), even
        // k among them (what rint gets wrong).
        let mut ties = std::collections::BTreeSet::new();
        for &v in &p {
            let x = ((v + 1.0) * 0.5).clamp(0.0, 1.0) * 255.0;
            if x.fract() == 0.5 {
                ties.insert(x.floor() as u32);
            }
        }
        let even = ties.iter().filter(|k| *k % 2 == 0).count();
        assert!(
            ties.len() >= 180 && even >= 80,
            "{} ties, {even} even",
            ties.len()
        );
        let codes: std::collections::BTreeSet<u8> = p.iter().map(|v| to_u8(*v)).collect();
        assert_eq!(codes.len(), 256);
        assert!(p.iter().any(|v| v.is_nan()) && p.iter().any(|v| v.abs() > 1.0));
    }

    #[test]
    fn every_mutation_changes_the_probes_bytes() {
        // What the device check runs: the probe as 2 frames of h x w, padded.
        let mut p = probe_values(&mut Rng::new(0x5eed), 4096);
        let (h, w) = (37usize, 64usize);
        let frame = 3 * h * w;
        let frames = p.len().div_ceil(frame);
        p.resize(frames * frame, 0.25);
        let want = rgb8_host(&p, frames, h, w, Rgb8Mutation::None).unwrap();
        for m in Rgb8Mutation::DEFECTS {
            let got = rgb8_host(&p, frames, h, w, m).unwrap();
            let (n, _) = mismatches(&got, &want);
            assert!(n > 0, "{m:?} does not change the probe's bytes");
        }
        // rint and fma differ only on a few values: the ties and their neighbours.
        let rint = rgb8_host(&p, frames, h, w, Rgb8Mutation::Rint).unwrap();
        let (n, max) = mismatches(&rint, &want);
        assert!(n >= 100 && max == 1, "{n} {max}");
        let fma = rgb8_host(&p, frames, h, w, Rgb8Mutation::Fma).unwrap();
        let (n, max) = mismatches(&fma, &want);
        assert!(n >= 1 && max == 1, "{n} {max}");
    }

    #[test]
    fn mismatches_count_and_measure() {
        assert_eq!(mismatches(&[1, 2, 3], &[1, 5, 0]), (2, 3));
        assert_eq!(mismatches(&[1, 2], &[1, 2]), (0, 0));
        assert_eq!(mismatches(&[1], &[1, 2]).0, 2);
    }
}
