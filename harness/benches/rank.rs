//! `cargo bench -p harness --bench rank`: `harness rank` over 1,000 synthetic bundles
//! (target: under 2 s on the 2-core development machine).
//!
//! The bundles are sealed through the evidence crate once into
//! `target/bench-rank-store` (reused while its `READY` file names the same count);
//! the timed part is what `harness rank` does: read every bundle (manifests, then one
//! polars scan over the phase tables and one over the sample tables), pair, bootstrap,
//! fit and render the markdown. Reports the median and the fastest of the runs.

use harness::bundle::files::store_bundle_dirs;
use harness::bundle::scan::load_dirs;
use harness::levers_spec::LeverSpec;
use harness::test_kit::ranked::{render, seal, Noise};
use std::path::Path;
use std::time::Instant;

const BUNDLES: usize = 1000;
const RUNS: usize = 5;
const TARGET_S: f64 = 2.0;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-rank-store");
    let spec_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/levers.toml");
    let spec = match LeverSpec::load(&spec_path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench rank: {e}");
            std::process::exit(2);
        }
    };
    let ready = root.join("READY");
    if std::fs::read_to_string(&ready).ok().as_deref() != Some(&BUNDLES.to_string()) {
        if root.exists() {
            std::fs::remove_dir_all(&root).expect("remove stale bench store");
        }
        let store = evidence::store::Store::resolve(Some(&root)).expect("bench store");
        let t = Instant::now();
        let mut noise = Noise::new(1);
        let mut n = 0usize;
        let mut round = 1u32;
        'fill: loop {
            for (rung, dims) in [("0", (64u64, 64u64, 9u64)), ("2", (256, 128, 25))] {
                for l in &spec.levers {
                    for arm in [&l.baseline, &l.treatment] {
                        let on = arm == &l.treatment;
                        let mut x = |v: f64| v * (1.0 + 0.05 * noise.next());
                        let k = if on { 0.8 } else { 1.0 };
                        let mut r =
                            render(rung, dims, x(20.0) * k, x(8.0), x(16.0), x(6.0) * k, 5.0);
                        r.schedule =
                            Some(("bench".into(), round, n as u32, l.id.clone(), arm.clone()));
                        seal(&store, &r);
                        n += 1;
                        if n == BUNDLES {
                            break 'fill;
                        }
                    }
                }
            }
            round += 1;
        }
        std::fs::write(&ready, BUNDLES.to_string()).expect("write READY");
        eprintln!(
            "bench rank: sealed {BUNDLES} bundles in {:.1} s (setup, not timed)",
            t.elapsed().as_secs_f64()
        );
    }
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let dirs = store_bundle_dirs(&root).expect("list bench store");
        let loaded = load_dirs(&dirs);
        assert_eq!(
            loaded.bundles.len(),
            BUNDLES,
            "{:?}",
            loaded.unreadable.first()
        );
        let r = harness::rank::rank(&spec, &loaded.bundles, &loaded.unreadable, &[], "bench");
        let md = harness::formats::markdown::markdown(&r);
        times.push(t.elapsed().as_secs_f64());
        bytes = md.len();
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "rank/{BUNDLES}-bundles: median {median:.3} s, fastest {:.3} s over {RUNS} runs ({} report bytes); target {TARGET_S:.1} s: {:.2}x of target",
        times[0],
        bytes,
        median / TARGET_S
    );
}
