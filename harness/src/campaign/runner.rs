//! The campaign's run machinery: each schedule position is one `harness run` in a
//! child process (this same binary), so a run that crashes, is killed or leaks
//! cannot take the campaign or the next run down with it.
//!
//! The child's stderr (the live phase lines) passes through as it comes; its stdout
//! (the phase table and the bundle's `path:`) is echoed after it exits. The
//! outcome is read from the sealed bundle's manifest, never from the exit code
//! alone; a refusal (exit 3) is reported with the gate the child named.

use evidence::fragments::{self, Completion, Exit};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;

use crate::campaign::execute::{Job, RunFailure, RunOutcome, Runner};
use crate::exit;

/// Runs each job as `HARNESS run --rung R --store S --engine E --lever K=V --schedule JSON`.
#[derive(Debug, Clone)]
pub struct ChildRunner {
    /// The harness binary to run (normally `std::env::current_exe()`).
    pub harness: PathBuf,
    /// The engine binary every run uses.
    pub engine: PathBuf,
    /// The store the bundles are sealed into (a directory, or an `s3://` URL:
    /// then each run seals into `local_store` and publishes there).
    pub store: PathBuf,
    /// The local store each run stages in when `store` is a bucket
    /// (`HARNESS_LOCAL_STORE` of the child).
    pub local_store: Option<PathBuf>,
    /// Extra `harness run` flags passed to every run (cadence, timeout, ...).
    pub extra: Vec<String>,
    /// The campaign's own SIGINT/SIGTERM flags: a signal to the campaign is passed
    /// on to the running child, which stops its engine and seals `interrupted`
    /// (and the campaign then stops, resumable). None in tests.
    pub signals: Option<std::sync::Arc<crate::run::signals::Signals>>,
}

impl ChildRunner {
    /// The child's command line (without spawning it).
    pub fn command(&self, job: &Job) -> Command {
        let mut c = Command::new(&self.harness);
        c.arg("run")
            .arg("--rung")
            .arg(&job.rung_path)
            .arg("--store")
            .arg(&self.store)
            .arg("--engine")
            .arg(&self.engine);
        if let Some(l) = &self.local_store {
            c.env(evidence::store::LOCAL_STORE_ENV, l);
        }
        for (k, v) in &job.levers {
            c.arg("--lever").arg(format!("{k}={v}"));
        }
        c.arg("--schedule").arg(job.schedule.to_string());
        c.args(&self.extra);
        c
    }
}

/// The gate and reason of a `refused by gate 'G': WHY` line, if `line` is one.
pub fn parse_refusal(line: &str) -> Option<(String, String)> {
    let rest = &line[line.find("refused by gate '")? + "refused by gate '".len()..];
    let (gate, why) = rest.split_once("': ")?;
    Some((gate.to_string(), why.trim().to_string()))
}

/// The bundle directory of a `path: DIR` line in the child's stdout.
pub fn parse_bundle_path(stdout: &str) -> Option<PathBuf> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("path: "))
        .map(|p| PathBuf::from(p.trim()))
}

/// Read `complete` and `exit.reason` from a sealed bundle's manifest.
pub fn outcome_of(dir: &Path) -> anyhow::Result<RunOutcome> {
    let m = crate::bundle::manifest::read_json(dir)?;
    let file = dir.join(evidence::bundle_files::MANIFEST);
    let complete = m["complete"].as_bool().with_context(|| {
        format!(
            "{}: field 'complete': expected true or false",
            file.display()
        )
    })?;
    let exit_reason = fragments::read::<Exit>(&m)
        .ok()
        .flatten()
        .and_then(|e| e.reason)
        .with_context(|| format!("{}: field 'exit.reason': expected a string", file.display()))?;
    let bundle_id = m["id"]
        .as_str()
        .map(str::to_string)
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .with_context(|| format!("{}: no bundle id", file.display()))?;
    let verdict_pass = fragments::read::<Completion>(&m)
        .ok()
        .flatten()
        .and_then(|c| c.verdict)
        .as_deref()
        == Some("pass");
    Ok(RunOutcome {
        bundle_id,
        complete: complete && verdict_pass,
        exit_reason,
        run_wall_s: m["phases"]["run_wall_s"].as_f64(),
    })
}

