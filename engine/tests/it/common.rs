//! Helpers shared by the end-to-end tests of the `engine` binary: running it
//! with the marker protocol on descriptor 3, rebuilding phases from markers,
//! and the pixel check every rendered video must pass.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use engine::frames::y4m::Y4mVideo;
use evidence::clock::monotonic_ns;
use evidence::marker::{parse_marker_line, Marker};

/// One finished engine process.
pub struct Run {
    /// Exit status, stdout and stderr.
    pub out: Output,
    /// Every marker line it wrote, parsed.
    pub markers: Vec<Marker>,
    /// Wall time of the process, ns.
    pub wall_ns: u64,
}

/// Run `bin` with `args`; markers come back through a file handed to the child
/// as descriptor 3 (`HARNESS_MARKER_FD=3`), stdout and stderr through files in
/// `dir` (a pipe would wake the test's reader at every marker line and, on a
/// loaded 2-core box, preempt the engine exactly between two phases).
pub fn run_with_markers<S: AsRef<OsStr>>(bin: &Path, args: &[S], dir: &Path) -> Run {
    let mpath = dir.join("markers.jsonl");
    let mfile = std::fs::File::create(&mpath).unwrap();
    use std::os::fd::AsRawFd;
    let fd = mfile.as_raw_fd();
    let mut cmd = Command::new(bin);
    cmd.args(args).env("HARNESS_MARKER_FD", "3");
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps FD_CLOEXEC, so clear it explicitly then.
            let rc = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (so, se) = (dir.join("stdout.txt"), dir.join("stderr.txt"));
    cmd.stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap());
    let t0 = monotonic_ns();
    let status = cmd.status().unwrap();
    let wall_ns = monotonic_ns() - t0;
    let out = Output {
        status,
        stdout: std::fs::read(&so).unwrap(),
        stderr: std::fs::read(&se).unwrap(),
    };
    drop(mfile);
    let text = std::fs::read_to_string(&mpath).unwrap();
    let markers = text
        .lines()
        .map(|l| parse_marker_line(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    Run {
        out,
        markers,
        wall_ns,
    }
}

/// The arguments of `engine render --rung RUNG --weights WEIGHTS --out OUT EXTRA...`.
pub fn render_args(rung: &Path, weights: &Path, out: &Path, extra: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["render".into(), "--rung".into(), rung.into()];
    args.extend(["--weights".into(), weights.into()]);
    args.extend(["--out".into(), out.into()]);
    args.extend(extra.iter().map(OsString::from));
    args
}

/// Run `bin synth-weights --preset PRESET --out DIR`, asserting success; returns stdout.
pub fn synth_weights(bin: &Path, preset: &str, dir: &Path) -> String {
    let out = Command::new(bin)
        .args(["synth-weights", "--preset", preset, "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One closed phase: name, open/close times, attrs, whether it has children.
#[derive(Debug)]
pub struct Span {
    /// Phase name.
    pub name: String,
    /// Open time, ns.
    pub open: u64,
    /// Close time, ns.
    pub close: u64,
    /// Index of the enclosing phase.
    pub parent: Option<usize>,
    /// Whether no phase opened inside it.
    pub leaf: bool,
    /// Attributes of its close marker.
    pub close_attrs: BTreeMap<String, serde_json::Value>,
}

/// Rebuild phases from markers, asserting they nest (every close matches the
/// innermost open) and that nothing is left open.
pub fn spans(ms: &[Marker]) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    for m in ms {
        match m {
            Marker::Open { t_ns, name, .. } => {
                let parent = stack.last().copied();
                if let Some(p) = parent {
                    out[p].leaf = false;
                }
                out.push(Span {
                    name: name.clone(),
                    open: *t_ns,
                    close: 0,
                    parent,
                    leaf: true,
                    close_attrs: BTreeMap::new(),
                });
                stack.push(out.len() - 1);
            }
            Marker::Close { t_ns, name, attrs } => {
                let i = stack.pop().expect("close without open");
                assert_eq!(
                    &out[i].name, name,
                    "close of {name} while {} is innermost",
                    out[i].name
                );
                out[i].close = *t_ns;
                out[i].close_attrs = attrs.clone().into_iter().collect();
            }
            _ => {}
        }
    }
    assert!(stack.is_empty(), "phases left open: {stack:?}");
    out
}

/// Mean and standard deviation of frame `i`'s luma.
pub fn luma_stats(v: &Y4mVideo, i: usize) -> (f64, f64) {
    let y = v.luma(i);
    let n = y.len() as f64;
    let mean = y.iter().map(|&b| b as f64).sum::<f64>() / n;
    let var = y.iter().map(|&b| (b as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// The pixel check a rendered video must pass: no frame near-black,
/// near-white or near-uniform (mean luma in (16, 240), std > 2), all frames
/// distinct, and adjacent frames differing (mean absolute luma difference > 0.5).
pub fn pixel_check(v: &Y4mVideo) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    let px = (v.width * v.height) as f64;
    for i in 0..v.frames.len() {
        let (mean, std) = luma_stats(v, i);
        if !(mean > 16.0 && mean < 240.0) {
            return Err(format!("frame {i} mean luma {mean}"));
        }
        if std <= 2.0 {
            return Err(format!("frame {i} is near-uniform (std {std})"));
        }
        if !seen.insert(v.frames[i].clone()) {
            return Err(format!("frame {i} duplicates another"));
        }
        if i > 0 {
            let d: f64 = v
                .luma(i)
                .iter()
                .zip(v.luma(i - 1))
                .map(|(a, b)| (*a as f64 - *b as f64).abs())
                .sum::<f64>()
                / px;
            if d <= 0.5 {
                return Err(format!("frames {} and {i} barely differ ({d})", i - 1));
            }
        }
    }
    Ok(())
}

/// Held by every test that renders through the binary or times a phase: one
/// at a time, so their coverage and timing checks do not measure each other
/// on a 2-core machine (a poisoned lock is taken over: the test that panicked
/// already failed).
pub fn exclusive() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}
