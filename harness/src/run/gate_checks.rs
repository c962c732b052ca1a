//! The preflight gates: each a hard refusal with a clear message, each recorded in
//! the `gates` fragment whatever its verdict.
//!
//! * `store-durable` (H2): the store is not on /tmp, /var/tmp, /mnt, tmpfs or ramfs.
//! * `lease` (H3): a lease id, required when the rung says so.
//! * `engine-binary` (H5): the engine is copied into the store under its sha256 and
//!   run from there, so a worktree vanishing mid-run cannot change what is measured.
//! * `contention`: load and other GPU processes, recorded and flagged (never refused).
//! * `headroom`: the engine's projected host peak fits in MemAvailable minus the floor.
//! * `watchdog-control`: the watchdog's positive control passed (H1).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::gate_verdict::{Gate, Verdict};
use crate::sampler::gpu::Gpu;
use evidence::fragments::Contention;

/// Load above this many runnable tasks per core flags the run as contended.
///
/// Half the cores busy with other work already moves wall times by tens of per
/// cent on a render that uses every core; the flag makes such runs visible in
/// `rank` rather than silently mixed with quiet ones.
pub const CONTENTION_LOAD_PER_CORE: f64 = 0.5;

/// Why the CUDA rung at `rung_file` is refused where NVML opened no GPU (`why` is
/// its reason).
pub fn no_gpu_for_cuda(rung_file: &Path, why: &str) -> String {
    format!(
        "{}: the rung renders on the CUDA arm (device = \"cuda\") but no GPU can be used \
         here ({why}); run it on a GPU machine, or rung 0 here (the CPU arm)",
        rung_file.display()
    )
}

/// The `lease` gate: `required` comes from the rung.
pub fn lease(required: bool, id: Option<&str>) -> Gate {
    match (id.map(str::trim).filter(|s| !s.is_empty()), required) {
        (Some(id), _) => Gate::new("lease", Verdict::Pass, format!("lease id {id}")),
        (None, true) => Gate::new(
            "lease",
            Verdict::Refuse,
            "the rung requires a lease id ([require] lease = true): pass --lease-id ID or set HARNESS_LEASE_ID",
        ),
        (None, false) => Gate::new("lease", Verdict::NotApplicable, "the rung requires no lease"),
    }
}

/// Hex sha256 of a file (streamed; the same function the weights digest uses).
pub use evidence::weights_digest::sha256_file;

/// Resolve `program` like a shell would (a name without `/` is looked up in PATH).
pub fn resolve_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Why [`resolve_program`] found no program at `program`, in words: what
/// opening it said (a symbolic link loop, a directory, permission denied)
/// rather than "not found" for every case.
pub fn why_unresolved(program: &Path) -> String {
    let said = |p: &Path| match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Some(format!("{}: a directory, not a program", p.display())),
        Ok(_) => Some(format!("{}: not a regular file", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Some(format!(
            "{}: a loop of symbolic links (it never reaches a file): fix or remove the link",
            p.display()
        )),
        Err(e) => Some(format!("{}: cannot be opened: {e}", p.display())),
    };
    if program.components().count() > 1 {
        return said(program).unwrap_or_else(|| format!("{}: no such file", program.display()));
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find_map(|p| said(&p))
    });
    match found {
        Some(why) => format!("{} (found through PATH): {why}", program.display()),
        None => format!("{}: not found (as a path or in PATH)", program.display()),
    }
}

/// The engine binary copied into `bin_dir` under its sha256.
#[derive(Debug, Clone, PartialEq)]
pub struct CopiedBinary {
    /// Where it was copied from.
    pub source: PathBuf,
    /// Where it runs from: `bin_dir/<sha256>`.
    pub store_path: PathBuf,
    /// Hex sha256 of its bytes.
    pub sha256: String,
}

