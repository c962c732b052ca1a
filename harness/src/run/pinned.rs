//! What an `--exec` engine ran, pinned: the program is run in place, as the user
//! would run it (their PATH, their interpreter, their environment), and the files
//! that decide what it does are hashed before it starts and again after it ends.
//!
//! A native engine given with `--engine` is still copied into the store under its
//! sha256 (a rebuild of the worktree cannot change it mid-campaign). An `--exec`
//! program is not: a pyenv shim dispatches on its own name, a virtual
//! environment's interpreter finds its packages next to the path it was started
//! from, a shell script's interpreter is named inside it; a copy breaks all three.
//! Instead the harness pins:
//!
//! * the program (resolved through PATH and symlinks) by sha256;
//! * the interpreter a script names on its `#!` line (`#!/usr/bin/env NAME`
//!   resolved through PATH);
//! * every argument that names an existing regular file (the script, a config);
//! * for a Python interpreter (the program or the `#!` line names `python*`):
//!   `sys.executable`, `sys.prefix`, `sys.base_prefix`, the version and a digest of
//!   the installed distributions (`name==version`, sorted), asked of the same
//!   interpreter in the same environment.
//!
//! After the engine ends the same files are hashed again (and the distributions
//! listed again); a run whose pinned inputs changed while it ran is flagged in
//! the bundle (`exec_check`) and `harness rank` does not compare it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use evidence::weights_digest::sha256_file;

/// Files larger than this are pinned by size and modification time instead of
/// hashed (a weights file named on a command line would take minutes), bytes.
pub const MAX_HASHED_BYTES: u64 = 1 << 30;

/// How long the interpreter may take to describe itself (a conda environment
/// with thousands of distributions lists them in about two seconds), seconds.
pub const DESCRIBE_TIMEOUT_S: u64 = 30;

/// One pinned file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinnedFile {
    /// `program`, `interpreter` or `argument`.
    pub role: &'static str,
    /// The path as named (on the command line, on the `#!` line, or via PATH).
    pub named: String,
    /// The file it resolves to (symlinks followed).
    pub resolved: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// Hex sha256 of its bytes; `None` above [`MAX_HASHED_BYTES`].
    pub sha256: Option<String>,
    /// Modification time, ns since the epoch (what pins a file too large to hash).
    pub mtime_ns: i128,
}

/// Everything pinned for one `--exec` run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pinned {
    /// The program, its interpreter and its file arguments, in that order.
    pub files: Vec<PinnedFile>,
    /// The Python interpreter's self-description, when the engine is Python.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<serde_json::Value>,
}

fn pin_file(role: &'static str, named: &str, path: &Path) -> Result<PinnedFile, String> {
    use std::os::unix::fs::MetadataExt;
    let resolved = path.canonicalize().map_err(|e| format!("{named}: {e}"))?;
    let md = std::fs::metadata(&resolved).map_err(|e| format!("{named}: {e}"))?;
    let sha256 = if md.len() <= MAX_HASHED_BYTES {
        Some(
            sha256_file(&resolved)
                .map_err(|e| format!("{}: cannot hash: {e}", resolved.display()))?,
        )
    } else {
        None
    };
    Ok(PinnedFile {
        role,
        named: named.to_string(),
        resolved,
        bytes: md.len(),
        sha256,
        mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
    })
}

/// The interpreter a script names on its first line (`#!/bin/sh`,
/// `#!/usr/bin/env python3 -u`), resolved through PATH for `env`.
fn shebang(program: &Path) -> Option<(String, PathBuf)> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let text = std::str::from_utf8(head[..n].strip_prefix(b"#!")?).ok()?;
    let line = text.lines().next()?;
    let mut words = line.split_whitespace();
    let first = words.next()?;
    if Path::new(first).file_name()? == "env" {
        let name = words.find(|w| !w.starts_with('-'))?;
        let p = crate::run::gate_checks::resolve_program(Path::new(name))?;
        return Some((name.to_string(), p));
    }
    Some((first.to_string(), PathBuf::from(first)))
}

fn is_python(name: &Path) -> bool {
    name.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"))
}

/// The Python snippet that describes the interpreter it runs in, as one JSON line.
const DESCRIBE_PY: &str = r#"
import sys, json, hashlib
try:
    import importlib.metadata as md
    names = sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata['Name']})
except Exception as e:
    names = [f"(cannot list: {e})"]
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix,
  "base_prefix": sys.base_prefix, "version": sys.version.split()[0],
  "distributions": len(names),
  "distributions_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest()}))
"#;

/// Ask `python` (as named: through a shim or a venv path, with the user's
/// environment) to describe itself; an error says why it could not.
pub fn describe_python(python: &Path) -> Result<serde_json::Value, String> {
    let mut child = Command::new(python)
        .args(["-c", DESCRIBE_PY])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: cannot run: {e}", python.display()))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(DESCRIBE_TIMEOUT_S);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{}: did not describe itself within {DESCRIBE_TIMEOUT_S} s",
                    python.display()
                ));
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{}: describing itself failed ({}): {}",
            python.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_str(text.trim()).map_err(|e| {
        format!(
            "{}: printed something other than JSON ({e})",
            python.display()
        )
    })
}

