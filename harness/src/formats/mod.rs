//! Every output format, one file per format:
//!
//! * a ranking ([`crate::rank::Ranking`]): [`markdown`], the lever table
//!   (`reports/levers.md`); [`forest`], the forest plot SVG beside it; [`html`],
//!   the `harness report` page; [`ranking_text`], the numbers and sentences they
//!   print alike;
//! * a bundle's timeline, behind [`Format`]: [`perfetto`], Trace Event JSON for the
//!   Perfetto UI (`harness export --perfetto`); [`plot`], the timeline picture as
//!   PNG or SVG (`harness plot`), its PNG text drawn by [`glyphs`].
//!
//! Every timeline format encodes a [`Timeline`] into bytes; [`write_file`] lands
//! them, [`write_timeline`] both.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

use crate::timeline::Timeline;

pub mod forest;
pub mod glyphs;
pub mod html;
pub mod markdown;
pub mod perfetto;
pub mod plot;
pub mod ranking_text;

/// One way of writing a bundle's timeline to a file.
pub trait Format {
    /// The format's name in messages (`perfetto`, `png`, `svg`).
    fn name(&self) -> &'static str;
    /// The file extension it is written with, without the dot.
    fn extension(&self) -> &'static str;
    /// Encode `t`. Deterministic: the same bundle gives the same bytes.
    fn encode(&self, t: &Timeline) -> anyhow::Result<Vec<u8>>;
}

/// Whether `out` names standard output (`--out -`).
pub fn is_stdout(out: &Path) -> bool {
    out == Path::new("-")
}

/// The default output path of `format` for bundle `id`: `<first 12 hex of id>.<suffix>`
/// in the working directory.
pub fn default_out(id: &str, suffix: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("{}.{suffix}", crate::short_id::short(id)))
}

/// Write `bytes` to `out` through a temporary file in the same directory and a
/// rename, so a reader never sees half a file. An existing file at `out` is
/// replaced (these outputs are derived from a bundle and can be made again).
///
/// `-` writes the bytes to standard output instead ([`is_stdout`]).
pub fn write_file(out: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if is_stdout(out) {
        let mut so = std::io::stdout().lock();
        so.write_all(bytes)
            .and_then(|()| so.flush())
            .context("writing to standard output")?;
        return Ok(());
    }
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = out
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("{}: not a file name", out.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> anyhow::Result<()> {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
        std::fs::rename(&tmp, out)
            .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Encode `t` in `format`, write it to `out` (`-`: standard output) and say so
/// (on standard error when standard output holds the file); returns exit 0.
pub fn write_timeline(t: &Timeline, format: &dyn Format, out: &Path) -> anyhow::Result<u8> {
    let bytes = format.encode(t)?;
    write_file(out, &bytes)?;
    let said = format!(
        "wrote {} ({} {}, {} bytes) for bundle {}",
        if is_stdout(out) {
            "standard output".to_string()
        } else {
            out.display().to_string()
        },
        format.name(),
        format.extension(),
        bytes.len(),
        t.id
    );
    // With `--out -` standard output holds the file alone.
    if is_stdout(out) {
        eprintln!("{said}");
    } else {
        println!("{said}");
    }
    Ok(crate::exit::OK)
}
