//! The GEMM algorithm choice (lever `gemm-algo`): cuBLASLt's heuristic answers
//! one algorithm per problem from a model of the card, not from a run. With
//! [`AlgoChoice::Tuned`] the first time a problem is planned its heuristic's
//! first [`CANDIDATES`] answers are each run [`TIMED_RUNS`] times on the
//! product's own operands (after one untimed run) and the fastest is kept where
//! it beats the heuristic's first by at least [`MIN_GAIN`]; otherwise the first
//! stays. Another algorithm may sum the k products in another order (split-K,
//! another tile), so the outputs may differ in their last bits: the lever is
//! numerics-changing.
//!
//! The choice is kept per machine in a cache file ([`TuneCache`]:
//! `<cache dir>/gemm-algos/<card>-cc<major><minor>-lt<cuBLASLt version>.tsv`, the
//! engine's cache directory of [`super::nvrtc::cache_dir`]): a later run of the
//! same problem on the same card and library reads the stored algorithm (checked
//! by `cublasLtMatmulAlgoCheck` before use) instead of timing again, so the
//! numerics of a tuned render are fixed per machine once its first run has
//! tuned. A line the cache cannot read or an algorithm the library no longer
//! accepts is counted ([`TuneReport::cache_rejected`]) and tuned again; a cache
//! that cannot be written is reported ([`TuneReport::cache_error`]), never an
//! error of the render. Every choice a render ran is digested
//! ([`TuneReport::digest`]) so two bundles say whether they ran the same
//! algorithms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// How a GEMM's algorithm is chosen: the `gemm-algo` lever's arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AlgoChoice {
    /// cuBLASLt's heuristic's first answer (the baseline).
    #[default]
    Heuristic,
    /// The fastest of the heuristic's first [`CANDIDATES`] answers, timed on the
    /// card once per problem and kept in the machine's cache.
    Tuned,
}

impl AlgoChoice {
    /// The `gemm-algo` lever's arm name (`heuristic`, `tuned`).
    pub fn name(self) -> &'static str {
        match self {
            AlgoChoice::Heuristic => "heuristic",
            AlgoChoice::Tuned => "tuned",
        }
    }
}

/// How many of the heuristic's answers a tuned problem times.
pub const CANDIDATES: usize = 8;
/// Timed runs of each candidate (after one untimed run); their mean is its time.
pub const TIMED_RUNS: usize = 3;
/// The fraction by which a candidate must beat the heuristic's first answer to
/// replace it: below it the difference is within the timing's noise, and the
/// heuristic's first (whose numerics the baseline has) stays.
pub const MIN_GAIN: f64 = 0.02;

/// The index of the candidate to keep from their mean times (ms; non-finite for
/// one that failed to run): the fastest where it beats `times[0]` by at least
/// `min_gain` of it, else 0; where `times[0]` failed, the fastest that ran.
/// `None` where none ran.
pub fn pick(times: &[f64], min_gain: f64) -> Option<usize> {
    let best = times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)?;
    match times.first() {
        Some(&first) if first.is_finite() => Some(if times[best] < first * (1.0 - min_gain) {
            best
        } else {
            0
        }),
        _ => Some(best),
    }
}

/// One stored choice: the candidate's index in the heuristic's list when it
/// was tuned and the algorithm itself (cuBLASLt's opaque 64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Index in the heuristic's list when tuned (0: the heuristic's first).
    pub index: usize,
    /// `cublasLtMatmulAlgo_t`'s data.
    pub algo: [u64; 8],
}

/// The format tag of a cache line.
const LINE_TAG: &str = "v1";

/// `v1<TAB>key<TAB>index<TAB>16 hex digits x 8, comma-separated`.
pub fn format_line(key: &str, s: &Stored) -> String {
    let hex: Vec<String> = s.algo.iter().map(|w| format!("{w:016x}")).collect();
    format!("{LINE_TAG}\t{key}\t{}\t{}", s.index, hex.join(","))
}

/// A cache line read back, or why it cannot be.
pub fn parse_line(line: &str) -> Result<(String, Stored), String> {
    let f: Vec<&str> = line.split('\t').collect();
    if f.len() != 4 || f[0] != LINE_TAG {
        return Err(format!(
            "expected 4 tab-separated fields starting with {LINE_TAG}, got {} fields",
            f.len()
        ));
    }
    if f[1].is_empty() {
        return Err("an empty problem key".into());
    }
    let index: usize = f[2]
        .parse()
        .map_err(|_| format!("index {:?} is not a count", f[2]))?;
    if index >= CANDIDATES {
        return Err(format!("index {index} is past the {CANDIDATES} candidates"));
    }
    let words: Vec<&str> = f[3].split(',').collect();
    if words.len() != 8 {
        return Err(format!("expected 8 algorithm words, got {}", words.len()));
    }
    let mut algo = [0u64; 8];
    for (slot, w) in algo.iter_mut().zip(&words) {
        if w.len() != 16 {
            return Err(format!("algorithm word {w:?} is not 16 hex digits"));
        }
        *slot = u64::from_str_radix(w, 16)
            .map_err(|_| format!("algorithm word {w:?} is not hexadecimal"))?;
    }
    Ok((f[1].to_string(), Stored { index, algo }))
}

