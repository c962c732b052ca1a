//! Verification: re-read every file of a bundle, recompute every hash, check
//! every table against its schema and the manifest.
//!
//! Checks, each failure naming its file:
//! * `manifest.json` hashes to the bundle id (its directory name) and is the
//!   canonical encoding of a schema-1 manifest;
//! * every listed file exists with the listed size and sha256, and no unlisted
//!   file is present;
//! * every Parquet table decodes completely, has exactly its documented columns
//!   (types, nullability, unit/window/source metadata) and the listed row count;
//!   `log.zst` decompresses to the listed number of lines; images are PNG;
//! * the manifest's counts agree with the tables (samples, phases, marker lines);
//! * the rung's geometry (`rung.config` width, height, frames) agrees with the
//!   frames the bundle holds: each kept PNG's size, and in a complete bundle the
//!   rows of `frames.parquet` (`check_geometry`).
//!
//! A single flipped byte anywhere is therefore caught: in `manifest.json` by the
//! id, elsewhere by the file's sha256.
//!
//! Bounded resources: a bundle may come from anywhere (`harness unpack`), so no
//! check's memory grows with what a file holds. Sizes are compared with the
//! manifest before any file is read; files are hashed by streaming them through a
//! fixed buffer; `manifest.json` is read whole only up to [`MAX_MANIFEST_BYTES`],
//! a Parquet table only after its size matched the manifest and up to
//! [`MAX_TABLE_BYTES`]; of an image only its 8-byte signature is read. `log.zst` is
//! decompressed as a stream (zstd window at most 2^[`LOG_WINDOW_LOG_MAX`] bytes)
//! and its lines counted over a fixed buffer, stopping at the first line past the
//! manifest's count, the first line longer than [`MAX_LOG_LINE_BYTES`], or
//! [`MAX_LOG_BYTES`] of text: a decompression bomb costs at most that much reading
//! and O(buffer + window) memory.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::bundle_files::{self, LOG, MANIFEST};
use crate::error::VerifyError;
use crate::fragments::{Rung, RungGeometry};
use crate::manifest::{hex, sha256_hex, Manifest};
use crate::parquet_tables;

/// The largest `manifest.json` verify reads: 16 MiB (sealed manifests are ~10 KB).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;
/// The largest Parquet table verify decodes, read whole after its size matched the
/// manifest: 256 MiB (sealed tables are ~100 KB; a day at 10 ms cadence is ~50 MB).
pub const MAX_TABLE_BYTES: u64 = 256 << 20;
/// The longest line of `log.zst`, newline included: 256 KiB. The harness cuts an
/// output line at 64 KiB (`MAX_OUTPUT_LINE`), escaping at most doubles it, and the
/// `t_ns<TAB>stream<TAB>` prefix adds under 40 bytes.
pub const MAX_LOG_LINE_BYTES: u64 = 256 << 10;
/// The most decompressed text verify reads from `log.zst`: 1 GiB. The seal builds
/// the whole text in memory, so a real log is far smaller.
pub const MAX_LOG_BYTES: u64 = 1 << 30;
/// The largest zstd window (log2 of bytes) accepted in `log.zst`: 2^24 = 16 MiB.
/// The seal compresses at level 9 (window at most 2^21); `zstd -19` uses 2^23.
pub const LOG_WINDOW_LOG_MAX: u32 = 24;
/// The read buffer for hashing and line counting: 64 KiB.
const BUF_BYTES: usize = 64 << 10;

/// The outcome of verifying one bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// The id the bundle was checked against.
    pub id: String,
    /// Files read (manifest included).
    pub files: usize,
    /// Every failure found; empty when the bundle verifies.
    pub errors: Vec<VerifyError>,
}

impl VerifyReport {
    /// True when no check failed.
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Where a bundle's files are read from: a directory, or bytes a caller holds.
enum Source<'a> {
    Dir(&'a Path),
    Mem(&'a BTreeMap<String, Vec<u8>>),
}

impl Source<'_> {
    /// The file `name`, as a reader of at most `limit` bytes.
    fn open(&self, name: &str, limit: u64) -> std::io::Result<Box<dyn Read + '_>> {
        match self {
            Source::Dir(d) => Ok(Box::new(std::fs::File::open(d.join(name))?.take(limit))),
            Source::Mem(m) => {
                let b: &[u8] = m.get(name).map(Vec::as_slice).unwrap_or_default();
                Ok(Box::new(b.take(limit)))
            }
        }
    }
}

