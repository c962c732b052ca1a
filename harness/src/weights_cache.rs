//! The page-cache state of the weight files when the engine starts: left as it is,
//! made cold (every file's pages evicted), or made warm (every file read once).
//!
//! A lever whose metric reads the weights (`staging`'s load.dit wall, above all) is
//! judged on pairs of runs; when each run inherits whatever the previous one left in
//! the page cache, the arms are confounded with their order (the rung-2 campaign
//! 223c8a9b01c34e09: a run after `staging=serial`, which releases the pages, read
//! the weights cold, and one after `batched` warm). `harness run --weights-cache
//! cold|warm` sets the state before the engine starts, measures it with `mincore`,
//! and refuses the run when the state could not be reached, so a run never claims a
//! cache state it did not have. The verdict and the bytes are recorded in the
//! `weights-cache` gate of every bundle.
//!
//! A cold start also measures the disk itself ([`DiskRead`]): a sample of the
//! weights read with `O_DIRECT` (past the page cache, which stays cold) by
//! several readers, so a reader of the bundle sees beside the engine's cold
//! staging rate what the disk could have given it (issue 37).

use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::gate_verdict::{Gate, Verdict};
use crate::sampler::pagecache::Residency;

/// The page-cache state a run starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Whatever the page cache holds (the state the previous run left).
    #[default]
    AsIs,
    /// Every weight file's pages evicted before the engine starts.
    Cold,
    /// Every weight file read once before the engine starts.
    Warm,
}

impl Policy {
    /// The flag's value as typed (`as-is`, `cold`, `warm`).
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::AsIs => "as-is",
            Policy::Cold => "cold",
            Policy::Warm => "warm",
        }
    }
}

/// A cold start may keep at most this share of the weights resident: pages another
/// process maps cannot be evicted, and a run that keeps more is not cold.
pub const COLD_MAX_RESIDENT_SHARE: f64 = 0.02;
/// A warm start must have at least this share of the weights resident (less means
/// the page cache cannot hold them next to what else the machine keeps).
pub const WARM_MIN_RESIDENT_SHARE: f64 = 0.98;

/// Why the state could not be set or read.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A weight file could not be opened or read.
    #[error("{path}: {why}")]
    File {
        /// The weight file.
        path: PathBuf,
        /// What failed.
        why: String,
    },
    /// Residency could not be read (mincore refused or a file could not be mapped).
    #[error("page-cache residency of the weights cannot be read: {0}")]
    Residency(String),
}

/// Bytes of the weights a cold start reads past the page cache to measure the
/// disk (fewer when the weights are smaller): several of the largest requests
/// per reader, little next to a load.
pub const DISK_SAMPLE_BYTES: u64 = 1 << 30;
/// Readers of the disk measurement, each on its own range (the engine's
/// staging reads with several threads too; one reader at queue depth 1
/// understates an NVMe disk).
pub const DISK_READERS: usize = 4;
/// One `O_DIRECT` request, bytes (a multiple of every logical block size).
pub const DISK_REQUEST_BYTES: usize = 8 << 20;

/// The disk's cold read rate, measured on the weights themselves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskRead {
    /// Bytes read.
    pub bytes: u64,
    /// Wall seconds from the first request to the last reader's end.
    pub seconds: f64,
    /// Readers, each on its own range.
    pub readers: usize,
}

impl DiskRead {
    /// The rate, GB/s (10^9 bytes a second).
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// What preparing the cache found, in bytes and seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prepared {
    /// The policy applied.
    pub policy: Policy,
    /// Bytes of all weight files.
    pub total_bytes: u64,
    /// Bytes resident before the policy was applied.
    pub resident_before_bytes: u64,
    /// Bytes resident after (just before the engine starts).
    pub resident_after_bytes: u64,
    /// Seconds spent evicting or reading.
    pub seconds: f64,
    /// A cold start's disk measurement, or why there is none (`Err`: the file
    /// system refuses `O_DIRECT`, say); `None` for the other policies.
    pub disk: Option<Result<DiskRead, String>>,
}

