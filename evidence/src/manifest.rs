//! `manifest.json`: the typed sections computed at seal, the harness's fragments,
//! canonical JSON, and the bundle id.
//!
//! The manifest is one JSON object. Its keys are the fragments the harness wrote
//! to the journal (`run`, `rung`, `exit`, ... see `specs/bundle.md`; a later
//! fragment with the same key replaces an earlier one; each has its record in
//! [`crate::fragments`]) plus the sections computed at seal, which are typed
//! here: `schema`, `cadence`, `phases`, `markers`, `journal`, `files`, `video`,
//! `complete`.
//!
//! Canonical form: keys sorted by their UTF-8 bytes at every level, no whitespace,
//! strings escaped as serde_json escapes them, integers as plain decimals, other
//! numbers in serde_json's shortest round-trip form. The bundle id is the sha256
//! (lowercase hex) of the exact bytes of `manifest.json`.

use crate::fragments::{read_lenient, Exit, Fragment, Run};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The bundle schema version this crate writes.
pub const SCHEMA_VERSION: u64 = 1;

/// The keys computed at seal; a journal fragment with one of these keys is
/// ignored (and listed in `journal.ignored_fragments`).
pub const COMPUTED_KEYS: &[&str] = &[
    "schema", "cadence", "phases", "markers", "journal", "files", "video", "complete",
];

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(H[(b >> 4) as usize] as char);
        s.push(H[(b & 15) as usize] as char);
    }
    s
}

/// The canonical JSON text of `v` (see the module docs).
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            // Sort explicitly: serde_json's map may preserve insertion order.
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // Serialising a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// A verdict of a check recorded in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The check held.
    Pass,
    /// The check failed.
    Fail,
    /// Nothing to check (e.g. no phase has sub-scopes).
    NotApplicable,
}

impl Verdict {
    /// `pass`, `fail` or `not-applicable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::NotApplicable => "not-applicable",
        }
    }
}

/// One sealed file other than `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// sha256 of the file's bytes, lowercase hex.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Rows (Parquet), lines (`log.zst`); null for images.
    pub rows: Option<u64>,
}

/// The render's `video.y4m`, kept outside the bundle as `store/renders/<id>.y4m`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideoEntry {
    /// sha256 of the video file, lowercase hex.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// The sampler's achieved cadence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cadence {
    /// Rows in `samples.parquet`.
    pub samples: u64,
    /// The intended interval in milliseconds (`sampler.cadence_ms`), if recorded.
    pub expected_ms: Option<f64>,
    /// Median interval between consecutive samples, milliseconds.
    pub median_interval_ms: Option<f64>,
    /// 99th percentile (nearest rank) of the intervals, milliseconds.
    pub p99_interval_ms: Option<f64>,
    /// Longest interval, milliseconds.
    pub max_interval_ms: Option<f64>,
    /// Deadlines that got no sample: [`Cadence::slots`] less `samples` (at least
    /// 0). Null without `expected_ms`. Bundles sealed before commit cf98c2c hold
    /// the older count (per interval `round(interval / expected) - 1`, summed),
    /// which also counted late ticks; `slots` recomputes from any bundle.
    pub missed_ticks: Option<u64>,
    /// CLOCK_MONOTONIC ns of the first sample.
    pub first_t_ns: Option<u64>,
    /// CLOCK_MONOTONIC ns of the last sample.
    pub last_t_ns: Option<u64>,
}

impl Cadence {
    /// The deadlines the recording spans at the expected period:
    /// `round((last_t_ns - first_t_ns) / expected) + 1`; None without an expected
    /// period or without samples.
    pub fn slots(&self) -> Option<u64> {
        let e = self.expected_ms.filter(|e| *e > 0.0)?;
        let (a, b) = (self.first_t_ns?, self.last_t_ns?);
        Some((b.saturating_sub(a) as f64 / 1e6 / e).round() as u64 + 1)
    }

    /// `(deadlines without a sample, deadlines spanned)`: [`Cadence::slots`] less the
    /// samples taken (at least 0), and the slots; None where `slots` is. Seal, `show`
    /// and `diff` all count misses through this, so bundles sealed with the older
    /// `missed_ticks` read the same as new ones.
    pub fn deadlines_without_sample(&self) -> Option<(u64, u64)> {
        let n = self.slots()?;
        Some((n.saturating_sub(self.samples), n))
    }
}

