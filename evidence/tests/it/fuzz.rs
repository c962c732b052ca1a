//! Property fuzzing (proptest) of every parser that reads bytes the project did
//! not just write itself: the journal reader, the marker-line parser, the manifest
//! parser and the rung parser. For every input: no panic, no hang (each case is
//! timed), and a clear error (it names the file where the parser is given one).
//!
//! `PROPTEST_CASES=N` sets the cases per property (2048 by default in CI;
//! `just fuzz` runs 20,000). Each test prints a `FUZZ:` line with its count.

use std::path::Path;
use std::time::{Duration, Instant};

use evidence::journal::{encode_record, header_bytes, parse_journal, Record, Stream};
use evidence::manifest::Manifest;
use evidence::marker::parse_marker_line;
use evidence::rung::Rung;
use evidence::sample::Sample;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// The longest any single case may take (a hang shows up as a failure, not a stall).
const CASE_LIMIT: Duration = Duration::from_secs(2);

/// Run `check` over `strategy` for the configured number of cases; print the count.
fn fuzz<S: Strategy>(name: &str, strategy: S, check: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    // PROPTEST_CASES when set, else a default that keeps CI within a few seconds.
    let config = Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2048),
        ..Config::default()
    };
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |v| {
        let t = Instant::now();
        check(v)?;
        prop_assert!(t.elapsed() < CASE_LIMIT, "case took {:?}", t.elapsed());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    eprintln!("FUZZ: {name}: {cases} cases, no panic, no hang");
}

/// A record from a seed: every kind, random contents.
fn record(kind: u8, n: u64, text: String) -> Record {
    match kind % 4 {
        0 => {
            let mut s = Sample::empty(n);
            s.set("rss_bytes", Some((n % 1_000_003) as f64 * 4096.0));
            s.set("mem_available_bytes", Some((n / 7) as f64));
            Record::Sample(s)
        }
        1 => Record::Marker {
            recv_ns: n,
            line: text,
        },
        2 => Record::Output {
            t_ns: n,
            stream: if n % 2 == 0 {
                Stream::Stdout
            } else {
                Stream::Stderr
            },
            line: text,
        },
        _ => Record::Fragment {
            key: format!("k{}", n % 13),
            value: serde_json::json!({"text": text, "n": n}),
        },
    }
}

fn records() -> impl Strategy<Value = Vec<Record>> {
    prop::collection::vec(
        (any::<u8>(), any::<u64>(), ".{0,40}").prop_map(|(k, n, t)| record(k, n, t)),
        1..12,
    )
}

fn encode(rs: &[Record]) -> Vec<u8> {
    let mut out = header_bytes().to_vec();
    for r in rs {
        encode_record(r, &mut out).unwrap();
    }
    out
}

/// A damaged copy of `bytes`: `op` picks flip / truncate / insert / overwrite.
fn damage(bytes: &[u8], op: u8, at: usize, with: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let at = if b.is_empty() { 0 } else { at % b.len() };
    match op % 4 {
        0 => {
            if let Some(x) = b.get_mut(at) {
                *x ^= with.first().copied().unwrap_or(1).max(1);
            }
        }
        1 => b.truncate(at),
        2 => {
            b.splice(at..at, with.iter().copied());
        }
        _ => {
            for (i, w) in with.iter().enumerate() {
                if let Some(x) = b.get_mut(at + i) {
                    *x = *w;
                }
            }
        }
    }
    b
}

