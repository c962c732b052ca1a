//! The probe the watchdog control runs: this binary in its hidden
//! `__alloc-probe` mode, allocating until the watchdog kills it.

use std::time::{Duration, Instant};

use evidence::clock::monotonic_ns;

/// `harness __alloc-probe` (hidden): the watchdog control's allocating child.
#[derive(Debug, clap::Args)]
pub struct AllocProbeArgs {
    /// STEP EVERY_MS REPORT_AT MAX HOLD_MS
    pub args: Vec<String>,
}

/// Run the probe; returns its exit code (see [`alloc_probe_main`]).
pub fn run(a: &AllocProbeArgs) -> u8 {
    alloc_probe_main(&a.args)
}

/// The hidden `__alloc-probe STEP EVERY_MS REPORT_AT MAX HOLD_MS [FLOOR]` mode:
/// allocate STEP bytes (touching every page) every EVERY_MS ms up to MAX bytes;
/// print `crossed <t_ns>` when REPORT_AT bytes are held or, with a non-zero
/// FLOOR, when MemAvailable first reads below FLOOR bytes (and again at the start of
/// every later stretch below it); print `held` at MAX,
/// then hold HOLD_MS ms (still watching MemAvailable); with a FLOOR, print
/// `longest-below-ms <ms>` (the longest stretch MemAvailable stayed below it) and
/// exit 0.
pub fn alloc_probe_main(args: &[String]) -> u8 {
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (step, every_ms, report_at, max, hold_ms, floor) = match nums[..] {
        [a, b, c, d, e] if nums.len() == args.len() => (a, b, c, d, e, 0),
        [a, b, c, d, e, f] if nums.len() == args.len() => (a, b, c, d, e, f),
        _ => {
            eprintln!("__alloc-probe: expected STEP EVERY_MS REPORT_AT MAX HOLD_MS [FLOOR]");
            return crate::exit::USAGE;
        }
    };
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total = 0u64;
    let mut reported = false;
    // With a floor: the start of the current stretch below it, and the longest one.
    let mut below_since: Option<u64> = None;
    let mut longest_below_ns = 0u64;
    use std::io::Write;
    let mut out = std::io::stdout();
    let mut report = |total: u64, out: &mut std::io::Stdout| {
        let now = monotonic_ns();
        let crossed = if floor > 0 {
            let below = crate::sampler::system::mem_available_bytes().is_ok_and(|a| a < floor);
            if below {
                if below_since.is_none() {
                    // Every stretch's start is reported: the watchdog's latency
                    // runs from the stretch it acted on, not an earlier dip.
                    reported = false;
                }
                let since = *below_since.get_or_insert(now);
                longest_below_ns = longest_below_ns.max(now - since);
            } else {
                below_since = None;
            }
            below
        } else {
            total >= report_at
        };
        if crossed && !reported {
            reported = true;
            let _ = writeln!(out, "crossed {now}");
            let _ = out.flush();
        }
    };
    while total < max {
        held.push(vec![0x5a; step as usize]);
        total += step;
        report(total, &mut out);
        std::thread::sleep(Duration::from_millis(every_ms));
    }
    let _ = writeln!(out, "held");
    let _ = out.flush();
    let until = Instant::now() + Duration::from_millis(hold_ms);
    while Instant::now() < until {
        report(total, &mut out);
        std::thread::sleep(Duration::from_millis(every_ms.max(1)));
    }
    std::hint::black_box(&held);
    if floor > 0 {
        let _ = writeln!(out, "longest-below-ms {}", longest_below_ns / 1_000_000);
        let _ = out.flush();
    }
    0
}
