//! End to end: the real `harness` binary drives the test engine, and the sealed
//! bundles say what happened. Each test has its own store under
//! `CARGO_TARGET_TMPDIR` (never /tmp).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::bins::TEST_ENGINE as ENGINE;
use crate::support::bins::{bundle_path, gate, text, HARNESS};
use crate::support::dirs::vacant_dir;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh store directory for one test.
fn store(name: &str) -> PathBuf {
    vacant_dir(&format!(
        "run-{name}-{}",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

fn harness(store: &Path) -> Command {
    let mut c = Command::new(HARNESS);
    c.arg("run").arg("--store").arg(store);
    c.env_remove("HARNESS_LEASE_ID")
        .env_remove("TEST_ENGINE_SCRIPT");
    c
}

/// `harness run --exec -- test-engine SCRIPT...` with extra harness flags.
fn exec(store: &Path, flags: &[&str], script: &str) -> Output {
    let mut c = harness(store);
    c.args(flags).arg("--exec").arg("--").arg(ENGINE);
    c.args(script.split_whitespace());
    c.output().unwrap()
}

fn manifest(out: &Output) -> Value {
    let p = bundle_path(out).join("manifest.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

const GOOD_FRAMES: &str = "--frames good 64x48 9";

#[test]
fn a_good_exec_run_completes_with_samples_markers_and_frames() {
    let s = store("good");
    let out = exec(
        &s,
        &["--cadence-ms", "20"],
        &format!("--hello --render 2 2 --sleep-ms 300 {GOOD_FRAMES}"),
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "completed");
    assert_eq!(m["exit"]["code"], 0);
    assert_eq!(m["completion"]["verdict"], "pass");
    assert_eq!(m["completion"]["frames"], 9);
    assert_eq!(m["engine"]["exec"], true);
    assert_eq!(m["engine"]["version"], env!("CARGO_PKG_VERSION"));
    // An --exec program runs in place, pinned by sha256 (run/pinned.rs).
    let sha = m["engine"]["sha256"].as_str().unwrap();
    assert!(m["engine"]["store_path"].is_null());
    assert_eq!(m["engine"]["run_path"], ENGINE);
    assert_eq!(m["engine"]["pinned"]["files"][0]["sha256"], sha);
    assert_eq!(m["engine"]["pinned"]["files"][0]["role"], "program");
    // The sampler ran at its cadence for the engine's life (>= 0.3 s at 20 ms).
    assert_eq!(m["sampler"]["cadence_ms"], 20);
    assert!(
        m["sampler"]["ticks"].as_u64().unwrap() >= 12,
        "{}",
        m["sampler"]
    );
    // No GPU here: every GPU column is null with its reason.
    let su = &m["sensors_unavailable"];
    assert!(
        su["gpu_util_pct"].as_str().unwrap().contains("NVML"),
        "{su}"
    );
    // Gates and the watchdog control are recorded.
    let gates = m["gates"].as_array().unwrap();
    for name in [
        "store-durable",
        "engine-binary",
        "contention",
        "headroom",
        "watchdog-control",
    ] {
        assert!(
            gates.iter().any(|g| g["name"] == name),
            "gate {name} missing: {gates:?}"
        );
    }
    let controls = m["controls"].as_array().unwrap();
    let wd = controls
        .iter()
        .find(|c| c["name"] == "watchdog-floor")
        .unwrap();
    assert_eq!(wd["verdict"], "pass", "{wd}");
    let gpu = controls.iter().find(|c| c["name"] == "gpu-util").unwrap();
    assert_eq!(gpu["verdict"], "not-applicable");
    // The phase table was printed.
    assert!(
        text(&out.stdout).contains("denoise.step"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn sigkill_of_the_engine_mid_phase_leaves_a_bundle_naming_the_open_phase() {
    let s = store("sigkill");
    let mut child: Child = harness(&s)
        .args(["--exec", "--", ENGINE])
        .args("--hello --pid --open load.dit --close load.dit --open denoise --open denoise.step --hang".split(' '))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut pid = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(p) = line.strip_prefix("test-engine pid=") {
            pid = Some(p.trim().parse::<i32>().unwrap());
        }
        if line == "+denoise.step" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "engine never opened denoise.step"
        );
    }
    let pid = pid.expect("the engine printed its pid");
    std::thread::sleep(Duration::from_millis(200));
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 1, "{}", rest.join("\n"));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "killed");
    assert_eq!(m["exit"]["signal"], 9);
    assert_eq!(
        m["exit"]["open_phases"],
        serde_json::json!(["denoise", "denoise.step"])
    );
    assert!(m["exit"]["detail"]
        .as_str()
        .unwrap()
        .contains("during denoise > denoise.step"));
    assert_eq!(m["completion"]["verdict"], "fail");
}

#[test]
fn the_watchdog_kills_a_runaway_allocator_over_the_unified_budget() {
    let s = store("runaway-budget");
    let out = exec(
        &s,
        &[
            "--unified-budget",
            "256MiB",
            "--cadence-ms",
            "20",
            "--timeout",
            "60",
        ],
        "--hello --open load.dit --runaway 16MiB/10",
    );
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "watchdog", "{}", m["exit"]);
    assert_eq!(m["exit"]["signal"], 9);
    let t = &m["watchdog"]["tripped"];
    assert_eq!(t["column"], "unified_bytes");
    assert_eq!(t["limit"], 256u64 << 20);
    let v = t["value"].as_u64().unwrap();
    // Crossed, and killed within a few ticks (16 MiB per 10 ms, 20 ms ticks).
    assert!(v > 256 << 20 && v < 512 << 20, "tripped at {v}");
    assert!(m["exit"]["detail"]
        .as_str()
        .unwrap()
        .contains("watchdog killed the engine during load.dit"));
    assert!(text(&out.stderr).contains("WATCHDOG"));
    let controls = m["controls"].as_array().unwrap();
    assert!(controls
        .iter()
        .any(|c| c["name"] == "watchdog-unified-budget" && c["verdict"] == "pass"));
}

#[test]
fn the_watchdog_kills_a_runaway_allocator_at_the_memavailable_floor() {
    let s = store("runaway-floor");
    let avail = procfs_avail();
    // 3 GiB below the reading: room for the watchdog control's 1 GiB probe (it
    // needs twice that above the floor) and a crossing no other test's memory
    // churn can hide for long.
    let floor = avail - (3 << 30);
    let out = exec(
        &s,
        &[
            "--mem-floor",
            &floor.to_string(),
            // A backstop far above the floor's crossing, should others free memory.
            "--unified-budget",
            "8GiB",
            "--cadence-ms",
            "20",
        ],
        "--hello --open denoise --runaway 16MiB/10",
    );
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "watchdog", "{}", text(&out.stderr));
    assert_eq!(m["watchdog"]["tripped"]["column"], "mem_available_bytes");
    assert_eq!(m["watchdog"]["mem_floor_bytes"], floor);
    assert!(m["watchdog"]["tripped"]["value"].as_u64().unwrap() < floor);
}

fn procfs_avail() -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = t
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap();
    kb * 1024
}

#[test]
fn garbage_marker_lines_are_kept_counted_and_not_fatal() {
    let s = store("garbage");
    let out = exec(
        &s,
        &[],
        &format!("--hello --open denoise --garbage 7 --close denoise {GOOD_FRAMES}"),
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["markers"]["unparsed"], 7, "{}", m["markers"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("malformed marker line #1 kept verbatim"),
        "{err}"
    );
    assert!(err.contains("(7 malformed)"), "{err}");
}

#[test]
fn a_sub_scope_outside_its_parent_fails_containment() {
    let s = store("containment");
    let out = exec(
        &s,
        &[],
        &format!(
            "--hello --open denoise --open denoise.step --sleep-ms 20 --close denoise.step --close denoise \
             --sleep-ms 20 --open denoise.step --sleep-ms 20 --close denoise.step {GOOD_FRAMES}"
        ),
    );
    let m = manifest(&out);
    assert_eq!(
        m["phases"]["containment"]["verdict"], "fail",
        "{}",
        m["phases"]
    );
    assert_eq!(
        m["phases"]["exclusivity"]["verdict"], "pass",
        "{}",
        m["phases"]
    );
}

#[test]
fn a_second_name_inside_the_sub_scopes_window_fails_exclusivity() {
    let s = store("exclusivity");
    let out = exec(
        &s,
        &[],
        &format!(
            "--hello --open denoise --open denoise.step --sleep-ms 20 --close denoise.step \
             --open decode.video --sleep-ms 20 --close decode.video \
             --open denoise.step --sleep-ms 20 --close denoise.step --close denoise {GOOD_FRAMES}"
        ),
    );
    let m = manifest(&out);
    assert_eq!(
        m["phases"]["exclusivity"]["verdict"], "fail",
        "{}",
        m["phases"]
    );
}

#[test]
fn a_tmp_store_is_refused_before_anything_is_written() {
    let tmp = PathBuf::from(format!("/tmp/harness-refusal-{}", std::process::id()));
    let out = exec(&tmp, &[], &format!("--hello {GOOD_FRAMES}"));
    assert_eq!(code(&out), 3, "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("store-durable") && err.contains("/tmp"),
        "{err}"
    );
    assert!(!tmp.exists(), "the refused store was created");
}

#[test]
fn black_frames_are_not_completed_despite_exit_code_0() {
    let s = store("black");
    let out = exec(&s, &[], "--hello --frames black 64x48 9");
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "engine-failed");
    assert_eq!(m["exit"]["code"], 0);
    assert_eq!(m["completion"]["verdict"], "fail");
    let reasons = m["completion"]["reasons"].as_array().unwrap();
    assert!(
        reasons
            .iter()
            .any(|r| r.as_str().unwrap().contains("near-black")),
        "{reasons:?}"
    );
    assert!(reasons
        .iter()
        .any(|r| r.as_str().unwrap().contains("same hash as frame 0")));
}

#[test]
fn a_crash_and_an_abort_are_classified_by_code_and_signal() {
    let s = store("crash");
    let out = exec(&s, &[], "--hello --open load.dit --exit 3");
    let m = manifest(&out);
    assert_eq!(
        (m["exit"]["reason"].as_str(), m["exit"]["code"].as_i64()),
        (Some("engine-failed"), Some(3))
    );
    assert_eq!(m["exit"]["open_phases"], serde_json::json!(["load.dit"]));
    let out = exec(&s, &[], "--hello --abort");
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "killed");
    assert_eq!(m["exit"]["signal"], libc::SIGABRT);
}

