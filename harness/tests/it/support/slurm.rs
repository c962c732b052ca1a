//! A real Slurm for the fleet tests: Debian's slurm-wlm and munge as a two-node
//! cluster on loopback (`n1` and `n2`, two slurmd on this host; one node where
//! the second does not come up), installed and started by
//! `scripts/slurm-cluster.sh` (`just test` runs `install` and `start` before the
//! tests and `stop` after). The cluster's daemons are shared by every test of
//! the binary, one test at a time ([`Cluster::start`] holds the cluster until
//! the test ends): two tests' tasks on the two nodes of this one machine would
//! each be measured under the other's load. Each test submits its own arrays
//! (named by campaign id) and waits for its own job.
//! Where Slurm cannot be installed, `HARNESS_NO_SLURM=1` makes each test say NOT
//! RUN on stderr instead of failing (as `HARNESS_NO_S3_SERVER` does for S3).

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::bins::{repo, text};

/// The cluster as the client commands reach it, held by one test.
pub struct Cluster {
    /// Its `slurm.conf` (`SLURM_CONF` of every client command).
    pub conf: PathBuf,
    /// This test's turn: no other test of the binary submits until it ends.
    _turn: MutexGuard<'static, ()>,
}

/// Whose turn it is on the cluster.
static TURN: Mutex<()> = Mutex::new(());

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
    /// it is not up yet), once no other test holds it, with no job left on it
    /// (a failed test's are cancelled); `None`, with NOT RUN said, under
    /// `HARNESS_NO_SLURM`. Panics when Slurm is simply missing, or does not
    /// start.
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
        // A test that failed before releasing the cluster poisons the lock; its
        // turn is over all the same.
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let cl = Cluster {
            conf: conf.clone(),
            _turn: turn,
        };
        cl.clear();
        Some(cl)
    }

    /// Cancel every job on the cluster (only a test that failed leaves one) and
    /// wait until none is left.
    fn clear(&self) {
        let jobs = |cl: &Cluster| {
            let out = cl
                .command("squeue")
                .args(["--noheader", "--format=%i"])
                .output()
                .expect("squeue");
            text(&out.stdout).trim().to_string()
        };
        if jobs(self).is_empty() {
            return;
        }
        eprintln!("slurm: cancelling jobs a failed test left: {}", jobs(self));
        let _ = self.command("scancel").arg("--partition=harness").status();
        let t0 = Instant::now();
        while !jobs(self).is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "jobs still on the cluster: {}",
                jobs(self)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The cluster's nodes (sinfo), sorted.
    pub fn nodes(&self) -> Vec<String> {
        let out = self
            .command("sinfo")
            .args(["--noheader", "--Node", "--format=%N"])
            .output()
            .expect("sinfo");
        let mut nodes: Vec<String> = text(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// A Slurm client command pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// `(task id JOB_TASK, state)` of every task of `job`, from squeue.
    pub fn tasks(&self, job: u64) -> Vec<(String, String)> {
        self.tasks_on(job)
            .into_iter()
            .map(|(i, s, _)| (i, s))
            .collect()
    }

    /// `(task id JOB_TASK, state, node)` of every task of `job`, from squeue
    /// (the node empty while pending).
    pub fn tasks_on(&self, job: u64) -> Vec<(String, String, String)> {
        let out = self
            .command("squeue")
            .args(["--noheader", "--array", "--states=all", "--format=%i|%T|%N"])
            .arg(format!("--jobs={job}"))
            .output()
            .expect("squeue");
        text(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split('|').map(|x| x.trim().to_string());
                Some((f.next()?, f.next()?, f.next().unwrap_or_default()))
            })
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