/// Verify the bundle directory `dir` against the id it is named by.
pub fn verify_dir(dir: &Path) -> VerifyReport {
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    verify_dir_as(dir, &id)
}

/// Verify the bundle directory `dir` against `id` (bounded: see the module docs).
pub fn verify_dir_as(dir: &Path, id: &str) -> VerifyReport {
    let mut sizes = BTreeMap::new();
    let mut errors = Vec::new();
    match std::fs::read_dir(dir) {
        Err(e) => errors.push(VerifyError::Unreadable {
            file: dir.display().to_string(),
            why: e.to_string(),
        }),
        Ok(rd) => {
            for e in rd {
                let e = match e {
                    Ok(e) => e,
                    Err(err) => {
                        errors.push(VerifyError::Unreadable {
                            file: dir.display().to_string(),
                            why: err.to_string(),
                        });
                        continue;
                    }
                };
                let name = e.file_name().to_string_lossy().into_owned();
                match std::fs::metadata(e.path()) {
                    Ok(m) if m.is_file() => {
                        sizes.insert(name, m.len());
                    }
                    Ok(_) => errors.push(VerifyError::Unlisted { file: name }),
                    Err(err) => errors.push(VerifyError::Unreadable {
                        file: name,
                        why: err.to_string(),
                    }),
                }
            }
        }
    }
    let n = sizes.len();
    errors.extend(verify_source(id, &Source::Dir(dir), &sizes));
    VerifyReport {
        id: id.to_string(),
        files: n,
        errors,
    }
}

/// Verify a bundle given as file name -> bytes (`manifest.json` included). The
/// checks and their bounds are those of [`verify_dir_as`].
pub fn verify_files(id: &str, files: &BTreeMap<String, Vec<u8>>) -> Vec<VerifyError> {
    let sizes: BTreeMap<String, u64> = files
        .iter()
        .map(|(k, v)| (k.clone(), v.len() as u64))
        .collect();
    verify_source(id, &Source::Mem(files), &sizes)
}

/// sha256 (lowercase hex) and length of everything `r` yields, through a fixed buffer.
fn sha256_stream(mut r: impl Read) -> std::io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; BUF_BYTES];
    let mut n = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                h.update(&buf[..k]);
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((hex(&h.finalize()), n))
}

/// Read all of `r` (already limited by the caller) into memory.
fn read_limited(mut r: impl Read) -> std::io::Result<Vec<u8>> {
    let mut b = Vec::new();
    r.read_to_end(&mut b)?;
    Ok(b)
}

fn verify_source(id: &str, src: &Source, sizes: &BTreeMap<String, u64>) -> Vec<VerifyError> {
    let mut errors = Vec::new();
    let Some(&msize) = sizes.get(MANIFEST) else {
        return vec![VerifyError::Missing {
            file: MANIFEST.into(),
        }];
    };
    if msize > MAX_MANIFEST_BYTES {
        return vec![VerifyError::TooLarge {
            file: MANIFEST.into(),
            bytes: msize,
            limit: MAX_MANIFEST_BYTES,
        }];
    }
    let mbytes = match src
        .open(MANIFEST, MAX_MANIFEST_BYTES + 1)
        .and_then(read_limited)
    {
        Ok(b) if b.len() as u64 <= MAX_MANIFEST_BYTES => b,
        Ok(b) => {
            return vec![VerifyError::TooLarge {
                file: MANIFEST.into(),
                bytes: b.len() as u64,
                limit: MAX_MANIFEST_BYTES,
            }]
        }
        Err(e) => {
            return vec![VerifyError::Unreadable {
                file: MANIFEST.into(),
                why: e.to_string(),
            }]
        }
    };
    let actual = sha256_hex(&mbytes);
    if actual != id {
        errors.push(VerifyError::IdMismatch {
            expected: id.to_string(),
            actual,
        });
    }
    let manifest = match std::str::from_utf8(&mbytes)
        .map_err(|e| format!("not UTF-8: {e}"))
        .and_then(Manifest::from_json)
    {
        Ok(m) => m,
        Err(why) => {
            errors.push(VerifyError::Manifest { why });
            return errors;
        }
    };
    if manifest.canonical_bytes() != mbytes {
        errors.push(VerifyError::Manifest {
            why: "not in canonical form (sorted keys, compact, stable numbers)".into(),
        });
    }
    for name in sizes.keys() {
        if name != MANIFEST && !manifest.files.contains_key(name) {
            errors.push(VerifyError::Unlisted { file: name.clone() });
        }
    }
    for required in [
        bundle_files::SAMPLES,
        bundle_files::PHASES,
        bundle_files::MARKERS,
        LOG,
    ] {
        if !manifest.files.contains_key(required) {
            errors.push(VerifyError::Manifest {
                why: format!("files lacks the required {required}"),
            });
        }
    }
    for (name, entry) in &manifest.files {
        let Some(&size) = sizes.get(name) else {
            errors.push(VerifyError::Missing { file: name.clone() });
            continue;
        };
        if size != entry.bytes {
            errors.push(VerifyError::Size {
                file: name.clone(),
                expected: entry.bytes,
                actual: size,
            });
            continue;
        }
        // Read one byte past the listed size: a file that grew since it was
        // listed shows as a size mismatch, and no more than that is read.
        let (h, got) = match src
            .open(name, entry.bytes.saturating_add(1))
            .and_then(sha256_stream)
        {
            Ok(r) => r,
            Err(e) => {
                errors.push(VerifyError::Unreadable {
                    file: name.clone(),
                    why: e.to_string(),
                });
                continue;
            }
        };
        if got != entry.bytes {
            errors.push(VerifyError::Size {
                file: name.clone(),
                expected: entry.bytes,
                actual: got,
            });
            continue;
        }
        if h != entry.sha256 {
            errors.push(VerifyError::Hash {
                file: name.clone(),
                expected: entry.sha256.clone(),
                actual: h,
            });
            continue;
        }
        if let Err(e) = check_content(src, name, entry.bytes, entry.rows, &manifest) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        errors.extend(check_geometry(src, &manifest));
    }
    errors
}

