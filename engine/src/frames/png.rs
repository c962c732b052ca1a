//! PNG frames: RGB8, 8 bits per channel, no alpha (`first.png`, `middle.png`,
//! `last.png`, and `frame_NNNNN.png` with `--all-frames`).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use super::Frame;

/// A PNG could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {detail}")]
pub struct PngError {
    /// The file.
    pub file: PathBuf,
    /// What failed.
    pub detail: String,
}

/// Write `frame` to `path` as an RGB8 PNG and sync it.
pub fn write_png(path: &Path, frame: &Frame) -> Result<(), PngError> {
    let err = |detail: String| PngError {
        file: path.to_path_buf(),
        detail,
    };
    let file = File::create(path).map_err(|e| err(e.to_string()))?;
    let mut enc = ::png::Encoder::new(
        BufWriter::new(file),
        frame.width as u32,
        frame.height as u32,
    );
    enc.set_color(::png::ColorType::Rgb);
    enc.set_depth(::png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| err(e.to_string()))?;
    w.write_image_data(&frame.rgb)
        .map_err(|e| err(e.to_string()))?;
    w.finish().map_err(|e| err(e.to_string()))?;
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| err(e.to_string()))
}

/// Read an RGB8 PNG back (tests and checks).
pub fn read_png(path: &Path) -> Result<Frame, PngError> {
    let err = |detail: String| PngError {
        file: path.to_path_buf(),
        detail,
    };
    let file = File::open(path).map_err(|e| err(e.to_string()))?;
    let dec = ::png::Decoder::new(std::io::BufReader::new(file));
    let mut r = dec.read_info().map_err(|e| err(e.to_string()))?;
    let mut buf = vec![0; r.output_buffer_size().unwrap_or(0)];
    let info = r.next_frame(&mut buf).map_err(|e| err(e.to_string()))?;
    if info.color_type != ::png::ColorType::Rgb || info.bit_depth != ::png::BitDepth::Eight {
        return Err(err(format!(
            "expected RGB8, found {:?} {:?}",
            info.color_type, info.bit_depth
        )));
    }
    buf.truncate(info.buffer_size());
    Ok(Frame {
        width: info.width as usize,
        height: info.height as usize,
        rgb: buf,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_roundtrips_exact_bytes() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/png");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("f.png");
        let f = Frame {
            width: 5,
            height: 3,
            rgb: (0..45u32).map(|i| (i * 37 % 256) as u8).collect(),
        };
        write_png(&p, &f).unwrap();
        assert_eq!(read_png(&p).unwrap(), f);
        let e = write_png(Path::new("/nonexistent-dir/x.png"), &f)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent-dir/x.png"), "{e}");
    }
}
