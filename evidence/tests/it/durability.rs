//! The journal's durability cadence, observed from outside the writer: while
//! records are appended steadily, every record is on disk (readable by a second
//! handle, and fdatasync'ed) within about a second. Part of the fault suite: a
//! writer that stops flushing or syncing on its cadence turns this red.

use std::time::{Duration, Instant};

use evidence::journal::{read_journal, Record, SharedJournal};
use evidence::sample::Sample;

#[test]
fn appended_records_reach_the_disk_within_a_second_and_are_synced() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("durability");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("journal");
    let j = SharedJournal::create(&path).unwrap();
    let t0 = Instant::now();
    let mut appended: Vec<(Instant, usize)> = Vec::new();
    let mut worst = Duration::ZERO;
    let mut n = 0usize;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while t0.elapsed() < Duration::from_millis(3500) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut s = Sample::empty(x >> 20);
        s.set("rss_bytes", Some((x % 1_000_000) as f64));
        j.append(&Record::Sample(s)).unwrap();
        n += 1;
        appended.push((Instant::now(), n));
        std::thread::sleep(Duration::from_millis(10));
        // What a reader of the file sees now: every record older than the worst
        // lag so far must be there.
        let on_disk = read_journal(&path).unwrap().records.len();
        let oldest_missing = appended.iter().find(|(_, k)| *k > on_disk).map(|(t, _)| *t);
        if let Some(t) = oldest_missing {
            worst = worst.max(t.elapsed());
        }
    }
    let syncs = j.syncs();
    j.finish().unwrap();
    assert!(
        worst <= Duration::from_secs(1),
        "a record waited {worst:?} to reach the file"
    );
    // 3.5 s of steady appends: at least one fdatasync per second.
    assert!(syncs >= 3, "only {syncs} fdatasyncs in 3.5 s of appends");
    eprintln!("FAULTS: journal cadence: {n} records, worst on-disk lag {worst:?}, {syncs} fdatasyncs in 3.5 s");
}
