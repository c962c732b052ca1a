//! A real Slurm for the fleet tests: Debian's slurm-wlm and munge as a one-node
//! cluster on loopback, installed and started by `scripts/slurm-cluster.sh`
//! (`just test` runs `install` and `start` before the tests and `stop` after).
//! The cluster's daemons are shared by every test of the binary; each test
//! submits its own arrays (named by campaign id) and waits for its own job.
//! Where Slurm cannot be installed, `HARNESS_NO_SLURM=1` makes each test say NOT
//! RUN on stderr instead of failing (as `HARNESS_NO_S3_SERVER` does for S3).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::bins::{repo, text};

/// The cluster as the client commands reach it.
pub struct Cluster {
    /// Its `slurm.conf` (`SLURM_CONF` of every client command).
    pub conf: PathBuf,
}

/// The states after which an array task does nothing more.
pub const TERMINAL: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
];

/// Whether sbatch is on PATH and the daemons are where Debian puts them (sbatch
/// itself cannot be asked without a configuration to read).
fn installed() -> bool {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("sbatch").is_file()));
    on_path && std::path::Path::new("/usr/sbin/slurmctld").exists()
}

impl Cluster {
    /// The running cluster for test `name` (started by the project's script if
    /// it is not up yet); `None`, with NOT RUN said, under `HARNESS_NO_SLURM`.
    /// Panics when Slurm is simply missing, or does not start.
    pub fn start(name: &str) -> Option<Cluster> {
        if std::env::var_os("HARNESS_NO_SLURM").is_some() {
            eprintln!(
                "NOT RUN {name}: no Slurm here (HARNESS_NO_SLURM; scripts/slurm-cluster.sh install failed)"
            );
            return None;
        }
        assert!(
            installed(),
            "Slurm is not installed: run scripts/slurm-cluster.sh install (just test does), \
             or set HARNESS_NO_SLURM=1 to report {name} NOT RUN"
        );
        static CONF: OnceLock<PathBuf> = OnceLock::new();
        let conf = CONF.get_or_init(|| {
            let out = Command::new(repo().join("scripts/slurm-cluster.sh"))
                .arg("start")
                .output()
                .expect("run scripts/slurm-cluster.sh start");
            let so = text(&out.stdout);
            assert!(
                out.status.success(),
                "scripts/slurm-cluster.sh start failed:\n{so}\n{}",
                text(&out.stderr)
            );
            so.lines()
                .find_map(|l| l.strip_prefix("export SLURM_CONF="))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("no SLURM_CONF in {so}"))
        });
        Some(Cluster { conf: conf.clone() })
    }

    /// A Slurm client command pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// `(task id JOB_TASK, state)` of every task of `job`, from squeue.
    pub fn tasks(&self, job: u64) -> Vec<(String, String)> {
        let out = self
            .command("squeue")
            .args(["--noheader", "--array", "--states=all", "--format=%i|%T"])
            .arg(format!("--jobs={job}"))
            .output()
            .expect("squeue");
        text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(i, s)| (i.trim().to_string(), s.trim().to_string()))
            .collect()
    }

    /// Wait (up to `limit`) until every task of `job` is in a [`TERMINAL`] state;
    /// their `(task id, state)`.
    pub fn wait(&self, job: u64, limit: Duration) -> Vec<(String, String)> {
        let t0 = Instant::now();
        loop {
            let tasks = self.tasks(job);
            if !tasks.is_empty() && tasks.iter().all(|(_, s)| TERMINAL.contains(&s.as_str())) {
                return tasks;
            }
            assert!(
                t0.elapsed() < limit,
                "job {job} not finished after {limit:?}: {tasks:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