/// The file name of a card's cache: its name made file-safe, its compute
/// capability and the cuBLASLt version (an algorithm is valid only for these).
pub fn cache_file_name(card: &str, capability: (i32, i32), lt_version: usize) -> String {
    let slug: String = card
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "{}-cc{}{}-lt{lt_version}.tsv",
        slug.trim_matches('-'),
        capability.0,
        capability.1
    )
}

/// The machine's stored choices, read once from `path` (when there is one).
#[derive(Debug, Default)]
pub struct TuneCache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Stored>,
    /// Lines that could not be read: (line number, why).
    pub bad_lines: Vec<(usize, String)>,
}

impl TuneCache {
    /// The cache at `path` (`None`: nothing is read or written). A missing file
    /// is an empty cache; unreadable lines are kept in [`TuneCache::bad_lines`]
    /// and skipped.
    pub fn open(path: Option<PathBuf>) -> TuneCache {
        let mut c = TuneCache {
            path,
            ..TuneCache::default()
        };
        if let Some(text) = c
            .path
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
        {
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match parse_line(line) {
                    Ok((k, s)) => {
                        c.entries.insert(k, s);
                    }
                    Err(why) => c.bad_lines.push((i + 1, why)),
                }
            }
        }
        c
    }

    /// Where the cache lives, if anywhere.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The stored choice of problem `key`.
    pub fn get(&self, key: &str) -> Option<Stored> {
        self.entries.get(key).copied()
    }

    /// Forget `key` (its stored algorithm was refused by the library).
    pub fn remove(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Store `s` for `key` and write the whole cache (a temporary file renamed
    /// over the old one, so a reader never sees half of it). Returns why it
    /// could not be written; the choice is kept in memory either way.
    pub fn insert(&mut self, key: &str, s: Stored) -> Result<(), String> {
        self.entries.insert(key.to_string(), s);
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let mut text = String::new();
        for (k, s) in &self.entries {
            let _ = writeln!(text, "{}", format_line(k, s));
        }
        let tmp = path.with_extension(format!("tsv.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&tmp, text.as_bytes())?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("writing the GEMM algorithm cache {}: {e}", path.display())
        })
    }
}

/// What the tuned choice did in one GEMM handle's life (a render's DiT).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TuneReport {
    /// The cache file, if any.
    pub cache_file: Option<PathBuf>,
    /// Problems timed on the card this run.
    pub tuned: usize,
    /// Problems whose stored choice was read from the cache.
    pub from_cache: usize,
    /// Problems whose kept algorithm is not the heuristic's first.
    pub not_first: usize,
    /// Host milliseconds spent timing candidates.
    pub tune_ms: f64,
    /// Cache lines unreadable or algorithms the library refused (then tuned
    /// again).
    pub cache_rejected: usize,
    /// Why the cache could not be written, if it could not (the last error).
    pub cache_error: Option<String>,
    /// Problems planned while a stream was being captured (cannot be timed:
    /// they keep the heuristic's first).
    pub untimed_in_capture: usize,
    /// Each problem's kept choice: key -> (index, algorithm, gain over the
    /// heuristic's first as a fraction of its time; `None` when read from the
    /// cache).
    pub choices: BTreeMap<String, (usize, [u64; 8], Option<f64>)>,
}

