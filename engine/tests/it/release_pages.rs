//! `release-pages = on` measurably lowers the weights' page-cache residency
//! after load: the weights are written fresh, read once so they are in the page
//! cache (checked with mincore), then loaded with the lever off and on.

use std::path::{Path, PathBuf};

use engine::presets::preset;
use engine::synth_weights::{self as synth, component_specs, SynthOptions};
use engine::weights::layout::{Component, Layout};
use engine::weights::residency::{file_residency, warm_file, Residency};
use engine::weights::safetensors::LoadOptions;
use engine::weights::safetensors::Widen;
use engine::weights::TensorSource;

fn residency_of(files: &[PathBuf]) -> Residency {
    files
        .iter()
        .map(|f| file_residency(f).unwrap())
        .fold(Residency::default(), Residency::plus)
}

fn load_all(root: &Path, release: bool) -> Vec<PathBuf> {
    let p = preset("tiny").unwrap();
    let lay = Layout::resolve(root).unwrap();
    let mut files = Vec::new();
    for (c, specs) in component_specs(&p) {
        let cf = lay.component(c).unwrap();
        let src = cf
            .open(LoadOptions {
                widen: Widen::Single,
                release_pages: release,
            })
            .unwrap();
        for s in &specs {
            let t = src.load_f32(&s.name, &s.shape).unwrap();
            assert_eq!(t.numel(), s.numel());
        }
        if release {
            src.release_all();
        }
        files.extend(cf.files.iter().cloned());
        assert!(matches!(
            c,
            Component::Transformer | Component::Vae | Component::TextEncoder
        ));
    }
    files
}

#[test]
fn release_on_drops_the_weights_from_the_page_cache_and_off_keeps_them() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("release_pages");
    let _ = std::fs::remove_dir_all(&dir);
    synth::synthesize(&preset("tiny").unwrap(), &dir, &SynthOptions::default()).unwrap();
    let files = load_all(&dir, false);
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(total > 1 << 20, "{total}");

    for f in &files {
        warm_file(f).unwrap();
    }
    let warm = residency_of(&files);
    assert!(
        warm.fraction() > 0.99,
        "weights not in cache after reading: {warm:?}"
    );
    load_all(&dir, false);
    let off = residency_of(&files);

    for f in &files {
        warm_file(f).unwrap();
    }
    load_all(&dir, true);
    let on = residency_of(&files);
    eprintln!(
        "residency: warm {:.3}, after off {:.3}, after on {:.3}",
        warm.fraction(),
        off.fraction(),
        on.fraction()
    );
    assert!(
        off.fraction() > 0.99,
        "release-pages=off must leave the cache alone: {off:?}"
    );
    assert!(
        on.fraction() < 0.05,
        "release-pages=on must drop the pages: {on:?}"
    );
}
