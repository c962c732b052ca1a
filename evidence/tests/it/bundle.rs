//! End-to-end tests of the bundle machinery on recorded journals: seal, verify,
//! determinism, truncation recovery, byte flips, concurrency, recover.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use arrow_array::{Array, Float64Array, Int64Array, StringArray};
use evidence::bundle_files::{self, MANIFEST};
use evidence::journal::{encode_record, header_bytes, parse_journal, Record};
use evidence::manifest::{sha256_hex, Manifest, Verdict};
use evidence::parquet_tables;
use evidence::recover::{recover_all, Outcome};
use evidence::seal::{build_bundle, seal, SealInputs};
use evidence::store::{Store, JOURNAL_FILE};
use evidence::test_kit::run::{fake_png, synth_records, test_dir, write_journal, Rng, RunShape};
use evidence::verify::{verify_dir, verify_files};
use serde_json::json;

fn store(dir: &Path) -> Store {
    Store::resolve(Some(&dir.join("store"))).expect("store")
}

/// Stage a run: journal, three frame images and a video in the frames dir.
fn stage(store: &Store, records: &[Record], seed: u64) -> evidence::store::Staging {
    let st = store.open_staging().expect("staging");
    write_journal(&st.journal_path(), records);
    let mut rng = Rng(seed);
    for name in ["first.png", "middle.png", "last.png"] {
        std::fs::write(st.frames_dir().join(name), fake_png(&mut rng)).unwrap();
    }
    let video: Vec<u8> = (0..5000).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(st.frames_dir().join("video.y4m"), video).unwrap();
    st
}

