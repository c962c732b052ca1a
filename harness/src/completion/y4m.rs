//! A streaming YUV4MPEG2 reader for 8-bit 4:4:4 and 4:2:0 video.
//!
//! The format: one header line `YUV4MPEG2 W<width> H<height> F<num>:<den> ... [C<space>]`,
//! then per frame a line starting with `FRAME` (optionally with parameters) followed by
//! the planes Y, U, V with no padding. Without a `C` tag the colour space is 4:2:0
//! (`420jpeg`). Only 8-bit `C444` and the 8-bit `C420*` variants are accepted; anything
//! else is refused with an error naming the tag, never guessed.

use std::io::{BufRead, Read};

use evidence::error::Y4mReadError;

/// Chroma subsampling of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chroma {
    /// Full-resolution chroma planes.
    C444,
    /// Chroma planes at half width and half height (rounded up).
    C420,
}

/// The stream header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Frame width in pixels.
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Frame rate as numerator and denominator (`F25:1`), when given.
    pub fps: Option<(u32, u32)>,
    /// Chroma layout.
    pub chroma: Chroma,
}

impl Header {
    /// Bytes of the luma plane.
    pub fn luma_bytes(&self) -> usize {
        self.width as usize * self.height as usize
    }

    /// Bytes of one chroma plane.
    pub fn chroma_plane_bytes(&self) -> usize {
        match self.chroma {
            Chroma::C444 => self.luma_bytes(),
            Chroma::C420 => (self.width as usize).div_ceil(2) * (self.height as usize).div_ceil(2),
        }
    }

    /// Bytes of one frame's planes (Y, U and V).
    pub fn frame_bytes(&self) -> usize {
        self.luma_bytes() + 2 * self.chroma_plane_bytes()
    }
}

/// Longest header or frame line accepted, in bytes.
const MAX_LINE: usize = 4096;
/// Largest frame side accepted, in pixels (keeps a corrupt header from allocating wildly).
const MAX_SIDE: u32 = 16384;

/// Reads frames one at a time from a YUV4MPEG2 stream.
pub struct Y4mReader<R> {
    input: R,
    header: Header,
    next_index: u32,
}

fn read_line<R: BufRead>(input: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = input
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(line))
}

fn parse_header(line: &[u8]) -> Result<Header, Y4mReadError> {
    let bad = |s: String| Y4mReadError::Header(s);
    if line.last() != Some(&b'\n') {
        return Err(bad(format!("no newline within the first {MAX_LINE} bytes")));
    }
    let text = std::str::from_utf8(&line[..line.len() - 1])
        .map_err(|_| bad("the header line is not ASCII".into()))?;
    let mut tokens = text.split(' ');
    if tokens.next() != Some("YUV4MPEG2") {
        return Err(bad("expected the magic 'YUV4MPEG2' at the start".into()));
    }
    let (mut width, mut height, mut fps, mut chroma) = (None, None, None, Chroma::C420);
    for tok in tokens.filter(|t| !t.is_empty()) {
        let (tag, val) = tok.split_at(1);
        match tag {
            "W" | "H" => {
                let v: u32 = val
                    .parse()
                    .ok()
                    .filter(|v| (1..=MAX_SIDE).contains(v))
                    .ok_or_else(|| bad(format!("{tag}: expected 1..={MAX_SIDE}, found {val:?}")))?;
                if tag == "W" {
                    width = Some(v);
                } else {
                    height = Some(v);
                }
            }
            "F" => {
                let parsed = val
                    .split_once(':')
                    .and_then(|(n, d)| Some((n.parse().ok()?, d.parse().ok()?)))
                    .filter(|&(_, d): &(u32, u32)| d > 0);
                fps = Some(parsed.ok_or_else(|| {
                    bad(format!(
                        "F: expected <num>:<den> with den > 0, found {val:?}"
                    ))
                })?);
            }
            "C" => {
                chroma = match val {
                    "444" => Chroma::C444,
                    "420" | "420jpeg" | "420paldv" | "420mpeg2" => Chroma::C420,
                    other => {
                        return Err(bad(format!(
                            "C{other}: only 8-bit C444 and C420 (jpeg, paldv, mpeg2) are supported"
                        )))
                    }
                }
            }
            // Interlacing, aspect ratio and extensions do not change the plane layout.
            "I" | "A" | "X" => {}
            other => return Err(bad(format!("unknown tag {other:?} in {tok:?}"))),
        }
    }
    Ok(Header {
        width: width.ok_or_else(|| bad("missing W<width>".into()))?,
        height: height.ok_or_else(|| bad("missing H<height>".into()))?,
        fps,
        chroma,
    })
}

