//! The files `harness report` writes beside its page: every bundle's timeline as
//! SVG (through [`crate::formats::plot`], what `harness plot --out F.svg` writes)
//! under `timelines/`, and every pair's `harness diff` (through [`crate::diff`]) as
//! an HTML page under `diffs/`. A bundle whose timeline or diff cannot be made is
//! not fatal: the page names the reason instead of a link.
//!
//! File names are the bundle ids where an id is a plain name (hex, as the store
//! makes them); any other id (a hand-made store can hold anything) is replaced by
//! a hash of it, so no id can name a path outside the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::bundle::facts::Bundle;
use crate::bundle::manifest;
use crate::diff::{diff, markdown::markdown};
use crate::formats::forest::xml_escape;
use crate::formats::plot::Svg;
use crate::formats::Format;
use crate::rank::Ranking;
use crate::short_id::short;
use crate::timeline::Timeline;

/// Directory of the timelines, relative to the report.
pub const TIMELINES: &str = "timelines";
/// Directory of the diffs, relative to the report.
pub const DIFFS: &str = "diffs";
/// Width of the timeline pictures, pixels.
pub const TIMELINE_WIDTH: u32 = 1400;

/// What was written: relative links, or why there is none.
#[derive(Debug, Default)]
pub struct Artifacts {
    /// Bundle id -> its timeline (`timelines/<id>.svg`) or the reason it has none.
    pub timelines: BTreeMap<String, Result<String, String>>,
    /// (baseline id, treatment id) -> the diff page or the reason it has none.
    pub diffs: BTreeMap<(String, String), Result<String, String>>,
}

impl Artifacts {
    /// The timeline link of `id`, or why there is none.
    pub fn timeline(&self, id: &str) -> Result<&str, &str> {
        match self.timelines.get(id) {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => Err(e),
            None => Err("no bundle directory with this id in the store"),
        }
    }

    /// The diff link of a pair, or why there is none.
    pub fn diff(&self, a: &str, b: &str) -> Result<&str, &str> {
        match self.diffs.get(&(a.to_string(), b.to_string())) {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => Err(e),
            None => Err("not generated"),
        }
    }
}

/// A file-name stem for `id`: the id itself when it is a plain name of at most 100
/// ASCII letters, digits, `-` and `_`, else `id-` and 32 hex digits of its sha256.
pub fn file_stem(id: &str) -> String {
    let plain = !id.is_empty()
        && id.len() <= 100
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        id.to_string()
    } else {
        let h = format!("{:x}", Sha256::digest(id.as_bytes()));
        format!("id-{}", &h[..32])
    }
}

/// Write the timelines of every bundle in `dirs` (id -> directory) and the diff of
/// every pair of `r` into `out`. An I/O error writing is an error; a bundle that
/// cannot be drawn or compared is recorded with its reason.
pub fn write(
    out: &Path,
    r: &Ranking,
    dirs: &BTreeMap<String, PathBuf>,
    bundles: &[Bundle],
) -> anyhow::Result<Artifacts> {
    let mut a = Artifacts::default();
    let tdir = out.join(TIMELINES);
    std::fs::create_dir_all(&tdir).with_context(|| format!("creating {}", tdir.display()))?;
    for (id, dir) in dirs {
        let rel = format!("{TIMELINES}/{}.svg", file_stem(id));
        let made = Timeline::load(dir).and_then(|t| {
            Svg {
                width: TIMELINE_WIDTH,
            }
            .encode(&t)
        });
        let entry = match made {
            Ok(bytes) => {
                let file = out.join(&rel);
                std::fs::write(&file, bytes)
                    .with_context(|| format!("writing {}", file.display()))?;
                Ok(rel)
            }
            Err(e) => Err(format!("no timeline: {e:#}")),
        };
        a.timelines.insert(id.clone(), entry);
    }
    let ddir = out.join(DIFFS);
    std::fs::create_dir_all(&ddir).with_context(|| format!("creating {}", ddir.display()))?;
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            for p in &x.rounds {
                let key = (p.baseline_id.clone(), p.treatment_id.clone());
                if a.diffs.contains_key(&key) {
                    continue;
                }
                let rel = format!(
                    "{DIFFS}/{}_vs_{}.html",
                    file_stem(&key.0),
                    file_stem(&key.1)
                );
                let entry = match diff_page(&key.0, &key.1, dirs, bundles, &a) {
                    Ok(html) => {
                        let file = out.join(&rel);
                        std::fs::write(&file, html)
                            .with_context(|| format!("writing {}", file.display()))?;
                        Ok(rel)
                    }
                    Err(e) => Err(format!("no diff: {e}")),
                };
                a.diffs.insert(key, entry);
            }
        }
    }
    Ok(a)
}

/// The diff of bundles `a` and `b` as a self-contained HTML page (the markdown of
/// `harness diff A B`, preformatted, with links to both timelines).
fn diff_page(
    a: &str,
    b: &str,
    dirs: &BTreeMap<String, PathBuf>,
    bundles: &[Bundle],
    art: &Artifacts,
) -> Result<String, String> {
    let find = |id: &str| -> Result<(&Bundle, serde_json::Value), String> {
        let bundle = bundles
            .iter()
            .find(|x| x.id == id)
            .ok_or_else(|| format!("{id} was not loaded"))?;
        let dir = dirs
            .get(id)
            .ok_or_else(|| format!("{id}: no bundle directory"))?;
        let m = manifest::read_json(dir).map_err(|e| e.to_string())?;
        Ok((bundle, m))
    };
    let (ba, ma) = find(a)?;
    let (bb, mb) = find(b)?;
    let text = markdown(&diff(ba, &ma, bb, &mb));
    let mut o = String::new();
    let link = |id: &str| match art.timeline(id) {
        Ok(p) => format!(
            r#"<a href="../{}">timeline of {}</a>"#,
            xml_escape(p),
            xml_escape(short(id))
        ),
        Err(e) => format!("{}: {}", xml_escape(short(id)), xml_escape(e)),
    };
    // Writing into a String cannot fail.
    let _ = write!(
        o,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>harness diff {sa} {sb}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;color:#1a1a1a}}pre{{font-size:13px;line-height:1.35;white-space:pre;overflow-x:auto;background:#f7f7f7;padding:1em;border:1px solid #ddd}}</style>
</head>
<body>
<p><a href="../index.html">back to the report</a> · A (baseline): {la} · B (treatment): {lb}</p>
<h1>harness diff {sa} {sb}</h1>
<pre>{text}</pre>
</body>
</html>
"#,
        sa = xml_escape(short(a)),
        sb = xml_escape(short(b)),
        la = link(a),
        lb = link(b),
        text = xml_escape(&text),
    );
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_are_not_plain_names_never_become_paths() {
        let hex = "ab".repeat(32);
        assert_eq!(file_stem(&hex), hex);
        for bad in ["../../etc", "a/b", "", "x y", "é", &"a".repeat(101)] {
            let s = file_stem(bad);
            assert!(s.starts_with("id-") && s.len() == 35, "{bad:?} -> {s}");
        }
        assert_ne!(file_stem("a/b"), file_stem("a/c"));
    }
}
