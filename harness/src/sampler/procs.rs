//! The engine's process tree, read from procfs: memory, CPU, threads and I/O,
//! summed over the root process and every descendant.
//!
//! This kernel may lack `/proc/<pid>/task/<tid>/children`, so descendants are found
//! by scanning `/proc` for parent links. The scan reads every process's `stat` and is
//! done on the slow sub-cadence (about once a second); between scans the known
//! members are read directly, so a child that lives less than a scan interval can be
//! missed. Its CPU time is still counted once it is reaped, through its parent's
//! `cutime`/`cstime`.

use std::collections::{BTreeMap, HashMap, HashSet};

use evidence::sample::Sample;
use procfs::process::Process;

use super::Reasons;

/// Bytes per kB as procfs `status` reports them (kibibytes).
const KIB: f64 = 1024.0;

/// Reads the columns of one process tree.
pub struct ProcessTree {
    root: i32,
    /// Known members by pid; the handle keeps its `/proc/<pid>` directory open, so a
    /// recycled pid is never read as the old process.
    members: BTreeMap<i32, Process>,
    ticks_per_second: f64,
    /// (tree CPU ticks, CLOCK_MONOTONIC ns) at the previous read.
    prev_cpu: Option<(u64, u64)>,
}

/// Every descendant of `root` (and `root` itself) among the processes now in /proc.
pub fn descendants(root: i32) -> HashSet<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(all) = procfs::process::all_processes() {
        for p in all.flatten() {
            if let Ok(st) = p.stat() {
                children.entry(st.ppid).or_default().push(st.pid);
            }
        }
    }
    let mut out = HashSet::from([root]);
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if out.insert(c) {
                todo.push(c);
            }
        }
    }
    out
}

impl ProcessTree {
    /// A tree rooted at `root` (the engine's pid).
    pub fn new(root: i32) -> Self {
        let mut t = ProcessTree {
            root,
            members: BTreeMap::new(),
            ticks_per_second: procfs::ticks_per_second() as f64,
            prev_cpu: None,
        };
        t.rescan();
        t
    }

    /// The root pid.
    pub fn root(&self) -> i32 {
        self.root
    }