/// The geometry of manifest `m`'s rung (`rung.config`): every dimension absent
/// when the bundle has no rung, the rung no config, or the config lacks it.
fn rung_geometry(m: &Manifest) -> RungGeometry {
    m.record::<Rung>()
        .and_then(|r| r.config)
        .map(|c| RungGeometry::of(&c))
        .unwrap_or_default()
}

/// The width and height in the IHDR chunk of the PNG `name` (its first 24
/// bytes: signature, chunk length, `IHDR`, width, height, big-endian).
fn png_size(src: &Source, name: &str) -> Result<(u64, u64), String> {
    let head = src
        .open(name, 24)
        .and_then(read_limited)
        .map_err(|e| e.to_string())?;
    if head.len() < 24 || &head[12..16] != b"IHDR" {
        return Err("no IHDR chunk where a PNG has it".into());
    }
    let be = |b: &[u8]| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    Ok((be(&head[16..20]), be(&head[20..24])))
}

/// The rung's geometry held against the frames the bundle holds: every kept
/// PNG must be `rung.config` width x height, and a complete bundle's
/// `frames.parquet` must hold `rung.config.frames` rows. A bundle without a
/// rung (`harness run --exec` without `--rung`) has no geometry to hold; one
/// whose rung lacks a dimension is refused by its readers, not here. Each
/// failure names the file and both sizes.
fn check_geometry(src: &Source, m: &Manifest) -> Vec<VerifyError> {
    let mut errors = Vec::new();
    let RungGeometry {
        width: w,
        height: h,
        frames: f,
        ..
    } = rung_geometry(m);
    if let (Some(w), Some(h)) = (w, h) {
        for name in bundle_files::FRAME_IMAGES {
            if !m.files.contains_key(*name) {
                continue;
            }
            match png_size(src, name) {
                Ok((pw, ph)) if (pw, ph) != (w, h) => errors.push(VerifyError::Content {
                    file: name.to_string(),
                    why: format!(
                        "the image is {pw}x{ph} but manifest.json rung.config says {w}x{h}: \
                         the rung's geometry and its frames disagree"
                    ),
                }),
                Ok(_) => {}
                Err(why) => errors.push(VerifyError::Content {
                    file: name.to_string(),
                    why,
                }),
            }
        }
    }
    if let (Some(f), true) = (f, m.complete) {
        if let Some(rows) = m.files.get(bundle_files::FRAMES).and_then(|e| e.rows) {
            if rows != f {
                errors.push(VerifyError::Content {
                    file: bundle_files::FRAMES.to_string(),
                    why: format!(
                        "{rows} frames but manifest.json rung.config.frames says {f}: the \
                         rung's geometry and its frames disagree"
                    ),
                });
            }
        }
    }
    errors
}

