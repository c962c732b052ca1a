//! The run journal: an append-only, crash-safe file of typed records.
//!
//! `harness run` appends every sample, marker line, engine output line, manifest
//! fragment and frame row to the journal in the run's staging directory as it
//! arrives; sealing turns the journal into a bundle. A run that dies leaves a
//! journal whose intact prefix still seals (see `recover`).
//!
//! # Format (version 1), all integers little-endian
//!
//! ```text
//! header   magic "EVJRNL\r\n" (8 bytes) | version u32 = 1 | sample columns u32
//! record   len u32 | crc32 u32 | type u8 | payload (len - 1 bytes)
//!          len counts type + payload; crc32 (IEEE) is over type + payload
//! type 1   Sample    t_ns u64 | ncols u16 | presence bitmap (ceil(ncols/8) bytes,
//!                    bit i of byte i/8 = column i present) | f64 per present column
//! type 2   Marker    recv_ns u64 | line (UTF-8, rest of payload)
//! type 3   Output    t_ns u64 | stream u8 (0 stdout, 1 stderr) | line (UTF-8)
//! type 4   Fragment  key_len u16 | key (UTF-8) | value (JSON text, rest of payload)
//! type 5   Frame     index u32 | sha_len u8 | sha256 (UTF-8) | mean, std, min, max f64
//!                    | has_motion u8 [| motion f64] | flags u8 (1 near_black, 2 near_uniform)
//!                    | has_dup u8 [| duplicate_of u32]
//! ```
//!
//! A sample row costs 8 + 2 + 5 + 8 per present value (at most 335 bytes for the
//! current 40 columns) plus 9 bytes of framing: a 3-hour 10 Hz run (108,000 rows)
//! is about 37 MB (GPM's columns are set on one row in ten at 10 Hz).
//!
//! A header whose column count is one of [`crate::sample::PREFIX_LAYOUTS`] (a
//! journal from before columns were appended) reads too: its rows are padded
//! with nulls to today's width.
//!
//! The reader stops at the first record that is torn (runs past the end of the
//! file) or corrupt (bad length, checksum, type or payload) and reports how many
//! bytes it dropped; every record it returns was written whole.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{io_at, IoAt, JournalError};
use crate::sample::{Sample, SAMPLE_COLUMNS};

/// The first 8 bytes of every journal.
pub const MAGIC: &[u8; 8] = b"EVJRNL\r\n";
/// The journal format version this crate writes and reads.
pub const VERSION: u32 = 1;
/// Bytes in the header: magic, version, sample column count.
pub const HEADER_BYTES: usize = 16;
/// Bytes of framing before each record's type byte: length and checksum.
pub const FRAME_BYTES: usize = 8;
/// The largest record (type + payload) accepted, in bytes.
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// How often the flusher thread wakes to flush and fdatasync pending appends.
pub const FLUSH_PERIOD: Duration = Duration::from_millis(200);

const T_SAMPLE: u8 = 1;
const T_MARKER: u8 = 2;
const T_OUTPUT: u8 = 3;
const T_FRAGMENT: u8 = 4;
const T_FRAME: u8 = 5;

/// Which standard stream of the engine a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The engine's standard output.
    Stdout,
    /// The engine's standard error.
    Stderr,
}

impl Stream {
    /// `"stdout"` or `"stderr"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Per-frame facts the harness computes from the engine's frames.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameRow {
    /// Frame index, 0-based.
    pub index: u32,
    /// sha256 of the frame's bytes as the y4m stream stores them (Y, U and V
    /// planes), lowercase hex. (The schema-1 column metadata calls it "RGB8
    /// pixels"; sealed bundles keep that string, see specs/bundle.md.)
    pub sha256: String,
    /// Mean luma, 0-255.
    pub mean_luma: f64,
    /// Standard deviation of luma, 0-255.
    pub std_luma: f64,
    /// Minimum luma, 0-255.
    pub min_luma: f64,
    /// Maximum luma, 0-255.
    pub max_luma: f64,
    /// Mean absolute luma difference to the previous frame, 0-255; `None` on frame 0.
    pub motion_vs_prev: Option<f64>,
    /// The frame is near-black.
    pub near_black: bool,
    /// The frame is near-uniform.
    pub near_uniform: bool,
    /// Index of an earlier frame with identical pixels, if any.
    pub duplicate_of: Option<u32>,
}

