//! The pixel completion check: a render is complete when its frames look like a video.
//!
//! Judged on `video.y4m` (every frame), never on the exit code: every frame has a
//! distinct hash, no frame is near-black or near-uniform, and no two adjacent frames
//! are (almost) the same picture. The frame count and size must match the rung when
//! one is known, and the still frames `first.png`, `middle.png`, `last.png` must exist.
//! Luma statistics are in 8-bit code values (0-255) of the Y plane.

pub mod y4m;

use sha2::{Digest, Sha256};
use std::io::BufReader;
use std::path::Path;

use evidence::error::Y4mReadError;
use y4m::Y4mReader;

/// A frame whose mean luma is below this is near-black, in code values (0-255).
///
/// Limited-range black is 16 and full-range black is 0; 4 code values above
/// limited-range black leaves room for encoder noise. A picture whose *average*
/// brightness is this low shows nothing a viewer can see, even in a dark scene,
/// whose highlights lift the mean well above it.
pub const NEAR_BLACK_MEAN_LUMA: f64 = 20.0;

/// A frame whose luma standard deviation is below this is near-uniform, in code values.
///
/// Two code values is the spread of quantisation noise plus light dithering on a
/// flat field; any picture with an edge, a texture or a gradient across the frame
/// spreads its luma over far more than that.
pub const NEAR_UNIFORM_STD_LUMA: f64 = 2.0;

/// Adjacent frames whose mean absolute luma difference is below this are a
/// zero-motion pair, in code values.
///
/// 0.25 means fewer than one pixel in four changed by a single code value: a
/// re-encoded or re-dithered copy of the same picture. Sensor noise alone in a real
/// static shot, or the frame-to-frame change of a decoded latent video, is several
/// times larger.
pub const ZERO_MOTION_MEAN_ABS_DIFF: f64 = 0.25;

/// At most this many reasons are listed; the rest are counted in one final reason.
pub const MAX_REASONS: usize = 40;

/// The per-frame result is the journal's own row type (one `frames.parquet` row);
/// the check fills it, `harness run` journals it as it is.
pub use evidence::journal::FrameRow as FrameStats;

/// The verdict of the completion check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every check passed.
    Pass,
    /// At least one check failed; the reasons say which.
    Fail,
    /// The check was not run (the engine never started).
    NotChecked,
}

/// What the check expects, from the rung when there is one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect {
    /// Number of frames.
    pub frames: Option<u32>,
    /// Width and height in pixels.
    pub size: Option<(u32, u32)>,
}

/// The outcome: the `completion` fragment and the per-frame rows.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Pass or fail.
    pub verdict: Verdict,
    /// Every failed check, in the order found.
    pub reasons: Vec<String>,
    /// The per-frame rows, in frame order.
    pub frames: Vec<FrameStats>,
}

impl Completion {
    /// The `completion` manifest fragment.
    pub fn fragment(&self) -> evidence::fragments::Completion {
        evidence::fragments::Completion {
            verdict: serde_json::to_value(&self.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string)),
            reasons: Some(
                self.reasons
                    .iter()
                    .map(|r| serde_json::Value::String(r.clone()))
                    .collect(),
            ),
            frames: Some(self.frames.len() as u64),
        }
    }

    /// The fragment for a run whose engine never ran.
    pub fn not_checked(why: &str) -> Completion {
        Completion {
            verdict: Verdict::NotChecked,
            reasons: vec![why.to_string()],
            frames: Vec::new(),
        }
    }
}