/// Pin the program `named` (as the user typed it), found at `path` (PATH
/// resolved, symlinks not followed), with its arguments `args` (relative paths
/// are relative to the current directory).
pub fn pin(named: &Path, path: &Path, args: &[String]) -> Result<Pinned, String> {
    let mut files = vec![pin_file("program", &named.display().to_string(), path)?];
    let interpreter = shebang(path);
    if let Some((name, p)) = &interpreter {
        if p.is_file() {
            files.push(pin_file("interpreter", name, p)?);
        }
    }
    for a in args {
        let p = Path::new(a);
        if !a.starts_with('-') && p.is_file() {
            files.push(pin_file("argument", a, p)?);
        }
    }
    let python = if is_python(path) {
        Some(describe_python(path).unwrap_or_else(|e| serde_json::json!({ "error": e })))
    } else {
        match &interpreter {
            Some((_, p)) if is_python(p) => {
                Some(describe_python(p).unwrap_or_else(|e| serde_json::json!({ "error": e })))
            }
            _ => None,
        }
    };
    Ok(Pinned { files, python })
}

impl Pinned {
    /// What differs now from when the run started: one line per changed file
    /// (or Python environment); empty when everything is as pinned.
    pub fn changes(&self, python: Option<&Path>) -> Vec<String> {
        let mut changed = Vec::new();
        for f in &self.files {
            match pin_file(f.role, &f.named, &f.resolved) {
                Ok(now)
                    if now.sha256 == f.sha256
                        && now.bytes == f.bytes
                        && (f.sha256.is_some() || now.mtime_ns == f.mtime_ns) => {}
                Ok(now) => changed.push(format!(
                    "{} {} ({}): {} bytes, sha256 {} at start; {} bytes, sha256 {} at the end",
                    f.role,
                    f.named,
                    f.resolved.display(),
                    f.bytes,
                    f.sha256.as_deref().unwrap_or("not hashed"),
                    now.bytes,
                    now.sha256.as_deref().unwrap_or("not hashed"),
                )),
                Err(e) => changed.push(format!(
                    "{} {}: gone or unreadable at the end: {e}",
                    f.role, f.named
                )),
            }
        }
        if let (Some(before), Some(py)) = (&self.python, python) {
            let key = "distributions_sha256";
            if before.get(key).is_some() {
                match describe_python(py) {
                    Ok(now) if now.get(key) == before.get(key) => {}
                    Ok(now) => changed.push(format!(
                        "python distributions: {} at start, {} at the end",
                        before[key], now[key]
                    )),
                    Err(e) => changed.push(format!("python: cannot describe it at the end: {e}")),
                }
            }
        }
        changed
    }

    /// The Python interpreter to ask again at the end, if one was described.
    pub fn python_program(&self) -> Option<PathBuf> {
        self.python.as_ref()?;
        let program = self.files.first()?;
        if is_python(Path::new(&program.named)) || is_python(&program.resolved) {
            return crate::run::gate_checks::resolve_program(Path::new(&program.named));
        }
        self.files
            .iter()
            .find(|f| f.role == "interpreter")
            .map(|f| f.resolved.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_script_its_interpreter_and_its_file_arguments_are_pinned_and_an_edit_is_seen() {
        let d = dir("pinned-script");
        let script = d.join("engine.sh");
        std::fs::write(&script, "#!/usr/bin/env sh\necho hi\n").unwrap();
        let conf = d.join("conf.txt");
        std::fs::write(&conf, "a").unwrap();
        let args = vec![
            "--flag".to_string(),
            conf.display().to_string(),
            "no-such-file".to_string(),
        ];
        let p = pin(&script, &script, &args).unwrap();
        let roles: Vec<&str> = p.files.iter().map(|f| f.role).collect();
        assert_eq!(roles, ["program", "interpreter", "argument"], "{p:?}");
        assert_eq!(p.files[1].named, "sh");
        assert!(p.python.is_none());
        assert!(p.changes(None).is_empty());
        std::fs::write(&conf, "b").unwrap();
        let changed = p.changes(None);
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(
            changed[0].starts_with("argument") && changed[0].contains("conf.txt"),
            "{changed:?}"
        );
        std::fs::remove_file(&script).unwrap();
        assert!(p.changes(None).iter().any(|c| c.contains("gone")));
    }

    #[test]
    fn shebang_lines_name_their_interpreter() {
        let d = dir("pinned-shebang");
        let f = d.join("s");
        std::fs::write(&f, "#!/bin/sh -e\n").unwrap();
        assert_eq!(shebang(&f).unwrap().0, "/bin/sh");
        std::fs::write(&f, "\u{7f}ELF....").unwrap();
        assert!(shebang(&f).is_none());
        assert!(is_python(Path::new("/x/venv/bin/python3.11")));
        assert!(!is_python(Path::new("/usr/bin/node")));
    }
}
