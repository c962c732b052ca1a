//! Frames: 8-bit RGB pictures from the decoder's pixels, and the files they go to
//! (`video.y4m` via [`y4m`], `first.png`/`middle.png`/`last.png` via [`png`]).

pub mod png;
pub mod y4m;

use crate::tensor::Tensor;

/// One frame: `width * height` RGB8 pixels, row-major, interleaved `R G B`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `3 * width * height` bytes.
    pub rgb: Vec<u8>,
}

/// Pixels could not be turned into frames.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    /// The pixel tensor is not `[3, F, H, W]`.
    #[error("decoded pixels have shape {0:?}, expected [3, frames, height, width]")]
    Shape(Vec<usize>),
}

/// Map one decoder value in `[-1, 1]` to 8 bits: `round((v + 1) / 2 * 255)`,
/// clamped; NaN maps to 0 (a broken decode shows as black, never as a panic).
pub fn to_u8(v: f32) -> u8 {
    let x = ((v + 1.0) * 0.5).clamp(0.0, 1.0) * 255.0;
    if x.is_nan() {
        0
    } else {
        x.round() as u8
    }
}

/// Split decoder output `[3, F, H, W]` (values in `[-1, 1]`) into `F` RGB8 frames.
pub fn frames_from_pixels(pixels: &Tensor) -> Result<Vec<Frame>, FrameError> {
    let s = pixels.shape();
    if s.len() != 4 || s[0] != 3 {
        return Err(FrameError::Shape(s.to_vec()));
    }
    let (f, h, w) = (s[1], s[2], s[3]);
    let plane = h * w;
    let d = pixels.data();
    use rayon::prelude::*;
    Ok((0..f)
        .into_par_iter()
        .map(|fi| {
            let mut rgb = vec![0u8; 3 * plane];
            for c in 0..3 {
                let src = &d[(c * f + fi) * plane..(c * f + fi + 1) * plane];
                for (p, &v) in src.iter().enumerate() {
                    rgb[3 * p + c] = to_u8(v);
                }
            }
            Frame {
                width: w,
                height: h,
                rgb,
            }
        })
        .collect())
}

/// Full-range BT.601 luma of one RGB8 pixel, in `[0, 255]`.
pub fn luma(r: u8, g: u8, b: u8) -> f64 {
    0.299 * r as f64 + 0.587 * g as f64 + 0.114 * b as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_mapping_rounds_and_clamps() {
        assert_eq!(to_u8(-1.0), 0);
        assert_eq!(to_u8(1.0), 255);
        assert_eq!(to_u8(0.0), 128); // 127.5 rounds away from zero
        assert_eq!(to_u8(-0.5), 64); // 63.75
        assert_eq!(to_u8(7.0), 255);
        assert_eq!(to_u8(-3.0), 0);
        assert_eq!(to_u8(f32::NAN), 0);
    }

    #[test]
    fn frames_are_split_by_time_with_channels_interleaved() {
        // [3, 2, 1, 2]: value encodes (c, f, x) so each byte can be checked.
        let t = Tensor::from_fn(&[3, 2, 1, 2], |i| {
            let (c, f, x) = (i / 4, (i / 2) % 2, i % 2);
            -1.0 + 0.1 * (c * 4 + f * 2 + x) as f32
        });
        let fr = frames_from_pixels(&t).unwrap();
        assert_eq!(fr.len(), 2);
        assert_eq!((fr[1].width, fr[1].height), (2, 1));
        // frame 1, pixel 1, channel 2: index 2*4 + 1*2 + 1 = 11 -> v = 0.1.
        assert_eq!(fr[1].rgb[3 + 2], to_u8(0.1));
        assert_eq!(fr[0].rgb[0], to_u8(-1.0));
        assert_eq!(fr[0].rgb[1], to_u8(-1.0 + 0.4));
        assert!(frames_from_pixels(&Tensor::zeros(&[4, 1, 1, 1])).is_err());
    }

    #[test]
    fn luma_weights_sum_to_one() {
        assert!((luma(255, 255, 255) - 255.0).abs() < 1e-9);
        assert!((luma(255, 0, 0) - 76.245).abs() < 1e-9);
    }
}