impl Prepared {
    /// The `weights_cache` fragment: the figures as numbers (rank pairs
    /// weight-reading metrics only between runs that started in about the same
    /// cache state).
    pub fn fragment(&self) -> evidence::fragments::WeightsCache {
        evidence::fragments::WeightsCache {
            policy: Some(self.policy.as_str().to_string()),
            total_bytes: Some(self.total_bytes),
            resident_before_bytes: Some(self.resident_before_bytes),
            resident_after_bytes: Some(self.resident_after_bytes),
            seconds: Some(self.seconds),
            disk_read_bytes: self.disk_read().map(|d| d.bytes),
            disk_read_s: self.disk_read().map(|d| d.seconds),
            disk_readers: self.disk_read().map(|d| d.readers as u64),
            disk_read_note: match &self.disk {
                Some(Err(why)) => Some(why.clone()),
                _ => None,
            },
        }
    }

    /// The disk measurement when it was made.
    pub fn disk_read(&self) -> Option<&DiskRead> {
        self.disk.as_ref().and_then(|d| d.as_ref().ok())
    }

    /// The share of the weights resident after preparation (1 for no bytes).
    pub fn after_share(&self) -> f64 {
        if self.total_bytes == 0 {
            1.0
        } else {
            self.resident_after_bytes as f64 / self.total_bytes as f64
        }
    }

    /// The `weights-cache` gate: passes when the state asked for was reached,
    /// refuses (naming the bytes and the bound) when it was not.
    pub fn gate(&self) -> Gate {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut figures = format!(
            "{:.3} of {:.3} GiB resident before, {:.3} GiB after ({:.1}%), {:.2} s",
            gib(self.resident_before_bytes),
            gib(self.total_bytes),
            gib(self.resident_after_bytes),
            100.0 * self.after_share(),
            self.seconds
        );
        match &self.disk {
            Some(Ok(d)) => figures.push_str(&format!(
                "; disk read {:.2} GB/s cold (O_DIRECT, {} readers, {:.3} GiB)",
                d.gbps(),
                d.readers,
                gib(d.bytes)
            )),
            Some(Err(why)) => figures.push_str(&format!("; disk rate not measured: {why}")),
            None => {}
        }
        let (ok, bound) = match self.policy {
            Policy::AsIs => (true, String::new()),
            Policy::Cold => (
                self.after_share() <= COLD_MAX_RESIDENT_SHARE,
                format!(
                    "; a cold start allows at most {:.0}% (pages some process still maps cannot be evicted)",
                    100.0 * COLD_MAX_RESIDENT_SHARE
                ),
            ),
            Policy::Warm => (
                self.after_share() >= WARM_MIN_RESIDENT_SHARE,
                format!(
                    "; a warm start needs at least {:.0}% (the page cache cannot hold the weights)",
                    100.0 * WARM_MIN_RESIDENT_SHARE
                ),
            ),
        };
        let verdict = if ok { Verdict::Pass } else { Verdict::Refuse };
        let detail = if ok {
            format!("{}: {figures}", self.policy.as_str())
        } else {
            format!("{}: {figures}{bound}", self.policy.as_str())
        };
        Gate::new("weights-cache", verdict, detail)
    }
}

