//! Fault injection through the real `harness` binary and the test engine: the
//! engine SIGKILLed at seeded random points, the harness itself SIGKILLed at seeded
//! random points then `harness recover`, and a full disk during a run. Stores live
//! under `CARGO_TARGET_TMPDIR` (never /tmp).
//!
//! Bounded for CI (about a minute on two cores). `FAULTS_RUNS=N` sets the number
//! of kills per kind (default 6), `FAULTS_SEED=S` the seed (default 9); the
//! `just faults-long` recipe runs 40 of each. Every test prints a `FAULTS:` line
//! with its counts (run with `--nocapture` to see them).
//!
//! The full-disk test needs root and a loop device (it makes an ext4 image and
//! mounts it); where they are missing it FAILS saying so, unless
//! `HARNESS_FAULTS_NO_LOOP=1` declares the machine unable, in which case it
//! prints why it did not run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use evidence::clock::monotonic_ns;
use evidence::store::Store;
use polars::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::support::bins::{HARNESS, TEST_ENGINE as ENGINE};
use crate::support::dirs::fresh_dir;

/// Kills per kind.
fn runs() -> usize {
    std::env::var("FAULTS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

fn rng(salt: u64) -> ChaCha8Rng {
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9u64);
    ChaCha8Rng::seed_from_u64(seed ^ salt)
}

/// `harness run --store S --cadence-ms 10 --exec -- test-engine SCRIPT`, stderr piped.
fn start(store: &Path, script: &str) -> Child {
    Command::new(HARNESS)
        .arg("run")
        .arg("--store")
        .arg(store)
        .args(["--cadence-ms", "10", "--exec", "--", ENGINE])
        .args(script.split_whitespace())
        .env_remove("HARNESS_LEASE_ID")
        .env_remove("TEST_ENGINE_SCRIPT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Forward the child's stderr lines to a channel (and keep reading to EOF).
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

/// Wait for the engine's `test-engine pid=N` line; `Err(line)` when the harness
/// refuses the run at its `watchdog-control` gate instead.
fn engine_pid(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>) -> Result<i32, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let l = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no engine pid line; stderr so far:\n{}", seen.join("\n")));
        seen.push(l.clone());
        if let Some(p) = l.strip_prefix("test-engine pid=") {
            return Ok(p.trim().parse().unwrap());
        }
        if l.contains("refused by gate 'watchdog-control'") {
            return Err(l);
        }
    }
}

/// Attempts [`launch`] makes before it gives up.
const LAUNCH_ATTEMPTS: usize = 3;

/// Starts `harness run` (see [`start`]) and waits for the engine's pid line.
///
/// The harness's positive control (`watchdog-control`, judged here in 10 ms ticks)
/// refuses a run when a loaded machine (2 cores, the rest of the suite running)
/// delays the watchdog's reaction past 2 ticks. That refusal is the gate doing its
/// job, not the fault under test, so the launch is retried in an emptied store, at
/// most [`LAUNCH_ATTEMPTS`] times, each retry named on stderr; the test fails when
/// every attempt is refused.
fn launch(store: &Path, script: &str) -> (Child, mpsc::Receiver<String>, Vec<String>, i32) {
    let mut refusals = Vec::new();
    for attempt in 1..=LAUNCH_ATTEMPTS {
        let mut child = start(store, script);
        let rx = lines(&mut child);
        let mut seen = Vec::new();
        match engine_pid(&rx, &mut seen) {
            Ok(pid) => return (child, rx, seen, pid),
            Err(line) => {
                let _ = child.wait();
                eprintln!("FAULTS: launch attempt {attempt} refused, retrying: {line}");
                refusals.push(line);
                let _ = std::fs::remove_dir_all(store);
                std::fs::create_dir_all(store).unwrap();
            }
        }
    }
    panic!(
        "every one of {LAUNCH_ATTEMPTS} launches was refused by the watchdog control:\n{}",
        refusals.join("\n")
    )
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The largest `t_ns` in a bundle's `samples.parquet` (None when it has no rows).
fn last_sample_ns(bundle: &Path) -> Option<u64> {
    let f = std::fs::File::open(bundle.join("samples.parquet")).unwrap();
    let df = ParquetReader::new(f).finish().unwrap();
    let t = df.column("t_ns").unwrap().cast(&DataType::UInt64).unwrap();
    t.u64().unwrap().max()
}

#[test]
fn the_engine_sigkilled_at_random_points_always_leaves_a_bundle_naming_its_open_phase() {
    let n = runs();
    let mut r = rng(1);
    let mut leaves = std::collections::BTreeSet::new();
    let mut depths = [0usize; 3];
    for run in 0..n {
        let store = fresh_dir(&format!("faults-engine-kill-{run}"));
        // `render` stays open from before the pid line to the end; inside it six
        // phases with a sub-scope each, random sleeps.
        let mut script = String::from("--hello --open render --pid");
        let mut total_ms = 0u64;
        for i in 0..6 {
            let (a, b, c) = (
                r.random_range(10..60u64),
                r.random_range(10..60u64),
                r.random_range(10..60u64),
            );
            total_ms += a + b + c;
            script += &format!(
                " --open p{i} --sleep-ms {a} --open p{i}.sub --sleep-ms {b} --close p{i}.sub --sleep-ms {c} --close p{i}"
            );
        }
        script += " --hang";
        let kill_after = r.random_range(0..total_ms + 40);
        let (child, rx, mut seen, pid) = launch(&store, &script);
        std::thread::sleep(Duration::from_millis(kill_after));
        // SAFETY: pid is the test engine this test started (through the harness).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        let out = child.wait_with_output().unwrap();
        seen.extend(rx.try_iter());
        let so = String::from_utf8_lossy(&out.stdout).into_owned();
        let path = so
            .lines()
            .find_map(|l| l.strip_prefix("path: "))
            .unwrap_or_else(|| panic!("run {run}: no bundle:\n{so}\n{}", seen.join("\n")));
        let m = manifest(Path::new(path.trim()));
        assert_eq!(m["exit"]["reason"], "killed", "run {run}");
        assert_eq!(m["exit"]["signal"], 9, "run {run}");
        let open: Vec<String> = m["exit"]["open_phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            open.first().map(String::as_str),
            Some("render"),
            "run {run}: {open:?}"
        );
        assert!(open.len() <= 3, "run {run}: {open:?}");
        if let Some(p) = open.get(1) {
            assert!(
                p.starts_with('p') && !p.contains('.'),
                "run {run}: {open:?}"
            );
            if let Some(sub) = open.get(2) {
                assert_eq!(sub, &format!("{p}.sub"), "run {run}: {open:?}");
            }
        }
        let detail = m["exit"]["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("during {}", open.join(" > "))),
            "run {run}: {detail}"
        );
        let v = Command::new(HARNESS)
            .args(["verify", "--store"])
            .arg(&store)
            .arg(path.trim())
            .output()
            .unwrap();
        assert!(v.status.success(), "run {run}: verify failed");
        depths[open.len() - 1] += 1;
        leaves.insert(open.last().unwrap().clone());
    }
    eprintln!(
        "FAULTS: engine SIGKILL: {n} runs killed, {n} bundles sealed naming their open phase; \
         open depth 1/2/3: {depths:?}; innermost phases hit: {leaves:?}"
    );
}

#[test]
fn the_harness_sigkilled_at_random_points_is_recovered_losing_under_a_second() {
    let n = runs();
    let mut r = rng(2);
    let mut worst_s = 0.0f64;
    let mut recovered = 0;
    let mut losses = Vec::new();
    for run in 0..n {
        let store = fresh_dir(&format!("faults-harness-kill-{run}"));
        let script = "--hello --open render --pid --open denoise --hang";
        let (mut child, _rx, _seen, engine) = launch(&store, script);
        let delay = r.random_range(200..2500u64);
        std::thread::sleep(Duration::from_millis(delay));
        let t_kill = monotonic_ns();
        child.kill().unwrap(); // SIGKILL of the harness itself
        let _ = child.wait();
        // The orphaned engine's group (the harness made it a group leader).
        // SAFETY: signals only the group this test's engine leads.
        unsafe { libc::killpg(engine, libc::SIGKILL) };
        let out = Command::new(HARNESS)
            .args(["recover", "--store"])
            .arg(&store)
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "run {run}: recover failed:\n{so}");
        let sealed: Vec<&str> = so.lines().filter(|l| l.starts_with("sealed ")).collect();
        assert_eq!(sealed.len(), 1, "run {run}: {so}");
        assert!(
            sealed[0].contains("(harness-killed"),
            "run {run}: {}",
            sealed[0]
        );
        let id = sealed[0]
            .split(" -> ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        let st = Store::resolve(Some(&store)).unwrap();
        assert!(
            st.staging_dirs().unwrap().is_empty(),
            "run {run}: staging left"
        );
        let dir = st.find(id).unwrap();
        assert!(
            evidence::verify::verify_dir(&dir).ok(),
            "run {run}: invalid bundle"
        );
        let m = manifest(&dir);
        assert_eq!(m["exit"]["reason"], "harness-killed", "run {run}");
        let last = last_sample_ns(&dir)
            .unwrap_or_else(|| panic!("run {run}: killed after {delay} ms, no sample kept"));
        let lost = t_kill.saturating_sub(last) as f64 / 1e9;
        assert!(
            lost <= 1.0,
            "run {run}: killed {delay} ms in, last kept sample {lost:.3} s before the kill"
        );
        worst_s = worst_s.max(lost);
        losses.push(lost);
        recovered += 1;
    }
    eprintln!(
        "FAULTS: harness SIGKILL: {n} harness runs killed, {recovered} bundles recovered (all verify); \
         sample time lost at worst {worst_s:.3} s; each: {}",
        losses.iter().map(|l| format!("{l:.3}")).collect::<Vec<_>>().join(" ")
    );
}

/// A small ext4 filesystem loop-mounted under the target dir; unmounted on drop.
struct SmallFs {
    mount: PathBuf,
}

impl SmallFs {
    fn make(dir: &Path, bytes: u64) -> Result<SmallFs, String> {
        let img = dir.join("disk.img");
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).map_err(|e| e.to_string())?;
        let f = std::fs::File::create(&img).map_err(|e| e.to_string())?;
        f.set_len(bytes).map_err(|e| e.to_string())?;
        let run = |c: &mut Command| -> Result<(), String> {
            let o = c.output().map_err(|e| format!("{c:?}: {e}"))?;
            if o.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{c:?}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
        };
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mount))?;
        Ok(SmallFs { mount })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

/// Fill the filesystem holding `dir` until a write fails; returns bytes written.
fn fill(dir: &Path) -> u64 {
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let block = vec![0x5au8; 64 * 1024];
    let mut n = 0u64;
    while f.write_all(&block).is_ok() {
        n += block.len() as u64;
    }
    let _ = f.sync_all();
    n
}

#[test]
fn a_full_disk_stops_the_run_cleanly_keeps_the_journal_and_says_why() {
    let dir = fresh_dir("faults-full-disk");
    // Room for the engine copy (H5) plus 16 MiB.
    let engine_bytes = std::fs::metadata(ENGINE).unwrap().len();
    let fs = match SmallFs::make(&dir, engine_bytes + 16 * 1024 * 1024) {
        Ok(fs) => fs,
        Err(why) if std::env::var_os("HARNESS_FAULTS_NO_LOOP").is_some() => {
            eprintln!("FAULTS: full disk NOT RUN (HARNESS_FAULTS_NO_LOOP set): {why}");
            return;
        }
        Err(why) => panic!(
            "could not create a full-disk fs (loop-mounted ext4 needs root and /dev/loop*; \
             set HARNESS_FAULTS_NO_LOOP=1 only where that is known to be unavailable): {why}"
        ),
    };
    let store = fs.mount.join("store");
    let (mut child, rx, mut seen, engine) = launch(
        &store,
        "--hello --open render --pid --open denoise --stderr working --hang",
    );
    std::thread::sleep(Duration::from_millis(500));
    let filled = fill(&fs.mount);
    let t_full = Instant::now();
    // The run must stop by itself, promptly.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            // SAFETY: the engine group this test started.
            unsafe { libc::killpg(engine, libc::SIGKILL) };
            panic!("the run did not stop within 30 s of the disk filling");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped_s = t_full.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(100));
    seen.extend(rx.try_iter());
    let stderr = seen.join("\n");
    assert!(
        !status.success(),
        "a run on a full disk exited 0:\n{stderr}"
    );
    assert!(
        stderr.contains("No space left on device") && stderr.contains("journal"),
        "the error must say the journal hit a full disk:\n{stderr}"
    );
    assert!(stderr.contains("harness recover"), "{stderr}");
    // The engine is gone.
    // SAFETY: signal 0 only probes.
    assert_ne!(unsafe { libc::kill(engine, 0) }, 0, "engine still alive");
    // The journal up to the failure survives and reads cleanly.
    let st = Store::resolve(Some(&store)).unwrap();
    let staging = st.staging_dirs().unwrap();
    assert_eq!(staging.len(), 1, "{staging:?}");
    let j =
        evidence::journal::read_journal(&staging[0].join(evidence::store::JOURNAL_FILE)).unwrap();
    let samples = j
        .records
        .iter()
        .filter(|r| matches!(r, evidence::journal::Record::Sample(_)))
        .count();
    assert!(samples >= 10, "only {samples} samples kept");
    assert!(
        j.records.iter().any(|r| r.kind() == "marker"),
        "the engine's markers are lost"
    );
    // Free space: recover seals it into a valid incomplete bundle.
    std::fs::remove_file(fs.mount.join("filler")).unwrap();
    let out = Command::new(HARNESS)
        .args(["recover", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{so}");
    let id = so
        .lines()
        .find_map(|l| l.strip_prefix("sealed "))
        .and_then(|l| l.split(" -> ").nth(1))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("nothing sealed: {so}"));
    let b = st.find(id).unwrap();
    assert!(evidence::verify::verify_dir(&b).ok());
    eprintln!(
        "FAULTS: full disk (loop-mounted ext4, {} MiB): filled with {} MiB, run stopped {:.2} s later; \
         journal kept {} records ({} samples, {} bytes dropped); recovered as {}",
        (engine_bytes + 16 * 1024 * 1024) >> 20,
        filled >> 20,
        stopped_s,
        j.records.len(),
        samples,
        j.bytes_dropped,
        &id[..12]
    );
}
