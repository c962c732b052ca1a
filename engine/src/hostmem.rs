//! Peak resident host memory per phase.
//!
//! The kernel keeps a high-water mark of this process's resident set (`VmHWM` in
//! `/proc/self/status`) and lets the process reset it to the current RSS by
//! writing `5` to `/proc/self/clear_refs`. [`PeakTracker`] reads and resets it at
//! every phase boundary and folds each reading into every open phase, so a
//! phase's peak is the maximum over its own window and its children's (carried
//! up to enclosing phases). Where the reset is refused, the tracker falls back to
//! `VmRSS` sampled at boundaries only, which can miss a spike between two
//! boundaries; [`PeakSource`] says which method produced a figure.

/// What a peak figure was measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakSource {
    /// `VmHWM`, reset through `/proc/self/clear_refs` at each boundary (exact).
    VmHwmReset,
    /// `VmRSS` sampled at boundaries (a lower bound of the true peak).
    VmRssSampled,
}

impl PeakSource {
    /// The attribute value naming the method.
    pub fn as_str(self) -> &'static str {
        match self {
            PeakSource::VmHwmReset => "vmhwm_reset",
            PeakSource::VmRssSampled => "vmrss_at_boundaries",
        }
    }
}

/// `VmHWM` and `VmRSS` of this process, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemStatus {
    /// Peak resident set since start or the last reset.
    pub hwm_bytes: u64,
    /// Current resident set.
    pub rss_bytes: u64,
}

/// Parse the `VmHWM` and `VmRSS` lines (kB) of a `/proc/<pid>/status` text.
pub fn parse_status(text: &str) -> MemStatus {
    let kb = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .map(|k| k * 1024)
            .unwrap_or(0)
    };
    MemStatus {
        hwm_bytes: kb("VmHWM:"),
        rss_bytes: kb("VmRSS:"),
    }
}

/// This process's memory status (zeros if `/proc` is unreadable).
pub fn status() -> MemStatus {
    std::fs::read_to_string("/proc/self/status")
        .map(|t| parse_status(&t))
        .unwrap_or_default()
}

/// Reset `VmHWM` to the current RSS; false when the kernel refuses.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// `/proc/self/status` and `/proc/self/clear_refs` kept open, so a phase
/// boundary costs one `pread` and one `write` instead of two opens and closes.
struct ProcFiles {
    status: Option<std::fs::File>,
    clear_refs: Option<std::fs::File>,
    buf: Vec<u8>,
}

impl ProcFiles {
    fn open() -> Self {
        ProcFiles {
            status: std::fs::File::open("/proc/self/status").ok(),
            clear_refs: std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/self/clear_refs")
                .ok(),
            buf: Vec::with_capacity(4096),
        }
    }

    fn status(&mut self) -> MemStatus {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.status else {
            return status();
        };
        self.buf.resize(8192, 0);
        let mut n = 0;
        while n < self.buf.len() {
            match f.read_at(&mut self.buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(_) => return status(),
            }
        }
        parse_status(&String::from_utf8_lossy(&self.buf[..n]))
    }

    fn reset(&mut self) -> bool {
        use std::io::Write;
        match &mut self.clear_refs {
            Some(f) => f.write_all(b"5").is_ok(),
            None => false,
        }
    }
}

/// Per-phase peaks over nested phases.
pub struct PeakTracker {
    source: PeakSource,
    open: Vec<u64>,
    proc: ProcFiles,
}

impl Default for PeakTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl PeakTracker {
    /// A tracker; probes whether `VmHWM` can be reset.
    pub fn new() -> Self {
        let mut proc = ProcFiles::open();
        let source = if proc.reset() {
            PeakSource::VmHwmReset
        } else {
            PeakSource::VmRssSampled
        };
        PeakTracker {
            source,
            open: Vec::new(),
            proc,
        }
    }

    /// The method in use.
    pub fn source(&self) -> PeakSource {
        self.source
    }

    /// Read the peak since the last boundary, fold it into every open phase,
    /// reset; returns the reading and the resident set at that moment.
    fn boundary(&mut self) -> (u64, u64) {
        let s = self.proc.status();
        let v = match self.source {
            PeakSource::VmHwmReset => {
                let v = s.hwm_bytes.max(s.rss_bytes);
                if !self.proc.reset() {
                    self.source = PeakSource::VmRssSampled;
                }
                v
            }
            PeakSource::VmRssSampled => s.rss_bytes,
        };
        for m in &mut self.open {
            *m = (*m).max(v);
        }
        (v, s.rss_bytes)
    }

    /// A phase opens.
    pub fn open(&mut self) {
        // The reading belongs to the window that just ended (the parents');
        // the new phase starts from the resident set now.
        let (_, rss) = self.boundary();
        self.open.push(rss);
    }

    /// The innermost phase closes; returns its peak resident bytes.
    pub fn close(&mut self) -> u64 {
        self.boundary();
        self.open.pop().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse_to_bytes() {
        let t = "Name:\tengine\nVmPeak:\t  9 kB\nVmHWM:\t    1708 kB\nVmRSS:\t     900 kB\n";
        assert_eq!(
            parse_status(t),
            MemStatus {
                hwm_bytes: 1708 * 1024,
                rss_bytes: 900 * 1024
            }
        );
        assert_eq!(parse_status("nothing"), MemStatus::default());
    }

    #[test]
    fn peaks_nest_and_a_spike_is_seen_by_its_phase_and_parents_only() {
        let mut t = PeakTracker::new();
        const BIG: usize = 96 << 20;
        t.open(); // outer
        t.open(); // spike
        let mut v = vec![0u8; BIG];
        for i in (0..BIG).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        // Closed while the buffer is alive, so the figure does not depend on the
        // process-wide VmHWM surviving resets by other tests running in parallel.
        let spike = t.close();
        drop(v);
        t.open(); // quiet sibling after the spike was freed
        let quiet = t.close();
        let outer = t.close();
        let base = status().rss_bytes;
        assert!(
            spike >= base + (BIG as u64) / 2,
            "spike {spike} base {base}"
        );
        assert!(outer >= spike, "outer {outer} < spike {spike}");
        if t.source() == PeakSource::VmHwmReset {
            assert!(
                quiet + (BIG as u64) / 2 <= spike,
                "quiet {quiet} spike {spike}"
            );
        }
    }
}
