//! Processes that left the engine's process group: found, killed and recorded.
//!
//! The watchdog and the end of a run stop the engine with one `killpg`, which
//! misses a descendant that called `setsid` (or `setpgid`) to leave the group.
//! The harness makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so such
//! a process, orphaned when the engine exits, becomes the harness's own child
//! instead of init's; after the engine ends, every child of the harness other
//! than the engine is one of these. Each is killed, reaped and named in the
//! bundle (`escaped` fragment), and its own children, reparented in turn, too.

/// One process that had left the engine's process group (the `escaped`
/// fragment's record of it).
pub use evidence::fragments::EscapedProcess as Escaped;

/// Make this process the reaper of its orphaned descendants. False when the
/// kernel refuses (then escaped processes go to init and are not seen).
pub fn become_subreaper() -> bool {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and no pointers.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
}

/// (pid, comm, session) of every process whose parent is `parent`, read with
/// procfs as the sampler reads the engine's tree.
fn children_of(parent: i32) -> Vec<(i32, String, i32)> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter_map(|p| p.stat().ok())
        .filter(|st| st.ppid == parent)
        .map(|st| (st.pid, st.comm, st.session))
        .collect()
}

/// Kill and reap every child of this process except `engine`, repeatedly (each
/// one killed hands its own children to this process), up to `rounds` passes.
/// Only for a process whose children are the engine and what escaped it
/// (`harness run` after the engine ended).
pub fn kill_escaped(engine: i32, rounds: usize) -> Vec<Escaped> {
    kill_children(|pid| pid != engine, rounds)
}

/// Kill and reap the children of this process that `select` picks, in passes.
fn kill_children(select: impl Fn(i32) -> bool, rounds: usize) -> Vec<Escaped> {
    let me = std::process::id() as i32;
    let mut killed = Vec::new();
    for _ in 0..rounds {
        let found: Vec<_> = children_of(me)
            .into_iter()
            .filter(|(pid, _, _)| select(*pid))
            .collect();
        if found.is_empty() {
            break;
        }
        for (pid, comm, session) in found {
            // SAFETY: plain syscalls on a pid that is our own child (a zombie at
            // worst, which waitpid then reaps).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
            }
            killed.push(Escaped { pid, comm, session });
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_other_than_the_engine_is_killed_reaped_and_named() {
        // Two children of this test process: the "engine" is spared, the other
        // (standing in for an orphan handed to the subreaper) is killed.
        let mut engine = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let other_pid = other.id() as i32;
        // (Other tests' children share this process: only `other` is selected.)
        let killed = kill_children(|pid| pid == other_pid, 4);
        assert_eq!(killed.len(), 1, "{killed:?}");
        assert_eq!(killed[0].comm, "sleep");
        // Reaped already: the pid is gone (or a waitpid finds no child).
        assert!(
            other.try_wait().is_err()
                || !std::path::Path::new(&format!("/proc/{other_pid}")).exists()
        );
        assert!(engine.try_wait().unwrap().is_none(), "the engine is spared");
        engine.kill().unwrap();
        engine.wait().unwrap();
    }
}
