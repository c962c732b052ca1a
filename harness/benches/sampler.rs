//! Sampler cost: the work of one tick, and the harness's CPU while sampling an idle
//! engine at 10 Hz and 100 Hz (target: below 1% of one core at 10 Hz).
//!
//! `cargo bench -p harness --bench sampler [-- --seconds S]`. Prints figures; it
//! asserts nothing (performance targets are reported, never timed tests).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use evidence::clock::monotonic_ns;
use harness::sampler::gpu::Gpu;
use harness::sampler::system::self_cpu_seconds;
use harness::sampler::{CostStats, NullSink, Sampler, SamplerConfig, Target, TickReader};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args
        .windows(2)
        .find(|w| w[0] == "--seconds")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(10.0);
    let mut idle = Command::new("sleep")
        .arg("3600")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn an idle engine (sleep)");
    let pid = idle.id() as i32;
    let target = Target { pid, pgid: pid };
    let (gpu, why) = match Gpu::open(0) {
        Ok(g) => (Some(Arc::new(g)), None),
        Err(w) => (None, Some(w)),
    };
    println!(
        "GPU: {}",
        gpu.as_ref()
            .map(|g| serde_json::to_string(&g.facts()).unwrap_or_default())
            .unwrap_or_else(|| format!("none ({})", why.clone().unwrap_or_default()))
    );

    // 1. The work of one tick, called back to back.
    for observer in [true, false] {
        let config = SamplerConfig {
            cadence_ms: 100,
            observer,
            limits: Some(harness::sampler::limits::Limits {
                mem_floor_bytes: 0,
                unified_budget_bytes: Some(u64::MAX),
            }),
            weights: vec![],
        };
        let mut reader = TickReader::new(&config, target, gpu.as_ref(), why.clone());
        let mut costs = Vec::new();
        for i in 0..2000u64 {
            let t = monotonic_ns();
            let s = reader.read(i, t);
            std::hint::black_box(&s);
            costs.push(monotonic_ns() - t);
        }
        let fast: Vec<u64> = costs
            .iter()
            .enumerate()
            .filter(|(i, _)| i % config.slow_every() as usize != 0)
            .map(|(_, c)| *c)
            .collect();
        let slow: Vec<u64> = costs
            .iter()
            .enumerate()
            .filter(|(i, _)| i % config.slow_every() as usize == 0)
            .map(|(_, c)| *c)
            .collect();
        let (f, s) = (
            CostStats::of(&mut fast.clone()),
            CostStats::of(&mut slow.clone()),
        );
        println!(
            "tick work, observer {}: fast ticks median {:.1} us p99 {:.1} us; slow ticks (1 in {}) median {:.1} us p99 {:.1} us",
            if observer { "on " } else { "off" },
            f.median_us,
            f.p99_us,
            config.slow_every(),
            s.median_us,
            s.p99_us
        );
    }

    // 2. The harness's CPU over a window of sampling at 10 Hz and 100 Hz.
    for cadence_ms in [100u64, 10] {
        let config = SamplerConfig {
            cadence_ms,
            observer: true,
            limits: Some(harness::sampler::limits::Limits {
                mem_floor_bytes: 0,
                unified_budget_bytes: None,
            }),
            weights: vec![],
        };
        let cpu0 = self_cpu_seconds().unwrap_or(0.0);
        let t0 = Instant::now();
        let sampler = Sampler::spawn(config, target, gpu.clone(), why.clone(), Box::new(NullSink))
            .expect("start the sampler");
        std::thread::sleep(Duration::from_secs_f64(seconds));
        let report = sampler.stop();
        let wall = t0.elapsed().as_secs_f64();
        let cpu = self_cpu_seconds().unwrap_or(0.0) - cpu0;
        println!(
            "{:>3} Hz for {wall:.1} s: harness CPU {:.3}% of one core ({:.1} ms CPU); {} ticks, {} missed; tick work median {:.1} us p99 {:.1} us",
            1000 / cadence_ms,
            100.0 * cpu / wall,
            cpu * 1e3,
            report.ticks,
            report.missed_ticks,
            report.cost.median_us,
            report.cost.p99_us
        );
    }
    let _ = idle.kill();
    let _ = idle.wait();
}
