//! The run's weights: which directory, its files and its digest, and synthesizing
//! deterministic weights into the store's cache when a rung names none.
//!
//! The digest (`evidence/src/weights_digest.rs`, which the engine computes too) is
//! `sha256:` + the hex sha256 of the lines
//! `"<sha256 hex of file>  <relative path>\n"` (the `sha256sum` format) of every
//! regular file except the root `DIGEST`, sorted by path bytes. A directory whose
//! `DIGEST` file exists is complete; its digest is read from that file instead of
//! re-hashing (hashing would read every byte and warm the page cache the run is
//! about to measure).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use evidence::weights_digest::DIGEST_FILE;

/// A weights problem, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The directory or its DIGEST is not what is expected.
    #[error("{path}: {why}")]
    Invalid {
        /// The path involved.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One weight file (the `weights` fragment's record of it).
pub use evidence::fragments::WeightFile;

/// The weights a run uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// The directory (or the single file's parent directory).
    pub dir: PathBuf,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Where the digest came from (`DIGEST file` or `computed`).
    pub digest_source: &'static str,
    /// Every file, sorted by path.
    pub files: Vec<WeightFile>,
    /// Whether the harness synthesized these weights.
    pub synthesized: bool,
}

impl Weights {
    /// Absolute paths of the files (for page-cache residency).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| self.dir.join(&f.path)).collect()
    }

    /// The `weights` manifest fragment.
    pub fn fragment(&self) -> evidence::fragments::Weights {
        evidence::fragments::Weights {
            digest: Some(self.digest.clone()),
            digest_source: Some(self.digest_source.to_string()),
            dir: Some(self.dir.clone()),
            files: Some(self.files.clone()),
            synthesized: Some(self.synthesized),
            rest: serde_json::Map::new(),
        }
    }
}

