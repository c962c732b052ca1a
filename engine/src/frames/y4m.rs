//! `video.y4m`: YUV4MPEG2, 4:4:4 8-bit (`C444`), BT.601 full range, frame rate as an
//! exact ratio (`F25:1`, `F30000:1001`).
//!
//! The header is `YUV4MPEG2 W<w> H<h> F<n>:<d> Ip A1:1 C444 XCOLORRANGE=FULL`; each
//! frame is `FRAME\n` then the Y, Cb and Cr planes, `w * h` bytes each. The
//! conversion from RGB is the full-range BT.601 matrix (JPEG's):
//! `Y = 0.299 R + 0.587 G + 0.114 B`, `Cb = 128 - 0.168736 R - 0.331264 G + 0.5 B`,
//! `Cr = 128 + 0.5 R - 0.418688 G - 0.081312 B`, rounded and clamped to 0..=255.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::Frame;

/// A y4m file could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum Y4mError {
    /// An I/O error on the file.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A frame of another size than the header's.
    #[error("{file}: frame {index} is {got_w}x{got_h}, the stream is {w}x{h}")]
    FrameSize {
        /// The file.
        file: PathBuf,
        /// 0-based frame index.
        index: usize,
        /// Stream width.
        w: usize,
        /// Stream height.
        h: usize,
        /// Frame width.
        got_w: usize,
        /// Frame height.
        got_h: usize,
    },
    /// The file is not a 4:4:4 YUV4MPEG2 stream this module writes.
    #[error("{file}: not a C444 YUV4MPEG2 stream: {detail}")]
    Format {
        /// The file.
        file: PathBuf,
        /// What was wrong.
        detail: String,
    },
}

