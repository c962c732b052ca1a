//! System-wide readings: `/proc/meminfo`, `/proc/pressure/memory`, `/proc/loadavg`,
//! and the harness's own CPU use.

use evidence::clock::monotonic_ns;
use evidence::sample::Sample;
use procfs::Current;

use super::Reasons;

/// Reads the system columns; remembers the previous self-CPU reading for deltas.
#[derive(Debug, Default)]
pub struct SystemProbe {
    /// (CPU seconds of this process, CLOCK_MONOTONIC ns) at the previous tick.
    prev_self: Option<(f64, u64)>,
}

/// User + system CPU time in seconds of `who` (`libc::RUSAGE_SELF`: this process,
/// all threads; `libc::RUSAGE_CHILDREN`: its reaped children and their reaped
/// descendants), from getrusage; None when the call fails.
pub fn rusage_cpu_seconds(who: libc::c_int) -> Option<f64> {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; an invalid `who` fails with EINVAL.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return None;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(tv(ru.ru_utime) + tv(ru.ru_stime))
}

/// This process's user + system CPU time in seconds, all threads, from getrusage.
pub fn self_cpu_seconds() -> Option<f64> {
    rusage_cpu_seconds(libc::RUSAGE_SELF)
}

/// MemAvailable in bytes, now.
pub fn mem_available_bytes() -> Result<u64, String> {
    let m = procfs::Meminfo::current().map_err(|e| format!("/proc/meminfo: {e}"))?;
    m.mem_available
        .ok_or_else(|| "/proc/meminfo has no MemAvailable (kernel older than 3.14)".into())
}

/// MemTotal in bytes.
pub fn mem_total_bytes() -> Result<u64, String> {
    procfs::Meminfo::current()
        .map(|m| m.mem_total)
        .map_err(|e| format!("/proc/meminfo: {e}"))
}

/// The one-minute load average.
pub fn load1() -> Result<f64, String> {
    procfs::LoadAverage::current()
        .map(|l| l.one as f64)
        .map_err(|e| format!("/proc/loadavg: {e}"))
}

impl SystemProbe {
    /// Fill the memory columns only (what the watchdog needs).
    pub fn read_memory(&mut self, s: &mut Sample, reasons: &mut Reasons) {
        match procfs::Meminfo::current() {
            Ok(m) => {
                match m.mem_available {
                    Some(v) => {
                        s.set("mem_available_bytes", Some(v as f64));
                    }
                    None => reasons.note(
                        "mem_available_bytes",
                        "/proc/meminfo has no MemAvailable (kernel older than 3.14)",
                    ),
                }
                s.set("cached_bytes", Some(m.cached as f64));
                s.set("dirty_bytes", Some(m.dirty as f64));
            }
            Err(e) => {
                for c in ["mem_available_bytes", "cached_bytes", "dirty_bytes"] {
                    reasons.note(c, &format!("/proc/meminfo: {e}"));
                }
            }
        }
    }

    /// Fill every system column.
    pub fn read(&mut self, s: &mut Sample, reasons: &mut Reasons) {
        self.read_memory(s, reasons);
        match procfs::MemoryPressure::current() {
            Ok(p) => {
                s.set("psi_mem_some_avg10_pct", Some(p.some.avg10 as f64));
                s.set("psi_mem_full_avg10_pct", Some(p.full.avg10 as f64));
            }
            Err(e) => {
                for c in ["psi_mem_some_avg10_pct", "psi_mem_full_avg10_pct"] {
                    reasons.note(
                        c,
                        &format!("/proc/pressure/memory: {e} (kernel without PSI?)"),
                    );
                }
            }
        }
        match load1() {
            Ok(v) => {
                s.set("load1", Some(v));
            }
            Err(e) => reasons.note("load1", &e),
        }
        self.read_self_cpu(s, reasons);
    }

    /// Fill `harness_cpu_cores`: this process's CPU time over the tick.
    pub fn read_self_cpu(&mut self, s: &mut Sample, reasons: &mut Reasons) {
        let now = monotonic_ns();
        match self_cpu_seconds() {
            Some(cpu) => {
                if let Some((pcpu, pt)) = self.prev_self {
                    let dt = (now.saturating_sub(pt)) as f64 / 1e9;
                    if dt > 0.0 {
                        s.set("harness_cpu_cores", Some((cpu - pcpu).max(0.0) / dt));
                    }
                }
                self.prev_self = Some((cpu, now));
            }
            None => reasons.note("harness_cpu_cores", "getrusage(RUSAGE_SELF) failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_columns_read_plausible_values_here() {
        let mut p = SystemProbe::default();
        let mut r = Reasons::default();
        let mut s = Sample::empty(0);
        p.read(&mut s, &mut r);
        let total = mem_total_bytes().unwrap() as f64;
        let avail = s.get("mem_available_bytes").unwrap();
        assert!(avail > 0.0 && avail <= total, "{avail} of {total}");
        assert!(s.get("cached_bytes").unwrap() <= total);
        assert!(s.get("load1").unwrap() >= 0.0);
        // First tick has no CPU delta; after burning 20 ms of CPU the second has one.
        assert_eq!(s.get("harness_cpu_cores"), None);
        let (cpu0, t0) = (self_cpu_seconds().unwrap(), std::time::Instant::now());
        let mut x = 0u64;
        while self_cpu_seconds().unwrap() - cpu0 < 0.02 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let mut s2 = Sample::empty(0);
        p.read(&mut s2, &mut r);
        let wall = t0.elapsed().as_secs_f64();
        let cores = s2.get("harness_cpu_cores").unwrap();
        let cpus = std::thread::available_parallelism().unwrap().get() as f64;
        assert!(cores * wall >= 0.018, "{cores} cores over {wall} s");
        assert!(cores <= cpus + 0.5, "{cores} cores on {cpus} CPUs");
    }
}
