//! The harness's own signals: Ctrl-C (SIGINT) and SIGTERM stop the engine and still
//! seal the run (marked interrupted); SIGHUP is ignored, so a closed terminal does
//! not end a run that a lease is paying for (H4). The engine, in its own process
//! group, never receives the terminal's signals directly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Flags set by the signal handlers.
#[derive(Debug)]
pub struct Signals {
    int: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
}

impl Signals {
    /// Install the handlers.
    pub fn install() -> std::io::Result<Signals> {
        let int = Arc::new(AtomicBool::new(false));
        let term = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(libc::SIGINT, int.clone())?;
        signal_hook::flag::register(libc::SIGTERM, term.clone())?;
        // SAFETY: ignoring a signal installs no handler code; always sound.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        Ok(Signals { int, term })
    }

    /// The signal received since the last call, if any (SIGINT before SIGTERM).
    pub fn take(&self) -> Option<&'static str> {
        if self.int.swap(false, Ordering::Relaxed) {
            Some("SIGINT")
        } else if self.term.swap(false, Ordering::Relaxed) {
            Some("SIGTERM")
        } else {
            None
        }
    }
}
