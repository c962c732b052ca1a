//! `widen-f32 = double` measurably raises peak RSS: loading the same weights with
//! the stored bytes kept beside the f32 copies peaks higher by about the stored
//! size. The process's high-water mark counts every thread's allocations, so
//! the measurement runs in a child process of this test binary running this
//! test alone (`ENGINE_IT_ALONE` set); the parent asserts that it ran and passed.

use std::path::PathBuf;

use engine::hostmem;
use engine::synth_weights::{header_bytes, unit_bytes, FilePlan};
use engine::weights::safetensors::Widen;
use engine::weights::safetensors::{LoadOptions, SafetensorsSource};
use engine::weights::spec::{DType, TensorSpec};
use engine::weights::TensorSource;

/// Eight bf16 tensors of 2^21 elements: 32 MiB stored, 64 MiB as f32.
fn write_weights(path: &std::path::Path) -> Vec<TensorSpec> {
    let specs: Vec<TensorSpec> = (0..8)
        .map(|i| {
            TensorSpec::new(
                format!("blocks.{i}.proj.weight"),
                &[2048, 1024],
                DType::BF16,
            )
        })
        .collect();
    let plan = FilePlan {
        rel: "w.safetensors".into(),
        tensors: specs.clone(),
    };
    let mut bytes = header_bytes(&plan);
    for s in &specs {
        bytes.extend(unit_bytes(s, 0, s.numel()));
    }
    std::fs::write(path, bytes).unwrap();
    specs
}

/// Peak RSS over loading every tensor (f32 copies kept) with `widen`.
fn peak_of(path: &std::path::Path, specs: &[TensorSpec], widen: Widen) -> (u64, u64) {
    let before = hostmem::status().rss_bytes;
    assert!(
        hostmem::reset_peak(),
        "this test needs /proc/self/clear_refs"
    );
    let opts = LoadOptions {
        widen,
        release_pages: true,
    };
    let src =
        SafetensorsSource::open("w", &[path.to_path_buf()], &|n, _| Some(n.into()), opts).unwrap();
    let copies: Vec<_> = specs
        .iter()
        .map(|s| src.load_f32(&s.name, &s.shape).unwrap())
        .collect();
    let retained = src.into_retained();
    let peak = hostmem::status().hwm_bytes;
    let kept: usize = retained.iter().map(Vec::len).sum();
    assert!(copies.iter().all(|t| t.data().iter().any(|x| *x != 0.0)));
    drop(copies);
    drop(retained);
    (peak.saturating_sub(before), kept as u64)
}

#[test]
fn double_widening_peaks_higher_by_the_stored_bytes() {
    if std::env::var_os("ENGINE_IT_ALONE").is_none() {
        let name = "widen_rss::double_widening_peaks_higher_by_the_stored_bytes";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads", "1"])
            .env("ENGINE_IT_ALONE", "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{text}");
        assert!(
            out.status.success(),
            "the measurement failed in its own process"
        );
        assert!(
            text.contains("1 passed"),
            "the measurement did not run: {text}"
        );
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("widen_rss");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    let specs = write_weights(&path);
    let stored: u64 = specs.iter().map(|s| s.nbytes() as u64).sum();
    // Warm-up run so allocator arenas and the page cache are in a steady state.
    let _ = peak_of(&path, &specs, Widen::Single);
    let (single, kept_single) = peak_of(&path, &specs, Widen::Single);
    let (double, kept_double) = peak_of(&path, &specs, Widen::Double);
    assert_eq!(kept_single, 0);
    assert_eq!(kept_double, stored);
    let extra = double.saturating_sub(single);
    eprintln!("peak over baseline: single {single} B, double {double} B, extra {extra} B, stored {stored} B");
    assert!(
        single >= 2 * stored * 9 / 10,
        "f32 copies must show: {single} < 0.9 * {}",
        2 * stored
    );
    assert!(
        extra >= stored * 9 / 10 && extra <= stored * 13 / 10,
        "double should add about the stored {stored} B, added {extra} B"
    );
}
