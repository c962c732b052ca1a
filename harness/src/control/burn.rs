//! The burn child of the GPU control: `ENGINE burn --seconds S` started with the
//! marker channel (as `harness run` starts a render), its `burn.load` phase
//! followed as it opens and closes, its stderr passed through with the last line
//! kept, and its end.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use evidence::clock::monotonic_ns;
use evidence::marker::{parse_marker_line, Marker};

use crate::run::spawn::{self, EngineCommand};

/// The phase inside which the GPU is under load (`engine/src/cuda/burn.rs`).
pub const LOAD_PHASE: &str = "burn.load";

/// What the burn's markers said so far. Times are the harness's receive times,
/// CLOCK_MONOTONIC ns (the same clock as the readings).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadMarks {
    /// When `burn.load` opened.
    pub open_ns: Option<u64>,
    /// When `burn.load` closed.
    pub close_ns: Option<u64>,
    /// The close's attributes (`gemms`, `device_ms`, `tflops`).
    pub close_attrs: serde_json::Map<String, serde_json::Value>,
}

/// A started burn.
pub struct Burn {
    child: Child,
    pid: i32,
    /// When it was started, CLOCK_MONOTONIC ns.
    pub started_ns: u64,
    marks: Arc<Mutex<LoadMarks>>,
    last_stderr: Arc<Mutex<Option<String>>>,
    threads: Vec<JoinHandle<()>>,
}

/// How a burn ended.
#[derive(Debug, Clone)]
pub struct Ended {
    /// Its exit status (None when it could not be reaped).
    pub status: Option<ExitStatus>,
    /// What its markers said.
    pub marks: LoadMarks,
    /// Its last non-empty stderr line.
    pub last_stderr: Option<String>,
}

impl Burn {
    /// Start `engine burn --seconds S` with the marker channel on fd 3.
    pub fn start(engine: &Path, seconds: f64) -> std::io::Result<Burn> {
        let cmd = EngineCommand {
            program: engine.to_path_buf(),
            args: vec![
                "burn".into(),
                "--seconds".into(),
                seconds.to_string().into(),
            ],
        };
        let started_ns = monotonic_ns();
        let running = spawn::spawn_with_env(&cmd, &[])?;
        let marks = Arc::new(Mutex::new(LoadMarks::default()));
        let last_stderr = Arc::new(Mutex::new(None));
        let m = marks.clone();
        let markers = running.markers;
        let follow = std::thread::Builder::new()
            .name("burn-markers".into())
            .spawn(move || follow_markers(markers, &m))?;
        let l = last_stderr.clone();
        let stderr = running.stderr;
        let pass = std::thread::Builder::new()
            .name("burn-stderr".into())
            .spawn(move || pass_stderr(stderr, &l))?;
        let mut stdout = running.stdout;
        let drain = std::thread::Builder::new()
            .name("burn-stdout".into())
            .spawn(move || {
                let _ = std::io::copy(&mut stdout, &mut std::io::sink());
            })?;
        Ok(Burn {
            child: running.child,
            pid: running.pid,
            started_ns,
            marks,
            last_stderr,
            threads: vec![follow, pass, drain],
        })
    }

    /// What the markers said so far.
    pub fn marks(&self) -> LoadMarks {
        self.marks.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Whether the burn has ended (without reaping it).
    pub fn has_exited(&self) -> bool {
        spawn::has_exited(self.pid)
    }

    /// Stop the burn's process group (SIGTERM, SIGKILL after `grace`).
    pub fn terminate(&self, grace: Duration) {
        spawn::terminate(self.pid, grace);
    }

    /// Wait up to `timeout` for the burn to end (then stop it), reap it, and let
    /// its readers drain (bounded), so the marks include every line it wrote.
    pub fn finish(mut self, timeout: Duration) -> Ended {
        if !spawn::wait_exited(self.pid, timeout) {
            spawn::terminate(self.pid, Duration::from_secs(3));
        }
        // Stragglers of the group would hold the channel open.
        crate::sampler::kill_group(self.pid, libc::SIGKILL);
        let status = spawn::reap(&mut self.child).ok();
        for t in self.threads.drain(..) {
            join_bounded(t, Duration::from_secs(5));
        }
        Ended {
            status,
            marks: self.marks(),
            last_stderr: self.last_stderr.lock().ok().and_then(|l| l.clone()),
        }
    }
}

/// Join `t` if it ends within `timeout`; otherwise leave it (it holds no lock).
fn join_bounded(t: JoinHandle<()>, timeout: Duration) {
    let until = std::time::Instant::now() + timeout;
    while !t.is_finished() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if t.is_finished() {
        let _ = t.join();
    }
}

/// Follow the marker channel to its end, stamping `burn.load`'s open and close.
fn follow_markers(ch: impl Read, marks: &Mutex<LoadMarks>) {
    for line in BufReader::new(ch).lines().map_while(Result::ok) {
        let Ok(m) = parse_marker_line(&line) else {
            continue;
        };
        let now = monotonic_ns();
        let Ok(mut k) = marks.lock() else { return };
        match m {
            Marker::Open { name, .. } if name == LOAD_PHASE && k.open_ns.is_none() => {
                k.open_ns = Some(now);
            }
            Marker::Close { name, attrs, .. } if name == LOAD_PHASE && k.close_ns.is_none() => {
                k.close_ns = Some(now);
                k.close_attrs = attrs.into_iter().collect();
            }
            _ => {}
        }
    }
}

/// Pass the burn's stderr through to ours, keeping its last non-empty line.
fn pass_stderr(err: impl Read, last: &Mutex<Option<String>>) {
    for line in BufReader::new(err).lines().map_while(Result::ok) {
        eprintln!("{line}");
        if !line.trim().is_empty() {
            if let Ok(mut l) = last.lock() {
                *l = Some(line);
            }
        }
    }
}