/// Luma statistics of one Y plane.
fn luma_stats(y: &[u8]) -> (f64, f64, f64, f64) {
    let n = y.len().max(1) as f64;
    let (mut sum, mut sq, mut lo, mut hi) = (0u64, 0u64, u8::MAX, u8::MIN);
    for &v in y {
        sum += v as u64;
        sq += (v as u64) * (v as u64);
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let mean = sum as f64 / n;
    let var = (sq as f64 / n - mean * mean).max(0.0);
    (mean, var.sqrt(), lo as f64, hi as f64)
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    let total: u64 = a.iter().zip(b).map(|(&x, &y)| x.abs_diff(y) as u64).sum();
    total as f64 / a.len().max(1) as f64
}

/// Check the frames in `frames_dir` (`video.y4m` and the still PNGs).
pub fn check_frames_dir(frames_dir: &Path, expect: Expect) -> Completion {
    let video = frames_dir.join("video.y4m");
    let mut c = match std::fs::File::open(&video) {
        Ok(f) => check_stream(BufReader::new(f), expect),
        Err(e) => Completion {
            verdict: Verdict::Fail,
            reasons: vec![format!("{}: cannot open: {e}", video.display())],
            frames: Vec::new(),
        },
    };
    for still in ["first.png", "middle.png", "last.png"] {
        if !frames_dir.join(still).is_file() {
            c.reasons.push(format!("{still} missing"));
        }
    }
    if !c.reasons.is_empty() {
        c.verdict = Verdict::Fail;
    }
    c
}

/// Check a YUV4MPEG2 stream.
pub fn check_stream<R: std::io::BufRead>(input: R, expect: Expect) -> Completion {
    let mut reasons = Vec::new();
    let mut frames: Vec<FrameStats> = Vec::new();
    let result: Result<(), Y4mReadError> = (|| {
        let mut reader = Y4mReader::new(input)?;
        let h = reader.header().clone();
        if let Some((w, hh)) = expect.size {
            if (h.width, h.height) != (w, hh) {
                reasons.push(format!(
                    "frame size {}x{} differs from the expected {w}x{hh}",
                    h.width, h.height
                ));
            }
        }
        let (mut cur, mut prev) = (Vec::new(), Vec::new());
        let mut seen: std::collections::HashMap<String, u32> = Default::default();
        let luma = h.luma_bytes();
        while reader.next_frame(&mut cur)? {
            let index = frames.len() as u32;
            let sha256 = format!("{:x}", Sha256::digest(&cur));
            let (mean, std, lo, hi) = luma_stats(&cur[..luma]);
            let motion = (index > 0).then(|| mean_abs_diff(&cur[..luma], &prev[..luma]));
            let duplicate_of = seen.get(&sha256).copied();
            seen.entry(sha256.clone()).or_insert(index);
            let row = FrameStats {
                index,
                sha256,
                mean_luma: mean,
                std_luma: std,
                min_luma: lo,
                max_luma: hi,
                motion_vs_prev: motion,
                near_black: mean < NEAR_BLACK_MEAN_LUMA,
                near_uniform: std < NEAR_UNIFORM_STD_LUMA,
                duplicate_of,
            };
            if row.near_black {
                reasons.push(format!(
                    "frame {index}: near-black (mean luma {mean:.2} < {NEAR_BLACK_MEAN_LUMA})"
                ));
            }
            if row.near_uniform {
                reasons.push(format!(
                    "frame {index}: near-uniform (luma std {std:.3} < {NEAR_UNIFORM_STD_LUMA})"
                ));
            }
            if let Some(d) = duplicate_of {
                reasons.push(format!("frame {index}: same hash as frame {d}"));
            }
            if let Some(m) = motion.filter(|&m| m < ZERO_MOTION_MEAN_ABS_DIFF) {
                reasons.push(format!(
                    "frames {} and {index}: zero motion (mean abs luma diff {m:.3} < {ZERO_MOTION_MEAN_ABS_DIFF})",
                    index - 1
                ));
            }
            frames.push(row);
            std::mem::swap(&mut cur, &mut prev);
        }
        Ok(())
    })();
    if let Err(e) = result {
        reasons.push(format!("video.y4m: {e}"));
    }
    if frames.is_empty() {
        reasons.push("video.y4m holds no frames".into());
    }
    if let Some(n) = expect.frames {
        if frames.len() as u64 != n as u64 {
            reasons.push(format!("expected {n} frames, found {}", frames.len()));
        }
    }
    if reasons.len() > MAX_REASONS {
        let more = reasons.len() - MAX_REASONS;
        reasons.truncate(MAX_REASONS);
        reasons.push(format!("... and {more} more"));
    }
    Completion {
        verdict: if reasons.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        reasons,
        frames,
    }
}

#[cfg(test)]
mod tests {
    use super::y4m::{header_line, Chroma, Header};
    use super::*;

    const W: u32 = 16;
    const H: u32 = 8;

    fn xorshift(seed: u32) -> impl FnMut() -> u8 {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        }
    }

    /// A 4:4:4 stream of `lumas` frames (random chroma).
    fn video(lumas: &[Vec<u8>]) -> Vec<u8> {
        let h = Header {
            width: W,
            height: H,
            fps: Some((25, 1)),
            chroma: Chroma::C444,
        };
        let mut out = header_line(&h).into_bytes();
        let mut r = xorshift(99);
        for y in lumas {
            out.extend_from_slice(b"FRAME\n");
            out.extend_from_slice(y);
            out.extend((0..2 * y.len()).map(|_| r()));
        }
        out
    }

    fn random_luma(seed: u32) -> Vec<u8> {
        let mut r = xorshift(seed);
        (0..(W * H)).map(|_| r()).collect()
    }

    fn good(n: u32) -> Vec<Vec<u8>> {
        (1..=n).map(random_luma).collect()
    }

    fn check(lumas: &[Vec<u8>], expect: Expect) -> Completion {
        check_stream(&video(lumas)[..], expect)
    }

    #[test]
    fn random_frames_pass_with_stats_computed() {
        let frames = good(5);
        let c = check(
            &frames,
            Expect {
                frames: Some(5),
                size: Some((W, H)),
            },
        );
        assert_eq!(c.verdict, Verdict::Pass, "{:?}", c.reasons);
        assert_eq!(c.frames.len(), 5);
        let f0 = &frames[0];
        let mean = f0.iter().map(|&v| v as f64).sum::<f64>() / f0.len() as f64;
        assert!((c.frames[0].mean_luma - mean).abs() < 1e-9);
        assert_eq!(c.frames[0].min_luma, *f0.iter().min().unwrap() as f64);
        assert_eq!(c.frames[0].max_luma, *f0.iter().max().unwrap() as f64);
        assert_eq!(c.frames[0].motion_vs_prev, None);
        let mad = f0
            .iter()
            .zip(&frames[1])
            .map(|(&a, &b)| a.abs_diff(b) as f64)
            .sum::<f64>()
            / f0.len() as f64;
        assert!((c.frames[1].motion_vs_prev.unwrap() - mad).abs() < 1e-9);
        assert_eq!(c.frames[0].sha256.len(), 64);
        assert!(c.frames.iter().all(|f| f.duplicate_of.is_none()));
    }

    #[test]
    fn a_black_frame_fails_near_black_and_near_uniform() {
        let mut frames = good(4);
        frames[2] = vec![0; (W * H) as usize];
        let c = check(&frames, Expect::default());
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.frames[2].near_black && c.frames[2].near_uniform);
        assert!(c
            .reasons
            .iter()
            .any(|r| r.starts_with("frame 2: near-black")));
        assert!(!c.frames[1].near_black);
    }

    #[test]
    fn a_bright_flat_frame_is_near_uniform_only() {
        let mut frames = good(3);
        frames[1] = (0..W * H).map(|i| 180 + (i % 2) as u8).collect();
        let c = check(&frames, Expect::default());
        assert!(c.frames[1].near_uniform && !c.frames[1].near_black);
        assert_eq!(c.verdict, Verdict::Fail);
    }

    #[test]
    fn a_repeated_frame_is_a_duplicate_and_zero_motion() {
        // Frame 3 repeats frame 2's bytes exactly (luma and chroma).
        let frames = good(3);
        let mut bytes = video(&frames);
        let last_start = bytes.len() - 3 * (W * H) as usize - 6;
        let last = bytes[last_start..].to_vec();
        bytes.extend_from_slice(&last);
        let c = check_stream(&bytes[..], Expect::default());
        assert_eq!(c.frames[3].duplicate_of, Some(2));
        assert_eq!(c.frames[3].motion_vs_prev, Some(0.0));
        assert!(c.reasons.iter().any(|r| r.contains("same hash as frame 2")));
        assert!(c
            .reasons
            .iter()
            .any(|r| r.contains("frames 2 and 3: zero motion")));
    }

    #[test]
    fn near_identical_adjacent_frames_are_zero_motion_without_duplicate_hash() {
        let mut frames = good(3);
        let mut almost = frames[1].clone();
        almost[0] = almost[0].wrapping_add(1);
        frames[2] = almost;
        let c = check(&frames, Expect::default());
        assert_eq!(c.frames[2].duplicate_of, None);
        assert!(c.frames[2].motion_vs_prev.unwrap() < ZERO_MOTION_MEAN_ABS_DIFF);
        assert_eq!(c.verdict, Verdict::Fail);
    }

    #[test]
    fn count_and_size_must_match_the_expectation() {
        let c = check(
            &good(3),
            Expect {
                frames: Some(9),
                size: Some((64, 64)),
            },
        );
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.reasons.iter().any(|r| r == "expected 9 frames, found 3"));
        assert!(c
            .reasons
            .iter()
            .any(|r| r.contains("16x8 differs from the expected 64x64")));
    }

    #[test]
    fn a_truncated_or_empty_video_fails() {
        let mut bytes = video(&good(2));
        bytes.truncate(bytes.len() - 10);
        let c = check_stream(&bytes[..], Expect::default());
        assert_eq!(c.verdict, Verdict::Fail);
        assert_eq!(c.frames.len(), 1);
        assert!(c.reasons.iter().any(|r| r.contains("frame 1: cut short")));
        let c = check_stream(&b""[..], Expect::default());
        assert_eq!(c.verdict, Verdict::Fail);
    }

    #[test]
    fn reasons_are_capped() {
        let frames = vec![vec![0u8; (W * H) as usize]; 60];
        let c = check(&frames, Expect::default());
        assert_eq!(c.reasons.len(), MAX_REASONS + 1);
        assert!(c.reasons.last().unwrap().starts_with("... and "));
    }
}
