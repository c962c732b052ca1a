//! Where the GPU control reads utilization from: NVML in production, or (tests
//! only) a file named by [`FAKE_UTIL_ENV`], so the control's timing and verdicts
//! can be exercised on a machine without a GPU.

use std::path::PathBuf;

use crate::sampler::gpu::Gpu;

/// Test-only: read the GPU's utilization from this file instead of NVML. The file
/// holds an integer percent; a missing file reads 0 (an idle GPU). Every result
/// measured this way says so in its detail and is never kept for runs.
pub const FAKE_UTIL_ENV: &str = "HARNESS_CONTROL_FAKE_UTIL";

/// A source of GPU utilization readings, percent (0-100).
pub trait UtilSource {
    /// One reading: the share of the last sample period any kernel ran, percent.
    fn utilization_pct(&self) -> Result<u32, String>;
    /// What is read, in words (`NVML GPU 0`, `fake utilization from FILE`).
    fn describe(&self) -> String;
    /// Whether the readings come from a real GPU (only those are kept for runs).
    fn is_real(&self) -> bool;
}

impl UtilSource for Gpu {
    fn utilization_pct(&self) -> Result<u32, String> {
        Gpu::utilization_pct(self)
    }

    fn describe(&self) -> String {
        format!("NVML GPU {}", self.index())
    }

    fn is_real(&self) -> bool {
        true
    }
}

/// The fake source of [`FAKE_UTIL_ENV`].
#[derive(Debug, Clone)]
pub struct FileUtil {
    /// The file holding the percent.
    pub path: PathBuf,
}

impl FileUtil {
    /// The fake source named by [`FAKE_UTIL_ENV`], when it is set.
    pub fn from_env() -> Option<FileUtil> {
        std::env::var_os(FAKE_UTIL_ENV).map(|p| FileUtil { path: p.into() })
    }
}

impl UtilSource for FileUtil {
    fn utilization_pct(&self) -> Result<u32, String> {
        match std::fs::read_to_string(&self.path) {
            Ok(t) => t
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("{}: {t:?} is not a percent: {e}", self.path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        }
    }

    fn describe(&self) -> String {
        format!("fake utilization from {}", self.path.display())
    }

    fn is_real(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_reads_the_file_and_a_missing_file_as_idle() {
        let d =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/util");
        std::fs::create_dir_all(&d).unwrap();
        let f = FileUtil {
            path: d.join("pct"),
        };
        let _ = std::fs::remove_file(&f.path);
        assert_eq!(f.utilization_pct(), Ok(0));
        std::fs::write(&f.path, "100\n").unwrap();
        assert_eq!(f.utilization_pct(), Ok(100));
        std::fs::write(&f.path, "lots").unwrap();
        assert!(f.utilization_pct().unwrap_err().contains("not a percent"));
        assert!(!f.is_real());
    }
}