/// One journal record.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// One sampler row.
    Sample(Sample),
    /// One marker line as received (parsed at seal time).
    Marker {
        /// CLOCK_MONOTONIC nanoseconds when the harness received the line.
        recv_ns: u64,
        /// The line, without its newline.
        line: String,
    },
    /// One line of the engine's output.
    Output {
        /// CLOCK_MONOTONIC nanoseconds when the harness received the line.
        t_ns: u64,
        /// The stream it came from.
        stream: Stream,
        /// The line, without its newline.
        line: String,
    },
    /// A manifest fragment; a later fragment with the same key replaces the earlier.
    Fragment {
        /// The manifest key (`run`, `exit`, ...).
        key: String,
        /// The value.
        value: serde_json::Value,
    },
    /// One frame's facts.
    Frame(FrameRow),
}

impl Record {
    /// The record kind as named in the manifest's `journal.records` counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Sample(_) => "sample",
            Record::Marker { .. } => "marker",
            Record::Output { .. } => "output",
            Record::Fragment { .. } => "fragment",
            Record::Frame(_) => "frame",
        }
    }
}

/// Everything that could be read from a journal.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JournalContents {
    /// The intact records, in file order.
    pub records: Vec<Record>,
    /// Size of the file in bytes.
    pub bytes_total: u64,
    /// Bytes up to the end of the last intact record (header included).
    pub bytes_good: u64,
    /// `bytes_total - bytes_good`: the torn or corrupt tail.
    pub bytes_dropped: u64,
    /// Why reading stopped before the end of the file; `None` on a clean end.
    pub stop_reason: Option<String>,
}

/// The header bytes for a journal of the current format.
pub fn header_bytes() -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(SAMPLE_COLUMNS.len() as u32).to_le_bytes());
    h
}

fn too_long(what: &'static str, len: usize, max: usize) -> JournalError {
    JournalError::Encode {
        what,
        why: format!("{len} bytes exceeds the {max}-byte limit"),
    }
}

/// Append the framed encoding of `r` to `out`.
///
/// Promise: on error `out` is unchanged.
pub fn encode_record(r: &Record, out: &mut Vec<u8>) -> Result<(), JournalError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_BYTES]);
    let res = encode_body(r, out);
    if let Err(e) = res {
        out.truncate(start);
        return Err(e);
    }
    let body_len = out.len() - start - FRAME_BYTES;
    if body_len > MAX_RECORD_BYTES {
        out.truncate(start);
        return Err(too_long(r.kind(), body_len, MAX_RECORD_BYTES));
    }
    let crc = crc32fast::hash(&out[start + FRAME_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn encode_body(r: &Record, out: &mut Vec<u8>) -> Result<(), JournalError> {
    match r {
        Record::Sample(s) => {
            if s.values.len() != SAMPLE_COLUMNS.len() {
                return Err(JournalError::Encode {
                    what: "sample",
                    why: format!(
                        "{} values, expected one per sampler column ({})",
                        s.values.len(),
                        SAMPLE_COLUMNS.len()
                    ),
                });
            }
            out.push(T_SAMPLE);
            out.extend_from_slice(&s.t_ns.to_le_bytes());
            let n = s.values.len();
            out.extend_from_slice(&(n as u16).to_le_bytes());
            let bitmap_at = out.len();
            out.resize(bitmap_at + n.div_ceil(8), 0);
            for (i, v) in s.values.iter().enumerate() {
                if let Some(v) = v {
                    out[bitmap_at + i / 8] |= 1 << (i % 8);
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        Record::Marker { recv_ns, line } => {
            out.push(T_MARKER);
            out.extend_from_slice(&recv_ns.to_le_bytes());
            out.extend_from_slice(line.as_bytes());
        }
        Record::Output { t_ns, stream, line } => {
            out.push(T_OUTPUT);
            out.extend_from_slice(&t_ns.to_le_bytes());
            out.push(match stream {
                Stream::Stdout => 0,
                Stream::Stderr => 1,
            });
            out.extend_from_slice(line.as_bytes());
        }
        Record::Fragment { key, value } => {
            if key.len() > u16::MAX as usize {
                return Err(too_long("fragment key", key.len(), u16::MAX as usize));
            }
            let json = serde_json::to_string(value).map_err(|e| JournalError::Encode {
                what: "fragment",
                why: e.to_string(),
            })?;
            out.push(T_FRAGMENT);
            out.extend_from_slice(&(key.len() as u16).to_le_bytes());
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(json.as_bytes());
        }
        Record::Frame(f) => {
            if f.sha256.len() > u8::MAX as usize {
                return Err(too_long("frame sha256", f.sha256.len(), u8::MAX as usize));
            }
            out.push(T_FRAME);
            out.extend_from_slice(&f.index.to_le_bytes());
            out.push(f.sha256.len() as u8);
            out.extend_from_slice(f.sha256.as_bytes());
            for v in [f.mean_luma, f.std_luma, f.min_luma, f.max_luma] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            match f.motion_vs_prev {
                Some(m) => {
                    out.push(1);
                    out.extend_from_slice(&m.to_le_bytes());
                }
                None => out.push(0),
            }
            out.push(u8::from(f.near_black) | (u8::from(f.near_uniform) << 1));
            match f.duplicate_of {
                Some(d) => {
                    out.push(1);
                    out.extend_from_slice(&d.to_le_bytes());
                }
                None => out.push(0),
            }
        }
    }
    Ok(())
}

/// A cursor over a record payload; every read fails cleanly past the end.
struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.b.len() < n {
            return Err(format!("payload ends {} bytes early", n - self.b.len()));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_bits(self.u64()?))
    }
    fn flag(&mut self) -> Result<bool, String> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(format!("flag byte {x}, expected 0 or 1")),
        }
    }
    fn rest_str(&mut self) -> Result<String, String> {
        let b = std::mem::take(&mut self.b);
        String::from_utf8(b.to_vec()).map_err(|e| format!("text is not UTF-8: {e}"))
    }
    fn str(&mut self, n: usize) -> Result<String, String> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|e| format!("text is not UTF-8: {e}"))
    }
    fn end(&self) -> Result<(), String> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.b.len()))
        }
    }
}

