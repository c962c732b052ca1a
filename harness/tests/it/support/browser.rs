//! Headless Chromium for the report's page test: finding it, and running it on a
//! page with a deadline.
//!
//! The browser is `$HARNESS_TEST_CHROMIUM`, else Debian's `/usr/bin/chromium`
//! (`scripts/chromium.sh`, which `just test` runs, installs it where it is missing
//! and it runs as root). Where there is none, the test FAILS saying so, unless
//! `HARNESS_NO_CHROMIUM=1` declares the machine unable (`just test` sets it when
//! the script could not install the browser), in which case the test writes a
//! NOT RUN line straight to stderr (past the test harness's capture) and returns.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's chromium package's launcher.
pub const DEBIAN_CHROMIUM: &str = "/usr/bin/chromium";

/// The browser, or None (after saying NOT RUN loudly) where the machine is
/// declared unable; panics where it is missing and not declared.
pub fn chromium(test: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HARNESS_TEST_CHROMIUM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "HARNESS_TEST_CHROMIUM={}: no such file",
            p.display()
        );
        return Some(p);
    }
    let p = PathBuf::from(DEBIAN_CHROMIUM);
    if p.is_file() {
        return Some(p);
    }
    if std::env::var_os("HARNESS_NO_CHROMIUM").is_some_and(|v| !v.is_empty()) {
        // Straight to the process's stderr: libtest captures eprintln! of a
        // passing test, and a skipped browser check must not pass quietly.
        let _ = writeln!(
            std::io::stderr(),
            "\n*** {test}: browser check NOT RUN: no {DEBIAN_CHROMIUM} and HARNESS_NO_CHROMIUM is set \
             (scripts/chromium.sh installs it as root) ***\n"
        );
        return None;
    }
    panic!(
        "no headless browser at {DEBIAN_CHROMIUM}: run `just test` (scripts/chromium.sh installs \
         Debian's chromium as root) or `apt-get install chromium`, or set HARNESS_TEST_CHROMIUM; \
         set HARNESS_NO_CHROMIUM=1 only where a browser cannot be installed"
    );
}

/// What one browser run left: exit code, stdout, stderr.
#[derive(Debug)]
pub struct BrowserRun {
    /// The exit code (-1 when killed).
    pub code: i32,
    /// Standard output (the DOM for `--dump-dom`).
    pub stdout: String,
    /// Standard error (with `--enable-logging=stderr`, every console message).
    pub stderr: String,
}

/// Run `browser` headless on `url` with `args`, a profile of its own under
/// `profile`, and console messages logged to stderr; killed after `limit`.
pub fn headless(
    browser: &Path,
    profile: &Path,
    url: &str,
    args: &[String],
    limit: Duration,
) -> BrowserRun {
    let _ = std::fs::remove_dir_all(profile);
    std::fs::create_dir_all(profile).expect("create the browser profile directory");
    let dir = profile.parent().unwrap_or(profile);
    let (out, err) = (dir.join("browser.stdout"), dir.join("browser.stderr"));
    let mut child = Command::new(browser)
        .args([
            "--headless",
            // Root (CI) cannot use the sandbox; nothing but local files is opened.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("create the stdout file"))
        .stderr(std::fs::File::create(&err).expect("create the stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", browser.display()));
    let start = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait for the browser") {
            break st.code().unwrap_or(-1);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} on {url} ran past {limit:?}", browser.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    BrowserRun {
        code,
        stdout: read(&out),
        stderr: read(&err),
    }
}

/// The console messages in a browser's stderr (`...:CONSOLE:...] "text", source: ...`).
pub fn console_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(":CONSOLE")).collect()
}
