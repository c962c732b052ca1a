//! Page-cache residency of the run's weight files, through `mincore(2)`.
//!
//! Each file is mapped read-only once (mapping does not fault pages in) and asked,
//! page by page, whether it is resident. Linux answers for the page cache only when
//! the caller owns the file or may write it; for other files it reports only pages
//! this process mapped itself (none), so such files make the column unavailable
//! with that reason rather than a false 0.
//!
//! A pass is slow for large weights (over 16 GiB of resident pages, 247-310 ms on
//! the development VM: `scripts/cadence-weights.sh`), so it runs on its own thread
//! ([`Background`]): on the sampler's thread, one tick in ten overran the 100 ms
//! cadence at rung 3.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use evidence::clock::monotonic_ns;

use memmap2::Mmap;

/// Why residency cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PageCacheError {
    /// A file could not be opened or mapped.
    #[error("{path}: {why}")]
    File {
        /// The weight file.
        path: PathBuf,
        /// What failed.
        why: String,
    },
}

struct Mapped {
    map: Option<Mmap>,
    len: u64,
}

/// The mapped weight files.
pub struct Residency {
    files: Vec<Mapped>,
    page: usize,
    scratch: Vec<u8>,
}

/// Whether the kernel will report page-cache residency of the open file `f`
/// (at `path`) to this process: it must own the file or be allowed to write it.
fn mincore_can_see(path: &Path, meta: &std::fs::Metadata) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if meta.uid() == unsafe { libc::geteuid() } {
        return true;
    }
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

impl Residency {
    /// Map every file in `paths`. Empty files are allowed.
    pub fn open(paths: &[PathBuf]) -> Result<Self, PageCacheError> {
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let err = |why: String| PageCacheError::File {
                path: path.clone(),
                why,
            };
            let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
            let meta = f.metadata().map_err(|e| err(e.to_string()))?;
            if !mincore_can_see(path, &meta) {
                return Err(err(
                    "neither owned by this user nor writable: mincore would report only this process's own mappings".into(),
                ));
            }
            let len = meta.len();
            let map = if len == 0 {
                None
            } else {
                // SAFETY: the mapping is only passed to mincore, never read, so a
                // file truncated underneath it cannot fault this process.
                Some(unsafe { Mmap::map(&f) }.map_err(|e| err(format!("mmap: {e}")))?)
            };
            files.push(Mapped { map, len });
        }
        Ok(Residency {
            files,
            page: procfs::page_size() as usize,
            scratch: Vec::new(),
        })
    }

    /// Total bytes of the weight files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Bytes of the files now resident in the page cache.
    pub fn resident_bytes(&mut self) -> Result<u64, String> {
        let mut total = 0u64;
        for f in &self.files {
            let Some(map) = &f.map else { continue };
            let pages = map.len().div_ceil(self.page);
            self.scratch.clear();
            self.scratch.resize(pages, 0);
            // SAFETY: the range is exactly our live mapping and `scratch` holds one
            // byte per page of it.
            let rc = unsafe {
                libc::mincore(
                    map.as_ptr() as *mut libc::c_void,
                    map.len(),
                    self.scratch.as_mut_ptr(),
                )
            };
            if rc != 0 {
                return Err(format!("mincore: {}", std::io::Error::last_os_error()));
            }
            let resident = self.scratch.iter().filter(|&&b| b & 1 == 1).count() as u64;
            // The last page may be partial: count at most the file's length.
            total += (resident * self.page as u64).min(f.len);
        }
        Ok(total)
    }
}

/// One pass of a [`Background`] probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// 1 for the first pass, then one more per pass.
    pub seq: u64,
    /// Resident bytes of the weight files, or why mincore failed.
    pub bytes: Result<u64, String>,
    /// CLOCK_MONOTONIC nanoseconds when the pass began.
    pub t_ns: u64,
}

#[derive(Default)]
struct Shared {
    latest: Option<Reading>,
    costs_ns: Vec<u64>,
}

/// A [`Residency`] read on its own thread every `every`, so that a pass over tens
/// of GB never delays the sampler's fixed-cadence tick. The first pass runs in
/// [`Background::start`] itself, so a reading exists before the first tick.
/// Dropping it stops the thread (at most one pass later).
pub struct Background {
    shared: Arc<Mutex<Shared>>,
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
    seen: u64,
}