/// Decode one record body (type byte + payload).
fn decode_body(body: &[u8], ncols: usize) -> Result<Record, String> {
    let (&ty, payload) = body.split_first().ok_or("empty record")?;
    let mut c = Cur { b: payload };
    let r = match ty {
        T_SAMPLE => {
            let t_ns = c.u64()?;
            let n = c.u16()? as usize;
            if n != ncols {
                return Err(format!("sample with {n} columns, header says {ncols}"));
            }
            let bitmap = c.take(n.div_ceil(8))?;
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                if bitmap[i / 8] & (1 << (i % 8)) != 0 {
                    values.push(Some(c.f64()?));
                } else {
                    values.push(None);
                }
            }
            // Unused bitmap bits must be zero.
            if n % 8 != 0 && bitmap[n / 8] >> (n % 8) != 0 {
                return Err("presence bits set past the last column".into());
            }
            c.end()?;
            // A journal of an earlier (prefix) layout: the appended columns are
            // null in its rows.
            values.resize(SAMPLE_COLUMNS.len().max(n), None);
            Record::Sample(Sample { t_ns, values })
        }
        T_MARKER => {
            let recv_ns = c.u64()?;
            Record::Marker {
                recv_ns,
                line: c.rest_str()?,
            }
        }
        T_OUTPUT => {
            let t_ns = c.u64()?;
            let stream = match c.u8()? {
                0 => Stream::Stdout,
                1 => Stream::Stderr,
                x => return Err(format!("stream byte {x}, expected 0 or 1")),
            };
            Record::Output {
                t_ns,
                stream,
                line: c.rest_str()?,
            }
        }
        T_FRAGMENT => {
            let klen = c.u16()? as usize;
            let key = c.str(klen)?;
            let text = c.rest_str()?;
            let value =
                serde_json::from_str(&text).map_err(|e| format!("fragment {key:?}: {e}"))?;
            Record::Fragment { key, value }
        }
        T_FRAME => {
            let index = c.u32()?;
            let slen = c.u8()? as usize;
            let sha256 = c.str(slen)?;
            let mean_luma = c.f64()?;
            let std_luma = c.f64()?;
            let min_luma = c.f64()?;
            let max_luma = c.f64()?;
            let motion_vs_prev = if c.flag()? { Some(c.f64()?) } else { None };
            let flags = c.u8()?;
            if flags > 3 {
                return Err(format!("frame flags {flags}, expected 0-3"));
            }
            let duplicate_of = if c.flag()? { Some(c.u32()?) } else { None };
            c.end()?;
            Record::Frame(FrameRow {
                index,
                sha256,
                mean_luma,
                std_luma,
                min_luma,
                max_luma,
                motion_vs_prev,
                near_black: flags & 1 != 0,
                near_uniform: flags & 2 != 0,
                duplicate_of,
            })
        }
        t => return Err(format!("unknown record type {t}")),
    };
    Ok(r)
}

