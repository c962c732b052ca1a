//! Seal benchmark: a synthetic 3-hour run at 10 Hz (108,000 samples of every
//! sampler column, ~5,000 markers, one output line per marker, 121 frames) is
//! journaled, then sealed into a store three times (fresh staging each time).
//! Reports the seal time (read journal, build, write, fsync, read-back verify,
//! publish) and the bundle size. Targets: < 1 s, < 5 MB.
//!
//! Run: `cargo bench -p evidence --bench seal`.

use std::time::Instant;

use evidence::journal::Record;
use evidence::seal::seal;
use evidence::store::{Store, JOURNAL_FILE};
use evidence::test_kit::run::{synth_records, write_journal, RunShape};

fn main() {
    let shape = RunShape {
        seed: 2026,
        wall_ns: 3 * 3600 * 1_000_000_000,
        steps: 1240,
        cadence_ns: 100_000_000,
        frames: 121,
        completes: true,
        boot_id: "00000000-0000-4000-8000-000000000000",
    };
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("bench-seal")
        .join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("bench dir");
    let store = Store::resolve(Some(&root.join("store"))).expect("store");

    let t = Instant::now();
    let records = synth_records(shape);
    let count = |f: fn(&Record) -> bool| records.iter().filter(|r| f(r)).count();
    let samples = count(|r| matches!(r, Record::Sample(_)));
    let markers = count(|r| matches!(r, Record::Marker { .. }));
    let journal = root.join("journal");
    write_journal(&journal, &records);
    let jbytes = std::fs::metadata(&journal).expect("journal").len();
    println!(
        "synthetic run: {samples} samples x {} columns, {markers} markers, journal {:.1} MB (generated and written in {:.2} s)",
        evidence::sample::SAMPLE_COLUMNS.len(),
        jbytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    let mut times = Vec::new();
    let mut id = String::new();
    for round in 0..3 {
        let st = store.open_staging().expect("staging");
        std::fs::copy(&journal, st.dir().join(JOURNAL_FILE)).expect("copy journal");
        let t = Instant::now();
        let sealed = seal(st.dir(), &store).expect("seal");
        let secs = t.elapsed().as_secs_f64();
        times.push(secs);
        if round == 0 {
            assert!(sealed.fresh);
            id = sealed.id.clone();
        } else {
            assert_eq!(sealed.id, id, "same journal, same id");
        }
        println!(
            "seal round {round}: {secs:.3} s ({})",
            if sealed.fresh {
                "published"
            } else {
                "identical bundle existed: no-op"
            }
        );
    }
    times.sort_by(f64::total_cmp);
    let dir = store.bundles_dir().join(&id);
    let mut total = 0u64;
    let mut sizes = Vec::new();
    for e in std::fs::read_dir(&dir).expect("bundle") {
        let e = e.expect("entry");
        let n = e.metadata().expect("meta").len();
        total += n;
        sizes.push(format!(
            "{}={:.0} kB",
            e.file_name().to_string_lossy(),
            n as f64 / 1e3
        ));
    }
    sizes.sort();
    println!(
        "bundle {id}: {:.2} MB ({})",
        total as f64 / 1e6,
        sizes.join(", ")
    );
    println!(
        "seal time: min {:.3} s, median {:.3} s (target < 1 s); bundle {:.2} MB (target < 5 MB)",
        times[0],
        times[1],
        total as f64 / 1e6
    );
    let _ = std::fs::remove_dir_all(&root);
}
