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
//! ([`super::periodic::Periodic`]): on the sampler's thread it made ticks overrun
//! the 100 ms cadence at rung 3 on the device (reports/device-notes.md).

use std::path::{Path, PathBuf};

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
}