/// Copy `source` into `bin_dir/<sha256>` (reusing an identical copy), verified by
/// hashing the copy.
pub fn copy_engine(source: &Path, bin_dir: &Path) -> Result<CopiedBinary, String> {
    let ctx = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let sha = sha256_file(source).map_err(|e| ctx("cannot read", source, e))?;
    std::fs::create_dir_all(bin_dir).map_err(|e| ctx("cannot create", bin_dir, e))?;
    let dest = bin_dir.join(&sha);
    let reuse = dest.is_file() && sha256_file(&dest).ok().as_deref() == Some(sha.as_str());
    if !reuse {
        let tmp = bin_dir.join(format!(".{sha}.partial-{}", std::process::id()));
        let result = (|| {
            std::fs::copy(source, &tmp)?;
            let f = std::fs::File::open(&tmp)?;
            f.sync_all()?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o555))?;
            std::fs::rename(&tmp, &dest)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(ctx("cannot copy the engine to", &dest, e));
        }
        let got = sha256_file(&dest).map_err(|e| ctx("cannot re-read", &dest, e))?;
        if got != sha {
            return Err(format!(
                "the copy {} hashes to {got}, not {sha}",
                dest.display()
            ));
        }
    }
    Ok(CopiedBinary {
        source: source.to_path_buf(),
        store_path: dest,
        sha256: sha,
    })
}

/// The busy cores of other work above which a host of `cores` cores counts as
/// contended ([`CONTENTION_LOAD_PER_CORE`] of them).
pub fn contention_limit(cores: usize) -> f64 {
    CONTENTION_LOAD_PER_CORE * cores as f64
}

/// How long [`busy_cores`] watches the host before the engine starts, ms.
pub const CONTENTION_WINDOW_MS: u64 = 500;

/// Cores busy (user, nice, system, irq, softirq, steal) across the whole host over
/// `window`, from two readings of `/proc/stat`'s `cpu` line; None when unreadable.
///
/// This, not load1, judges contention: load1 is a one-minute decaying average,
/// so on a box that just finished a render (the previous position of the same
/// campaign) it stays high for minutes while the box is in fact idle. The
/// harness sleeps through the window, so what it sees is other work.
pub fn busy_cores(window: std::time::Duration) -> Option<f64> {
    fn read() -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        parse_cpu_line(text.lines().next()?)
    }
    let (b0, t0) = read()?;
    std::thread::sleep(window);
    let (b1, t1) = read()?;
    let dt = t1.checked_sub(t0).filter(|d| *d > 0)?;
    let db = b1.saturating_sub(b0);
    Some(db as f64 / dt as f64 * crate::run::facts::cores() as f64)
}

/// (busy, total) jiffies of a `/proc/stat` `cpu ...` aggregate line.
pub fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut it = line.split_whitespace();
    if it.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = it.map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest is inside user).
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    let total = busy + get(3) + get(4);
    Some((busy, total))
}

/// The `contention` fragment and whether it is flagged: other work busy on more
/// than [`CONTENTION_LOAD_PER_CORE`] of the cores just before the engine starts,
/// or another process on the GPU. `load1` is recorded for reference only.
pub fn contention(
    busy: Option<f64>,
    load1: Option<f64>,
    cores: usize,
    gpu: Option<&Gpu>,
    own_pid: u32,
) -> Contention {
    let mut why = Vec::new();
    let limit = contention_limit(cores);
    match busy {
        Some(b) if b > limit => why.push(format!(
            "{b:.2} cores busy with other work above {limit:.2} ({CONTENTION_LOAD_PER_CORE} per core on {cores} cores, {CONTENTION_WINDOW_MS} ms before start)"
        )),
        Some(_) => {}
        None => why.push("/proc/stat unreadable".into()),
    }
    let others = match gpu.map(|g| g.compute_processes()) {
        Some(Ok(procs)) => {
            let n = procs.iter().filter(|p| p.pid != own_pid).count();
            if n > 0 {
                why.push(format!("{n} other process(es) on the GPU"));
            }
            Some(n as u64)
        }
        Some(Err(e)) => {
            why.push(format!("GPU processes unreadable ({e})"));
            None
        }
        None => None,
    };
    Contention {
        busy_cores_at_start: busy,
        window_ms: Some(CONTENTION_WINDOW_MS),
        load1_at_start: load1,
        other_gpu_procs: others,
        flagged: Some(!why.is_empty()),
        detail: Some(if why.is_empty() {
            "quiet".to_string()
        } else {
            why.join("; ")
        }),
        quiet_wait_s: None,
        quiet_wait_limit_s: None,
        during: None,
        rest: serde_json::Map::new(),
    }
}