    /// The pids currently known to be in the tree.
    pub fn pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.members.keys().copied()
    }

    /// Find new descendants (and forget processes that are gone).
    pub fn rescan(&mut self) {
        let now = descendants(self.root);
        self.members.retain(|pid, _| now.contains(pid));
        for pid in now {
            if let std::collections::btree_map::Entry::Vacant(e) = self.members.entry(pid) {
                if let Ok(p) = Process::new(pid) {
                    e.insert(p);
                }
            }
        }
    }

    /// Fill the process-tree columns of `s` (all of them, or only `rss_bytes` when
    /// `rss_only`). Processes that vanished are dropped from the tree.
    pub fn read(&mut self, s: &mut Sample, reasons: &mut Reasons, rss_only: bool, now_ns: u64) {
        let mut sums: BTreeMap<&'static str, f64> = BTreeMap::new();
        let mut add = |k: &'static str, v: f64| *sums.entry(k).or_insert(0.0) += v;
        let mut cpu_ticks: u64 = 0;
        let mut any_stat = false;
        let mut gone = Vec::new();
        for (&pid, p) in &self.members {
            let status = match p.status() {
                Ok(st) => st,
                Err(_) => {
                    gone.push(pid);
                    continue;
                }
            };
            // A zombie has no memory lines; it contributes nothing.
            if let Some(v) = status.vmrss {
                add("rss_bytes", v as f64 * KIB);
            }
            if rss_only {
                continue;
            }
            for (col, v) in [
                ("rss_anon_bytes", status.rssanon),
                ("rss_file_bytes", status.rssfile),
                ("rss_shmem_bytes", status.rssshmem),
                ("vm_hwm_bytes", status.vmhwm),
            ] {
                if let Some(v) = v {
                    add(col, v as f64 * KIB);
                }
            }
            match p.stat() {
                Ok(st) => {
                    any_stat = true;
                    // Reaped children's time arrives in cutime/cstime, so a child that
                    // exits between reads is still counted once.
                    cpu_ticks +=
                        st.utime + st.stime + st.cutime.max(0) as u64 + st.cstime.max(0) as u64;
                    add("threads", st.num_threads as f64);
                }
                Err(_) => {
                    gone.push(pid);
                    continue;
                }
            }
            match p.io() {
                Ok(io) => {
                    add("read_bytes", io.read_bytes as f64);
                    add("write_bytes", io.write_bytes as f64);
                }
                Err(e) => {
                    for c in ["read_bytes", "write_bytes"] {
                        reasons.note(c, &format!("/proc/{pid}/io: {e}"));
                    }
                }
            }
        }
        for pid in gone {
            self.members.remove(&pid);
        }
        for (k, v) in sums {
            s.set(k, Some(v));
        }
        if !rss_only && any_stat {
            if let Some((pt, pns)) = self.prev_cpu {
                let dt = now_ns.saturating_sub(pns) as f64 / 1e9;
                if dt > 0.0 {
                    // A process reparented away takes its ticks with it: clamp at 0.
                    let d = cpu_ticks.saturating_sub(pt) as f64 / self.ticks_per_second;
                    s.set("cpu_cores", Some(d / dt));
                }
            }
            self.prev_cpu = Some((cpu_ticks, now_ns));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evidence::clock::monotonic_ns;
    use std::process::{Command, Stdio};

    #[test]
    fn a_shell_and_its_children_are_one_tree() {
        // sh spawns two sleeping children and waits for them.
        let mut child = Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5 & wait"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        let mut found = HashSet::new();
        // Wait until both children have exec'd `sleep`: a child caught between fork
        // and exec is still a copy of sh whose memory is changing, and the two RSS
        // readings below would differ by more than a few pages.
        let is_sleep = |p: &i32| {
            Process::new(*p)
                .and_then(|pr| pr.stat())
                .is_ok_and(|st| st.comm == "sleep")
        };
        for _ in 0..250 {
            found = descendants(root);
            if found.len() >= 3 && found.iter().filter(|p| **p != root).all(is_sleep) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found.iter().filter(|p| **p != root).all(is_sleep),
            "{found:?}"
        );
        let mut tree = ProcessTree::new(root);
        assert_eq!(tree.pids().count(), 3);
        let mut s = Sample::empty(0);
        let mut r = Reasons::default();
        tree.read(&mut s, &mut r, false, monotonic_ns());
        let rss = s.get("rss_bytes").unwrap();
        let own: f64 = tree
            .pids()
            .map(|p| Process::new(p).unwrap().status().unwrap().vmrss.unwrap() as f64 * 1024.0)
            .sum();
        // Same processes read twice a moment apart: equal within a few pages.
        assert!((rss - own).abs() < 64.0 * 1024.0, "{rss} vs {own}");
        assert_eq!(s.get("threads"), Some(3.0));
        assert_eq!(s.get("cpu_cores"), None, "no delta on the first read");
        std::thread::sleep(std::time::Duration::from_millis(20));
        tree.read(&mut s, &mut r, false, monotonic_ns());
        let cores = s.get("cpu_cores").unwrap();
        assert!(
            (0.0..0.5).contains(&cores),
            "sleeping tree used {cores} cores"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let mut s = Sample::empty(0);
        tree.read(&mut s, &mut r, false, monotonic_ns());
        // The root is gone; its orphaned sleeps are reparented but still known.
        assert!(tree.pids().all(|p| p != root));
        for p in tree.pids().collect::<Vec<_>>() {
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }

    #[test]
    fn cpu_of_a_busy_child_is_counted() {
        let mut child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let mut tree = ProcessTree::new(child.id() as i32);
        let mut s = Sample::empty(0);
        let mut r = Reasons::default();
        tree.read(&mut s, &mut r, false, monotonic_ns());
        std::thread::sleep(std::time::Duration::from_millis(300));
        tree.read(&mut s, &mut r, false, monotonic_ns());
        let cores = s.get("cpu_cores").unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // A spinning shell on a loaded 2-core box still gets a visible share.
        assert!(
            cores > 0.05 && cores < 1.2,
            "busy loop measured {cores} cores"
        );
    }
}
