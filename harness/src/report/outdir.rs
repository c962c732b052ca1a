//! The `--out` directory of `harness report`: made whole in a staging directory
//! beside it and swapped in at the end, and never written over unless an earlier
//! `harness report` made it, which its [`MARKER`] file proves.
//!
//! The marker lists every file the report wrote, each with its size and
//! sha256 ([`marker_text`]), and is written last. Rules: a missing or empty
//! `--out` is created; one whose marker has our header and lists exactly what
//! is in it (every file there listed, at its size and sha256; no link, no
//! other kind of entry; directories only where listed files live) is
//! replaced whole; anything else (a file, a directory with other contents, a
//! marker that does not account for it, a file edited since) is refused with an
//! input error (exit 2) naming the path, and nothing in it is touched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::exit::UsageError;

/// The file that marks a directory as made by `harness report`.
pub const MARKER: &str = ".harness-report";

/// The marker's first line; every further line is `<sha256> <bytes> <path>`
/// for one file the report wrote (paths relative, `/`-separated, sorted).
pub const MARKER_HEADER: &str =
    "harness report 1: these files were written by `harness report`; the next run replaces them";

/// The most a marker may hold that is read to check it: 16 MiB.
const MAX_MARKER_BYTES: u64 = 16 << 20;

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
    Ok(Staging {
        dir,
        out: out.to_path_buf(),
        committed: false,
    })
}

/// The sha256 (hex) of the file at `path`, streamed through a fixed buffer.
fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(evidence::manifest::hex(&h.finalize()))
}