fn check_content(
    src: &Source,
    name: &str,
    bytes: u64,
    rows: Option<u64>,
    m: &Manifest,
) -> Result<(), VerifyError> {
    let content = |why: String| VerifyError::Content {
        file: name.to_string(),
        why,
    };
    let unreadable = |e: std::io::Error| VerifyError::Unreadable {
        file: name.to_string(),
        why: e.to_string(),
    };
    let schemas = parquet_tables::schemas_for(name);
    if !schemas.is_empty() {
        if bytes > MAX_TABLE_BYTES {
            return Err(VerifyError::TooLarge {
                file: name.to_string(),
                bytes,
                limit: MAX_TABLE_BYTES,
            });
        }
        let data = src
            .open(name, bytes)
            .and_then(read_limited)
            .map_err(unreadable)?;
        let t = parquet_tables::read_table_as(&data, &schemas).map_err(content)?;
        if Some(t.rows) != rows {
            return Err(content(format!(
                "{} rows, manifest.json says {rows:?}",
                t.rows
            )));
        }
        let counted = match name {
            bundle_files::SAMPLES => Some(("cadence.samples", m.cadence.samples)),
            bundle_files::PHASES => Some(("phases.instances", m.phases.instances)),
            bundle_files::MARKERS => Some(("markers.lines", m.markers.lines)),
            _ => None,
        };
        if let Some((key, n)) = counted {
            if n != t.rows {
                return Err(content(format!(
                    "{} rows, manifest.json {key} says {n}",
                    t.rows
                )));
            }
        }
        return Ok(());
    }
    if name == LOG {
        let Some(rows) = rows else {
            return Err(content("manifest.json lists no line count for it".into()));
        };
        let r = src.open(name, bytes).map_err(unreadable)?;
        let lines = log_lines(r, rows).map_err(content)?;
        if lines != rows {
            return Err(content(format!("{lines} lines, manifest.json says {rows}")));
        }
        return Ok(());
    }
    if name.ends_with(".png") {
        let head = src
            .open(name, PNG_SIGNATURE.len() as u64)
            .and_then(read_limited)
            .map_err(unreadable)?;
        if head != PNG_SIGNATURE {
            return Err(content("not a PNG image".into()));
        }
        return Ok(());
    }
    Err(content("not a file a schema-1 bundle holds".into()))
}

/// The lines of the zstd-compressed log `compressed`, counted as a stream within
/// the module's bounds (at most `rows` lines are counted before refusing).
fn log_lines(compressed: impl Read, rows: u64) -> Result<u64, String> {
    let mut dec =
        zstd::stream::read::Decoder::new(compressed).map_err(|e| format!("not zstd: {e}"))?;
    dec.window_log_max(LOG_WINDOW_LOG_MAX)
        .map_err(|e| format!("not zstd: {e}"))?;
    count_lines(dec, rows, MAX_LOG_LINE_BYTES, MAX_LOG_BYTES)
}

