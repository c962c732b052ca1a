//! Watching the engine while it runs: the watchdog's trip, the journal, the
//! signals and the timeout, each of which ends the run; and joining the threads
//! that read its output without hanging on a pipe someone else holds.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use evidence::journal::SharedJournal;

use crate::classify::Intervention;
use crate::run::{signals, spawn, KILL_GRACE};
use crate::sampler::Sampler;

/// How often the harness looks at the engine, the watchdog and its signals.
const POLL: Duration = Duration::from_millis(20);

/// Watch the engine until it ends; returns what the harness did to end it.
pub(super) fn supervise(
    pid: i32,
    sampler: &Sampler,
    journal: &SharedJournal,
    timeout_s: Option<f64>,
    signals: &signals::Signals,
) -> Option<Intervention> {
    let started = Instant::now();
    let mut intervention = None;
    loop {
        // The watchdog kills from the sampler thread, so the engine may already be
        // gone when its trip is first seen here: look at the trip before the exit.
        let exited = spawn::has_exited(pid);
        if intervention.is_none() {
            if let Some(t) = sampler.tripped() {
                eprintln!(
                    "harness: WATCHDOG: {} = {} B crossed {} B; engine group killed",
                    t.column, t.value, t.limit
                );
                intervention = Some(Intervention::Watchdog(t));
                continue;
            }
        }
        if exited {
            return intervention;
        }
        if intervention.is_none() {
            // A journal that cannot be written (full disk) ends the run: evidence
            // that is not kept must not be produced.
            if let Some(why) = journal.failure() {
                eprintln!("harness: JOURNAL WRITE FAILED ({why}): stopping the engine");
                spawn::terminate(pid, KILL_GRACE);
                return intervention;
            }
            if let Some(sig) = signals.take() {
                eprintln!("harness: {sig}: stopping the engine (SIGTERM, SIGKILL after {KILL_GRACE:?}); the run will be sealed as interrupted");
                intervention = Some(Intervention::Interrupted(sig));
                spawn::terminate(pid, KILL_GRACE);
                continue;
            }
            if let Some(t) = timeout_s {
                if started.elapsed().as_secs_f64() >= t {
                    eprintln!("harness: timeout of {t} s: stopping the engine");
                    intervention = Some(Intervention::Timeout(t));
                    spawn::terminate(pid, KILL_GRACE);
                    continue;
                }
            }
        } else if signals.take().is_some() {
            // A second Ctrl-C while stopping: no more grace.
            crate::sampler::kill_group(pid, libc::SIGKILL);
        }
        std::thread::sleep(POLL);
    }
}

/// Join `h`, giving up after `timeout` (a process outside the engine's group may
/// still hold the pipe; the run must not hang on it).
pub(super) fn join_bounded<T>(h: JoinHandle<T>, timeout: Duration) {
    let until = Instant::now() + timeout;
    while !h.is_finished() {
        if Instant::now() >= until {
            eprintln!(
                "harness: a reader thread is still blocked after {timeout:?} (a process outside the engine's group holds its pipe); continuing"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = h.join();
}