/// Read the journal at `path`; see [`parse_journal`].
pub fn read_journal(path: &Path) -> Result<JournalContents, JournalError> {
    let bytes = std::fs::read(path).map_err(io_at(path, "read journal"))?;
    parse_journal(&bytes, path)
}

/// Parse journal bytes (`path` only names the file in errors and reasons).
///
/// Promise: never panics; a torn or corrupt tail is not an error but ends the
/// records, with `bytes_dropped` and `stop_reason` saying what was left. A file
/// shorter than the header whose bytes agree with the magic is an empty journal
/// (a run killed before its first record). Only a file that is not a journal at
/// all, or of another version, is an error.
pub fn parse_journal(bytes: &[u8], path: &Path) -> Result<JournalContents, JournalError> {
    let total = bytes.len() as u64;
    let head = &bytes[..bytes.len().min(8)];
    if head != &MAGIC[..head.len()] {
        return Err(JournalError::NotAJournal {
            path: path.to_path_buf(),
            expected: String::from_utf8_lossy(MAGIC).into_owned(),
            found: String::from_utf8_lossy(head).into_owned(),
        });
    }
    if bytes.len() < HEADER_BYTES {
        return Ok(JournalContents {
            records: Vec::new(),
            bytes_total: total,
            bytes_good: 0,
            bytes_dropped: total,
            stop_reason: Some(format!(
                "torn header: {} of {HEADER_BYTES} bytes",
                bytes.len()
            )),
        });
    }
    let le32 =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let version = le32(8);
    if version != VERSION {
        return Err(JournalError::Version {
            path: path.to_path_buf(),
            expected: VERSION,
            found: version,
        });
    }
    let ncols = le32(12) as usize;
    if ncols != SAMPLE_COLUMNS.len() && !crate::sample::PREFIX_LAYOUTS.contains(&ncols) {
        return Err(JournalError::Version {
            path: path.to_path_buf(),
            expected: SAMPLE_COLUMNS.len() as u32,
            found: ncols as u32,
        });
    }
    let mut records = Vec::new();
    let mut at = HEADER_BYTES;
    let mut stop_reason = None;
    while at < bytes.len() {
        let remain = bytes.len() - at;
        if remain < FRAME_BYTES {
            stop_reason = Some(format!(
                "torn record at byte {at}: {remain} of {FRAME_BYTES} framing bytes"
            ));
            break;
        }
        let len = le32(at) as usize;
        let crc = le32(at + 4);
        if len == 0 || len > MAX_RECORD_BYTES {
            stop_reason = Some(format!(
                "corrupt record at byte {at}: length {len} outside 1..={MAX_RECORD_BYTES}"
            ));
            break;
        }
        if len > remain - FRAME_BYTES {
            stop_reason = Some(format!(
                "torn record at byte {at}: length {len} but {} bytes remain",
                remain - FRAME_BYTES
            ));
            break;
        }
        let body = &bytes[at + FRAME_BYTES..at + FRAME_BYTES + len];
        if crc32fast::hash(body) != crc {
            stop_reason = Some(format!("corrupt record at byte {at}: checksum mismatch"));
            break;
        }
        match decode_body(body, ncols) {
            Ok(r) => records.push(r),
            Err(why) => {
                stop_reason = Some(format!("corrupt record at byte {at}: {why}"));
                break;
            }
        }
        at += FRAME_BYTES + len;
    }
    Ok(JournalContents {
        records,
        bytes_total: total,
        bytes_good: at as u64,
        bytes_dropped: total - at as u64,
        stop_reason,
    })
}

struct State {
    writer: BufWriter<File>,
    /// Bytes appended since the last flush.
    dirty: bool,
    /// Set when the journal is finished or its writer failed.
    closed: Option<String>,
    /// Reused encoding buffer.
    scratch: Vec<u8>,
}