/// Count the newline-terminated lines `text` yields, through a fixed buffer,
/// refusing (in words) as soon as there are more than `rows` lines, a line (newline
/// included) is longer than `max_line` bytes, or the text passes `max_total` bytes;
/// a read error is reported as `not zstd`. Text after the last newline counts
/// toward the limits but not as a line.
fn count_lines(
    mut text: impl Read,
    rows: u64,
    max_line: u64,
    max_total: u64,
) -> Result<u64, String> {
    let mut buf = vec![0u8; BUF_BYTES];
    let (mut lines, mut line_len, mut total) = (0u64, 0u64, 0u64);
    loop {
        let n = match text.read(&mut buf) {
            Ok(0) => return Ok(lines),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("not zstd: {e}")),
        };
        total += n as u64;
        if total > max_total {
            return Err(format!(
                "decompresses to more than {max_total} bytes, the most verify reads of a log; stopped there"
            ));
        }
        let mut rest = &buf[..n];
        let too_long = |lines: u64| {
            format!(
                "line {} is longer than {max_line} bytes, the longest a log line can be; stopped after {total} decompressed bytes",
                lines + 1
            )
        };
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            line_len += i as u64 + 1;
            if line_len > max_line {
                return Err(too_long(lines));
            }
            lines += 1;
            if lines > rows {
                return Err(format!(
                    "more than {rows} lines (manifest.json says {rows}); stopped after {total} decompressed bytes"
                ));
            }
            line_len = 0;
            rest = &rest[i + 1..];
        }
        line_len += rest.len() as u64;
        if line_len > max_line {
            return Err(too_long(lines));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A reader that counts the bytes taken from it.
    struct Counted<R> {
        inner: R,
        n: std::rc::Rc<std::cell::Cell<u64>>,
    }

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let k = self.inner.read(buf)?;
            self.n.set(self.n.get() + k as u64);
            Ok(k)
        }
    }

    /// `n` bytes of `byte`, zstd-compressed at `level` as a stream (never held whole).
    fn zstd_of_repeated(byte: u8, n: u64, level: i32) -> Vec<u8> {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), level).unwrap();
        let block = vec![byte; 1 << 20];
        let mut left = n;
        while left > 0 {
            let k = left.min(block.len() as u64) as usize;
            enc.write_all(&block[..k]).unwrap();
            left -= k as u64;
        }
        enc.finish().unwrap()
    }

    #[test]
    fn count_lines_counts_and_stops_at_each_limit() {
        assert_eq!(count_lines(&b"a\nbb\n"[..], 2, 8, 100), Ok(2));
        assert_eq!(count_lines(&b""[..], 0, 8, 100), Ok(0));
        // Text after the last newline is not a line.
        assert_eq!(count_lines(&b"a\nb"[..], 2, 8, 100), Ok(1));
        let e = count_lines(&b"a\nb\nc\n"[..], 2, 8, 100).unwrap_err();
        assert!(e.starts_with("more than 2 lines"), "{e}");
        // A line of exactly max_line bytes (newline included) passes; one more does not.
        assert_eq!(count_lines(&b"1234567\n"[..], 1, 8, 100), Ok(1));
        let e = count_lines(&b"12345678\n"[..], 1, 8, 100).unwrap_err();
        assert!(e.starts_with("line 1 is longer than 8 bytes"), "{e}");
        let e = count_lines(&b"a\n123456789"[..], 5, 8, 100).unwrap_err();
        assert!(e.starts_with("line 2 is longer"), "{e}");
        let e = count_lines(&[b'\n'; 200][..], 1000, 8, 100).unwrap_err();
        assert!(e.contains("more than 100 bytes"), "{e}");
    }

    /// 1 GiB of zeros (one endless line) is refused once one line passes
    /// MAX_LOG_LINE_BYTES: the decoder is asked for at most that plus one buffer.
    #[test]
    fn a_log_zst_bomb_of_one_endless_line_stops_after_one_line_limit() {
        let bomb = zstd_of_repeated(0, 1 << 30, 3);
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        let taken = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut dec = zstd::stream::read::Decoder::new(bomb.as_slice()).unwrap();
        dec.window_log_max(LOG_WINDOW_LOG_MAX).unwrap();
        let counted = Counted {
            inner: dec,
            n: taken.clone(),
        };
        let e = count_lines(counted, 1 << 20, MAX_LOG_LINE_BYTES, MAX_LOG_BYTES).unwrap_err();
        assert!(e.starts_with("line 1 is longer than 262144 bytes"), "{e}");
        assert!(
            taken.get() <= MAX_LOG_LINE_BYTES + BUF_BYTES as u64,
            "{} bytes decompressed",
            taken.get()
        );
    }

    /// Newlines only, with a line count the manifest could claim: the absolute cap
    /// stops it (a smaller cap here; the real one is MAX_LOG_BYTES).
    #[test]
    fn a_log_zst_bomb_of_newlines_stops_at_the_total_cap() {
        let bomb = zstd_of_repeated(b'\n', 64 << 20, 3);
        let dec = zstd::stream::read::Decoder::new(bomb.as_slice()).unwrap();
        let e = count_lines(dec, u64::MAX, MAX_LOG_LINE_BYTES, 16 << 20).unwrap_err();
        assert!(e.contains("more than 16777216 bytes"), "{e}");
        // Against the manifest's count, it stops at the first line past it.
        let e = log_lines(bomb.as_slice(), 1000).unwrap_err();
        assert!(e.starts_with("more than 1000 lines"), "{e}");
    }

    #[test]
    fn a_log_zst_with_a_window_over_the_limit_is_refused() {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.window_log(LOG_WINDOW_LOG_MAX + 3).unwrap();
        enc.long_distance_matching(true).unwrap();
        enc.write_all(b"1\tstdout\thello\n").unwrap();
        let big_window = enc.finish().unwrap();
        let e = log_lines(big_window.as_slice(), 1).unwrap_err();
        assert!(e.starts_with("not zstd"), "{e}");
        // The same text with the default window counts.
        let ok = zstd::stream::encode_all(&b"1\tstdout\thello\n"[..], 9).unwrap();
        assert_eq!(log_lines(ok.as_slice(), 1), Ok(1));
    }
}
