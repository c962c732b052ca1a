//! A reading taken on a thread of its own at a fixed period, for the sampler's
//! parts that take longer than a tick can spare.
//!
//! Two parts need it: the page-cache residency pass over the weight files (247-310
//! ms for 16 GiB on the development VM) and NVML's energy and PCIe throughput
//! (tens of milliseconds on the device, device runs camp3d-f in
//! reports/device-notes.md: the PCIe counters sample a 20 ms window each). On the
//! sampler's thread either one made ticks late. Here
//! the tick only takes the newest finished reading, if there is one, so a slow
//! part never moves the fixed-cadence deadlines; its value lands in the first row
//! after its pass ends (null in the rows between). What the worker cannot remove is
//! contention inside the library it calls: on the device (run slow1,
//! reports/device-notes.md) the tick's fast NVML reads still took milliseconds at
//! the p99, most likely waiting while this thread held a PCIe window.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use evidence::clock::monotonic_ns;

/// One pass of a [`Periodic`] worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading<T> {
    /// 1 for the first pass, then one more per pass.
    pub seq: u64,
    /// What the pass produced.
    pub value: T,
    /// CLOCK_MONOTONIC nanoseconds when the pass began.
    pub t_ns: u64,
}

struct Shared<T> {
    latest: Option<Reading<T>>,
    costs_ns: Vec<u64>,
}

/// A worker calling its function every `every` on a thread named for its part.
/// The first pass runs in [`Periodic::start`] itself, so a reading exists before
/// the first tick. Dropping it stops the thread (at most one pass later).
pub struct Periodic<T> {
    shared: Arc<Mutex<Shared<T>>>,
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
    spawn_error: Option<String>,
}

fn pass<T>(work: &mut impl FnMut() -> T, seq: u64, shared: &Mutex<Shared<T>>) {
    let t_ns = monotonic_ns();
    let value = work();
    let cost = monotonic_ns().saturating_sub(t_ns);
    if let Ok(mut s) = shared.lock() {
        s.latest = Some(Reading { seq, value, t_ns });
        s.costs_ns.push(cost);
    }
}

impl<T: Send + 'static> Periodic<T> {
    /// Run `work` now, then every `every` (measured from the end of one pass to the
    /// start of the next) on a new thread called `name`. If the thread cannot be
    /// spawned, the first reading is the only one and [`Periodic::spawn_error`] says
    /// why.
    pub fn start(
        name: &str,
        every: Duration,
        work: impl FnMut() -> T + Send + 'static,
    ) -> Periodic<T> {
        Self::start_on(std::thread::Builder::new(), name, every, work)
    }

    /// [`Periodic::start`] with the thread built by `builder` (a test makes its
    /// spawn fail with an impossible stack size).
    fn start_on(
        builder: std::thread::Builder,
        name: &str,
        every: Duration,
        mut work: impl FnMut() -> T + Send + 'static,
    ) -> Periodic<T> {
        let shared = Arc::new(Mutex::new(Shared {
            latest: None,
            costs_ns: Vec::new(),
        }));
        pass(&mut work, 1, &shared);
        let (tx, rx) = mpsc::channel::<()>();
        let sh = shared.clone();
        let spawned = builder.name(name.into()).spawn(move || {
            let mut seq = 1;
            // Any message, or the sender dropped, ends the loop.
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                seq += 1;
                pass(&mut work, seq, &sh);
            }
        });
        let (handle, spawn_error) = match spawned {
            Ok(h) => (Some(h), None),
            Err(e) => (
                None,
                Some(format!("the {name} thread could not start: {e}")),
            ),
        };
        Periodic {
            shared,
            stop: Some(tx),
            handle,
            spawn_error,
        }
    }

    /// Why no pass after the first will come, if the thread could not be spawned.
    pub fn spawn_error(&self) -> Option<&str> {
        self.spawn_error.as_deref()
    }

    /// The newest reading not taken before, if a pass has finished since; an older
    /// reading nobody took is superseded, never handed over late.
    pub fn take_new(&mut self) -> Option<Reading<T>> {
        self.shared.lock().ok()?.latest.take()
    }

    /// Nanoseconds each pass took so far (passes never count in a tick's cost).
    pub fn costs_ns(&self) -> Vec<u64> {
        self.shared
            .lock()
            .map(|s| s.costs_ns.clone())
            .unwrap_or_default()
    }
}

impl<T> Drop for Periodic<T> {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    fn wait_new<T: Send + 'static>(p: &mut Periodic<T>) -> Reading<T> {
        let t0 = Instant::now();
        loop {
            if let Some(r) = p.take_new() {
                return r;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no new pass in 5 s");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_first_pass_runs_in_start_then_each_new_pass_is_handed_over_once() {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let mut p = Periodic::start("test-periodic", Duration::from_millis(20), move || {
            c.fetch_add(1, Ordering::SeqCst) * 10 + 7
        });
        // A reading is there before any wait, from the first call.
        assert_eq!(p.spawn_error(), None);
        let first = p.take_new().expect("the first pass ran in start");
        assert_eq!((first.seq, first.value), (1, 7));
        assert!(first.t_ns > 0);
        // Taken once only: the next take is a later pass or nothing.
        if let Some(r) = p.take_new() {
            assert!(r.seq >= 2, "{r:?}");
        }
        let next = wait_new(&mut p);
        assert!(next.seq >= 2, "{next:?}");
        assert_eq!(
            next.value,
            (next.seq - 1) * 10 + 7,
            "value of pass {next:?}"
        );
        assert!(next.t_ns > first.t_ns);
        assert!(p.costs_ns().len() as u64 >= next.seq);
    }

    #[test]
    fn a_slow_pass_never_blocks_the_taker() {
        // Each pass sleeps 200 ms; taking from the tick's side must return at once,
        // whether or not a pass is in flight.
        let mut p = Periodic::start("test-slow", Duration::from_millis(1), || {
            std::thread::sleep(Duration::from_millis(200));
            1u8
        });
        assert!(p.take_new().is_some());
        let mut worst = Duration::ZERO;
        let t_end = Instant::now() + Duration::from_millis(700);
        let mut seen = 0;
        while Instant::now() < t_end {
            let t = Instant::now();
            seen += p.take_new().map_or(0, |_| 1);
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            seen >= 2,
            "{seen} passes finished in 700 ms of 200 ms passes"
        );
        assert!(worst < Duration::from_millis(50), "a take waited {worst:?}");
        let costs = p.costs_ns();
        assert!(costs.iter().all(|&c| c >= 200_000_000), "{costs:?}");
    }

    #[test]
    fn a_thread_that_cannot_start_leaves_the_first_reading_and_says_why() {
        // 1 EiB of stack, beyond any user address space (so whatever the host's
        // overcommit policy): the spawn fails, as when a host runs out of threads
        // or memory.
        let b = std::thread::Builder::new().stack_size(1 << 60);
        let mut p = Periodic::start_on(b, "test-nospawn", Duration::from_millis(1), || 5u8);
        let why = p.spawn_error().expect("the spawn failed").to_string();
        assert!(
            why.starts_with("the test-nospawn thread could not start: "),
            "{why}"
        );
        assert_eq!(p.take_new().map(|r| (r.seq, r.value)), Some((1, 5)));
        std::thread::sleep(Duration::from_millis(20));
        assert!(p.take_new().is_none(), "no pass after the first");
        drop(p); // nothing to join
    }

    #[test]
    fn dropping_stops_the_thread_promptly() {
        let p = Periodic::start("test-drop", Duration::from_secs(3600), || 0u8);
        let t0 = Instant::now();
        drop(p);
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
