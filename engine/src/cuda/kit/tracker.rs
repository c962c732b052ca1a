//! The device bytes the engine holds: a counter its allocations move and a
//! high-water mark the phase markers report (`peak_device_bytes`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the engine holds on the device now, and the most it has held since
/// the last [`MemTracker::reset_peak`].
#[derive(Debug, Default)]
pub struct MemTracker {
    current: AtomicU64,
    peak: AtomicU64,
}

impl crate::phase::DevicePeak for MemTracker {
    fn take_peak(&self) -> u64 {
        MemTracker::take_peak(self)
    }
}

impl MemTracker {
    pub(crate) fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Ordering::SeqCst) + n;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    pub(crate) fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Ordering::SeqCst);
    }

    /// Device bytes held now by this engine's allocations.
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::SeqCst)
    }

    /// High-water mark of [`MemTracker::current`] since the last reset, bytes.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }

    /// Start a new phase: the peak becomes the current holding.
    pub fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::SeqCst);
    }

    /// The high-water mark since the last call, restarted at the bytes held now.
    pub fn take_peak(&self) -> u64 {
        let now = self.current();
        self.peak.swap(now, Ordering::SeqCst).max(now)
    }
}