/// One group of containment or exclusivity checks: every phase instance of one
/// name that has sub-scopes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckGroup {
    /// The phase name.
    pub name: String,
    /// Instances checked.
    pub instances: u64,
    /// Instances that failed.
    pub failed: u64,
    /// Containment: the smallest share of a parent covered by its sub-scopes
    /// (0-1; may exceed 1 when sub-scopes overlap). Null for exclusivity.
    pub worst_share: Option<f64>,
    /// Pass when no instance failed.
    pub verdict: Verdict,
    /// The first failure, in words (phase seq, what was found); null on pass.
    pub detail: Option<String>,
}

/// A check over the phase tree with its groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSummary {
    /// Containment: the share of a parent its sub-scopes must cover (0.90). Null
    /// for exclusivity.
    pub min_share: Option<f64>,
    /// Fail when any group failed; not-applicable when no phase has sub-scopes.
    pub verdict: Verdict,
    /// One group per parent phase name, sorted by name.
    pub groups: Vec<CheckGroup>,
}

/// Phase coverage and the checks that a sum cannot make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhasesSummary {
    /// Phase instances (rows of `phases.parquet`).
    pub instances: u64,
    /// Leaf instances (phases without sub-scopes).
    pub leaves: u64,
    /// The engine's wall, seconds: from its first marker to its last (or to the
    /// end of the recording when a phase is still open). Null without markers.
    pub wall_s: Option<f64>,
    /// The harness's run wall, seconds (`run.end_ns - run.start_ns`, or to the
    /// end of the recording when the run has no end). Null without `run.start_ns`.
    pub run_wall_s: Option<f64>,
    /// Sum of the leaves' durations, seconds.
    pub leaf_sum_s: f64,
    /// `leaf_sum_s / wall_s` (null when the wall is null or zero).
    pub coverage: Option<f64>,
    /// `wall_s - leaf_sum_s` (negative when leaves overlap).
    pub unaccounted_s: Option<f64>,
    /// Names of the phases still open at the end of the recording, in open order.
    pub open_at_end: Vec<String>,
    /// Close markers that matched no open phase.
    pub unmatched_closes: u64,
    /// Containment: each phase's sub-scopes lie inside it and cover >= min_share.
    pub containment: CheckSummary,
    /// Exclusivity: no other leaf overlaps the window a phase's sub-scopes span.
    pub exclusivity: CheckSummary,
}

/// What the marker channel carried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkersSummary {
    /// Lines received (rows of `markers.parquet`).
    pub lines: u64,
    /// Lines that parsed as protocol events.
    pub parsed: u64,
    /// Lines that did not (kept verbatim with their error).
    pub unparsed: u64,
    /// Parsed events per kind (`open`, `close`, `tick`, `hello`, `info`).
    pub by_ev: BTreeMap<String, u64>,
    /// The engine's `hello` (engine, version, protocol, attrs), if any.
    pub hello: Option<Value>,
    /// The first parse error, with its line number (seq).
    pub first_error: Option<String>,
    /// Lines that parsed but whose `t_ns` the clock check rejected (outside the
    /// run, after the line was read, or going back in time; see
    /// `seal::MARKER_CLOCK_SLACK_NS`): kept in `markers.parquet` with the reason
    /// in `error`, used for no phase. Absent when zero (manifests sealed before
    /// the check stay canonical).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub clock_rejected: u64,
    /// The first clock rejection, naming its line; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_clock_error: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How much of the journal was intact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSummary {
    /// Size of the journal in bytes.
    pub bytes_total: u64,
    /// Bytes of intact records (header included).
    pub bytes_good: u64,
    /// The torn or corrupt tail that was dropped.
    pub bytes_dropped: u64,
    /// Why reading stopped early; null on a clean end.
    pub stop_reason: Option<String>,
    /// Intact records per kind (`sample`, `marker`, `output`, `fragment`, `frame`).
    pub records: BTreeMap<String, u64>,
    /// Fragment keys that collide with computed sections and were ignored.
    pub ignored_fragments: Vec<String>,
}