/// How a wait for a quiet host ended ([`quiet_start`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QuietStart {
    /// The last reading of the host's busy cores (None: unreadable, which ends
    /// the wait: there is nothing to wait on).
    pub busy: Option<f64>,
    /// Readings taken after the first.
    pub retries: u64,
    /// The signal that stopped the wait, if one did.
    pub interrupted: Option<&'static str>,
}

/// Read the host's busy cores with `read` (each reading is one start window)
/// until it is at or below `limit`, unreadable, `max_retries` readings past the
/// first have been taken, or `signal` names one: the start gate's reading once
/// the host has gone quiet, or the last one when it never did.
pub fn quiet_start(
    mut read: impl FnMut() -> Option<f64>,
    limit: f64,
    max_retries: u64,
    mut signal: impl FnMut() -> Option<&'static str>,
) -> QuietStart {
    let mut busy = read();
    let mut retries = 0;
    while busy.is_some_and(|b| b > limit) && retries < max_retries {
        if let Some(sig) = signal() {
            return QuietStart {
                busy,
                retries,
                interrupted: Some(sig),
            };
        }
        busy = read();
        retries += 1;
    }
    QuietStart {
        busy,
        retries,
        interrupted: None,
    }
}

/// The engine's per-phase memory projection of one render (`engine plan
/// --json`, whose subcommand keeps its name).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Projection {
    /// Projected peak resident host bytes.
    pub host_peak_bytes: u64,
    /// Projected peak device bytes.
    pub device_peak_bytes: u64,
    /// Bytes of weights.
    #[serde(default)]
    pub weights_bytes: u64,
}