#[test]
fn a_timeout_escalates_to_sigkill_when_sigterm_is_ignored() {
    let s = store("timeout");
    let t0 = Instant::now();
    let out = exec(
        &s,
        &["--timeout", "1"],
        "--hello --ignore-sigterm --open denoise --hang",
    );
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "timeout", "{}", text(&out.stderr));
    assert_eq!(
        m["exit"]["signal"], 9,
        "SIGTERM was ignored, SIGKILL followed"
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn ctrl_c_stops_the_engine_and_still_seals_a_partial_bundle() {
    let s = store("interrupt");
    let mut w = Watched::spawn(harness(&s).args([
        "--exec", "--", ENGINE, "--hello", "--open", "denoise", "--hang",
    ]));
    w.expect("+denoise");
    w.signal(libc::SIGINT);
    let (out, _, _) = w.finish();
    assert_eq!(code(&out), 1);
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "interrupted");
    assert_eq!(
        m["exit"]["signal"],
        libc::SIGTERM,
        "the engine obeyed SIGTERM"
    );
    assert_eq!(m["exit"]["open_phases"], serde_json::json!(["denoise"]));
}

/// H4: a closed terminal (SIGHUP to the harness and, as a terminal does, to the
/// engine's group if it were the foreground one) does not end the run: the
/// harness ignores SIGHUP and the engine runs in its own process group.
#[test]
fn sighup_from_a_closed_terminal_does_not_end_the_run() {
    let s = store("sighup");
    let mut w = Watched::spawn(harness(&s).args([
        "--exec",
        "--",
        ENGINE,
        "--hello",
        "--render",
        "2",
        "2",
        "--sleep-ms",
        "1500",
        "--frames",
        "good",
        "64x48",
        "9",
    ]));
    w.expect("+denoise");
    // The harness's own group (the test's) is what a terminal would signal.
    w.signal(libc::SIGHUP);
    let (out, _, _) = w.finish();
    assert_eq!(code(&out), 0, "{}", text(&out.stdout));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "completed");
    assert_eq!(m["completion"]["verdict"], "pass");
}