/// Every regular file under `dir` except the root `DIGEST`, sorted by path bytes.
pub fn list_files(dir: &Path) -> Result<Vec<WeightFile>, WeightsError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<WeightFile>) -> Result<(), WeightsError> {
        for e in std::fs::read_dir(dir).map_err(io(dir))? {
            let e = e.map_err(io(dir))?;
            let p = e.path();
            let meta = std::fs::metadata(&p).map_err(io(&p))?;
            if meta.is_dir() {
                walk(root, &p, out)?;
            } else if meta.is_file() && !(dir == root && e.file_name() == DIGEST_FILE) {
                let rel = p.strip_prefix(root).unwrap_or(&p);
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(WeightFile {
                    path: parts.join("/"),
                    bytes: meta.len(),
                });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    Ok(out)
}

/// Hex sha256 of a file's bytes.
pub fn sha256_file(path: &Path) -> Result<String, WeightsError> {
    evidence::weights_digest::sha256_file(path).map_err(io(path))
}

/// The digest of `dir`, computed by hashing every file.
pub fn compute_digest(dir: &Path, files: &[WeightFile]) -> Result<String, WeightsError> {
    let sums = files
        .iter()
        .map(|f| Ok((f.path.clone(), sha256_file(&dir.join(&f.path))?)))
        .collect::<Result<Vec<(String, String)>, WeightsError>>()?;
    Ok(evidence::weights_digest::digest_of(
        sums.iter().map(|(p, s)| (p.as_str(), s.as_str())),
    ))
}

/// The digest in `dir/DIGEST`, when the file exists; an error when it exists but
/// does not hold `sha256:<64 hex>`.
pub fn read_digest_file(dir: &Path) -> Result<Option<String>, WeightsError> {
    let p = dir.join(DIGEST_FILE);
    match std::fs::read_to_string(&p) {
        Ok(text) => match evidence::weights_digest::parse_digest(&text) {
            Some(d) => Ok(Some(d)),
            None => Err(WeightsError::Invalid {
                path: p,
                why: format!("expected 'sha256:<64 hex digits>', found {:?}", text.trim()),
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&p)(e)),
    }
}

/// Describe the weights at `dir` (a directory, or a single file).
pub fn describe(dir: &Path, synthesized: bool) -> Result<Weights, WeightsError> {
    let meta = std::fs::metadata(dir).map_err(io(dir))?;
    if meta.is_file() {
        let parent = dir.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let files = vec![WeightFile {
            path: name,
            bytes: meta.len(),
        }];
        let digest = compute_digest(&parent, &files)?;
        return Ok(Weights {
            dir: parent,
            digest,
            digest_source: "computed",
            files,
            synthesized,
        });
    }
    let files = list_files(dir)?;
    if files.is_empty() {
        return Err(WeightsError::Invalid {
            path: dir.to_path_buf(),
            why: "holds no files".into(),
        });
    }
    let (digest, digest_source) = match read_digest_file(dir)? {
        Some(d) => (d, "DIGEST file"),
        None => (compute_digest(dir, &files)?, "computed"),
    };
    Ok(Weights {
        dir: dir.to_path_buf(),
        digest,
        digest_source,
        files,
        synthesized,
    })
}

/// Whether `preset` is safe as a directory name.
fn valid_preset(preset: &str) -> bool {
    !preset.is_empty()
        && preset.len() <= 64
        && !preset.starts_with('.')
        && preset
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Synthesized weights for `preset` in `cache/weights/<preset>`, made once with
/// `engine synth-weights` into a temporary name inside the cache and renamed into
/// place once its `DIGEST` exists; a complete directory is reused as it is.
pub fn synthesize(engine: &Path, preset: &str, cache: &Path) -> Result<Weights, WeightsError> {
    let root = cache.join("weights");
    if !valid_preset(preset) {
        return Err(WeightsError::Invalid {
            path: root,
            why: format!("preset {preset:?} is not a plain name of [A-Za-z0-9._-]"),
        });
    }
    let target = root.join(preset);
    if target.join(DIGEST_FILE).is_file() {
        return describe(&target, true);
    }
    std::fs::create_dir_all(&root).map_err(io(&root))?;
    let tmp = root.join(format!(
        ".{preset}.partial-{}-{}",
        std::process::id(),
        evidence::clock::monotonic_ns()
    ));
    let mut command = Command::new(engine);
    command
        .args(["synth-weights", "--preset", preset, "--out"])
        .arg(&tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        crate::text_busy::retry_while_text_busy(|| command.spawn()).map_err(io(engine))?;
    // The engine's stderr is echoed as it comes (synthesis takes a minute at
    // ltxv-13b) and its last line kept: a failure's cause ("No space left on
    // device") belongs in the refusal the bundle records, not only on a terminal.
    let stderr = child.stderr.take();
    let echo = std::thread::spawn(move || {
        let mut last = String::new();
        // Byte lines read to the end whatever they hold: stopping early would close
        // the pipe and fail the engine's next write.
        for line in stderr
            .map(|e| std::io::BufReader::new(e).split(b'\n'))
            .into_iter()
            .flatten()
            .map_while(Result::ok)
        {
            let line = String::from_utf8_lossy(&line).into_owned();
            eprintln!("{line}");
            // A panic ends with the backtrace hint; the cause is the line before.
            if !line.trim().is_empty() && !line.starts_with("note: run with `RUST_BACKTRACE") {
                last = line;
            }
        }
        last
    });
    let out = child.wait_with_output().map_err(io(engine));
    let last_err = echo.join().unwrap_or_default();
    let out = out?;
    let fail = |why: String| {
        let _ = std::fs::remove_dir_all(&tmp);
        WeightsError::Invalid {
            path: engine.to_path_buf(),
            why,
        }
    };
    if !out.status.success() {
        return Err(fail(format!(
            "`synth-weights --preset {preset}` failed with {}{}",
            out.status,
            if last_err.is_empty() {
                String::new()
            } else {
                format!(": {}", last_err.trim())
            }
        )));
    }
    let printed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    let digest = match read_digest_file(&tmp) {
        Ok(Some(d)) => d,
        Ok(None) => return Err(fail(format!("synth-weights wrote no {DIGEST_FILE}"))),
        Err(e) => return Err(fail(e.to_string())),
    };
    if printed != digest {
        return Err(fail(format!(
            "synth-weights printed {printed:?} but its {DIGEST_FILE} holds {digest:?}"
        )));
    }
    // An incomplete leftover (no DIGEST) from an interrupted synthesis is replaced.
    if target.exists() {
        let stale = root.join(format!(".{preset}.stale-{}", std::process::id()));
        std::fs::rename(&target, &stale).map_err(io(&target))?;
        let _ = std::fs::remove_dir_all(&stale);
    }
    match std::fs::rename(&tmp, &target) {
        Ok(()) => {}
        // Another run finished the same synthesis first: keep theirs.
        Err(_) if target.join(DIGEST_FILE).is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(io(&target)(e)),
    }
    describe(&target, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn scratch(name: &str) -> PathBuf {
        crate::test_kit::scratch(&format!("weights-{name}"))
    }

    fn write(dir: &Path, rel: &str, bytes: &[u8]) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    #[test]
    fn digest_is_order_free_and_matches_the_sha256sum_lines() {
        let d = scratch("digest");
        write(&d, "vae/b.bin", b"second file");
        write(&d, "transformer/a.bin", b"first file");
        let files = list_files(&d).unwrap();
        assert_eq!(
            files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            ["transformer/a.bin", "vae/b.bin"]
        );
        assert_eq!(files[0].bytes, 10);
        let got = compute_digest(&d, &files).unwrap();
        // By hand: sha256sum lines sorted by path.
        let line = |data: &[u8], p: &str| format!("{:x}  {p}\n", Sha256::digest(data));
        let text = line(b"first file", "transformer/a.bin") + &line(b"second file", "vae/b.bin");
        assert_eq!(got, format!("sha256:{:x}", Sha256::digest(text.as_bytes())));
        // A DIGEST file is excluded from the list and then trusted.
        std::fs::write(d.join(DIGEST_FILE), format!("{got}\n")).unwrap();
        let w = describe(&d, false).unwrap();
        assert_eq!(w.files.len(), 2);
        assert_eq!(
            (w.digest.as_str(), w.digest_source),
            (got.as_str(), "DIGEST file")
        );
        // Changing one byte changes the computed digest.
        write(&d, "vae/b.bin", b"second filf");
        let files = list_files(&d).unwrap();
        assert_ne!(compute_digest(&d, &files).unwrap(), got);
    }

    #[test]
    fn a_malformed_digest_file_is_refused_by_name() {
        let d = scratch("bad-digest");
        write(&d, "x.bin", b"x");
        std::fs::write(d.join(DIGEST_FILE), "md5:abc\n").unwrap();
        let e = describe(&d, false).unwrap_err().to_string();
        assert!(e.contains("DIGEST") && e.contains("md5:abc"), "{e}");
        let e = describe(&d.join("missing"), false).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
    }

    /// A synthesis that fails says why in the error (what the weights gate records
    /// in the bundle), and leaves no partial directory behind.
    #[test]
    fn a_failed_synthesis_names_the_engines_last_error_line() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("synth-fails");
        let fake = d.join("engine.sh");
        std::fs::write(
            &fake,
            // A line that is not UTF-8 first (reading must go on past it), the
            // cause, then a panic's backtrace hint (not the cause) and a blank line.
            "#!/bin/sh\nmkdir -p \"$5\"\nprintf 'writing \\377\\376 shards\\n' >&2\n\
             echo 'engine: error: x.safetensors: No space left on device (os error 28)' >&2\n\
             echo 'note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace' >&2\n\
             echo >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = d.join("cache");
        let e = synthesize(&fake, "ltxv-2b", &cache)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`synth-weights --preset ltxv-2b` failed with exit status: 1: engine: error: x.safetensors: No space left on device (os error 28)"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(cache.join("weights"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn unsafe_preset_names_are_refused() {
        let d = scratch("preset");
        for bad in ["", "../x", ".hidden", "a/b"] {
            let e = synthesize(Path::new("/bin/false"), bad, &d)
                .unwrap_err()
                .to_string();
            assert!(e.contains("preset"), "{e}");
        }
    }
}