impl Runner for ChildRunner {
    fn run(&mut self, job: &Job) -> Result<RunOutcome, RunFailure> {
        let mut child = self
            .command(job)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", self.harness.display()))?;
        // Pass stderr through line by line, keeping the refusal line if any.
        let err = child.stderr.take().context("the child's stderr")?;
        let tee = std::thread::spawn(move || {
            let mut refusal = None;
            let mut last = Vec::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if let Some(r) = parse_refusal(&line) {
                    refusal = Some(r);
                }
                last.push(line);
                if last.len() > 20 {
                    last.remove(0);
                }
            }
            (refusal, last)
        });
        // Relay the campaign's signals to the child while it runs.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let relay = self.signals.clone().map(|sig| {
            let done = done.clone();
            let pid = child.id() as libc::pid_t;
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(name) = sig.take() {
                        let signo = if name == "SIGINT" {
                            libc::SIGINT
                        } else {
                            libc::SIGTERM
                        };
                        // SAFETY: kill(2) on our own child's pid; it is not yet reaped
                        // (we set `done` only after wait() returns).
                        unsafe { libc::kill(pid, signo) };
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            })
        });
        let mut stdout = String::new();
        if let Some(mut out) = child.stdout.take() {
            std::io::Read::read_to_string(&mut out, &mut stdout)
                .context("reading the child's stdout")?;
        }
        let status = child.wait().context("waiting for the run");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = relay {
            let _ = r.join();
        }
        let status = status?;
        let (refusal, last) = tee
            .join()
            .map_err(|_| anyhow::anyhow!("the stderr relay thread panicked"))?;
        let _ = std::io::stdout().lock().write_all(stdout.as_bytes());
        let code = status.code();
        if code == Some(i32::from(exit::REFUSED)) {
            let (gate, why) = refusal.unwrap_or_else(|| {
                (
                    "unknown".into(),
                    format!(
                        "exit 3 without a refusal line; last stderr: {}",
                        last.join(" | ")
                    ),
                )
            });
            return Err(RunFailure::Refused { gate, why });
        }
        match parse_bundle_path(&stdout) {
            Some(dir) => Ok(outcome_of(&dir)?),
            None => Err(RunFailure::Failed(anyhow::anyhow!(
                "harness run exited {status} without sealing a bundle; last stderr: {}",
                last.join(" | ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_lines_and_bundle_paths_are_read_from_the_childs_output() {
        assert_eq!(
            parse_refusal(
                "harness: error: refused by gate 'headroom': MemAvailable 1 GiB below 4 GiB"
            ),
            Some(("headroom".into(), "MemAvailable 1 GiB below 4 GiB".into()))
        );
        assert_eq!(parse_refusal("+denoise"), None);
        assert_eq!(
            parse_bundle_path("table\npath: /s/bundles/abc\nexit: completed"),
            Some(PathBuf::from("/s/bundles/abc"))
        );
        assert_eq!(parse_bundle_path("no path here"), None);
    }

    #[test]
    fn the_child_command_carries_store_engine_levers_and_schedule() {
        let r = ChildRunner {
            harness: "/h".into(),
            engine: "/e".into(),
            store: "/s".into(),
            local_store: None,
            extra: vec!["--cadence-ms".into(), "50".into()],
            signals: None,
        };
        let job = Job {
            rung_path: "rungs/0.toml".into(),
            levers: [("attn".to_string(), "sdpa".to_string())].into(),
            schedule: serde_json::json!({"campaign": "c", "position": 2}),
        };
        let c = r.command(&job);
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "run",
                "--rung",
                "rungs/0.toml",
                "--store",
                "/s",
                "--engine",
                "/e",
                "--lever",
                "attn=sdpa",
                "--schedule",
                r#"{"campaign":"c","position":2}"#,
                "--cadence-ms",
                "50"
            ]
        );
    }
}
