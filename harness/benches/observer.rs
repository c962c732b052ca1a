//! Observer overhead: the same fixed CPU load (the test engine's `--work N`, N
//! sha256 passes over 1 MiB) driven by the real `harness run`, observer on and off
//! interleaved in seeded random order, at 100 ms and 10 ms cadence. Reports per
//! cadence the paired wall ratio on/off of the workload (mean with a 95% t interval
//! and a 95% bootstrap interval), and from the observer-on bundles the achieved
//! cadence (median interval, p99 jitter = p99 of |interval - cadence|) and the
//! harness's own CPU share (mean of `harness_cpu_cores`, in cores).
//!
//! `cargo bench -p harness --bench observer -- [--pairs P] [--rounds N]`, or with
//! the dev profile (no release rebuild): `just bench-observer`. Stores go under
//! the target dir. Prints figures; asserts nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const ENGINE: &str = env!("CARGO_BIN_EXE_test-engine");

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .find(|w| w[0] == name)
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(default)
}

/// One run: the workload's wall (ns) and the bundle directory.
fn run(store: &Path, cadence_ms: u64, observer: bool, rounds: u64) -> (u64, PathBuf) {
    let out = Command::new(HARNESS)
        .arg("run")
        .arg("--store")
        .arg(store)
        .args(["--cadence-ms", &cadence_ms.to_string()])
        .args(["--observer", if observer { "on" } else { "off" }])
        .args([
            "--exec", "--", ENGINE, "--hello", "--open", "work", "--work",
        ])
        .arg(rounds.to_string())
        .args(["--close", "work"])
        .env_remove("HARNESS_LEASE_ID")
        .output()
        .expect("run the harness");
    let err = String::from_utf8_lossy(&out.stderr);
    let so = String::from_utf8_lossy(&out.stdout);
    let ns = err
        .lines()
        .find_map(|l| {
            l.split_once("test-engine work=")
                .map(|(_, r)| r.to_string())
        })
        .and_then(|r| {
            r.split_once(" ns=")
                .and_then(|(_, n)| n.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no work line:\n{err}"));
    let path = so
        .lines()
        .find_map(|l| l.strip_prefix("path: "))
        .unwrap_or_else(|| panic!("no bundle:\n{so}\n{err}"));
    (ns, PathBuf::from(path.trim()))
}

/// The sample intervals (ns) and the mean `harness_cpu_cores` of a bundle.
fn samples(bundle: &Path) -> (Vec<f64>, Option<f64>) {
    let f = std::fs::File::open(bundle.join("samples.parquet")).expect("samples.parquet");
    let df = ParquetReader::new(f)
        .finish()
        .expect("read samples.parquet");
    let t = df.column("t_ns").unwrap().cast(&DataType::Float64).unwrap();
    let t: Vec<f64> = t.f64().unwrap().into_no_null_iter().collect();
    let gaps = t.windows(2).map(|w| w[1] - w[0]).collect();
    let cpu = df
        .column("harness_cpu_cores")
        .ok()
        .and_then(|c| c.cast(&DataType::Float64).ok())
        .and_then(|c| c.f64().ok().and_then(|x| x.mean()));
    (gaps, cpu)
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Two-sided 97.5% Student t quantile for `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

fn main() {
    let pairs: usize = arg("--pairs", 10);
    let rounds: u64 = arg("--rounds", 1200);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-observer");
    let _ = std::fs::remove_dir_all(&root);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    println!(
        "observer overhead: {pairs} interleaved on/off pairs per cadence, workload --work {rounds} \
         (sha256 of 1 MiB x {rounds}); {} CPUs online",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    for cadence_ms in [100u64, 10] {
        let store = root.join(format!("c{cadence_ms}"));
        let mut ratios = Vec::new();
        let (mut on_s, mut off_s) = (Vec::new(), Vec::new());
        let mut gaps = Vec::new();
        let mut cpu = Vec::new();
        // One unmeasured warm-up run: the engine copy into the store (H5) and cold caches.
        let _ = run(&store, cadence_ms, true, rounds / 10);
        for _ in 0..pairs {
            let on_first = rng.random_bool(0.5);
            let mut on = (0, PathBuf::new());
            let mut off = 0;
            for observer in if on_first {
                [true, false]
            } else {
                [false, true]
            } {
                let r = run(&store, cadence_ms, observer, rounds);
                if observer {
                    on = r;
                } else {
                    off = r.0;
                }
            }
            ratios.push(on.0 as f64 / off as f64);
            on_s.push(on.0 as f64 / 1e9);
            off_s.push(off as f64 / 1e9);
            let (g, c) = samples(&on.1);
            gaps.extend(g);
            cpu.extend(c);
        }
        let m = mean(&ratios);
        let sd = (ratios.iter().map(|r| (r - m).powi(2)).sum::<f64>()
            / (ratios.len() - 1).max(1) as f64)
            .sqrt();
        let half = t975(ratios.len() - 1) * sd / (ratios.len() as f64).sqrt();
        let mut boot: Vec<f64> = (0..10_000)
            .map(|_| {
                let s: f64 = (0..ratios.len())
                    .map(|_| ratios[rng.random_range(0..ratios.len())])
                    .sum();
                s / ratios.len() as f64
            })
            .collect();
        let (b_lo, b_hi) = (quantile(&mut boot, 0.025), quantile(&mut boot, 0.975));
        let period = cadence_ms as f64 * 1e6;
        let mut jitter: Vec<f64> = gaps.iter().map(|g| (g - period).abs()).collect();
        let med = quantile(&mut gaps.clone(), 0.5);
        println!(
            "cadence {cadence_ms:>3} ms: workload wall on {:.3} s / off {:.3} s (means); ratio on/off {:.4} \
             (95% t [{:.4}, {:.4}], bootstrap [{:.4}, {:.4}]; overhead {:+.2}%)",
            mean(&on_s),
            mean(&off_s),
            m,
            m - half,
            m + half,
            b_lo,
            b_hi,
            (m - 1.0) * 100.0
        );
        println!(
            "               achieved interval median {:.3} ms, p99 jitter {:.3} ms over {} intervals; \
             harness CPU {:.3}% of one core (mean harness_cpu_cores {:.5})",
            med / 1e6,
            quantile(&mut jitter, 0.99) / 1e6,
            gaps.len(),
            mean(&cpu) * 100.0,
            mean(&cpu)
        );
    }
}
