//! Starting a program just written: a leaf that `run` (the engine, its input
//! check, the binary gate) and `weights` (the engine's `synth-weights`) share.

use std::time::{Duration, Instant};

/// Runs `start` (a spawn or an output call) again while it fails with ETXTBSY, for
/// up to about two seconds, then returns its last result.
///
/// A program just written (the engine copied into the store under its hash) can be
/// refused with "Text file busy" when another thread of this process forked while
/// the copy's write descriptor was open: the fork holds that descriptor until its
/// own exec closes it, which is a matter of milliseconds. The refusal says nothing
/// about the program, so the start is tried again instead of failing the run.
pub fn retry_while_text_busy<T>(
    mut start: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match start() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}
