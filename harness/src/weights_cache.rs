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
}

impl Prepared {
    /// The `weights_cache` fragment: the figures as numbers (rank pairs
    /// weight-reading metrics only between runs that started in about the same
    /// cache state).
    pub fn fragment(&self) -> crate::fragments::WeightsCache {
        crate::fragments::WeightsCache {
            policy: Some(self.policy.as_str().to_string()),
            total_bytes: Some(self.total_bytes),
            resident_before_bytes: Some(self.resident_before_bytes),
            resident_after_bytes: Some(self.resident_after_bytes),
            seconds: Some(self.seconds),
        }
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
        let figures = format!(
            "{:.3} of {:.3} GiB resident before, {:.3} GiB after ({:.1}%), {:.2} s",
            gib(self.resident_before_bytes),
            gib(self.total_bytes),
            gib(self.resident_after_bytes),
            100.0 * self.after_share(),
            self.seconds
        );
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