fn rung(dir: &Path, extra: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("t.toml");
    std::fs::write(
        &p,
        format!(
            "preset = \"tiny\"\nwidth = 64\nheight = 32\nframes = 9\nsteps = 3\nguidance = 3.0\n\
             seed = 7\ndevice = \"cpu\"\n{extra}"
        ),
    )
    .unwrap();
    p
}

#[test]
fn a_rung_run_synthesizes_weights_once_and_completes() {
    let s = store("rung");
    let r = rung(&s.with_extension("rungs"), "");
    let run = || {
        harness(&s)
            .args([
                "--rung",
                r.to_str().unwrap(),
                "--engine",
                ENGINE,
                "--lever",
                "vae=host",
            ])
            .output()
            .unwrap()
    };
    let out = run();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "completed");
    assert_eq!(m["weights"]["synthesized"], true);
    let digest = m["weights"]["digest"].as_str().unwrap().to_string();
    assert!(digest.starts_with("sha256:"));
    assert_eq!(m["rung"]["name"], "t");
    assert_eq!(m["rung"]["config"]["frames"], 9);
    assert_eq!(m["levers"]["vae"], "host");
    let args: Vec<String> = serde_json::from_value(m["engine"]["args"].clone()).unwrap();
    assert_eq!(args[0], "render");
    assert!(
        args.windows(2).any(|w| w == ["--lever", "vae=host"]),
        "{args:?}"
    );
    let headroom = gate(&m, "headroom");
    assert_eq!(headroom["verdict"], "pass", "{headroom}");
    // The page cache of the weight files was read.
    assert!(
        m["sensors_unavailable"]
            .get("weights_cached_bytes")
            .is_none(),
        "{}",
        m["sensors_unavailable"]
    );
    // The sampler states what its slow parts cost: the page-cache probe ran at
    // least on the first tick, and every journaled row was timed.
    let parts = &m["sampler"]["tick_cost_parts_us"];
    assert!(
        parts["pagecache"]["ticks"].as_u64().unwrap() >= 1,
        "{parts}"
    );
    assert!(
        parts["pagecache"]["max_us"].as_f64().unwrap() > 0.0,
        "{parts}"
    );
    assert_eq!(parts["sink"]["ticks"], m["sampler"]["ticks"], "{parts}");
    // ...and which of them ran off the tick; the slow GPU part exists exactly where
    // NVML opens a GPU.
    assert_eq!(
        m["sampler"]["off_tick_parts"],
        serde_json::json!(["gpu_slow", "pagecache", "gpm"]),
        "{}",
        m["sampler"]
    );
    let has_gpu = harness::sampler::gpu::Gpu::open(0).is_ok();
    assert_eq!(parts.get("gpu_slow").is_some(), has_gpu, "{parts}");
    // Twice: the same synthesized weights are reused.
    let out2 = run();
    let m2 = manifest(&out2);
    assert_eq!(m2["weights"]["digest"], digest.as_str());
    let weights_dirs = std::fs::read_dir(s.join("cache/weights")).unwrap().count();
    assert_eq!(weights_dirs, 1);
}