#[test]
fn the_journal_reader_never_panics_and_keeps_only_an_intact_prefix() {
    let path = Path::new("fuzz/journal");
    let header = header_bytes().len();
    fuzz(
        "journal reader (damaged journals)",
        (
            records(),
            any::<u8>(),
            any::<usize>(),
            prop::collection::vec(any::<u8>(), 1..16),
        ),
        |(rs, op, at, with)| {
            let good = encode(&rs);
            // Undamaged, everything reads back.
            let whole = parse_journal(&good, path).unwrap();
            prop_assert_eq!(&whole.records, &rs);
            prop_assert_eq!(whole.bytes_dropped, 0);
            let bad = damage(&good, op, at, &with);
            match parse_journal(&bad, path) {
                Ok(c) => {
                    prop_assert!(c.bytes_good <= bad.len() as u64);
                    prop_assert_eq!(c.bytes_good + c.bytes_dropped, bad.len() as u64);
                    // Damage after the header can only cut records off the end:
                    // every record read back is the one that was written there.
                    let first_damaged = at % good.len().max(1);
                    if first_damaged >= header {
                        prop_assert!(c.records.len() <= rs.len());
                        prop_assert_eq!(&c.records[..], &rs[..c.records.len()]);
                    }
                    if c.bytes_dropped > 0 {
                        prop_assert!(c.stop_reason.is_some());
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(
                        msg.contains("fuzz/journal"),
                        "error without the file: {}",
                        msg
                    );
                }
            }
            Ok(())
        },
    );
    fuzz(
        "journal reader (arbitrary bytes)",
        prop::collection::vec(any::<u8>(), 0..512),
        |bytes| {
            // Arbitrary bytes behind a valid header exercise the framing itself.
            let mut framed = header_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            for input in [&bytes[..], &framed[..]] {
                match parse_journal(input, path) {
                    Ok(c) => prop_assert_eq!(c.bytes_good + c.bytes_dropped, input.len() as u64),
                    Err(e) => prop_assert!(e.to_string().contains("fuzz/journal")),
                }
            }
            Ok(())
        },
    );
}

/// Marker-looking text: JSON punctuation, protocol words, names, numbers.
fn markerish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("\"ev\":".to_string()),
            Just("\"open\"".to_string()),
            Just("\"close\"".to_string()),
            Just("\"tick\"".to_string()),
            Just("\"name\":".to_string()),
            Just("\"t_ns\":".to_string()),
            Just("\"attrs\":".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            "[0-9]{1,25}",
            "\"[A-Za-z0-9_.\\- ]{0,80}\"",
            ".{0,8}",
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

#[test]
fn the_marker_parser_never_panics_and_what_it_accepts_round_trips() {
    fuzz(
        "marker parser",
        prop_oneof![markerish(), ".{0,300}", "\\PC{0,5000}"],
        |line| {
            if let Ok(m) = parse_marker_line(&line) {
                let again = parse_marker_line(&m.to_line());
                prop_assert!(
                    again.is_ok(),
                    "accepted {:?} but not its own rendering",
                    line
                );
                prop_assert_eq!(again.unwrap().to_line(), m.to_line());
            } else if let Err(e) = parse_marker_line(&line) {
                prop_assert!(!e.to_string().is_empty());
            }
            Ok(())
        },
    );
}

fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("schema_version".to_string()),
                    Just("files".to_string()),
                    Just("exit".to_string()),
                    Just("run".to_string()),
                    Just("sha256".to_string()),
                    Just("bytes".to_string()),
                    Just("rows".to_string()),
                    "[a-z_]{1,10}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn the_manifest_parser_never_panics_and_errors_say_what_is_wrong() {
    fuzz(
        "manifest parser",
        prop_oneof![
            json().prop_map(|v| v.to_string()),
            ".{0,300}",
            (json(), any::<usize>()).prop_map(|(v, cut)| {
                let s = v.to_string();
                let cut = cut % (s.len() + 1);
                String::from_utf8_lossy(&s.as_bytes()[..cut]).into_owned()
            }),
        ],
        |text| {
            match Manifest::from_json(&text) {
                Ok(m) => {
                    // What parses re-parses from its own canonical bytes.
                    let again = String::from_utf8(m.canonical_bytes()).unwrap();
                    prop_assert!(Manifest::from_json(&again).is_ok());
                }
                Err(e) => prop_assert!(!e.is_empty()),
            }
            Ok(())
        },
    );
}

#[test]
fn the_rung_parser_never_panics_and_errors_name_the_file() {
    let good =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../rungs/0.toml"))
            .unwrap();
    let file = Path::new("rungs/fuzz.toml");
    assert!(Rung::parse(&good, file).is_ok(), "rung 0 must parse");
    fuzz(
        "rung parser",
        (
            any::<u8>(),
            any::<usize>(),
            prop_oneof![
                "[a-z_]{1,8} = [0-9\\-]{1,30}",
                "[\\[\\]=\"0-9.a-z\n -]{0,20}",
                ".{0,6}",
            ],
        ),
        |(op, at, with)| {
            let text = String::from_utf8_lossy(&damage(good.as_bytes(), op, at, with.as_bytes()))
                .into_owned();
            if let Err(e) = Rung::parse(&text, file) {
                let msg = e.to_string();
                prop_assert!(
                    msg.contains("rungs/fuzz.toml"),
                    "error without the file: {}",
                    msg
                );
            }
            Ok(())
        },
    );
}