/// Ask `engine plan` for the memory projection of this render.
pub fn engine_projection(engine: &Path, render_args: &[String]) -> Result<Projection, String> {
    let mut command = Command::new(engine);
    command
        .arg("plan")
        .args(render_args)
        .arg("--json")
        .stdin(Stdio::null());
    let out = crate::text_busy::retry_while_text_busy(|| command.output())
        .map_err(|e| format!("cannot run {} plan: {e}", engine.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`engine plan` failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).map_err(|e| {
        format!("`engine plan --json` printed something other than the plan object ({e}): {text}")
    })
}

/// The `headroom` gate: the projected peak against MemAvailable minus the floor. On
/// a unified-memory GPU the device peak comes out of the same memory and is added.
pub fn headroom(projection: &Projection, mem_available: u64, floor: u64, unified: bool) -> Gate {
    let need = projection.host_peak_bytes
        + if unified {
            projection.device_peak_bytes
        } else {
            0
        };
    let room = mem_available.saturating_sub(floor);
    let what = if unified {
        "projected host + device peak"
    } else {
        "projected host peak"
    };
    let detail = format!(
        "{what} {need} B vs MemAvailable {mem_available} B minus floor {floor} B = {room} B"
    );
    if need <= room {
        Gate::new("headroom", Verdict::Pass, detail)
    } else {
        Gate::new("headroom", Verdict::Refuse, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn lease_is_required_only_when_the_rung_says_so() {
        assert_eq!(lease(true, None).verdict, Verdict::Refuse);
        assert!(lease(true, None).detail.contains("HARNESS_LEASE_ID"));
        assert_eq!(lease(true, Some("  ")).verdict, Verdict::Refuse);
        assert_eq!(lease(true, Some("L-42")).verdict, Verdict::Pass);
        assert_eq!(lease(false, None).verdict, Verdict::NotApplicable);
        assert_eq!(lease(false, Some("L-1")).verdict, Verdict::Pass);
    }

    #[test]
    fn headroom_compares_peak_with_available_minus_floor() {
        let p = Projection {
            host_peak_bytes: 600,
            device_peak_bytes: 300,
            weights_bytes: 0,
        };
        assert_eq!(headroom(&p, 1000, 400, false).verdict, Verdict::Pass);
        assert_eq!(headroom(&p, 1000, 401, false).verdict, Verdict::Refuse);
        // Unified memory: the device peak is drawn from the same pool.
        assert_eq!(headroom(&p, 1000, 400, true).verdict, Verdict::Refuse);
        assert_eq!(headroom(&p, 1300, 400, true).verdict, Verdict::Pass);
        assert!(headroom(&p, 10, 400, false).detail.contains("= 0 B"));
    }

    #[test]
    fn quiet_start_reads_until_the_host_is_quiet_or_the_wait_is_spent() {
        let never = || None;
        // Busy twice, then quiet: the quiet reading, two retries.
        let mut seq = [9.0, 8.5, 3.0, 9.9].into_iter();
        let q = quiet_start(|| seq.next(), 8.0, 10, never);
        assert_eq!((q.busy, q.retries, q.interrupted), (Some(3.0), 2, None));
        // Quiet at once: no retry.
        let q = quiet_start(|| Some(8.0), 8.0, 10, never);
        assert_eq!((q.busy, q.retries), (Some(8.0), 0));
        // Never quiet: the last busy reading after the allowed retries.
        let mut n = 0.0;
        let q = quiet_start(
            || {
                n += 1.0;
                Some(10.0 + n)
            },
            8.0,
            3,
            never,
        );
        assert_eq!((q.busy, q.retries), (Some(14.0), 3));
        // No wait asked: one reading, busy or not.
        let q = quiet_start(|| Some(12.0), 8.0, 0, never);
        assert_eq!((q.busy, q.retries), (Some(12.0), 0));
        // Unreadable: nothing to wait on.
        let q = quiet_start(|| None, 8.0, 10, never);
        assert_eq!((q.busy, q.retries), (None, 0));
        // A signal stops the wait with the busy reading it had.
        let q = quiet_start(|| Some(12.0), 8.0, 10, || Some("SIGINT"));
        assert_eq!(
            (q.busy, q.retries, q.interrupted),
            (Some(12.0), 0, Some("SIGINT"))
        );
    }

    #[test]
    fn contention_flags_busy_cores_not_the_lagging_load_average() {
        let contention = |busy, load1, cores, gpu: Option<&Gpu>, pid| {
            serde_json::to_value(contention(busy, load1, cores, gpu, pid)).unwrap()
        };
        let c = contention(Some(3.0), Some(0.2), 4, None, 1);
        assert_eq!(c["flagged"], true);
        assert!(c["detail"]
            .as_str()
            .unwrap()
            .contains("3.00 cores busy with other work above 2.00"));
        // A high load1 left by the previous render does not flag a quiet box.
        let c = contention(Some(1.0), Some(11.3), 4, None, 1);
        assert_eq!(
            (c["flagged"].as_bool(), c["detail"].as_str()),
            (Some(false), Some("quiet"))
        );
        assert_eq!(c["load1_at_start"], 11.3);
        assert!(c["other_gpu_procs"].is_null());
        assert_eq!(contention(None, None, 4, None, 1)["flagged"], true);
    }

    #[test]
    fn proc_stat_cpu_lines_parse_to_busy_and_total() {
        assert_eq!(
            parse_cpu_line("cpu  100 5 50 1000 20 3 2 1 0 0"),
            Some((161, 1181))
        );
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4"), None);
        assert_eq!(parse_cpu_line("cpu 1 x 3 4"), None);
        assert_eq!(parse_cpu_line("cpu 1 2"), None);
        // A reading of this machine: busy never exceeds total, cores are bounded.
        let b = busy_cores(std::time::Duration::from_millis(50)).unwrap();
        assert!(
            b >= 0.0 && b <= crate::run::facts::cores() as f64 + 0.01,
            "{b}"
        );
    }

    #[test]
    fn the_engine_is_copied_once_under_its_hash() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/gates-copy");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let src = d.join("engine");
        std::fs::write(&src, b"#!/bin/sh\necho hi\n").unwrap();
        let bin = d.join("bin");
        let c = copy_engine(&src, &bin).unwrap();
        assert_eq!(
            c.sha256,
            format!("{:x}", Sha256::digest(b"#!/bin/sh\necho hi\n"))
        );
        assert_eq!(c.store_path, bin.join(&c.sha256));
        let mut run = Command::new(&c.store_path);
        let out = crate::text_busy::retry_while_text_busy(|| run.output()).unwrap();
        assert_eq!(out.stdout, b"hi\n");
        // Same bytes: same path, nothing else written.
        let again = copy_engine(&src, &bin).unwrap();
        assert_eq!(again.store_path, c.store_path);
        assert_eq!(std::fs::read_dir(&bin).unwrap().count(), 1);
        let e = copy_engine(&d.join("nope"), &bin).unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn programs_resolve_through_path() {
        assert!(resolve_program(Path::new("sh")).is_some());
        assert!(resolve_program(Path::new("no-such-program-xyz")).is_none());
    }
}