/// The frame rate `fps` as an exact ratio `(numerator, denominator)`: integers as
/// `n:1`, NTSC-style rates as `n:1001`, anything else to 1/1000000 reduced.
pub fn fps_ratio(fps: f64) -> (u64, u64) {
    for d in [1u64, 1001, 1000] {
        let n = (fps * d as f64).round();
        if n >= 1.0 && (n / d as f64 - fps).abs() < 1e-9 * fps.max(1.0) {
            let n = n as u64;
            let g = gcd(n, d);
            return (n / g, d / g);
        }
    }
    let d = 1_000_000u64;
    let n = ((fps * d as f64).round() as u64).max(1);
    let g = gcd(n, d);
    (n / g, d / g)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn clamp_round(v: f64) -> u8 {
    v.round().clamp(0.0, 255.0) as u8
}

/// Full-range BT.601 `(Y, Cb, Cr)` of one RGB8 pixel.
pub fn rgb_to_ycbcr(r: u8, g: u8, b: u8) -> (u8, u8, u8) {
    let (r, g, b) = (r as f64, g as f64, b as f64);
    (
        clamp_round(0.299 * r + 0.587 * g + 0.114 * b),
        clamp_round(128.0 - 0.168736 * r - 0.331264 * g + 0.5 * b),
        clamp_round(128.0 + 0.5 * r - 0.418688 * g - 0.081312 * b),
    )
}

/// A streaming y4m writer: the header at creation, one frame per call.
pub struct Y4mWriter {
    out: BufWriter<File>,
    path: PathBuf,
    width: usize,
    height: usize,
    frames: usize,
}

impl Y4mWriter {
    /// Create `path` (replacing it) for `width x height` frames at `fps`.
    pub fn create(path: &Path, width: usize, height: usize, fps: f64) -> Result<Self, Y4mError> {
        let io = |source| Y4mError::Io {
            file: path.to_path_buf(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        let (n, d) = fps_ratio(fps);
        writeln!(
            out,
            "YUV4MPEG2 W{width} H{height} F{n}:{d} Ip A1:1 C444 XCOLORRANGE=FULL"
        )
        .map_err(io)?;
        Ok(Y4mWriter {
            out,
            path: path.to_path_buf(),
            width,
            height,
            frames: 0,
        })
    }

    /// Append one frame (it must have the stream's size).
    pub fn write_frame(&mut self, f: &Frame) -> Result<(), Y4mError> {
        let planes = self.planes(f, self.frames)?;
        self.write_planes(&planes)
    }

    /// Append `frames` in order; the same bytes as [`write_frame`](Self::write_frame)
    /// on each, with the colour conversion spread over the rayon pool a batch at a
    /// time (so at most a batch of converted frames is held at once).
    pub fn write_frames(&mut self, frames: &[Frame]) -> Result<(), Y4mError> {
        use rayon::prelude::*;
        const BATCH: usize = 16;
        for chunk in frames.chunks(BATCH) {
            let first = self.frames;
            let planes: Vec<Vec<u8>> = chunk
                .par_iter()
                .enumerate()
                .map(|(i, f)| self.planes(f, first + i))
                .collect::<Result<_, _>>()?;
            for p in &planes {
                self.write_planes(p)?;
            }
        }
        Ok(())
    }

    /// Frame `index`'s Y, Cb, Cr planes (full-range BT.601), after checking its size.
    fn planes(&self, f: &Frame, index: usize) -> Result<Vec<u8>, Y4mError> {
        if f.width != self.width || f.height != self.height {
            return Err(Y4mError::FrameSize {
                file: self.path.clone(),
                index,
                w: self.width,
                h: self.height,
                got_w: f.width,
                got_h: f.height,
            });
        }
        let n = self.width * self.height;
        let mut planes = vec![0u8; 3 * n];
        for p in 0..n {
            let (y, cb, cr) = rgb_to_ycbcr(f.rgb[3 * p], f.rgb[3 * p + 1], f.rgb[3 * p + 2]);
            planes[p] = y;
            planes[n + p] = cb;
            planes[2 * n + p] = cr;
        }
        Ok(planes)
    }

    fn write_planes(&mut self, planes: &[u8]) -> Result<(), Y4mError> {
        let io = |source| Y4mError::Io {
            file: self.path.clone(),
            source,
        };
        self.out.write_all(b"FRAME\n").map_err(io)?;
        self.out.write_all(planes).map_err(io)?;
        self.frames += 1;
        Ok(())
    }

    /// Flush and sync the file; returns the number of frames written.
    pub fn finish(self) -> Result<usize, Y4mError> {
        let path = self.path.clone();
        let io = |source| Y4mError::Io {
            file: path.clone(),
            source,
        };
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok(self.frames)
    }
}

/// A y4m stream read back: geometry, rate and each frame's Y, Cb, Cr planes.
#[derive(Debug, Clone, PartialEq)]
pub struct Y4mVideo {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Frame rate numerator and denominator.
    pub fps: (u64, u64),
    /// Per frame: `3 * width * height` bytes, the Y plane then Cb then Cr.
    pub frames: Vec<Vec<u8>>,
}

impl Y4mVideo {
    /// The Y (luma) plane of frame `i`.
    pub fn luma(&self, i: usize) -> &[u8] {
        &self.frames[i][..self.width * self.height]
    }
}

/// Read a C444 stream as written by [`Y4mWriter`].
pub fn read_y4m(path: &Path) -> Result<Y4mVideo, Y4mError> {
    let bad = |detail: String| Y4mError::Format {
        file: path.to_path_buf(),
        detail,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .map(BufReader::new)
        .and_then(|mut r| r.read_to_end(&mut bytes))
        .map_err(|source| Y4mError::Io {
            file: path.to_path_buf(),
            source,
        })?;
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no header line".into()))?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| bad("header is not text".into()))?;
    let mut parts = header.split(' ');
    if parts.next() != Some("YUV4MPEG2") {
        return Err(bad("missing YUV4MPEG2 magic".into()));
    }
    let (mut w, mut h, mut fps, mut c444) = (0usize, 0usize, (0u64, 0u64), false);
    for p in parts {
        let (tag, val) = p.split_at(1.min(p.len()));
        match tag {
            "W" => w = val.parse().map_err(|_| bad(format!("bad width {val:?}")))?,
            "H" => {
                h = val
                    .parse()
                    .map_err(|_| bad(format!("bad height {val:?}")))?
            }
            "F" => {
                let (n, d) = val
                    .split_once(':')
                    .ok_or_else(|| bad(format!("bad rate {val:?}")))?;
                fps = (
                    n.parse().map_err(|_| bad(format!("bad rate {val:?}")))?,
                    d.parse().map_err(|_| bad(format!("bad rate {val:?}")))?,
                );
            }
            "C" => c444 = val == "444",
            _ => {}
        }
    }
    if !c444 || w == 0 || h == 0 {
        return Err(bad(format!("header {header:?} lacks W, H or C444")));
    }
    let frame_len = 3 * w * h;
    let mut frames = Vec::new();
    let mut at = nl + 1;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let fnl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad(format!("frame {} has no FRAME line", frames.len())))?;
        if !rest.starts_with(b"FRAME") {
            return Err(bad(format!(
                "frame {} does not start with FRAME",
                frames.len()
            )));
        }
        let start = at + fnl + 1;
        let data = bytes
            .get(start..start + frame_len)
            .ok_or_else(|| bad(format!("frame {} is cut short", frames.len())))?;
        frames.push(data.to_vec());
        at = start + frame_len;
    }
    Ok(Y4mVideo {
        width: w,
        height: h,
        fps,
        frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/y4m")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn bt601_full_range_matches_hand_values() {
        assert_eq!(rgb_to_ycbcr(0, 0, 0), (0, 128, 128));
        assert_eq!(rgb_to_ycbcr(255, 255, 255), (255, 128, 128));
        // Pure red: Y = 76.245, Cb = 128 - 43.03 = 84.97, Cr = 128 + 127.5 -> 255.5 -> 255.
        assert_eq!(rgb_to_ycbcr(255, 0, 0), (76, 85, 255));
        // Pure blue: Y = 29.07, Cb = 255.5 -> 255, Cr = 128 - 20.73 = 107.27.
        assert_eq!(rgb_to_ycbcr(0, 0, 255), (29, 255, 107));
    }

    #[test]
    fn fps_is_an_exact_ratio() {
        assert_eq!(fps_ratio(25.0), (25, 1));
        assert_eq!(fps_ratio(30000.0 / 1001.0), (30000, 1001));
        assert_eq!(fps_ratio(12.5), (25, 2));
    }

    #[test]
    fn written_stream_reads_back_frame_by_frame() {
        let d = dir("roundtrip");
        let p = d.join("video.y4m");
        let frames: Vec<Frame> = (0..3u8)
            .map(|k| Frame {
                width: 4,
                height: 2,
                rgb: (0..24u8)
                    .map(|i| i.wrapping_mul(11).wrapping_add(k * 40))
                    .collect(),
            })
            .collect();
        let mut w = Y4mWriter::create(&p, 4, 2, 25.0).unwrap();
        for f in &frames {
            w.write_frame(f).unwrap();
        }
        assert_eq!(w.finish().unwrap(), 3);
        let text = std::fs::read(&p).unwrap();
        assert!(text.starts_with(b"YUV4MPEG2 W4 H2 F25:1 Ip A1:1 C444 XCOLORRANGE=FULL\nFRAME\n"));
        assert_eq!(text.len(), 52 + 3 * (6 + 24));
        let v = read_y4m(&p).unwrap();
        assert_eq!(
            (v.width, v.height, v.fps, v.frames.len()),
            (4, 2, (25, 1), 3)
        );
        let f = &frames[2];
        let (y, cb, cr) = rgb_to_ycbcr(f.rgb[3], f.rgb[4], f.rgb[5]);
        assert_eq!(v.frames[2][1], y);
        assert_eq!(v.frames[2][8 + 1], cb);
        assert_eq!(v.frames[2][16 + 1], cr);
        let mut w = Y4mWriter::create(&p, 4, 2, 25.0).unwrap();
        let e = w
            .write_frame(&Frame {
                width: 2,
                height: 2,
                rgb: vec![0; 12],
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("frame 0 is 2x2") && e.contains("4x2"), "{e}");
    }

    /// The batched, parallel writer gives the serial writer's bytes exactly, over
    /// more than one batch and a partial last batch; a wrong-size frame deep in a
    /// batch is named by its index in the stream. Mutation: write a batch's planes
    /// in completion order instead of frame order and the bytes differ.
    #[test]
    fn batched_writing_equals_frame_by_frame_writing() {
        let d = dir("batched");
        let mut x = 0x1234_5678u32;
        let frames: Vec<Frame> = (0..37)
            .map(|_| Frame {
                width: 10,
                height: 6,
                rgb: (0..180)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect(),
            })
            .collect();
        let (a, b) = (d.join("serial.y4m"), d.join("batched.y4m"));
        let mut w = Y4mWriter::create(&a, 10, 6, 25.0).unwrap();
        for f in &frames {
            w.write_frame(f).unwrap();
        }
        assert_eq!(w.finish().unwrap(), 37);
        let mut w = Y4mWriter::create(&b, 10, 6, 25.0).unwrap();
        w.write_frames(&frames).unwrap();
        assert_eq!(w.finish().unwrap(), 37);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

        let mut bad = frames.clone();
        bad[20].width = 9;
        bad[20].rgb.truncate(9 * 6 * 3);
        let mut w = Y4mWriter::create(&d.join("bad.y4m"), 10, 6, 25.0).unwrap();
        match w.write_frames(&bad) {
            Err(Y4mError::FrameSize { index, got_w, .. }) => assert_eq!((index, got_w), (20, 9)),
            other => panic!("expected a frame-size error, got {other:?}"),
        }
    }

    #[test]
    fn truncated_stream_is_a_format_error() {
        let d = dir("trunc");
        let p = d.join("v.y4m");
        std::fs::write(&p, b"YUV4MPEG2 W2 H2 F25:1 C444\nFRAME\n123").unwrap();
        let e = read_y4m(&p).unwrap_err().to_string();
        assert!(e.contains("cut short") && e.contains("v.y4m"), "{e}");
    }
}
