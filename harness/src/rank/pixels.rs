//! Pixel-level comparison of two renders' frames: the sum of squared differences,
//! the largest absolute difference and PSNR over 8-bit samples, and the one reader
//! of a bundle's frame images (8-bit RGB PNGs, as the engine and the diffusers
//! reference write them).
//!
//! PSNR (decibels) is `10 * log10(255^2 / MSE)` with MSE the mean of the squared
//! differences over every sample compared (each of R, G and B of every pixel of
//! every image, pooled): one figure per pair of renders, infinite when every sample
//! is equal. The maximum absolute error is the largest `|a - b|` of one sample,
//! 0-255.

use std::io::BufReader;
use std::path::{Path, PathBuf};

/// The peak value of an 8-bit sample.
pub const PEAK: f64 = 255.0;

/// The most bytes one decoded frame image may take (256 MiB: 8-bit RGB of
/// 9,000 x 9,000 pixels, far beyond any rung); a larger declared size is refused
/// before anything is allocated.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

/// Differences accumulated over samples of two renders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleDiff {
    /// Samples compared.
    pub samples: u64,
    /// Sum of squared differences, in squared sample units (0-255 scale).
    pub sse: u128,
    /// Largest absolute difference of one sample, 0-255.
    pub max_abs: u8,
}

impl SampleDiff {
    /// Accumulate the samples of `a` against `b` (equal lengths; the caller checks).
    pub fn add(&mut self, a: &[u8], b: &[u8]) {
        let mut sse: u64 = 0;
        let mut max = self.max_abs;
        for (&x, &y) in a.iter().zip(b) {
            let d = x.abs_diff(y);
            max = max.max(d);
            sse += u64::from(d) * u64::from(d);
        }
        self.sse += u128::from(sse);
        self.samples += a.len().min(b.len()) as u64;
        self.max_abs = max;
    }

    /// Mean squared error in squared sample units; `None` when nothing was compared.
    pub fn mse(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.sse as f64 / self.samples as f64)
    }

    /// PSNR in decibels against [`PEAK`]: `+inf` when every sample is equal,
    /// `None` when nothing was compared.
    pub fn psnr_db(&self) -> Option<f64> {
        let mse = self.mse()?;
        Some(if mse == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (PEAK * PEAK / mse).log10()
        })
    }
}

/// One decoded frame image: 8-bit RGB, row-major, 3 bytes per pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The samples, `width * height * 3` bytes.
    pub rgb: Vec<u8>,
}

/// A frame image could not be read as 8-bit RGB.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {detail}")]
pub struct ImageError {
    /// The image file.
    pub file: PathBuf,
    /// What failed.
    pub detail: String,
}

/// Read the PNG at `path` as 8-bit RGB: any other colour type or depth is an
/// error (a converted image would not be the frame the engine wrote), and so is a
/// declared size over [`MAX_IMAGE_BYTES`].
pub fn read_rgb8(path: &Path) -> Result<Rgb8, ImageError> {
    let err = |detail: String| ImageError {
        file: path.to_path_buf(),
        detail,
    };
    let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
    decode_rgb8(path, BufReader::new(file))
}