impl TuneReport {
    /// sha256 (hex) over every kept choice's key, index and algorithm, in key
    /// order: equal in two runs exactly when they ran the same algorithms.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        for (k, (i, algo, _)) in &self.choices {
            h.update(
                format_line(
                    k,
                    &Stored {
                        index: *i,
                        algo: *algo,
                    },
                )
                .as_bytes(),
            );
            h.update(b"\n");
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// One line per problem whose kept algorithm is not the heuristic's first:
    /// "key: #index (-x.x%)" (the gain where timed this run).
    pub fn changed(&self) -> Vec<String> {
        self.choices
            .iter()
            .filter(|(_, (i, _, _))| *i != 0)
            .map(|(k, (i, _, g))| match g {
                Some(g) => format!("{k}: #{i} ({:+.1}%)", -g * 100.0),
                None => format!("{k}: #{i} (cached)"),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh scratch directory under the build's target (never /tmp).
    fn scratch(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/gemm-tune")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Red on: the noise margin dropped (a 1% faster candidate replacing the
    /// first), the fastest not taken past the margin, a failed first not
    /// replaced, or a failed candidate (NaN/inf) chosen.
    #[test]
    fn pick_keeps_the_first_unless_a_candidate_beats_it_past_the_margin() {
        assert_eq!(pick(&[1.0, 0.99, 1.2], MIN_GAIN), Some(0));
        assert_eq!(pick(&[1.0, 0.97, 0.95], MIN_GAIN), Some(2));
        assert_eq!(pick(&[1.0, f64::INFINITY, 0.5], MIN_GAIN), Some(2));
        assert_eq!(pick(&[f64::INFINITY, 1.3, 1.1], MIN_GAIN), Some(2));
        assert_eq!(pick(&[f64::NAN, 1.3], MIN_GAIN), Some(1));
        assert_eq!(pick(&[1.0], MIN_GAIN), Some(0));
        assert_eq!(pick(&[f64::INFINITY, f64::NAN], MIN_GAIN), None);
        assert_eq!(pick(&[], MIN_GAIN), None);
    }

    /// Red on: a line not read back as written, or a damaged line (wrong tag,
    /// field count, index, word count or digit) accepted.
    #[test]
    fn cache_lines_round_trip_and_damaged_ones_are_refused() {
        let s = Stored {
            index: 3,
            algo: [1, u64::MAX, 0, 42, 7, 8, 9, 0x0123_4567_89ab_cdef],
        };
        let line = format_line("m6144 n2048 k2048 Bias Bf16", &s);
        assert_eq!(
            parse_line(&line).unwrap(),
            ("m6144 n2048 k2048 Bias Bf16".to_string(), s)
        );
        for bad in [
            line.replacen("v1", "v2", 1),
            line.replacen("\t3\t", "\t8\t", 1),
            line.replacen("\t3\t", "\tx\t", 1),
            line.replacen(",0123456789abcdef", "", 1),
            line.replacen("0123456789abcdef", "0123456789abcdeg", 1),
            line.replacen("0123456789abcdef", "123456789abcdef", 1),
            line.replacen("m6144 n2048 k2048 Bias Bf16", "", 1),
            format!("{line}\textra"),
        ] {
            assert!(parse_line(&bad).is_err(), "{bad}");
        }
    }

    /// Red on: the card, capability or library version missing from the file
    /// name (an algorithm stored by another card or cuBLASLt reused).
    #[test]
    fn the_cache_file_names_the_card_and_the_library() {
        let a = cache_file_name("NVIDIA H200", (9, 0), 130100);
        assert_eq!(a, "nvidia-h200-cc90-lt130100.tsv");
        assert_ne!(a, cache_file_name("NVIDIA H100 80GB HBM3", (9, 0), 130100));
        assert_ne!(a, cache_file_name("NVIDIA H200", (9, 0), 130200));
        assert_ne!(a, cache_file_name("NVIDIA H200", (10, 0), 130100));
    }

    /// Red on: a stored choice not read back by the next open, a damaged line
    /// silently dropped (not counted) or failing the whole cache, or a missing
    /// directory not created.
    #[test]
    fn the_cache_persists_choices_and_counts_damaged_lines() {
        let path = scratch("cache").join("sub").join("card.tsv");
        let mut c = TuneCache::open(Some(path.clone()));
        assert!(c.get("a").is_none() && c.bad_lines.is_empty());
        let s = Stored {
            index: 2,
            algo: [5; 8],
        };
        c.insert("a", s).unwrap();
        c.insert(
            "b",
            Stored {
                index: 0,
                algo: [6; 8],
            },
        )
        .unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("garbage line\n");
        std::fs::write(&path, text).unwrap();
        let again = TuneCache::open(Some(path.clone()));
        assert_eq!(again.get("a"), Some(s));
        assert_eq!(again.get("b").map(|s| s.index), Some(0));
        assert_eq!(again.bad_lines.len(), 1);
        assert_eq!(again.bad_lines[0].0, 3);
        // No path: nothing written, nothing fails.
        let mut none = TuneCache::open(None);
        none.insert("a", s).unwrap();
        assert_eq!(none.get("a"), Some(s));
    }

    /// Red on: the cache error swallowed where the directory cannot be made
    /// (a file stands where it should be).
    #[test]
    fn an_unwritable_cache_is_reported_not_fatal() {
        let blocker = scratch("unwritable").join("blocker");
        std::fs::write(&blocker, b"a file").unwrap();
        let mut c = TuneCache::open(Some(blocker.join("card.tsv")));
        let e = c
            .insert(
                "a",
                Stored {
                    index: 1,
                    algo: [1; 8],
                },
            )
            .unwrap_err();
        assert!(e.contains("blocker"), "{e}");
        assert_eq!(c.get("a").map(|s| s.index), Some(1));
    }

    /// Red on: the digest ignoring the algorithm or the index, or depending
    /// on the gains (timing noise) rather than the choices.
    #[test]
    fn the_digest_follows_the_choices_not_the_timings() {
        let mut a = TuneReport::default();
        a.choices.insert("k".into(), (1, [3; 8], Some(0.05)));
        let mut b = a.clone();
        b.choices.insert("k".into(), (1, [3; 8], None));
        assert_eq!(a.digest(), b.digest());
        b.choices.insert("k".into(), (1, [4; 8], None));
        assert_ne!(a.digest(), b.digest());
        b.choices.insert("k".into(), (2, [3; 8], None));
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.changed(), vec!["k: #1 (-5.0%)".to_string()]);
    }
}
