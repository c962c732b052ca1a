//! The shared clock: CLOCK_MONOTONIC in nanoseconds.
//!
//! Engines stamp markers with it and the harness stamps samples with it, so a
//! sample and a phase boundary can be compared directly (same host, same boot).

/// Nanoseconds on CLOCK_MONOTONIC (since an unspecified point, typically boot).
///
/// Promise: non-decreasing within one boot, comparable across processes.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec into the pointer we pass; the
    // pointer is valid for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // CLOCK_MONOTONIC cannot fail on Linux with a valid pointer; keep a defined value.
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_is_nondecreasing_and_advances() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_ns();
        assert!(a > 0);
        assert!(b >= a + 1_000_000, "a={a} b={b}");
    }
}