/// The whole manifest: computed sections plus the harness's fragments.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The bundle schema version ([`SCHEMA_VERSION`]).
    pub schema: u64,
    /// True only when the run's exit reason is `completed` and the journal ended cleanly.
    pub complete: bool,
    /// Achieved sampler cadence.
    pub cadence: Cadence,
    /// Phase coverage and checks.
    pub phases: PhasesSummary,
    /// Marker channel summary.
    pub markers: MarkersSummary,
    /// Journal integrity.
    pub journal: JournalSummary,
    /// Every other file of the bundle by name.
    pub files: BTreeMap<String, FileEntry>,
    /// The video, when the engine wrote one.
    pub video: Option<VideoEntry>,
    /// The harness's fragments by key (no key of [`COMPUTED_KEYS`]).
    pub fragments: BTreeMap<String, Value>,
}

fn to_value<T: Serialize>(t: &T) -> Value {
    // Plain structs of strings, numbers, maps and options serialise infallibly.
    serde_json::to_value(t).unwrap_or(Value::Null)
}

impl Manifest {
    /// The manifest as one JSON object.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in &self.fragments {
            m.insert(k.clone(), v.clone());
        }
        m.insert("schema".into(), Value::from(self.schema));
        m.insert("complete".into(), Value::Bool(self.complete));
        m.insert("cadence".into(), to_value(&self.cadence));
        m.insert("phases".into(), to_value(&self.phases));
        m.insert("markers".into(), to_value(&self.markers));
        m.insert("journal".into(), to_value(&self.journal));
        m.insert("files".into(), to_value(&self.files));
        m.insert("video".into(), to_value(&self.video));
        Value::Object(m)
    }

    /// The exact bytes of `manifest.json`.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        canonical_json(&self.to_value()).into_bytes()
    }

    /// Parse `manifest.json` text. Errors say which key is wrong and how.
    pub fn from_json(text: &str) -> Result<Manifest, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(mut m) = v else {
            return Err("not a JSON object".into());
        };
        fn take<T: serde::de::DeserializeOwned>(
            m: &mut Map<String, Value>,
            key: &str,
        ) -> Result<T, String> {
            let v = m
                .remove(key)
                .ok_or_else(|| format!("missing key {key:?}"))?;
            serde_json::from_value(v).map_err(|e| format!("key {key:?}: {e}"))
        }
        let schema: u64 = take(&mut m, "schema")?;
        if schema != SCHEMA_VERSION {
            return Err(format!(
                "key \"schema\": {schema}, this build reads schema {SCHEMA_VERSION}"
            ));
        }
        Ok(Manifest {
            schema,
            complete: take(&mut m, "complete")?,
            cadence: take(&mut m, "cadence")?,
            phases: take(&mut m, "phases")?,
            markers: take(&mut m, "markers")?,
            journal: take(&mut m, "journal")?,
            files: take(&mut m, "files")?,
            video: take(&mut m, "video")?,
            fragments: m.into_iter().collect(),
        })
    }

    /// The fragment `F` as its record, for display: `None` when absent, null or
    /// not an `F` ([`read_lenient`]).
    pub fn record<F: Fragment>(&self) -> Option<F> {
        read_lenient(&self.fragments)
    }

    /// The `exit` fragment ([`Exit`]), when it reads and names a reason.
    pub fn exit(&self) -> Option<Exit> {
        self.record::<Exit>().filter(|e| e.reason.is_some())
    }

    /// The `run` fragment ([`Run`]), read leniently.
    pub fn run(&self) -> Option<Run> {
        self.record()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_level_and_is_compact() {
        let v = json!({"b": 1, "a": {"z": [3, {"y": 1.5, "x": null}], "c": "é\n"}, "A": true});
        assert_eq!(
            canonical_json(&v),
            r#"{"A":true,"a":{"c":"é\n","z":[3,{"x":null,"y":1.5}]},"b":1}"#
        );
        // Numbers: integers plain, floats shortest round-trip.
        assert_eq!(
            canonical_json(&json!([0.1, 1.0, 1e300, -7, u64::MAX])),
            "[0.1,1.0,1e+300,-7,18446744073709551615]"
        );
    }

    #[test]
    fn canonical_text_round_trips_to_itself() {
        let v = json!({"k": [1.25, "s", {"b": false, "a": 2}], "j": -0.5});
        let t = canonical_json(&v);
        let back: Value = serde_json::from_str(&t).unwrap();
        assert_eq!(canonical_json(&back), t);
    }

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