/// Every entry under `dir` by its relative path (`/`-separated): `Some((bytes,
/// sha256))` for a regular file, `None` for a directory. A link or any other
/// kind of entry is an error naming it.
fn walk(dir: &Path) -> anyhow::Result<BTreeMap<String, Option<(u64, String)>>> {
    fn go(
        base: &Path,
        rel: &str,
        out: &mut BTreeMap<String, Option<(u64, String)>>,
    ) -> anyhow::Result<()> {
        let here = if rel.is_empty() {
            base.to_path_buf()
        } else {
            base.join(rel)
        };
        for e in std::fs::read_dir(&here).with_context(|| format!("listing {}", here.display()))? {
            let e = e.with_context(|| format!("listing {}", here.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let md = std::fs::symlink_metadata(e.path())
                .with_context(|| format!("reading {}", e.path().display()))?;
            if md.is_dir() {
                out.insert(r.clone(), None);
                go(base, &r, out)?;
            } else if md.is_file() {
                let sha = sha256_file(&e.path())
                    .with_context(|| format!("reading {}", e.path().display()))?;
                out.insert(r, Some((md.len(), sha)));
            } else {
                return Err(UsageError(format!(
                    "{}: a link or special file, which `harness report` never writes",
                    e.path().display()
                ))
                .into());
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    go(dir, "", &mut out)?;
    Ok(out)
}

/// The marker for the directory `dir` as it now is: the header, then one line
/// per file (the marker itself left out).
pub fn marker_text(dir: &Path) -> anyhow::Result<String> {
    let mut text = format!("{MARKER_HEADER}\n");
    for (rel, entry) in walk(dir)? {
        if let (Some((bytes, sha)), false) = (entry, rel == MARKER) {
            text.push_str(&format!("{sha} {bytes} {rel}\n"));
        }
    }
    Ok(text)
}

/// The files the marker of `out` lists (path -> (bytes, sha256)), or why it
/// proves nothing.
fn listed(out: &Path) -> Result<BTreeMap<String, (u64, String)>, String> {
    let path = out.join(MARKER);
    let md = std::fs::symlink_metadata(&path).map_err(|_| format!("no {MARKER} file in it"))?;
    if !md.is_file() || md.len() > MAX_MARKER_BYTES {
        return Err(format!("{MARKER} is not a marker `harness report` wrote"));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{MARKER} is not a marker `harness report` wrote ({e})"))?;
    let mut lines = text.lines();
    if lines.next() != Some(MARKER_HEADER) {
        return Err(format!(
            "{MARKER} is not a marker `harness report` wrote (its first line is not the header)"
        ));
    }
    let mut files = BTreeMap::new();
    for l in lines {
        let mut parts = l.splitn(3, ' ');
        let (Some(sha), Some(bytes), Some(rel)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("{MARKER}: a malformed line {l:?}"));
        };
        let bytes: u64 = bytes
            .parse()
            .map_err(|_| format!("{MARKER}: a malformed line {l:?}"))?;
        files.insert(rel.to_string(), (bytes, sha.to_string()));
    }
    Ok(files)
}

/// Refuse `out` unless it is missing, an empty directory, or holds exactly
/// what its marker says an earlier `harness report` wrote.
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
    if entries.next().is_none() {
        return Ok(());
    }
    let refuse = |why: String| -> anyhow::Error {
        UsageError(format!(
            "--out {}: not made by `harness report` as it is now: {why}; refusing to \
             overwrite it (nothing in it was touched): name a new or empty directory",
            out.display()
        ))
        .into()
    };
    let files = listed(out).map_err(refuse)?;
    for (rel, entry) in walk(out).map_err(|e| refuse(format!("{e:#}")))? {
        match entry {
            _ if rel == MARKER => {}
            // A directory is ours only if a listed file lives in it.
            None if files.keys().any(|f| f.starts_with(&format!("{rel}/"))) => {}
            None => return Err(refuse(format!("{rel}/ is not listed in {MARKER}"))),
            Some(got) => match files.get(&rel) {
                Some(want) if *want == got => {}
                Some(_) => {
                    return Err(refuse(format!(
                        "{rel} changed since `harness report` wrote it (size or sha256)"
                    )))
                }
                None => return Err(refuse(format!("{rel} is not listed in {MARKER}"))),
            },
        }
    }
    Ok(())
}

impl Staging {
    /// Put the staged directory in place of `out` (the old one, ours by the marker,
    /// is moved aside first and then removed). The marker listing every staged
    /// file is written here, last.
    pub fn commit(mut self) -> anyhow::Result<PathBuf> {
        let marker = marker_text(&self.dir)?;
        let mpath = self.dir.join(MARKER);
        std::fs::write(&mpath, marker).with_context(|| format!("writing {}", mpath.display()))?;
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

    #[test]
    fn a_marker_proves_only_the_files_it_lists_as_they_were_written() {
        let d = scratch("outdir-marker");
        // The case: any marker (even empty) beside a file of the user's.
        let out = d.join("planted");
        std::fs::create_dir_all(&out).expect("mkdir");
        std::fs::write(out.join("precious.txt"), "x").expect("write");
        std::fs::write(out.join(MARKER), "").expect("write");
        let err = prepare(&out).expect_err("an empty marker proves nothing");
        assert!(err.is::<UsageError>(), "{err:#}");
        assert!(out.join("precious.txt").is_file());
        // A report of ours, then a file of the user's added to it: refused by name.
        let ours = d.join("ours");
        let s = prepare(&ours).expect("prepare");
        std::fs::create_dir_all(s.dir.join("diffs")).expect("mkdir");
        std::fs::write(s.dir.join("diffs/a.html"), "a").expect("write");
        s.commit().expect("commit");
        std::fs::write(ours.join("diffs/notes.txt"), "mine").expect("write");
        let err = prepare(&ours).expect_err("an unlisted file");
        assert!(err.to_string().contains("diffs/notes.txt"), "{err}");
        std::fs::remove_file(ours.join("diffs/notes.txt")).expect("rm");
        // A file of ours edited since: refused, kept.
        std::fs::write(ours.join("diffs/a.html"), "edited").expect("write");
        let err = prepare(&ours).expect_err("an edited file");
        assert!(err.to_string().contains("diffs/a.html"), "{err}");
        assert_eq!(
            std::fs::read_to_string(ours.join("diffs/a.html")).ok(),
            Some("edited".into())
        );
        // A link where a file was: refused.
        std::fs::remove_file(ours.join("diffs/a.html")).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", ours.join("diffs/a.html")).expect("ln");
        assert!(prepare(&ours).expect_err("a link").is::<UsageError>());
        std::fs::remove_file(ours.join("diffs/a.html")).expect("rm");
        std::fs::write(ours.join("diffs/a.html"), "a").expect("write");
        // As written: replaced.
        prepare(&ours)
            .expect("ours again")
            .commit()
            .expect("commit");
        assert!(!ours.join("diffs").exists());
    }
}