/// Apply `policy` to the weight files `paths` and measure residency before and
/// after. `as-is` only measures.
pub fn prepare(paths: &[PathBuf], policy: Policy) -> Result<Prepared, CacheError> {
    let mut residency = Residency::open(paths).map_err(|e| CacheError::Residency(e.to_string()))?;
    let total_bytes = residency.total_bytes();
    let resident_before_bytes = residency.resident_bytes().map_err(CacheError::Residency)?;
    let t = Instant::now();
    match policy {
        Policy::AsIs => {}
        Policy::Cold => {
            for p in paths {
                evict(p)?;
            }
        }
        Policy::Warm => {
            for p in paths {
                read_through(p)?;
            }
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    // After the eviction and before the residency reading that the cold gate
    // judges: a measurement that warmed the cache would be refused there.
    let disk =
        (policy == Policy::Cold).then(|| disk_cold_read(paths, DISK_SAMPLE_BYTES, DISK_READERS));
    // as-is changed nothing: one reading serves for both.
    let resident_after_bytes = if policy == Policy::AsIs {
        resident_before_bytes
    } else {
        residency.resident_bytes().map_err(CacheError::Residency)?
    };
    Ok(Prepared {
        policy,
        total_bytes,
        resident_before_bytes,
        resident_after_bytes,
        seconds,
        disk,
    })
}

/// Where each reader reads: `(file index, offset, bytes)`, whole
/// [`DISK_REQUEST_BYTES`] requests from the largest files first, `sample`
/// bytes in all at most, `readers` ranges of equal size, each inside one
/// file. Weights smaller than the sample give one range: the largest file's
/// whole requests.
pub fn disk_ranges(sizes: &[u64], sample: u64, readers: usize) -> Vec<(usize, u64, u64)> {
    let req = DISK_REQUEST_BYTES as u64;
    let readers = readers.max(1);
    // Whole requests only: O_DIRECT cannot read a file's partial last block.
    let per = (sample / readers as u64) / req * req;
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|i| std::cmp::Reverse(sizes[*i]));
    let mut out = Vec::new();
    if per > 0 {
        for &i in &order {
            let mut off = 0u64;
            while out.len() < readers && sizes[i] - off >= per {
                out.push((i, off, per));
                off += per;
            }
        }
    }
    if out.len() < readers {
        // Not enough whole ranges: the largest file's whole requests, one reader.
        out.clear();
        if let Some(&i) = order.first() {
            let whole = sizes[i].min(sample) / req * req;
            if whole > 0 {
                out.push((i, 0, whole));
            }
        }
    }
    out
}

/// A page-aligned buffer for `O_DIRECT` reads.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Option<Aligned> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        (!ptr.is_null()).then_some(Aligned { ptr, layout })
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Read `len` bytes of `path` from `off` with `O_DIRECT` in
/// [`DISK_REQUEST_BYTES`] requests; `Err` names the file and the call.
fn read_direct(path: &Path, off: u64, len: u64) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("{}: open with O_DIRECT: {e}", path.display()))?;
    let buf = Aligned::new(DISK_REQUEST_BYTES).ok_or("no aligned buffer")?;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(DISK_REQUEST_BYTES as u64) as usize;
        // SAFETY: `buf` holds DISK_REQUEST_BYTES >= n writable bytes, page-aligned.
        let r = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf.ptr as *mut libc::c_void,
                n,
                (off + done) as libc::off_t,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("{}: O_DIRECT read: {e}", path.display()));
        }
        if r == 0 {
            return Err(format!(
                "{}: ended after {done} of the {len} bytes asked from offset {off}",
                path.display()
            ));
        }
        done += r as u64;
    }
    Ok(())
}

/// The disk's cold read rate on the weights `paths`: [`disk_ranges`] read by
/// their readers at once with `O_DIRECT`, timed from the first request to the
/// last reader's end. `Err` says why there is no figure (a file system without
/// `O_DIRECT`, weights smaller than one request); the run goes on without it.
pub fn disk_cold_read(paths: &[PathBuf], sample: u64, readers: usize) -> Result<DiskRead, String> {
    let sizes: Vec<u64> = paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect::<Result<_, _>>()?;
    let ranges = disk_ranges(&sizes, sample, readers);
    if ranges.is_empty() {
        return Err(format!(
            "the weights hold no whole {} MiB request to read",
            DISK_REQUEST_BYTES >> 20
        ));
    }
    let t = Instant::now();
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = ranges
            .iter()
            .map(|&(i, off, len)| sc.spawn(move || read_direct(&paths[i], off, len)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a reader panicked".into())))
            .collect()
    });
    let seconds = t.elapsed().as_secs_f64();
    if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
        return Err(e);
    }
    Ok(DiskRead {
        bytes: ranges.iter().map(|r| r.2).sum(),
        seconds,
        readers: ranges.len(),
    })
}