fn read_all(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn journal_bytes(records: &[Record]) -> Vec<u8> {
    let mut b = header_bytes().to_vec();
    for r in records {
        encode_record(r, &mut b).unwrap();
    }
    b
}

#[test]
fn a_sealed_bundle_verifies_and_holds_the_journal_values() {
    let d = test_dir("seal-values");
    let s = store(&d);
    let records = synth_records(RunShape::small(11));
    let st = stage(&s, &records, 11);
    let video_hash = sha256_hex(&std::fs::read(st.frames_dir().join("video.y4m")).unwrap());
    let staging_dir = st.dir().to_path_buf();
    let sealed = seal(st.dir(), &s).unwrap();
    assert!(sealed.fresh);
    assert_eq!(sealed.path, s.bundles_dir().join(&sealed.id));
    assert!(
        !staging_dir.exists(),
        "staging directory removed after seal"
    );
    let report = verify_dir(&sealed.path);
    assert!(report.ok(), "{:?}", report.errors);

    let files = read_all(&sealed.path);
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "first.png",
            "frames.parquet",
            "last.png",
            "log.zst",
            "manifest.json",
            "markers.parquet",
            "middle.png",
            "phases.parquet",
            "samples.parquet"
        ]
    );
    assert_eq!(sha256_hex(&files[MANIFEST]), sealed.id);
    let m = Manifest::from_json(std::str::from_utf8(&files[MANIFEST]).unwrap()).unwrap();
    assert!(m.complete);
    assert_eq!(m.video.as_ref().unwrap().sha256, video_hash);
    let render = s.renders_dir().join(format!("{}.y4m", sealed.id));
    assert_eq!(sha256_hex(&std::fs::read(render).unwrap()), video_hash);

    // Samples: every journal sample, in time order, values intact, nulls kept.
    let samples: Vec<&evidence::sample::Sample> = records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s),
            _ => None,
        })
        .collect();
    let t = parquet_tables::read_table(
        &files[bundle_files::SAMPLES],
        &parquet_tables::samples_schema(),
    )
    .unwrap();
    assert_eq!(t.rows, samples.len() as u64);
    let b = &t.batches[0];
    let tcol = b
        .column_by_name("t_ns")
        .unwrap()
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let util = b
        .column_by_name("gpu_util_pct")
        .unwrap()
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    let used = b.column_by_name("gpu_mem_used_bytes").unwrap();
    let phase = b
        .column_by_name("phase")
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(tcol.value(i), s.t_ns as i64);
        assert_eq!(Some(util.value(i)), s.get("gpu_util_pct"));
    }
    assert_eq!(
        used.null_count(),
        used.len(),
        "unavailable sensor stored as null, never 0"
    );
    assert!((0..phase.len()).any(|i| !phase.is_null(i) && phase.value(i) == "denoise.step"));
    assert_eq!(
        m.fragments["sensors_unavailable"]["gpu_mem_used_bytes"],
        json!("nvml memory_info: NOT_SUPPORTED on unified memory")
    );

    // Markers and phases.
    let lines: Vec<&str> = records
        .iter()
        .filter_map(|r| match r {
            Record::Marker { line, .. } => Some(line.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(m.markers.lines, lines.len() as u64);
    assert_eq!(m.markers.unparsed, 1);
    let opens = lines
        .iter()
        .filter(|l| l.contains(r#""ev":"open""#))
        .count() as u64;
    assert_eq!(m.phases.instances, opens);
    assert_eq!(m.files[bundle_files::PHASES].rows, Some(opens));
    let cov = m.phases.coverage.unwrap();
    assert!(cov > 0.99 && cov <= 1.0, "coverage {cov}");
    assert_eq!(m.phases.containment.verdict, Verdict::Pass);
    assert_eq!(m.phases.exclusivity.verdict, Verdict::Pass);
    assert_eq!(m.cadence.expected_ms, Some(100.0));
    assert!(m.cadence.median_interval_ms.unwrap() > 99.0);

    // Log: one line per output record.
    let outputs = records
        .iter()
        .filter(|r| matches!(r, Record::Output { .. }))
        .count();
    let log = zstd::stream::decode_all(&files["log.zst"][..]).unwrap();
    assert_eq!(log.iter().filter(|&&c| c == b'\n').count(), outputs);

    // The phase table reads the sealed bundle.
    let table = evidence::phase_table::phase_table_text(&sealed.path).unwrap();
    assert!(table.contains("denoise.step"), "{table}");
    assert!(table.contains("coverage: leaves sum"), "{table}");
    // GPM windows in the samples: the tensor and SM medians of the windows wholly
    // inside each phase, 50-69% in the busy denoise (the generator's range).
    let head = table.lines().next().unwrap();
    assert!(head.ends_with("tensor %   SM %"), "{head}");
    let denoise = table
        .lines()
        .find(|l| l.trim_start().starts_with("denoise "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = denoise.split_whitespace().collect();
    let (tensor, sm) = (cells[cells.len() - 2], cells[cells.len() - 1]);
    for v in [tensor, sm] {
        let v: f64 = v.parse().unwrap_or_else(|_| panic!("{denoise}"));
        assert!((50.0..70.0).contains(&v), "{denoise}");
    }
    assert!(
        table.contains("containment") && table.contains("exclusivity"),
        "{table}"
    );
}

#[test]
fn the_same_journal_seals_to_identical_bytes_and_id_and_twice_is_a_no_op() {
    let d = test_dir("determinism");
    let records = synth_records(RunShape::small(21));
    let s1 = store(&d.join("one"));
    let s2 = store(&d.join("two"));
    let a = seal(stage(&s1, &records, 5).dir(), &s1).unwrap();
    let b = seal(stage(&s2, &records, 5).dir(), &s2).unwrap();
    assert_eq!(a.id, b.id);
    assert_eq!(read_all(&a.path), read_all(&b.path));
    // Same content again into the first store: a no-op, same id, nothing replaced.
    let before = read_all(&a.path);
    let st = stage(&s1, &records, 5);
    let dir = st.dir().to_path_buf();
    let c = seal(st.dir(), &s1).unwrap();
    assert_eq!(c.id, a.id);
    assert!(!c.fresh);
    assert!(!dir.exists());
    assert_eq!(read_all(&a.path), before);
    assert_eq!(s1.bundle_ids().unwrap(), vec![a.id.clone()]);
    // A different journal gives a different id.
    let other = synth_records(RunShape::small(22));
    let e = seal(stage(&s1, &other, 5).dir(), &s1).unwrap();
    assert_ne!(e.id, a.id);
}

#[test]
fn truncation_at_every_byte_offset_recovers_to_a_valid_bundle() {
    let mut shape = RunShape::small(31);
    shape.wall_ns = 300_000_000;
    shape.steps = 1;
    shape.frames = 1;
    let records = synth_records(shape);
    let bytes = journal_bytes(&records);
    assert!(
        bytes.len() > 3000,
        "journal of {} bytes is too small to mean much",
        bytes.len()
    );
    let offsets: Vec<usize> = (0..=bytes.len()).collect();
    let workers = 2;
    let bytes = Arc::new(bytes);
    let records = Arc::new(records);
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let bytes = bytes.clone();
            let records = records.clone();
            let offs: Vec<usize> = offsets.iter().copied().skip(w).step_by(workers).collect();
            std::thread::spawn(move || {
                for cut in offs {
                    let c = parse_journal(&bytes[..cut], Path::new("journal")).unwrap();
                    // Never a record that was not fully written: exactly a prefix.
                    assert!(records.starts_with(&c.records), "cut {cut}");
                    assert_eq!(c.bytes_good + c.bytes_dropped, cut as u64);
                    let extra = if c
                        .records
                        .iter()
                        .any(|r| matches!(r, Record::Fragment { key, .. } if key == "exit"))
                    {
                        vec![]
                    } else {
                        vec![("exit".to_string(), json!({"reason": "harness-killed"}))]
                    };
                    let b = build_bundle(
                        &c,
                        &SealInputs {
                            extra_fragments: extra,
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    let errs = verify_files(&b.id, &b.files);
                    assert!(errs.is_empty(), "cut {cut}: {errs:?}");
                    let samples = c.records.iter().filter(|r| matches!(r, Record::Sample(_))).count();
                    assert_eq!(b.manifest.cadence.samples, samples as u64, "cut {cut}");
                    assert_eq!(b.manifest.journal.bytes_good, c.bytes_good);
                    let has_completed_exit = c.records.iter().any(|r| {
                        matches!(r, Record::Fragment { key, value } if key == "exit" && value["reason"] == "completed")
                    });
                    assert_eq!(
                        b.manifest.complete,
                        has_completed_exit && c.bytes_dropped == 0,
                        "cut {cut}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker");
    }
}

/// Make a staging directory by hand, as a dead run leaves it (no lock held).
fn dead_staging(store: &Store, name: &str, journal: &[u8]) -> PathBuf {
    let dir = store.staging_root().join(name);
    std::fs::create_dir_all(dir.join("frames")).unwrap();
    std::fs::write(dir.join(JOURNAL_FILE), journal).unwrap();
    dir
}

#[test]
fn recover_seals_dead_runs_on_disk_with_their_exit_reason() {
    let d = test_dir("recover");
    let s = store(&d);
    let this_boot = evidence::recover::current_boot_id().unwrap();
    let mut shape = RunShape::small(41);
    shape.completes = false;
    let mut other_boot = shape;
    other_boot.boot_id = "11111111-2222-4333-8444-555555555555";
    other_boot.seed = 42;
    let lost = journal_bytes(&synth_records(other_boot));
    let mut same = shape;
    same.seed = 43;
    // Make the "same boot" run claim this boot.
    let same_boot: &'static str = Box::leak(this_boot.clone().into_boxed_str());
    same.boot_id = same_boot;
    let same_bytes = journal_bytes(&synth_records(same));
    let done = journal_bytes(&synth_records(RunShape::small(44)));

    // Torn mid-record: 37 bytes short.
    dead_staging(&s, "a-lost", &lost[..lost.len() - 37]);
    dead_staging(&s, "b-same", &same_bytes);
    dead_staging(&s, "c-exit", &done);
    dead_staging(&s, "d-nojournal", &[]);
    std::fs::remove_file(s.staging_root().join("d-nojournal").join(JOURNAL_FILE)).unwrap();
    let live = s.open_staging().unwrap();
    write_journal(&live.journal_path(), &synth_records(RunShape::small(45)));

    let outcomes = recover_all(&s).unwrap();
    let mut reasons = BTreeMap::new();
    for o in &outcomes {
        match o {
            Outcome::Sealed {
                staging,
                sealed,
                reason,
            } => {
                assert!(verify_dir(&sealed.path).ok());
                assert!(!staging.exists());
                let name = staging.file_name().unwrap().to_string_lossy().into_owned();
                let m = Manifest::from_json(
                    &std::fs::read_to_string(sealed.path.join(MANIFEST)).unwrap(),
                )
                .unwrap();
                assert_eq!(m.exit().unwrap().reason.as_ref(), Some(reason));
                reasons.insert(name, (reason.clone(), m));
            }
            Outcome::Busy { staging } => assert_eq!(staging, live.dir()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(reasons["a-lost"].0, "host-lost");
    let a = &reasons["a-lost"].1;
    assert!(!a.complete && a.journal.bytes_dropped > 0 && a.journal.bytes_dropped < 400);
    assert!(a.exit().unwrap().detail.unwrap().contains("11111111-2222"));
    assert_eq!(reasons["b-same"].0, "harness-killed");
    assert_eq!(reasons["c-exit"].0, "completed");
    assert!(reasons["c-exit"].1.complete);
    assert_eq!(reasons["d-nojournal"].0, "harness-killed");
    assert!(live.dir().exists(), "a live run is never touched");
    assert_eq!(outcomes.len(), 5);
}

#[test]
fn recover_finishes_a_seal_interrupted_after_publishing() {
    let d = test_dir("recover-finish");
    let s = store(&d);
    let records = synth_records(RunShape::small(51));
    let sealed = seal(stage(&s, &records, 1).dir(), &s).unwrap();
    // A staging dir that was published but not cleaned up.
    let dir = dead_staging(&s, "half", &journal_bytes(&records));
    std::fs::write(dir.join("sealed_id"), &sealed.id).unwrap();
    let out = recover_all(&s).unwrap();
    assert!(matches!(&out[..], [Outcome::Cleaned { id, .. }] if *id == sealed.id));
    assert!(!dir.exists());
    assert_eq!(s.bundle_ids().unwrap().len(), 1);
}

#[test]
fn every_single_byte_flip_of_every_sealed_file_is_detected_naming_the_file() {
    let mut shape = RunShape::small(61);
    shape.wall_ns = 500_000_000;
    let c = parse_journal(&journal_bytes(&synth_records(shape)), Path::new("j")).unwrap();
    let mut rng = Rng(3);
    let images = vec![("first.png".to_string(), fake_png(&mut rng))];
    let b = build_bundle(
        &c,
        &SealInputs {
            images,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(verify_files(&b.id, &b.files).is_empty());
    let names: Vec<String> = b.files.keys().cloned().collect();
    let mut flips = 0;
    for name in &names {
        for at in 0..b.files[name].len() {
            let mut files = b.files.clone();
            files.get_mut(name).unwrap()[at] ^= 1 << (at % 8);
            let errs = verify_files(&b.id, &files);
            assert!(!errs.is_empty(), "flip of {name} byte {at} undetected");
            assert!(
                errs[0].to_string().contains(name.as_str()),
                "flip of {name} byte {at}: {}",
                errs[0]
            );
            flips += 1;
        }
    }
    assert!(flips > 5000, "only {flips} flips");
}

#[test]
fn a_flip_on_disk_is_reported_by_verify_dir_with_the_file() {
    let d = test_dir("flip-disk");
    let s = store(&d);
    let sealed = seal(stage(&s, &synth_records(RunShape::small(71)), 2).dir(), &s).unwrap();
    let p = sealed.path.join("phases.parquet");
    let mut b = std::fs::read(&p).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&p, b).unwrap();
    let r = verify_dir(&sealed.path);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0]
        .to_string()
        .starts_with("phases.parquet: sha256"));
    // An extra file is reported too.
    std::fs::write(sealed.path.join("notes.txt"), "x").unwrap();
    let r = verify_dir(&sealed.path);
    assert!(r.errors.iter().any(|e| e.to_string().contains("notes.txt")));
}

#[test]
fn two_concurrent_runs_into_one_store_both_seal() {
    let d = test_dir("concurrent");
    let s = store(&d);
    let barrier = Arc::new(Barrier::new(4));
    // Two different runs, and two identical ones, all sealing at once.
    let seeds = [81u64, 82, 83, 83];
    let handles: Vec<_> = seeds
        .iter()
        .map(|&seed| {
            let s = s.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let records = synth_records(RunShape::small(seed));
                let st = stage(&s, &records, seed);
                barrier.wait();
                seal(st.dir(), &s).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_ne!(results[0].id, results[1].id);
    assert_eq!(results[2].id, results[3].id);
    assert_eq!(
        results[2..].iter().filter(|r| r.fresh).count(),
        1,
        "exactly one identical seal publishes"
    );
    let ids = s.bundle_ids().unwrap();
    assert_eq!(ids.len(), 3);
    for id in ids {
        let r = verify_dir(&s.bundles_dir().join(&id));
        assert!(r.ok(), "{id}: {:?}", r.errors);
    }
    assert!(s.staging_dirs().unwrap().is_empty());
}