impl<R: BufRead> Y4mReader<R> {
    /// Read the header of `input`.
    pub fn new(mut input: R) -> Result<Self, Y4mReadError> {
        let line =
            read_line(&mut input)?.ok_or_else(|| Y4mReadError::Header("empty file".into()))?;
        let header = parse_header(&line)?;
        Ok(Y4mReader {
            input,
            header,
            next_index: 0,
        })
    }

    /// The stream header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Read the next frame's planes (Y, then U, then V) into `buf`, resized to
    /// [`Header::frame_bytes`]. `Ok(false)` at a clean end of stream.
    pub fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<bool, Y4mReadError> {
        let index = self.next_index;
        let bad = |why: String| Y4mReadError::Frame { index, why };
        let Some(line) = read_line(&mut self.input)? else {
            return Ok(false);
        };
        if !line.starts_with(b"FRAME") || line.last() != Some(&b'\n') {
            return Err(bad(format!(
                "expected a 'FRAME' line, found {:?}",
                String::from_utf8_lossy(&line[..line.len().min(32)])
            )));
        }
        buf.resize(self.header.frame_bytes(), 0);
        let mut filled = 0;
        while filled < buf.len() {
            match self.input.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Err(bad(format!(
                        "cut short: {filled} of {} plane bytes",
                        buf.len()
                    )))
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.next_index += 1;
        Ok(true)
    }
}

/// Write a YUV4MPEG2 header line for `header` (always with `F`, `Ip`, `A1:1`).
pub fn header_line(header: &Header) -> String {
    let (n, d) = header.fps.unwrap_or((25, 1));
    let c = match header.chroma {
        Chroma::C444 => "444",
        Chroma::C420 => "420jpeg",
    };
    format!(
        "YUV4MPEG2 W{} H{} F{n}:{d} Ip A1:1 C{c}\n",
        header.width, header.height
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn stream(h: &Header, frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = header_line(h).into_bytes();
        for f in frames {
            out.extend_from_slice(b"FRAME\n");
            out.extend_from_slice(f);
        }
        out
    }

    /// `n` bytes of xorshift32 noise from `seed`: test content whose bytes are not
    /// all alike (frames here, page-cache files in sampler::pagecache and weights_cache).
    pub(crate) fn noise(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn reads_444_and_420_frames_back_exactly() {
        for chroma in [Chroma::C444, Chroma::C420] {
            let h = Header {
                width: 5,
                height: 3,
                fps: Some((24000, 1001)),
                chroma,
            };
            let per = h.frame_bytes();
            assert_eq!(
                per,
                if chroma == Chroma::C444 {
                    45
                } else {
                    15 + 2 * 6
                }
            );
            let frames = vec![noise(per, 1), noise(per, 2)];
            let bytes = stream(&h, &frames);
            let mut r = Y4mReader::new(&bytes[..]).unwrap();
            assert_eq!(r.header(), &h);
            let mut buf = Vec::new();
            for f in &frames {
                assert!(r.next_frame(&mut buf).unwrap());
                assert_eq!(&buf, f);
            }
            assert!(!r.next_frame(&mut buf).unwrap());
        }
    }

    #[test]
    fn missing_c_tag_means_420_and_frame_params_are_allowed() {
        let mut bytes = b"YUV4MPEG2 W2 H2 F25:1\nFRAME Ixyz\n".to_vec();
        bytes.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
        let mut r = Y4mReader::new(&bytes[..]).unwrap();
        assert_eq!(r.header().chroma, Chroma::C420);
        let mut buf = Vec::new();
        assert!(r.next_frame(&mut buf).unwrap());
        assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn malformed_streams_are_named_errors() {
        let cases: [(&[u8], &str); 7] = [
            (b"", "empty"),
            (b"YUV4MPEG W2 H2\n", "magic"),
            (b"YUV4MPEG2 W2\n", "missing H"),
            (b"YUV4MPEG2 W0 H2\n", "W: expected"),
            (b"YUV4MPEG2 W2 H2 C422\n", "C422"),
            (b"YUV4MPEG2 W2 H2 C420p10\n", "C420p10"),
            (b"YUV4MPEG2 W2 H2 F25:0\n", "den > 0"),
        ];
        for (bytes, want) in cases {
            let e = Y4mReader::new(bytes).err().unwrap().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
        let mut short = b"YUV4MPEG2 W2 H2 C444\nFRAME\n".to_vec();
        short.extend_from_slice(&[0; 5]);
        let mut r = Y4mReader::new(&short[..]).unwrap();
        let e = r.next_frame(&mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("frame 0") && e.contains("5 of 12"), "{e}");
        let mut r = Y4mReader::new(&b"YUV4MPEG2 W2 H2\nFRAMX\n"[..]).unwrap();
        let e = r.next_frame(&mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("expected a 'FRAME' line"), "{e}");
    }
}