fn file_err(path: &Path, why: impl ToString) -> CacheError {
    CacheError::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Ask the kernel to drop every clean cached page of `path`.
fn evict(path: &Path) -> Result<(), CacheError> {
    let f = std::fs::File::open(path).map_err(|e| file_err(path, e))?;
    // SAFETY: posix_fadvise only takes a descriptor and a byte range (0, 0 = all).
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(file_err(
            path,
            format!(
                "posix_fadvise(DONTNEED): {}",
                std::io::Error::from_raw_os_error(rc)
            ),
        ));
    }
    Ok(())
}

/// Read `path` once, start to end, so its pages enter the page cache.
fn read_through(path: &Path) -> Result<(), CacheError> {
    let mut f = std::fs::File::open(path).map_err(|e| file_err(path, e))?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(file_err(path, format!("reading: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::y4m::tests::noise;
    use std::io::Write;

    fn weights(name: &str, mib: usize) -> Vec<PathBuf> {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/weights-cache")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut out = Vec::new();
        for i in 0..2u32 {
            let p = d.join(format!("part-{i}.safetensors"));
            let data = noise(mib << 20, 0x2545_f491 + i);
            let mut f = std::fs::File::create(&p).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            out.push(p);
        }
        out
    }

    #[test]
    fn cold_then_warm_reach_their_states_and_pass() {
        let paths = weights("cold-warm", 4);
        let cold = prepare(&paths, Policy::Cold).unwrap();
        assert_eq!(cold.total_bytes, 8 << 20);
        assert!(cold.after_share() <= COLD_MAX_RESIDENT_SHARE, "{cold:?}");
        assert_eq!(cold.gate().verdict, Verdict::Pass, "{:?}", cold.gate());
        let warm = prepare(&paths, Policy::Warm).unwrap();
        assert!(warm.resident_before_bytes <= cold.resident_after_bytes + (64 << 10));
        assert!(warm.after_share() >= WARM_MIN_RESIDENT_SHARE, "{warm:?}");
        assert_eq!(warm.gate().verdict, Verdict::Pass);
        // as-is measures and changes nothing.
        let same = prepare(&paths, Policy::AsIs).unwrap();
        assert_eq!(same.resident_before_bytes, warm.resident_after_bytes);
        assert!(same.gate().detail.starts_with("as-is: "));
    }

    #[test]
    fn pages_a_process_maps_stay_and_the_cold_gate_refuses() {
        // The bug class of the batched staging path: fadvise alone leaves mapped
        // pages resident. A cold start that cannot evict must say so, not pass.
        let paths = weights("mapped", 4);
        let f = std::fs::File::open(&paths[0]).unwrap();
        // SAFETY: read-only mapping of a file this test owns and does not change.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let sum: u64 = map.iter().step_by(4096).map(|&b| b as u64).sum();
        assert!(sum > 0);
        let p = prepare(&paths, Policy::Cold).unwrap();
        let g = p.gate();
        assert_eq!(g.verdict, Verdict::Refuse, "{g:?}");
        assert!(g.detail.contains("at most 2%"), "{}", g.detail);
        assert!(p.resident_after_bytes >= 4 << 20, "{p:?}");
        drop(map);
        assert_eq!(
            prepare(&paths, Policy::Cold).unwrap().gate().verdict,
            Verdict::Pass
        );
    }

    /// Red on: ranges past a file's end, overlapping ranges, a partial request
    /// (O_DIRECT would refuse it), or the largest file not read first.
    #[test]
    fn disk_ranges_are_whole_requests_inside_their_files() {
        let req = DISK_REQUEST_BYTES as u64;
        // 4 readers over 1 GiB: 256 MiB each, the largest file first.
        let sizes = [100 * req, 5 * req + 7, 40 * req];
        let r = disk_ranges(&sizes, 1 << 30, 4);
        assert_eq!(r.len(), 4, "{r:?}");
        for &(i, off, len) in &r {
            assert_eq!(len, 32 * req);
            assert_eq!(off % req, 0);
            assert!(off + len <= sizes[i], "{r:?}");
        }
        assert_eq!(r[0], (0, 0, 32 * req));
        assert_eq!(r[1], (0, 32 * req, 32 * req));
        assert_eq!(r[2], (0, 64 * req, 32 * req));
        assert_eq!(r[3], (2, 0, 32 * req));
        // Weights smaller than the sample: one reader, the largest file's whole
        // requests (its partial tail left out).
        let small = [3 * req + 100, req];
        assert_eq!(disk_ranges(&small, 1 << 30, 4), vec![(0, 0, 3 * req)]);
        // Less than one request: nothing to read.
        assert!(disk_ranges(&[req - 1], 1 << 30, 4).is_empty());
    }

    /// The disk read happens on a cold start only, reads past the page cache
    /// (the cold gate still passes after it), and lands in the gate and the
    /// fragment; a file system that refuses O_DIRECT gives a note instead.
    #[test]
    fn a_cold_start_measures_the_disk_and_stays_cold() {
        // 2 files of 40 MiB: the whole-request fallback reads 40 MiB of one.
        let paths = weights("disk", 40);
        // Whether this file system takes O_DIRECT at all: where it does, the
        // measurement must be made (a reader that always gave up would pass
        // the Err branch below otherwise).
        let direct_ok = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&paths[0])
                .is_ok()
        };
        let cold = prepare(&paths, Policy::Cold).unwrap();
        let g = cold.gate();
        let frag = cold.fragment();
        match cold.disk.as_ref().expect("a cold start tries the disk") {
            Ok(d) => {
                assert_eq!(d.bytes, 40 << 20, "{d:?}");
                assert_eq!(d.readers, 1);
                assert!(d.seconds > 0.0 && d.gbps() > 0.0, "{d:?}");
                assert_eq!(g.verdict, Verdict::Pass, "{g:?}");
                assert!(g.detail.contains("disk read"), "{}", g.detail);
                assert_eq!(frag.disk_read_bytes, Some(40 << 20));
                assert_eq!(frag.disk_readers, Some(1));
                assert!(frag.disk_read_note.is_none());
            }
            Err(why) => {
                assert!(!direct_ok, "O_DIRECT opens here, yet no figure: {why}");
                // tmpfs and some overlay mounts refuse O_DIRECT: said, not hidden.
                assert!(why.contains("O_DIRECT"), "{why}");
                assert!(g.detail.contains("disk rate not measured"), "{}", g.detail);
                assert_eq!(frag.disk_read_note.as_deref(), Some(why.as_str()));
                assert!(frag.disk_read_bytes.is_none());
            }
        }
        for p in [Policy::Warm, Policy::AsIs] {
            let other = prepare(&paths, p).unwrap();
            assert!(other.disk.is_none(), "{p:?}");
            let v = serde_json::to_value(other.fragment()).unwrap();
            assert!(v.get("disk_read_bytes").is_none(), "{v}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let mut paths = weights("missing", 1);
        paths.push(paths[0].with_file_name("gone.safetensors"));
        let e = prepare(&paths, Policy::Cold).unwrap_err().to_string();
        assert!(e.contains("gone.safetensors"), "{e}");
    }

    #[test]
    fn policy_values_are_the_flag_values() {
        for p in [Policy::AsIs, Policy::Cold, Policy::Warm] {
            let v = <Policy as clap::ValueEnum>::to_possible_value(&p).unwrap();
            assert_eq!(v.get_name(), p.as_str());
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
    }
}