struct Inner {
    path: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
    /// A second handle on the file for fdatasync outside the state lock.
    sync_file: File,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// Completed fdatasyncs.
    syncs: std::sync::atomic::AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Flush the buffer (under the lock), then fdatasync (outside it).
    fn flush_and_sync(&self) -> Result<(), JournalError> {
        {
            let mut st = self.lock();
            if let Err(e) = st.writer.flush() {
                st.closed = Some(format!("flush failed: {e}"));
                return Err(IoAt::new(&self.path, "flush journal", e).into());
            }
            st.dirty = false;
        }
        self.sync_file.sync_data().map_err(|e| {
            self.lock().closed = Some(format!("fdatasync failed: {e}"));
            JournalError::from(IoAt::new(&self.path, "fdatasync journal", e))
        })?;
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = st.writer.flush();
        let _ = self.sync_file.sync_data();
    }
}

/// The journal writer shared by the sampler, the marker reader and the output
/// readers of one run.
///
/// Promise: anything appended is flushed and fdatasync'ed within about one second
/// (the flusher thread wakes every [`FLUSH_PERIOD`]); [`SharedJournal::sync_now`]
/// does it at once. Records from concurrent appenders never interleave.
#[derive(Clone)]
pub struct SharedJournal {
    inner: Arc<Inner>,
}

impl SharedJournal {
    /// Create a new journal at `path` (which must not exist), write and fsync its
    /// header, and start the flusher thread.
    pub fn create(path: &Path) -> Result<SharedJournal, JournalError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(io_at(path, "create journal"))?;
        file.write_all(&header_bytes())
            .map_err(io_at(path, "write journal header"))?;
        file.sync_all().map_err(io_at(path, "fsync journal"))?;
        if let Some(parent) = path.parent() {
            crate::store::fsync_dir(parent)?;
        }
        let sync_file = file
            .try_clone()
            .map_err(io_at(path, "duplicate journal handle"))?;
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                writer: BufWriter::with_capacity(256 * 1024, file),
                dirty: false,
                closed: None,
                scratch: Vec::with_capacity(1024),
            }),
            wake: Condvar::new(),
            sync_file,
            flusher: Mutex::new(None),
            syncs: std::sync::atomic::AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        let handle = std::thread::Builder::new()
            .name("journal-flusher".into())
            .spawn(move || flusher(weak))
            .map_err(io_at(path, "start journal flusher thread"))?;
        *inner.flusher.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(SharedJournal { inner })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Append one record (buffered; on disk within about a second).
    pub fn append(&self, r: &Record) -> Result<(), JournalError> {
        let mut st = self.inner.lock();
        if let Some(why) = &st.closed {
            return Err(JournalError::Closed {
                path: self.inner.path.clone(),
                why: why.clone(),
            });
        }
        let mut buf = std::mem::take(&mut st.scratch);
        buf.clear();
        let enc = encode_record(r, &mut buf);
        let res = enc.and_then(|_| {
            st.writer.write_all(&buf).map_err(|e| {
                st.closed = Some(format!("write failed: {e}"));
                IoAt::new(&self.inner.path, "append to journal", e).into()
            })
        });
        st.scratch = buf;
        if res.is_ok() {
            st.dirty = true;
        }
        res
    }

    /// Why the journal stopped accepting records (a failed write, flush or
    /// fdatasync, e.g. a full disk); `None` while it is healthy or after a clean
    /// [`SharedJournal::finish`].
    pub fn failure(&self) -> Option<String> {
        self.inner
            .lock()
            .closed
            .clone()
            .filter(|why| why != "finished")
    }

    /// How many fdatasyncs of appended records have completed (the header's
    /// fsync at creation not counted): the durability cadence, observable.
    pub fn syncs(&self) -> u64 {
        self.inner.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Flush and fdatasync now (at phase boundaries).
    pub fn sync_now(&self) -> Result<(), JournalError> {
        self.inner.flush_and_sync()
    }

    /// Final flush and fdatasync; stops the flusher. Further appends through any
    /// clone fail with [`JournalError::Closed`].
    pub fn finish(self) -> Result<(), JournalError> {
        let first_failure = self.inner.lock().closed.clone();
        let res = self.inner.flush_and_sync();
        self.inner.lock().closed = Some("finished".into());
        self.inner.wake.notify_all();
        let handle = self
            .inner
            .flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        if let Some(why) = first_failure {
            return Err(JournalError::Closed {
                path: self.inner.path.clone(),
                why,
            });
        }
        res
    }
}

