//! Page-cache residency of weight files, and the release-pages lever's mechanism.
//!
//! Residency is read with `mincore(2)` over a read-only shared mapping of the file:
//! one byte per page, bit 0 set when the page is in the page cache. Releasing a
//! byte range drops it twice: `madvise(MADV_DONTNEED)` unmaps the pages from this
//! process (so they stop counting in its RSS), and `posix_fadvise(POSIX_FADV_DONTNEED)`
//! asks the kernel to drop the file's clean cached pages in that range.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use memmap2::{Mmap, MmapOptions};

/// How much of a file (or a range of it) is in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Residency {
    /// Pages spanned.
    pub pages_total: u64,
    /// Pages found resident.
    pub pages_resident: u64,
    /// Page size in bytes.
    pub page_size: u64,
}

impl Residency {
    /// Resident share in `[0, 1]` (1 for an empty file).
    pub fn fraction(&self) -> f64 {
        if self.pages_total == 0 {
            1.0
        } else {
            self.pages_resident as f64 / self.pages_total as f64
        }
    }

    /// Resident bytes (pages times page size).
    pub fn resident_bytes(&self) -> u64 {
        self.pages_resident * self.page_size
    }

    /// The sum of two residencies (of different files).
    pub fn plus(self, o: Residency) -> Residency {
        Residency {
            pages_total: self.pages_total + o.pages_total,
            pages_resident: self.pages_resident + o.pages_resident,
            page_size: self.page_size.max(o.page_size),
        }
    }
}

/// The system page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Residency of the pages of an existing mapping (whole mapping).
pub fn mapping_residency(map: &Mmap) -> std::io::Result<Residency> {
    let ps = page_size();
    let len = map.len();
    if len == 0 {
        return Ok(Residency {
            page_size: ps as u64,
            ..Default::default()
        });
    }
    let pages = len.div_ceil(ps);
    let mut vec = vec![0u8; pages];
    // SAFETY: the mapping starts page-aligned and is `len` bytes long; `vec` has
    // one byte per page of that range, as mincore requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Residency {
        pages_total: pages as u64,
        pages_resident: vec.iter().filter(|&&b| b & 1 == 1).count() as u64,
        page_size: ps as u64,
    })
}

/// Residency of the whole file at `path` (maps it read-only, never touches a page).
pub fn file_residency(path: &Path) -> std::io::Result<Residency> {
    let f = File::open(path)?;
    if f.metadata()?.len() == 0 {
        return Ok(Residency {
            page_size: page_size() as u64,
            ..Default::default()
        });
    }
    // SAFETY: a read-only shared mapping; nothing reads through it (mincore only
    // inspects the page tables and page cache).
    let map = unsafe { MmapOptions::new().map(&f)? };
    mapping_residency(&map)
}

/// Drop `[offset, offset + len)` of `file`, mapped at `map`, from this process and
/// from the page cache. Only whole pages inside the range are dropped from the
/// mapping (a page shared with a neighbouring range stays mapped); the fadvise
/// covers the exact range. Returns the bytes unmapped.
pub fn release_range(map: &Mmap, file: &File, offset: usize, len: usize) -> u64 {
    let ps = page_size();
    let start = offset.div_ceil(ps) * ps;
    let end = ((offset + len).min(map.len()) / ps) * ps;
    let mut unmapped = 0;
    if end > start {
        // SAFETY: [start, end) lies inside the mapping and is page aligned. The
        // mapping is a read-only shared file mapping, so MADV_DONTNEED only drops
        // our page-table entries; later reads fault the data back in from the file.
        let rc = unsafe {
            libc::madvise(
                map.as_ptr().add(start) as *mut libc::c_void,
                end - start,
                libc::MADV_DONTNEED,
            )
        };
        if rc == 0 {
            unmapped = (end - start) as u64;
        }
    }
    // SAFETY: posix_fadvise only takes a descriptor and a byte range.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
    unmapped
}

/// Ask the kernel to drop every clean cached page of `path` (for cold-cache runs
/// and tests); dirty pages are written back first by the `fdatasync`.
pub fn evict_file(path: &Path) -> std::io::Result<()> {
    let f = File::open(path)?;
    f.sync_data()?;
    // SAFETY: posix_fadvise only takes a descriptor and a byte range (0, 0 = all).
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Read every byte of `path` once so its pages are in the page cache.
pub fn warm_file(path: &Path) -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        n += k as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn warm_then_evict_then_release_changes_residency() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/residency");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("blob.bin");
        let ps = page_size();
        let data: Vec<u8> = (0..64 * ps).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        warm_file(&p).unwrap();
        let warm = file_residency(&p).unwrap();
        assert_eq!(warm.pages_total, 64);
        assert_eq!(warm.pages_resident, 64, "{warm:?}");
        evict_file(&p).unwrap();
        let cold = file_residency(&p).unwrap();
        assert!(cold.pages_resident < 8, "{cold:?}");

        warm_file(&p).unwrap();
        let f = File::open(&p).unwrap();
        // SAFETY: read-only mapping of a file this test owns.
        let map = unsafe { MmapOptions::new().map(&f).unwrap() };
        let sum: u64 = map.iter().map(|&b| b as u64).sum();
        assert!(sum > 0);
        // Release half a page into page 10 up to the middle of page 40: pages 11..40
        // are unmapped (29 pages); the fadvise drops the cached range.
        let n = release_range(&map, &f, 10 * ps + ps / 2, 30 * ps);
        assert_eq!(n, 29 * ps as u64);
        let after = mapping_residency(&map).unwrap();
        assert!(
            after.pages_resident <= 64 - 29,
            "release left {} of 64 pages resident",
            after.pages_resident
        );
        assert!(after.pages_resident >= 20, "{after:?}");
        assert!((Residency::default().fraction() - 1.0).abs() < 1e-12);
    }
}
