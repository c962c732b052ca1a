//! Property fuzzing (proptest) of the safetensors header path the weight loader
//! runs on every file it maps: a valid two-tensor file, damaged (byte flips,
//! truncation, inserted or overwritten bytes, a rewritten header length), is
//! opened and, when it opens, every tensor is loaded. For every input: no panic,
//! no hang (each case is timed), and an error that names the file.
//!
//! Files are written under `CARGO_TARGET_TMPDIR` (never /tmp). `PROPTEST_CASES=N`
//! sets the cases (1024 by default; `just fuzz` runs 20,000).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use engine::weights::safetensors::{LoadOptions, SafetensorsSource};
use engine::weights::source::TensorSource;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// A valid file: tensors `a` (F32 [2,3]) and `b` (BF16 [4]) with random payloads.
fn valid(payload: &[u8]) -> Vec<u8> {
    let header = r#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"__metadata__":{"format":"pt"}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend((0..32).map(|i| payload[i % payload.len()]));
    out
}

#[test]
fn the_safetensors_header_path_never_panics_and_errors_name_the_file() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-safetensors");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("case.safetensors");
    let rename = |n: &str, _: &[usize]| Some(n.to_string());
    // The undamaged file opens and loads.
    std::fs::write(&path, valid(&[0x3f, 0x80, 0x11, 0x42])).unwrap();
    let ok = SafetensorsSource::open(
        "fuzz",
        std::slice::from_ref(&path),
        &rename,
        LoadOptions::default(),
    )
    .expect("the valid file must open");
    ok.load_f32("a", &[2, 3]).unwrap();
    ok.load_f32("b", &[4]).unwrap();
    drop(ok);

    // PROPTEST_CASES when set, else a default that keeps CI within a few seconds.
    let config = Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024),
        ..Config::default()
    };
    let cases = config.cases;
    let opened = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(config);
    let strategy = (
        prop::collection::vec(any::<u8>(), 1..8),
        0u8..5,
        any::<usize>(),
        prop::collection::vec(any::<u8>(), 1..24),
        any::<u64>(),
    );
    let result = runner.run(&strategy, |(payload, op, at, with, len)| {
        let mut b = valid(&payload);
        let at = at % b.len();
        match op {
            0 => b[at] ^= with[0].max(1),
            1 => b.truncate(at),
            2 => {
                b.splice(at..at, with.iter().copied());
            }
            3 => {
                for (i, w) in with.iter().enumerate() {
                    if let Some(x) = b.get_mut(at + i) {
                        *x = *w;
                    }
                }
            }
            _ => {
                let n = len % (b.len() as u64 * 2);
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
        }
        std::fs::write(&path, &b).unwrap();
        let t = Instant::now();
        match SafetensorsSource::open(
            "fuzz",
            std::slice::from_ref(&path),
            &rename,
            LoadOptions::default(),
        ) {
            Ok(src) => {
                opened.set(opened.get() + 1);
                let shapes = src.shapes();
                for (name, shape) in shapes {
                    if let Err(e) = src.load_f32(&name, &shape) {
                        prop_assert!(e.to_string().contains("case.safetensors"), "{}", e);
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(
                    msg.contains("case.safetensors"),
                    "error without the file: {}",
                    msg
                );
            }
        }
        prop_assert!(
            t.elapsed() < Duration::from_secs(2),
            "case took {:?}",
            t.elapsed()
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("safetensors header path: {e}");
    }
    eprintln!(
        "FUZZ: safetensors header path: {cases} cases ({} opened), no panic, no hang",
        opened.get()
    );
}