fn flusher(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let dirty = {
            let st = inner.lock();
            if st.closed.is_some() {
                return;
            }
            let (st, _) = inner
                .wake
                .wait_timeout(st, FLUSH_PERIOD)
                .unwrap_or_else(|p| p.into_inner());
            if st.closed.is_some() {
                return;
            }
            st.dirty
        };
        if dirty && inner.flush_and_sync().is_err() {
            // The failure is recorded in the state; appenders see it.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(t: u64, seed: u64) -> Sample {
        let mut s = Sample::empty(t);
        let mut x = seed;
        for (i, v) in s.values.iter_mut().enumerate() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (x >> 60) % 3 != 0 || i == 0 {
                *v = Some((x >> 11) as f64 / 1024.0);
            }
        }
        s
    }

    fn all_kinds() -> Vec<Record> {
        vec![
            Record::Fragment {
                key: "run".into(),
                value: json!({"start_ns": 17, "argv": ["harness", "run"], "x": 1.25}),
            },
            Record::Sample(sample(100, 7)),
            Record::Marker {
                recv_ns: 101,
                line: r#"{"ev":"open","t_ns":99,"name":"load.dit"}"#.into(),
            },
            Record::Output {
                t_ns: 102,
                stream: Stream::Stderr,
                line: "+load.dit ünïcode".into(),
            },
            Record::Frame(FrameRow {
                index: 3,
                sha256: "ab".repeat(32),
                mean_luma: 101.5,
                std_luma: 12.25,
                min_luma: 3.0,
                max_luma: 250.0,
                motion_vs_prev: Some(4.5),
                near_black: false,
                near_uniform: true,
                duplicate_of: Some(1),
            }),
            Record::Frame(FrameRow {
                index: 0,
                sha256: "cd".repeat(32),
                mean_luma: 1.0,
                std_luma: 0.0,
                min_luma: 0.0,
                max_luma: 2.0,
                motion_vs_prev: None,
                near_black: true,
                near_uniform: false,
                duplicate_of: None,
            }),
            Record::Output {
                t_ns: 103,
                stream: Stream::Stdout,
                line: String::new(),
            },
        ]
    }

    fn encode_all(rs: &[Record]) -> Vec<u8> {
        let mut b = header_bytes().to_vec();
        for r in rs {
            encode_record(r, &mut b).unwrap();
        }
        b
    }

    #[test]
    fn every_kind_round_trips() {
        let rs = all_kinds();
        let b = encode_all(&rs);
        let c = parse_journal(&b, Path::new("j")).unwrap();
        assert_eq!(c.records, rs);
        assert_eq!(c.bytes_total, b.len() as u64);
        assert_eq!(c.bytes_good, b.len() as u64);
        assert_eq!(c.bytes_dropped, 0);
        assert_eq!(c.stop_reason, None);
    }

    #[test]
    fn every_truncation_yields_exactly_the_whole_records_before_it() {
        let rs = all_kinds();
        let b = encode_all(&rs);
        // Record end offsets.
        let mut ends = vec![HEADER_BYTES];
        let mut tmp = header_bytes().to_vec();
        for r in &rs {
            encode_record(r, &mut tmp).unwrap();
            ends.push(tmp.len());
        }
        for cut in 0..=b.len() {
            let c = parse_journal(&b[..cut], Path::new("j")).unwrap();
            let whole = ends.iter().filter(|&&e| e <= cut).count().saturating_sub(1);
            assert_eq!(c.records, rs[..whole], "cut at {cut}");
            assert_eq!(c.bytes_good + c.bytes_dropped, cut as u64);
            let clean = ends.contains(&cut);
            assert_eq!(
                c.stop_reason.is_none(),
                clean,
                "cut at {cut}: {:?}",
                c.stop_reason
            );
        }
    }

    #[test]
    fn every_bit_flip_in_a_record_stops_reading_there() {
        let rs = all_kinds();
        let b = encode_all(&rs);
        for at in HEADER_BYTES..b.len() {
            let mut bad = b.clone();
            bad[at] ^= 0x10;
            let c = parse_journal(&bad, Path::new("j")).unwrap();
            assert!(c.stop_reason.is_some(), "flip at {at} not detected");
            assert!(c.bytes_good <= at as u64, "flip at {at} passed");
            assert!(rs.starts_with(&c.records));
        }
    }

    #[test]
    fn a_foreign_file_or_version_is_an_error_naming_the_file() {
        let e = parse_journal(b"PAR1xxxxxxxxxxxxxxxx", Path::new("/s/journal")).unwrap_err();
        assert!(e.to_string().contains("/s/journal") && e.to_string().contains("not a journal"));
        let mut h = header_bytes();
        h[8] = 9;
        let e = parse_journal(&h, Path::new("/s/journal")).unwrap_err();
        assert!(e.to_string().contains("version 9"), "{e}");
    }

    /// A journal written before the GPM columns were appended (its header and
    /// rows carry the shorter prefix layout) still reads: each row's values land
    /// in their columns and the appended ones are null. A layout that is not a
    /// known prefix is refused. Red if the header check is reverted (the old
    /// journal is refused) or the padding dropped (rows one width short).
    #[test]
    fn a_journal_of_the_prefix_layout_reads_with_the_appended_columns_null() {
        let old = crate::sample::PREFIX_LAYOUTS[0];
        let mut b = header_bytes().to_vec();
        b[12..16].copy_from_slice(&(old as u32).to_le_bytes());
        let mut body = vec![T_SAMPLE];
        body.extend_from_slice(&77u64.to_le_bytes());
        body.extend_from_slice(&(old as u16).to_le_bytes());
        let mut bitmap = vec![0u8; old.div_ceil(8)];
        bitmap[0] |= 1; // column 0 present
        bitmap[(old - 1) / 8] |= 1 << ((old - 1) % 8); // and the last of the old layout
        body.extend_from_slice(&bitmap);
        body.extend_from_slice(&1.5f64.to_le_bytes());
        body.extend_from_slice(&2.5f64.to_le_bytes());
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        b.extend_from_slice(&body);
        let c = parse_journal(&b, Path::new("j")).unwrap();
        assert_eq!(c.stop_reason, None);
        let Record::Sample(s) = &c.records[0] else {
            panic!("{:?}", c.records)
        };
        assert_eq!(s.values.len(), SAMPLE_COLUMNS.len());
        assert_eq!(s.values[0], Some(1.5));
        assert_eq!(s.values[old - 1], Some(2.5));
        assert_eq!(s.get("gpm_tensor_active_pct"), None);
        assert!(s.values[old..].iter().all(Option::is_none));
        // An unknown width is still an error naming the file.
        b[12..16].copy_from_slice(&((old - 1) as u32).to_le_bytes());
        assert!(parse_journal(&b, Path::new("/s/j"))
            .unwrap_err()
            .to_string()
            .contains("/s/j"));
    }

    /// The module doc's row size: a row with every one of the 40 columns
    /// present is 335 bytes of type and payload, plus the framing.
    #[test]
    fn a_full_row_costs_what_the_module_doc_says() {
        assert_eq!(SAMPLE_COLUMNS.len(), 40);
        let s = Sample {
            t_ns: 1,
            values: vec![Some(1.0); SAMPLE_COLUMNS.len()],
        };
        let mut out = Vec::new();
        encode_record(&Record::Sample(s), &mut out).unwrap();
        assert_eq!(out.len() - FRAME_BYTES, 1 + 335);
    }

    #[test]
    fn sample_with_wrong_width_is_refused_at_append() {
        let s = Sample {
            t_ns: 1,
            values: vec![Some(1.0)],
        };
        let mut out = vec![7u8];
        assert!(encode_record(&Record::Sample(s), &mut out).is_err());
        assert_eq!(out, vec![7u8]);
    }

    fn test_dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/evidence-unit")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn shared_journal_concurrent_appends_and_flusher_reach_disk() {
        let d = test_dir("journal-shared");
        let p = d.join("journal");
        let j = SharedJournal::create(&p).unwrap();
        assert!(SharedJournal::create(&p).is_err(), "must not overwrite");
        let mut handles = Vec::new();
        for t in 0..4u64 {
            let j = j.clone();
            handles.push(std::thread::spawn(move || {
                for i in 0..200u64 {
                    j.append(&Record::Sample(sample(t * 1000 + i, t * 7 + i)))
                        .unwrap();
                }
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        // Without sync_now or finish, the flusher alone must put it on disk.
        std::thread::sleep(Duration::from_millis(1000));
        let c = read_journal(&p).unwrap();
        assert_eq!(c.records.len(), 800);
        assert_eq!(c.stop_reason, None);
        j.append(&all_kinds()[0]).unwrap();
        j.sync_now().unwrap();
        assert_eq!(read_journal(&p).unwrap().records.len(), 801);
        let j2 = j.clone();
        j.finish().unwrap();
        assert!(matches!(
            j2.append(&all_kinds()[0]),
            Err(JournalError::Closed { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }
}
