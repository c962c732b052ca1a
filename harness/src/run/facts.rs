//! Facts about the host and the run, for the `host` and `run` manifest fragments.

use evidence::fragments as frag;
use std::path::Path;

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`): monotonic times from two
/// runs are comparable only when their boot ids are equal.
pub fn boot_id() -> Option<String> {
    read_trim("/proc/sys/kernel/random/boot_id")
}

/// The host name.
pub fn hostname() -> Option<String> {
    read_trim("/proc/sys/kernel/hostname")
}

/// The kernel release (`uname -r`).
pub fn kernel() -> Option<String> {
    read_trim("/proc/sys/kernel/osrelease")
}

/// The operating system's `PRETTY_NAME` from `/etc/os-release`.
pub fn os_name() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
}

/// The CPU model name from `/proc/cpuinfo`.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The `host` fragment.
pub fn host_fragment() -> frag::Host {
    frag::Host {
        cpu_model: cpu_model(),
        cores: Some(cores() as u64),
        mem_total_bytes: crate::sampler::system::mem_total_bytes().ok(),
        kernel: kernel(),
        os: os_name(),
    }
}

/// The `run` fragment; `end_ns` is null until the run ends.
pub fn run_fragment(
    start: RunStart,
    end_ns: Option<u64>,
    argv: &[String],
    cwd: &Path,
) -> frag::Run {
    frag::Run {
        start_ns: Some(start.mono_ns),
        start_unix_ns: Some(start.unix_ns),
        end_ns,
        argv: argv.to_vec(),
        boot_id: boot_id(),
        hostname: hostname(),
        harness_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        cwd: Some(cwd.to_path_buf()),
    }
}

/// When a run started, read once on both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStart {
    /// CLOCK_MONOTONIC, ns: the clock of every marker and sample.
    pub mono_ns: u64,
    /// Wall clock, ns since the Unix epoch: for people and `harness ls` only, never
    /// for durations.
    pub unix_ns: u64,
}

impl RunStart {
    /// Read both clocks now (the monotonic one first).
    pub fn now() -> Self {
        let mono_ns = evidence::clock::monotonic_ns();
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self { mono_ns, unix_ns }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_read_here() {
        let b = boot_id().unwrap();
        assert_eq!(b.len(), 36, "{b}");
        assert!(kernel().unwrap().chars().next().unwrap().is_ascii_digit());
        let h = serde_json::to_value(host_fragment()).unwrap();
        assert!(h["cores"].as_u64().unwrap() >= 1);
        assert!(h["mem_total_bytes"].as_u64().unwrap() > 1 << 28);
        let start = RunStart {
            mono_ns: 5,
            unix_ns: 1_764_000_000_000_000_000,
        };
        let r = serde_json::to_value(run_fragment(
            start,
            None,
            &["harness".into()],
            Path::new("/w"),
        ))
        .unwrap();
        assert_eq!(
            (
                r["start_ns"].as_u64(),
                r["start_unix_ns"].as_u64(),
                r["end_ns"].is_null()
            ),
            (Some(5), Some(1_764_000_000_000_000_000), true)
        );
        let now = RunStart::now();
        // After 2025-01-01 and before 2100: a wall clock, not a monotonic one.
        assert!(now.unix_ns > 1_735_689_600_000_000_000 && now.unix_ns < 4_102_444_800_000_000_000);
        assert_eq!(r["boot_id"], b);
    }
}