fn pass(r: &mut Residency, seq: u64, shared: &Mutex<Shared>) {
    let t_ns = monotonic_ns();
    let bytes = r.resident_bytes();
    let cost = monotonic_ns().saturating_sub(t_ns);
    if let Ok(mut s) = shared.lock() {
        s.latest = Some(Reading { seq, bytes, t_ns });
        s.costs_ns.push(cost);
    }
}

impl Background {
    /// Read `r` now, then every `every` on a new thread.
    pub fn start(mut r: Residency, every: Duration) -> Background {
        let shared = Arc::new(Mutex::new(Shared::default()));
        pass(&mut r, 1, &shared);
        let (tx, rx) = mpsc::channel::<()>();
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("pagecache".into())
            .spawn(move || {
                let mut seq = 1;
                // Any message, or the sender dropped, ends the loop.
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                    seq += 1;
                    pass(&mut r, seq, &sh);
                }
            })
            .ok();
        Background {
            shared,
            stop: Some(tx),
            handle,
            seen: 0,
        }
    }

    /// The newest reading not taken before, if a pass has finished since.
    pub fn take_new(&mut self) -> Option<Reading> {
        let s = self.shared.lock().ok()?;
        let r = s.latest.as_ref().filter(|r| r.seq > self.seen)?.clone();
        self.seen = r.seq;
        Some(r)
    }

    /// Nanoseconds each pass took so far.
    pub fn costs_ns(&self) -> Vec<u64> {
        self.shared
            .lock()
            .map(|s| s.costs_ns.clone())
            .unwrap_or_default()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::y4m::tests::noise;
    use std::io::Write;

    fn dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/pagecache")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn written_then_dropped_pages_are_seen_to_leave() {
        let d = dir("drop");
        let path = d.join("w.bin");
        let mut f = std::fs::File::create(&path).unwrap();
        let data = noise(4 << 20, 0x9e37_79b9);
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        let empty = d.join("empty.bin");
        std::fs::File::create(&empty).unwrap();
        let mut r = Residency::open(&[path.clone(), empty]).unwrap();
        assert_eq!(r.total_bytes(), 4 << 20);
        // Just written: resident.
        assert_eq!(r.resident_bytes().unwrap(), 4 << 20);
        // Clean pages dropped with fadvise leave the cache.
        use std::os::fd::AsRawFd;
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        let after = r.resident_bytes().unwrap();
        assert!(after < 1 << 20, "{after} bytes still resident");
        // Reading a quarter brings about a quarter back (readahead may add some).
        let mut g = std::fs::File::open(&path).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        std::io::Read::read_exact(&mut g, &mut buf).unwrap();
        let back = r.resident_bytes().unwrap();
        assert!((1 << 20..4 << 20).contains(&back), "{back}");
    }

    #[test]
    fn a_missing_file_is_a_named_error() {
        let d = dir("missing");
        let e = Residency::open(&[d.join("nope.safetensors")])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("nope.safetensors"), "{e}");
    }

    #[test]
    fn the_background_probe_reads_first_then_hands_each_new_pass_over_once() {
        let d = dir("background");
        let path = d.join("w.bin");
        std::fs::write(&path, noise(1 << 20, 7)).unwrap();
        let r = Residency::open(std::slice::from_ref(&path)).unwrap();
        let mut bg = Background::start(r, Duration::from_millis(20));
        // The first pass ran in start: a reading is there before any wait.
        let first = bg.take_new().unwrap();
        assert_eq!(first.seq, 1);
        assert_eq!(first.bytes, Ok(1 << 20));
        assert!(first.t_ns > 0);
        // Taken once only.
        assert_eq!(bg.take_new().filter(|r| r.seq == 1), None);
        // Later passes arrive on their own.
        let t0 = std::time::Instant::now();
        let next = loop {
            if let Some(r) = bg.take_new() {
                break r;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no second pass");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(next.seq >= 2, "{next:?}");
        assert!(next.t_ns > first.t_ns);
        assert!(bg.costs_ns().len() >= 2);
        // Dropping stops the thread promptly (a 1-hour period does not hold it).
        let r = Residency::open(&[path]).unwrap();
        let long = Background::start(r, Duration::from_secs(3600));
        let t0 = std::time::Instant::now();
        drop(long);
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
