//! A fixed-cadence ticker on absolute CLOCK_MONOTONIC deadlines.
//!
//! Deadline k is `start + k * period`, so a slow tick never shifts the schedule:
//! the next tick fires on its own deadline, and deadlines already in the past by
//! more than one period are skipped and counted as missed rather than fired late
//! in a burst.

use std::sync::atomic::{AtomicBool, Ordering};

use evidence::clock::monotonic_ns;

/// Longest single sleep, in nanoseconds, so a stop request is seen promptly.
const MAX_SLEEP_NS: u64 = 100_000_000;

/// One fired tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// 0-based index of the deadline this tick served.
    pub index: u64,
    /// The deadline, CLOCK_MONOTONIC nanoseconds.
    pub scheduled_ns: u64,
    /// When the tick fired, CLOCK_MONOTONIC nanoseconds.
    pub fired_ns: u64,
}

impl Tick {
    /// How late the tick fired against its deadline, in nanoseconds.
    pub fn lag_ns(&self) -> u64 {
        self.fired_ns.saturating_sub(self.scheduled_ns)
    }
}

/// Fires at `start + k * period` for k = 0, 1, 2, ...
#[derive(Debug)]
pub struct Ticker {
    start_ns: u64,
    period_ns: u64,
    next: u64,
    missed: u64,
}

/// Sleep until CLOCK_MONOTONIC reaches `deadline_ns`.
fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // EINTR restarts with the same absolute deadline; any other error returns early
    // (the caller re-reads the clock, so an early return only costs a loop turn).
    loop {
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with
        // TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

impl Ticker {
    /// A ticker whose first deadline is now.
    pub fn new(period_ns: u64) -> Self {
        Ticker {
            start_ns: monotonic_ns(),
            period_ns: period_ns.max(1),
            next: 0,
            missed: 0,
        }
    }

    /// The period in nanoseconds.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// Deadlines skipped because the previous tick ran past them.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Wait for the next deadline; `None` once `stop` is set.
    pub fn wait(&mut self, stop: &AtomicBool) -> Option<Tick> {
        let now = monotonic_ns();
        let mut deadline = self.start_ns + self.next * self.period_ns;
        if now > deadline + self.period_ns {
            // Serve the latest deadline already due and count the ones skipped.
            let due = (now - self.start_ns) / self.period_ns;
            self.missed += due - self.next;
            self.next = due;
            deadline = self.start_ns + due * self.period_ns;
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let now = monotonic_ns();
            if now >= deadline {
                break;
            }
            sleep_until(deadline.min(now + MAX_SLEEP_NS));
        }
        let tick = Tick {
            index: self.next,
            scheduled_ns: deadline,
            fired_ns: monotonic_ns(),
        };
        self.next += 1;
        Some(tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_land_on_absolute_deadlines() {
        let stop = AtomicBool::new(false);
        let mut t = Ticker::new(5_000_000);
        let ticks: Vec<Tick> = (0..6).map(|_| t.wait(&stop).unwrap()).collect();
        for (k, tick) in ticks.iter().enumerate() {
            assert_eq!(tick.index, k as u64);
            assert_eq!(
                tick.scheduled_ns,
                ticks[0].scheduled_ns + k as u64 * 5_000_000
            );
            assert!(tick.fired_ns >= tick.scheduled_ns);
        }
        assert_eq!(t.missed(), 0);
    }

    #[test]
    fn a_slow_tick_skips_and_counts_deadlines_without_drift() {
        let stop = AtomicBool::new(false);
        let mut t = Ticker::new(2_000_000);
        let first = t.wait(&stop).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(11));
        let next = t.wait(&stop).unwrap();
        // 11 ms late: deadlines 1..=4 (or 5 on a loaded box) were skipped.
        assert!(t.missed() >= 4, "missed {}", t.missed());
        assert_eq!(next.index, 1 + t.missed());
        assert_eq!(
            next.scheduled_ns,
            first.scheduled_ns + next.index * 2_000_000
        );
    }

    #[test]
    fn stop_ends_the_wait() {
        let stop = AtomicBool::new(true);
        let mut t = Ticker::new(1_000_000_000);
        t.wait(&AtomicBool::new(false)).unwrap();
        let before = monotonic_ns();
        assert!(t.wait(&stop).is_none());
        assert!(monotonic_ns() - before < 50_000_000);
    }
}
