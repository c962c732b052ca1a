//! Starting the engine: its own process group, the marker channel on fd 3, the
//! frames directory in the environment, stdout and stderr captured; and stopping it.
//!
//! The engine leads a new process group, so the terminal's Ctrl-C reaches only the
//! harness (which decides what to do) and the watchdog can kill the engine and every
//! child it started with one `killpg`. The marker pipe's write end becomes the
//! child's fd 3 (named by `HARNESS_MARKER_FD=3`); the parent keeps only the read end,
//! so the channel reports end-of-file once every writer is gone.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use evidence::marker::{FRAMES_DIR_ENV, MARKER_FD_ENV};

/// The descriptor number the engine finds its marker channel on.
pub const MARKER_FD: i32 = 3;

/// What to start.
#[derive(Debug, Clone)]
pub struct EngineCommand {
    /// The program (already copied out to the store's bin dir).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// A started engine and the harness's ends of its channels.
pub struct Running {
    /// The child process.
    pub child: Child,
    /// Its pid, also its process group id.
    pub pid: i32,
    /// Read end of the marker channel.
    pub markers: File,
    /// Its stdout.
    pub stdout: ChildStdout,
    /// Its stderr.
    pub stderr: ChildStderr,
}

/// Start `cmd` with the marker channel and `frames_dir` in its environment.
pub fn spawn(cmd: &EngineCommand, frames_dir: &Path) -> std::io::Result<Running> {
    spawn_with_env(cmd, &[(FRAMES_DIR_ENV, frames_dir.as_os_str())])
}

/// Start `cmd` in a process group of its own with the marker channel on fd 3
/// (`HARNESS_MARKER_FD=3`), stdout and stderr piped, stdin empty, and `env` added
/// to its environment: what [`spawn`] does for a render, and `harness control`
/// for `engine burn`.
pub fn spawn_with_env(
    cmd: &EngineCommand,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::io::Result<Running> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here exactly once.
    let (read_end, write_end) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let w = fds[1];
    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .env(MARKER_FD_ENV, MARKER_FD.to_string())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (dup2, fcntl).
    unsafe {
        command.pre_exec(move || {
            if w == MARKER_FD {
                // Already in place: only clear close-on-exec.
                if libc::fcntl(w, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(w, MARKER_FD) < 0 {
                // dup2 gives the new descriptor no close-on-exec flag.
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = crate::text_busy::retry_while_text_busy(|| command.spawn())?;
    // The parent must not hold a writer, or the channel never reaches end-of-file.
    drop(write_end);
    let pid = child.id() as i32;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("child has no stdout/stderr pipes"));
    };
    Ok(Running {
        child,
        pid,
        markers: read_end,
        stdout,
        stderr,
    })
}

/// Whether process `pid` (a child of this process) has ended, without reaping it,
/// so its pid (and process group id) stays reserved until [`reap`].
pub fn has_exited(pid: i32) -> bool {
    // SAFETY: an all-zero siginfo_t is valid for waitid to overwrite.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid with WNOWAIT only inspects the child's state.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if rc != 0 {
        // ECHILD: already reaped (or never ours); either way it is not running.
        return true;
    }
    // SAFETY: after a successful waitid, si_pid is the field it sets (0 if none).
    unsafe { info.si_pid() != 0 }
}

/// Wait until `pid` ends or `timeout` passes; true if it ended.
pub fn wait_exited(pid: i32, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if has_exited(pid) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reap the child and return its status.
pub fn reap(child: &mut Child) -> std::io::Result<ExitStatus> {
    child.wait()
}

/// Stop the engine's group: SIGTERM, then SIGKILL if it is still alive after
/// `grace`. Returns the signal that was last sent.
pub fn terminate(pid: i32, grace: Duration) -> i32 {
    crate::sampler::kill_group(pid, libc::SIGTERM);
    if wait_exited(pid, grace) {
        return libc::SIGTERM;
    }
    crate::sampler::kill_group(pid, libc::SIGKILL);
    libc::SIGKILL
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn the_child_writes_markers_on_fd3_and_sees_its_environment() {
        let cmd = EngineCommand {
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "echo \"fd=$HARNESS_MARKER_FD dir=$HARNESS_FRAMES_DIR\" >&3; echo out; echo err >&2; \
                 [ \"$(ps -o pgid= -p $$ | tr -d ' ')\" = \"$$\" ] && echo leader >&3"
                    .into(),
            ],
        };
        let mut r = spawn(&cmd, Path::new("/some/frames")).unwrap();
        let mut m = String::new();
        r.markers.read_to_string(&mut m).unwrap();
        let mut o = String::new();
        r.stdout.read_to_string(&mut o).unwrap();
        let mut e = String::new();
        r.stderr.read_to_string(&mut e).unwrap();
        assert!(reap(&mut r.child).unwrap().success());
        assert_eq!(m, "fd=3 dir=/some/frames\nleader\n");
        assert_eq!((o.as_str(), e.as_str()), ("out\n", "err\n"));
    }

    #[test]
    fn exit_is_seen_without_reaping_and_terminate_escalates() {
        let cmd = EngineCommand {
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "trap '' TERM; sleep 30 & wait; sleep 30".into(),
            ],
        };
        let mut r = spawn(&cmd, Path::new("/x")).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!has_exited(r.pid));
        // SIGTERM is ignored by the shell (its sleep dies of it, the shell goes on).
        let sent = terminate(r.pid, Duration::from_millis(300));
        assert_eq!(sent, libc::SIGKILL);
        assert!(wait_exited(r.pid, Duration::from_secs(5)));
        // Still reapable: has_exited did not reap it.
        let st = reap(&mut r.child).unwrap();
        assert_eq!(st.signal(), Some(libc::SIGKILL));
    }
}