#[test]
fn refused_runs_leave_a_bundle_recording_the_refusal() {
    let s = store("refusals");
    let dir = s.with_extension("rungs");
    // Headroom: the plan projects more than the machine has.
    let r = rung(&dir, "");
    let out = harness(&s)
        .args(["--rung", r.to_str().unwrap(), "--engine", ENGINE])
        .env("TEST_ENGINE_PLAN_HOST_PEAK", "1000TiB")
        .output()
        .unwrap();
    assert_eq!(code(&out), 3, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "gate-refused");
    assert!(m["exit"]["detail"].as_str().unwrap().contains("headroom"));
    assert_eq!(m["completion"]["verdict"], "not-checked");
    // Lease: the rung requires one.
    let r = rung(&dir.join("lease"), "[require]\nlease = true\n");
    let out = harness(&s)
        .args(["--rung", r.to_str().unwrap(), "--engine", ENGINE])
        .output()
        .unwrap();
    assert_eq!(code(&out), 3);
    let m = manifest(&out);
    let lease = gate(&m, "lease");
    assert_eq!(lease["verdict"], "refuse");
    assert!(text(&out.stderr).contains("HARNESS_LEASE_ID"));
    let out = harness(&s)
        .args(["--rung", r.to_str().unwrap(), "--engine", ENGINE])
        .env("HARNESS_LEASE_ID", "lease-42")
        .env_remove("SLURMD_NODENAME")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(manifest(&out)["lease"]["id"], "lease-42");
    // Outside Slurm the lease names no node (the field is absent, as in the
    // bundles sealed before it was recorded); under Slurm it names slurmd's.
    assert_eq!(
        manifest(&out)["lease"].get("node"),
        None,
        "{}",
        manifest(&out)["lease"]
    );
    let out = harness(&s)
        .args(["--rung", r.to_str().unwrap(), "--engine", ENGINE])
        .env("HARNESS_LEASE_ID", "slurm:7_1")
        .env("SLURMD_NODENAME", "gpu07")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(
        manifest(&out)["lease"],
        serde_json::json!({"id": "slurm:7_1", "node": "gpu07"})
    );
    // A missing engine binary.
    let out = harness(&s)
        .args([
            "--rung",
            r.to_str().unwrap(),
            "--engine",
            "/nonexistent/engine",
            "--lease-id",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 3);
    assert!(text(&out.stderr).contains("/nonexistent/engine"));
    // A CUDA rung where NVML opens no GPU (this machine, unless it has one): refused
    // before weights are synthesized, naming the device and NVML's reason.
    if harness::sampler::gpu::Gpu::open(0).is_err() {
        let cuda = dir.join("cuda");
        std::fs::create_dir_all(&cuda).unwrap();
        let r = cuda.join("t.toml");
        std::fs::write(
            &r,
            "preset = \"tiny\"\nwidth = 64\nheight = 32\nframes = 9\nsteps = 3\n\
             guidance = 3.0\nseed = 7\ndevice = \"cuda\"\n",
        )
        .unwrap();
        let out = harness(&s)
            .args(["--rung", r.to_str().unwrap(), "--engine", ENGINE])
            .output()
            .unwrap();
        assert_eq!(code(&out), 3, "{}", text(&out.stderr));
        let m = manifest(&out);
        let g = gate(&m, "device");
        assert_eq!(g["verdict"], "refuse", "{g}");
        let d = g["detail"].as_str().unwrap();
        assert!(
            d.starts_with(r.to_str().unwrap())
                && d.contains("device = \"cuda\"")
                && d.contains("NVML"),
            "{d}"
        );
        assert!(
            m["gates"]
                .as_array()
                .unwrap()
                .iter()
                .all(|g| g["name"] != "weights"),
            "refused before the weights: {}",
            m["gates"]
        );
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    let s = store("usage");
    let out = harness(&s)
        .args(["--cadence-ms", "1", "--exec", "--", "x"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(text(&out.stderr).contains("--cadence-ms 1"));
}

#[test]
fn harness_control_reports_each_control() {
    let s = store("control");
    let out = Command::new(HARNESS)
        .args(["control", "--store"])
        .arg(&s)
        .args(["--engine", ENGINE])
        .output()
        .unwrap();
    let so = text(&out.stdout);
    assert_eq!(code(&out), 0, "{so}\n{}", text(&out.stderr));
    let gpu = so.lines().find(|l| l.starts_with("gpu-util")).unwrap();
    assert!(
        gpu.contains("not-applicable") && gpu.contains("NVML"),
        "{gpu}"
    );
    let wd = so
        .lines()
        .find(|l| l.starts_with("watchdog-floor"))
        .unwrap();
    assert!(wd.contains("pass") && wd.contains("SIGKILL"), "{wd}");
}

/// A cache state is about weight files: asking for one on a run that names none is
/// refused before the engine starts, with the flag and the remedy in the message.
#[test]
fn a_weights_cache_state_without_weights_is_refused() {
    let s = store("cache-no-weights");
    let out = exec(&s, &["--weights-cache", "cold"], GOOD_FRAMES);
    assert_eq!(code(&out), 3, "{}", text(&out.stderr));
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "gate-refused");
    let g = gate(&m, "weights-cache");
    assert_eq!(g["verdict"], "refuse");
    let d = g["detail"].as_str().unwrap();
    assert!(
        d.contains("--weights-cache cold") && d.contains("--weights"),
        "{d}"
    );
}

/// Read `lines` into `seen` until one starts (after its indent) with `prefix`;
/// false at the end.
fn wait_for(
    prefix: &str,
    seen: &mut Vec<String>,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> bool {
    for line in lines.by_ref() {
        let l = line.unwrap();
        let hit = l.trim_start().starts_with(prefix);
        seen.push(l);
        if hit {
            return true;
        }
    }
    false
}

/// A harness run whose stderr the test reads line by line as it comes.
struct Watched {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStderr>>,
    /// Every stderr line read so far.
    seen: Vec<String>,
}

impl Watched {
    /// Start `cmd` with stdout and stderr piped.
    fn spawn(cmd: &mut Command) -> Watched {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        Watched {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Read up to the first line starting with `prefix` (after leading
    /// spaces); false when stderr ends first.
    fn reach(&mut self, prefix: &str) -> bool {
        wait_for(prefix, &mut self.seen, &mut self.lines)
    }

    /// [`Watched::reach`], failing the test with every line read when stderr
    /// ends before `prefix`.
    fn expect(&mut self, prefix: &str) {
        assert!(
            self.reach(prefix),
            "no line starting with {prefix:?}:\n{}",
            self.seen.join("\n")
        );
    }

    /// Send `sig` to the harness.
    fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Read stderr to its end and wait for the harness: its output, the lines
    /// read before this call and the lines read by it.
    fn finish(self) -> (Output, Vec<String>, Vec<String>) {
        let rest: Vec<String> = self.lines.map_while(Result::ok).collect();
        (self.child.wait_with_output().unwrap(), self.seen, rest)
    }
}

/// The tests that burn every core take turns: each one's burners are the other's
/// "other work".
static BURNERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Threads keeping every core busy at nice 19 until [`Burners::stop`]: the burners
/// take only what nothing else wants, so the tests running beside them (and their
/// watchdog controls) keep their CPU, while /proc/stat counts nice time as busy all
/// the same. Hold [`BURNERS`] while they run.
struct Burners {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Burners {
    fn start() -> Burners {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    // SAFETY: setpriority on this thread's own id.
                    unsafe {
                        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19)
                    };
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Burners { stop, threads }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

/// `--quiet-wait-s`: the start gate reads a host kept busy by the test again,
/// window after window, and the engine starts once the test stops the load: the
/// `contention` fragment says how long the run waited and the most it would
/// have, and the detail says it waited. A run without the flag records neither.
/// (The wait's end is the host going quiet; where the suite beside this test
/// keeps it busy past the burners, the run waits out its 20 s and is flagged:
/// the assertions hold either way.)
#[test]
fn a_quiet_wait_starts_the_engine_once_the_host_goes_quiet() {
    let _one_burner = BURNERS.lock().unwrap_or_else(|e| e.into_inner());
    let s = store("quiet-wait");
    let engine = [
        ENGINE,
        "--hello",
        "--open",
        "work",
        "--sleep-ms",
        "100",
        "--close",
        "work",
        "--frames",
        "good",
        "64x48",
        "9",
    ];
    let burners = Burners::start();
    let child = harness(&s)
        .args(["--quiet-wait-s", "20", "--exec", "--"])
        .args(engine)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    burners.stop();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let c = manifest(&out)["contention"].clone();
    assert_eq!(c["quiet_wait_limit_s"], 20.0, "{c}");
    let waited = c["quiet_wait_s"].as_f64().unwrap_or(-1.0);
    // Busy for 2.5 s from before the spawn: at least the last second of it is
    // waited out (the gates before this one take well under a second).
    assert!((1.0..=21.0).contains(&waited), "{c}");
    let detail = c["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("of waiting for a quiet host (at most 20 s)"),
        "{c}"
    );
    if c["flagged"] == false {
        let limit = 0.5 * std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
        assert!(c["busy_cores_at_start"].as_f64().unwrap() <= limit, "{c}");
    }
    let plain = harness(&s)
        .args(["--exec", "--"])
        .args(engine)
        .output()
        .unwrap();
    assert_eq!(
        code(&plain),
        0,
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let c = manifest(&plain)["contention"].clone();
    assert!(
        c.get("quiet_wait_s").is_none() && c.get("quiet_wait_limit_s").is_none(),
        "{c}"
    );
}

/// Ctrl-C while the start gate waits for a quiet host stops the run there: the
/// bundle is sealed `interrupted` before the engine started, with the gate and
/// the `contention` fragment of the wait recorded, long before the wait's limit.
#[test]
fn ctrl_c_during_a_quiet_wait_seals_the_run_before_the_engine() {
    let _one_burner = BURNERS.lock().unwrap_or_else(|e| e.into_inner());
    let s = store("quiet-wait-interrupt");
    let burners = Burners::start();
    let t0 = std::time::Instant::now();
    let mut w = Watched::spawn(
        harness(&s)
            .args(["--quiet-wait-s", "120", "--exec", "--"])
            .args([ENGINE, "--hello", "--open", "work", "--hang"]),
    );
    // The gate just before contention: then the wait has begun.
    w.expect("harness: gate engine-binary");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    w.signal(libc::SIGINT);
    let (out, seen, rest) = w.finish();
    burners.stop();
    let all = format!("{}\n{}", seen.join("\n"), rest.join("\n"));
    assert_eq!(code(&out), 1, "{all}");
    let m = manifest(&out);
    assert_eq!(m["exit"]["reason"], "interrupted", "{all}");
    let detail = m["exit"]["detail"].as_str().unwrap_or("");
    assert!(detail.contains("before the engine started"), "{detail}");
    let c = &m["contention"];
    assert_eq!(c["quiet_wait_limit_s"], 120.0, "{c}");
    assert!(c["quiet_wait_s"].as_f64().unwrap_or(-1.0) >= 0.5, "{c}");
    assert!(rest.iter().any(|l| l.contains("gate contention")), "{all}");
    assert!(!all.contains("engine pid"), "{all}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(60));
}

/// Other work inside one phase flags that phase even when the lifetime mean stays
/// low: the engine sleeps 3 s in `quiet`, then 2 s in `work`; the test burns every
/// core (nice 19) from `+work` to `-work` only, as the harness's status lines say.
#[test]
fn work_inside_one_phase_flags_that_phase() {
    let _one_burner = BURNERS.lock().unwrap_or_else(|e| e.into_inner());
    let s = store("contended-phase");
    let mut w = Watched::spawn(
        harness(&s)
            .args(["--cadence-ms", "50", "--exec", "--", ENGINE])
            .args([
                "--hello",
                "--open",
                "quiet",
                "--sleep-ms",
                "3000",
                "--close",
                "quiet",
            ])
            .args(["--open", "work", "--sleep-ms", "2000", "--close", "work"]),
    );
    w.expect("+work");
    let burners = Burners::start();
    let closed = w.reach("-work");
    burners.stop();
    assert!(closed, "{}", w.seen.join("\n"));
    let (out, _, rest) = w.finish();
    let m = manifest(&out);
    let c = &m["contention"];
    let d = &c["during"];
    let phases = d["phases"].as_array().unwrap_or_else(|| panic!("{c}"));
    let names: Vec<&str> = phases.iter().filter_map(|p| p["phase"].as_str()).collect();
    assert_eq!(names, ["quiet", "work"], "{c}");
    let (quiet, work) = (&phases[0], &phases[1]);
    let limit = d["limit_cores"].as_f64().unwrap();
    let w = work["other_busy_cores"].as_f64().unwrap();
    let q = quiet["other_busy_cores"].as_f64().unwrap();
    assert!(work["seconds"].as_f64().unwrap() >= 1.9, "{work}");
    assert!(work["ticks"].as_u64().unwrap() >= 30, "{work}");
    assert!(
        w > limit,
        "work: {w} cores of other work, limit {limit}: {c}"
    );
    // The rows land in their own phase (50 ms rows: ~60 in quiet, ~40 in work).
    assert!(quiet["ticks"].as_u64().unwrap() >= 50, "{quiet}");
    assert!(q.is_finite(), "{quiet}");
    assert_eq!(work["flagged"], true, "{c}");
    assert_eq!(d["flagged"], true, "{c}");
    assert_eq!(c["flagged"], true, "{c}");
    // The detail names the work phase among the flagged ones ("inside work (..."
    // alone, or "inside quiet (...), work (..." when other tests of this binary
    // loaded the host during quiet too: this test is about work, not quiet).
    let detail = c["detail"].as_str().unwrap();
    let inside = detail.split_once("inside ").map_or("", |(_, rest)| rest);
    assert!(
        inside.starts_with("work (") || inside.contains(", work ("),
        "{c}"
    );
    assert!(
        rest.iter().any(|l| l.contains("contention FLAGGED")),
        "{}",
        rest.join("\n")
    );
}

/// Contention that starts after the start gate's window is caught during the run:
/// once the engine is running, this test keeps every core of the host busy, and
/// the bundle's `contention` is flagged with `during` naming the other work (the
/// engine itself sleeps, so none of it is the engine's). Without the `during`
/// judgement the run reads as quiet: the burners start after the start window.
#[test]
fn work_that_starts_after_the_gate_flags_the_run_as_contended_during_it() {
    let _one_burner = BURNERS.lock().unwrap_or_else(|e| e.into_inner());
    let s = store("contended-during");
    let mut w = Watched::spawn(
        harness(&s)
            .args(["--cadence-ms", "50", "--exec", "--", ENGINE])
            .args(["--hello", "--pid", "--open", "work", "--sleep-ms", "2500"])
            .args(["--close", "work"]),
    );
    // The engine has started.
    w.expect("test-engine pid=");
    let burners = Burners::start();
    let (out, _, rest) = w.finish();
    burners.stop();
    let m = manifest(&out);
    let c = &m["contention"];
    let d = &c["during"];
    assert_eq!(d["judged"], true, "{c}");
    assert!(d["window_s"].as_f64().unwrap() >= 2.5, "{c}");
    let other = d["other_busy_cores"].as_f64().unwrap();
    let limit = d["limit_cores"].as_f64().unwrap();
    assert!(other > limit, "other {other} vs limit {limit}: {c}");
    // The sleeping engine used next to nothing; the burners are other work.
    assert!(d["engine_cores"].as_f64().unwrap() < 0.2, "{c}");
    assert_eq!(d["flagged"], true, "{c}");
    assert_eq!(c["flagged"], true, "{c}");
    assert!(
        c["detail"].as_str().unwrap().contains("during the run"),
        "{c}"
    );
    assert!(
        rest.iter().any(|l| l.contains("contention FLAGGED")),
        "{}",
        rest.join("\n")
    );
    // `ls` marks the run for whoever scans the store.
    let ls = Command::new(HARNESS)
        .args(["ls", "--json", "--store"])
        .arg(&s)
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows[0]["contended"], true, "{rows}");
    let ls = Command::new(HARNESS)
        .args(["ls", "--store"])
        .arg(&s)
        .output()
        .unwrap();
    let listing = text(&ls.stdout);
    let row = listing.lines().nth(1).unwrap_or("");
    assert!(
        row.split_whitespace()
            .nth(3)
            .is_some_and(|x| x.ends_with('!')),
        "{listing}"
    );
}
