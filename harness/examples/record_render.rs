//! Record one real `engine render` into a sealed bundle with only the evidence
//! crate: the engine's markers over HARNESS_MARKER_FD, its stderr lines, and a
//! 50 ms sampler of its RSS and CPU from /proc. A stand-in for `harness run` (which
//! does this properly, with every sensor, gate and watchdog) so the picture and the
//! trace of `harness plot` / `harness export` can be checked on a real render.
//!
//! usage: cargo run -p harness --example record_render -- ENGINE RUNG WEIGHTS STORE

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use evidence::clock::monotonic_ns;
use evidence::journal::{Record, SharedJournal, Stream};
use evidence::sample::Sample;
use evidence::store::Store;
use serde_json::json;

fn proc_rss_and_ticks(pid: u32) -> Option<(f64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((kb * 1024.0, ticks))
}

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [engine, rung, weights, store] = a.as_slice() else {
        anyhow::bail!("usage: record_render ENGINE RUNG WEIGHTS STORE");
    };
    let store = Store::resolve(Some(std::path::Path::new(store)))?;
    let staging = store.open_staging()?;
    let j = SharedJournal::create(&staging.journal_path())?;
    let start = monotonic_ns();
    let frag = |k: &str, v: serde_json::Value| {
        j.append(&Record::Fragment {
            key: k.into(),
            value: v,
        })
    };
    let rung_text = std::fs::read_to_string(rung).with_context(|| format!("reading {rung}"))?;
    let cfg: toml::Value = toml::from_str(&rung_text)?;
    let engine_sha = evidence::seal::hash_file(std::path::Path::new(engine))?.sha256;
    frag(
        "run",
        json!({"start_ns": start, "argv": a, "hostname": "dev", "harness_version": "record_render example"}),
    )?;
    frag(
        "rung",
        json!({"name": std::path::Path::new(rung).file_stem().map(|s| s.to_string_lossy().into_owned()), "path": rung, "config": cfg}),
    )?;
    frag("profile", json!("default"))?;
    frag("levers", json!({}))?;
    frag(
        "engine",
        json!({"sha256": engine_sha, "store_path": engine}),
    )?;
    // The weights digest the engine's synth-weights (or a download check) wrote,
    // so rank and diff can read this bundle; null when the directory has none.
    let digest_file = std::path::Path::new(weights).join("DIGEST");
    let digest = std::fs::read_to_string(&digest_file)
        .ok()
        .map(|d| d.trim().to_string());
    frag(
        "weights",
        json!({"digest": digest, "digest_source": "DIGEST file", "dir": weights}),
    )?;
    frag("sampler", json!({"cadence_ms": 50}))?;
    frag("gpu", serde_json::Value::Null)?;
    frag(
        "sensors_unavailable",
        json!({"gpu_util_pct": "CPU arm: no GPU sampled by this example", "gpu_power_mw": "CPU arm: no GPU sampled by this example", "engine_gpu_mem_bytes": "CPU arm: no GPU sampled by this example", "weights_cached_bytes": "not sampled by this example"}),
    )?;

    // The marker channel: a pipe (std::io::pipe needs Rust 1.87; the MSRV is 1.85).
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating the marker pipe");
    }
    // SAFETY: both descriptors are new and owned here; each is wrapped exactly once.
    let (mut rd, wr) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let fd = wr.as_raw_fd();
    // SAFETY: clear close-on-exec on our own pipe end so the engine inherits it.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let mut child = Command::new(engine)
        .args(["render", "--rung", rung, "--weights", weights, "--out"])
        .arg(staging.frames_dir())
        .env("HARNESS_MARKER_FD", fd.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(wr);
    let pid = child.id();
    let jm = j.clone();
    let markers = std::thread::spawn(move || {
        for line in BufReader::new(&mut rd).lines().map_while(Result::ok) {
            let _ = jm.append(&Record::Marker {
                recv_ns: monotonic_ns(),
                line,
            });
        }
    });
    let je = j.clone();
    let stderr = child.stderr.take().context("stderr")?;
    let errs = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = je.append(&Record::Output {
                t_ns: monotonic_ns(),
                stream: Stream::Stderr,
                line,
            });
        }
    });
    let hz = 100.0; // USER_HZ
    let mut prev: Option<(u64, u64)> = None;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        let now = monotonic_ns();
        let mut s = Sample::empty(now);
        if let Some((rss, ticks)) = proc_rss_and_ticks(pid) {
            s.set("rss_bytes", Some(rss));
            if let Some((t0, k0)) = prev {
                let dt = (now - t0) as f64 / 1e9;
                s.set("cpu_cores", Some((ticks - k0) as f64 / hz / dt));
            }
            prev = Some((now, ticks));
        }
        j.append(&Record::Sample(s))?;
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = markers.join();
    let _ = errs.join();
    let end = monotonic_ns();
    let mut run = json!({"start_ns": start, "end_ns": end, "argv": a, "hostname": "dev", "harness_version": "record_render example"});
    run["boot_id"] = json!(evidence::recover::current_boot_id());
    frag("run", run)?;
    let ok = status.success();
    frag(
        "exit",
        json!({"reason": if ok { "completed" } else { "engine-failed" }, "code": status.code(), "signal": null, "detail": ""}),
    )?;
    frag(
        "completion",
        json!({"verdict": "not-checked", "reasons": ["the example does not check pixels"], "frames": null}),
    )?;
    j.finish()?;
    let sealed = evidence::seal::seal(staging.dir(), &store)?;
    println!("{}", sealed.id);
    Ok(())
}