/// [`read_rgb8`]'s decoding, from any reader of PNG bytes (`path` names it in errors).
fn decode_rgb8<R: std::io::BufRead + std::io::Seek>(
    path: &Path,
    input: R,
) -> Result<Rgb8, ImageError> {
    let err = |detail: String| ImageError {
        file: path.to_path_buf(),
        detail,
    };
    let mut dec = png::Decoder::new(input);
    dec.set_limits(png::Limits {
        bytes: MAX_IMAGE_BYTES as usize,
    });
    let mut r = dec
        .read_info()
        .map_err(|e| err(format!("not a readable PNG: {e}")))?;
    let (width, height, colour, depth) = {
        let i = r.info();
        (i.width, i.height, i.color_type, i.bit_depth)
    };
    if colour != png::ColorType::Rgb || depth != png::BitDepth::Eight {
        return Err(err(format!(
            "expected 8-bit RGB, found {colour:?} at {depth:?} bits"
        )));
    }
    let bytes = u64::from(width) * u64::from(height) * 3;
    if bytes > MAX_IMAGE_BYTES {
        return Err(err(format!(
            "{width}x{height} pixels declared: {bytes} bytes, more than the {MAX_IMAGE_BYTES} read"
        )));
    }
    let mut rgb = vec![0u8; bytes as usize];
    let info = r
        .next_frame(&mut rgb)
        .map_err(|e| err(format!("cannot decode: {e}")))?;
    rgb.truncate(info.buffer_size());
    if rgb.len() as u64 != bytes {
        return Err(err(format!(
            "decoded {} bytes, expected {bytes}",
            rgb.len()
        )));
    }
    Ok(Rgb8 { width, height, rgb })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Write `rgb` (`w x h` pixels) as an 8-bit RGB PNG at `path`.
    pub(crate) fn write_rgb8(path: &Path, w: u32, h: u32, rgb: &[u8]) {
        let f = std::fs::File::create(path).expect("create png");
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().expect("png header");
        wr.write_image_data(rgb).expect("png data");
    }

    #[test]
    fn identical_samples_are_infinite_psnr_and_zero_error() {
        let a = [0u8, 17, 255, 128];
        let mut d = SampleDiff::default();
        d.add(&a, &a);
        assert_eq!(d.samples, 4);
        assert_eq!(d.mse(), Some(0.0));
        assert_eq!(d.psnr_db(), Some(f64::INFINITY));
        assert_eq!(d.max_abs, 0);
        assert_eq!(SampleDiff::default().psnr_db(), None);
    }

    #[test]
    fn psnr_and_max_abs_match_hand_values() {
        // Four samples, one differing by 255: MSE = 255^2 / 4, so
        // PSNR = 10 log10(4) = 6.0206 dB; max abs 255.
        let mut d = SampleDiff::default();
        d.add(&[0, 0, 0, 0], &[255, 0, 0, 0]);
        assert_eq!(d.max_abs, 255);
        let p = d.psnr_db().unwrap();
        assert!((p - 10.0 * 4f64.log10()).abs() < 1e-12, "{p}");
        assert!((p - 6.0206).abs() < 1e-4, "{p}");
        // Every sample off by 1: MSE = 1, PSNR = 20 log10(255) = 48.1308 dB.
        let mut d = SampleDiff::default();
        d.add(&[10, 20, 30], &[11, 19, 31]);
        assert_eq!(d.max_abs, 1);
        assert!((d.psnr_db().unwrap() - 48.1308).abs() < 1e-4);
        // Pooling: 3 more samples equal halve the MSE (+3.0103 dB).
        d.add(&[5, 5, 5], &[5, 5, 5]);
        assert_eq!(d.samples, 6);
        assert!((d.psnr_db().unwrap() - (48.1308 + 3.0103)).abs() < 1e-4);
        // Differences of 3 and 4 in one image: SSE 25 over 2 samples, max 4.
        let mut d = SampleDiff::default();
        d.add(&[3, 200], &[0, 204]);
        assert_eq!((d.sse, d.max_abs), (25, 4));
        assert!((d.psnr_db().unwrap() - 10.0 * (65025.0f64 / 12.5).log10()).abs() < 1e-12);
    }

    #[test]
    fn pngs_read_back_exactly_and_other_formats_are_refused() {
        let dir = std::env::temp_dir().join(format!("harness-pixels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rgb: Vec<u8> = (0..2 * 3 * 3).map(|i| (i * 13) as u8).collect();
        let p = dir.join("a.png");
        write_rgb8(&p, 2, 3, &rgb);
        let img = read_rgb8(&p).unwrap();
        assert_eq!((img.width, img.height), (2, 3));
        assert_eq!(img.rgb, rgb);
        // Grey is not the RGB frame the engine writes.
        let g = dir.join("g.png");
        let f = std::fs::File::create(&g).unwrap();
        let mut enc = png::Encoder::new(f, 2, 2);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header()
            .unwrap()
            .write_image_data(&[1, 2, 3, 4])
            .unwrap();
        let e = read_rgb8(&g).unwrap_err().to_string();
        assert!(
            e.contains("g.png") && e.contains("expected 8-bit RGB"),
            "{e}"
        );
        std::fs::write(dir.join("bad.png"), b"not a png").unwrap();
        let e = read_rgb8(&dir.join("bad.png")).unwrap_err().to_string();
        assert!(e.contains("not a readable PNG"), "{e}");
        let e = read_rgb8(&dir.join("missing.png")).unwrap_err().to_string();
        assert!(e.contains("cannot open"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
