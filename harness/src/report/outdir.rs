//! The `--out` directory of `harness report`: made whole in a staging directory
//! beside it and swapped in at the end, and never written over unless an earlier
//! `harness report` made it (its [`MARKER`] file says so).
//!
//! Rules: a missing or empty `--out` is created; one holding the marker is replaced
//! whole; anything else (a file, or a directory with other contents) is refused
//! with an input error (exit 2) naming the path, and nothing is written.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::exit::UsageError;

/// The file that marks a directory as made by `harness report`.
pub const MARKER: &str = ".harness-report";

/// The marker's contents (fixed, so the directory's bytes depend on the store only).
pub const MARKER_TEXT: &str =
    "This directory was made by `harness report`; the next run replaces it whole.\n";

/// A staging directory being filled, to become `out` on [`Staging::commit`]; dropped
/// without a commit, it is removed.
#[derive(Debug)]
pub struct Staging {
    /// Where the files are written until the commit.
    pub dir: PathBuf,
    out: PathBuf,
    committed: bool,
}

/// Check that `out` may be written and open a staging directory beside it.
pub fn prepare(out: &Path) -> anyhow::Result<Staging> {
    let name = out
        .file_name()
        .ok_or_else(|| UsageError(format!("--out {}: not a directory name", out.display())))?
        .to_string_lossy()
        .into_owned();
    check_writable(out)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let dir = parent.join(format!(".{name}.report-new.{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(MARKER), MARKER_TEXT)
        .with_context(|| format!("writing {}", dir.join(MARKER).display()))?;
    Ok(Staging {
        dir,
        out: out.to_path_buf(),
        committed: false,
    })
}

/// Refuse `out` unless it is missing, an empty directory, or marked as ours.
fn check_writable(out: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
    };
    if !meta.is_dir() {
        return Err(UsageError(format!(
            "--out {}: exists and is not a directory; refusing to overwrite it",
            out.display()
        ))
        .into());
    }
    let mut entries =
        std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))?;
    let empty = entries.next().is_none();
    if empty || out.join(MARKER).is_file() {
        return Ok(());
    }
    Err(UsageError(format!(
        "--out {}: not empty and not made by `harness report` (no {MARKER} file in it); \
         refusing to overwrite it: name a new or empty directory",
        out.display()
    ))
    .into())
}

impl Staging {
    /// Put the staged directory in place of `out` (the old one, ours by the marker,
    /// is moved aside first and then removed).
    pub fn commit(mut self) -> anyhow::Result<PathBuf> {
        // Checked again: another process may have filled `out` meanwhile.
        check_writable(&self.out)?;
        let aside = self.dir.with_file_name(format!(
            ".{}.report-old.{}",
            self.out
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        let had_old = self.out.exists();
        if had_old {
            std::fs::rename(&self.out, &aside).with_context(|| {
                format!("moving {} aside to {}", self.out.display(), aside.display())
            })?;
        }
        if let Err(e) = std::fs::rename(&self.dir, &self.out) {
            if had_old {
                // Put the old report back rather than leave nothing.
                let _ = std::fs::rename(&aside, &self.out);
            }
            return Err(e).with_context(|| {
                format!("renaming {} to {}", self.dir.display(), self.out.display())
            });
        }
        self.committed = true;
        if had_old {
            std::fs::remove_dir_all(&aside)
                .with_context(|| format!("removing the old report {}", aside.display()))?;
        }
        Ok(self.out.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        crate::test_kit::scratch(&format!("outdir-{name}"))
    }

    #[test]
    fn a_foreign_directory_is_refused_and_ours_is_replaced() {
        let d = scratch("outdir");
        let out = d.join("report");
        // Missing: created.
        let s = prepare(&out).expect("prepare");
        std::fs::write(s.dir.join("index.html"), "one").expect("write");
        s.commit().expect("commit");
        assert_eq!(
            std::fs::read_to_string(out.join("index.html")).ok(),
            Some("one".into())
        );
        // Ours: replaced whole.
        let s = prepare(&out).expect("prepare again");
        std::fs::write(s.dir.join("other.html"), "two").expect("write");
        s.commit().expect("commit again");
        assert!(!out.join("index.html").exists());
        assert!(out.join("other.html").is_file() && out.join(MARKER).is_file());
        // Foreign: refused, naming the path, with nothing left behind.
        let foreign = d.join("notes");
        std::fs::create_dir_all(&foreign).expect("mkdir");
        std::fs::write(foreign.join("mine.txt"), "keep").expect("write");
        let err = prepare(&foreign).expect_err("foreign dir");
        assert!(err.is::<UsageError>(), "{err:#}");
        assert!(
            err.to_string().contains(&foreign.display().to_string()),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(foreign.join("mine.txt")).ok(),
            Some("keep".into())
        );
        let file = d.join("file");
        std::fs::write(&file, "x").expect("write");
        assert!(prepare(&file).expect_err("a file").is::<UsageError>());
        // A dropped staging directory leaves nothing behind.
        let s = prepare(&d.join("dropped")).expect("prepare");
        let staged = s.dir.clone();
        drop(s);
        assert!(!staged.exists() && !d.join("dropped").exists());
        // Empty: used.
        let empty = d.join("empty");
        std::fs::create_dir_all(&empty).expect("mkdir");
        prepare(&empty)
            .expect("empty dir")
            .commit()
            .expect("commit");
        assert!(empty.join(MARKER).is_file());
    }
}
