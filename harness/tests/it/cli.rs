//! End-to-end tests of the real `harness` binary: the store gate, and
//! recover / ls / verify / show on a store under the build directory.

use std::path::{Path, PathBuf};

use evidence::journal::Stream;
use evidence::marker::{Attrs, Marker};
use evidence::sample::Sample;
use serde_json::json;

use crate::support::bins::{harness, run};
use crate::support::dirs::fresh_dir;
use crate::support::journal::SynthJournal;

#[test]
fn a_store_under_tmp_is_refused_by_the_real_binary() {
    let p = format!("/tmp/harness-gate-test-{}", std::process::id());
    let (code, _out, err) = run(harness().args(["ls", "--store", &p]));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains(&p) && err.contains("under /tmp") && err.contains("rule"),
        "{err}"
    );
    assert!(
        !Path::new(&p).exists(),
        "the gate must refuse before creating anything"
    );
    // Through the environment too, and for every command.
    let (code, _, err) = run(harness()
        .args(["recover"])
        .env("HARNESS_STORE", "/var/tmp/hs"));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("/var/tmp"), "{err}");
    let (code, _, err) = run(harness().args(["verify", "abcd", "--store", "/mnt/x"]));
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = run(harness().args(["show", "abcd", "--store", "/dev/shm/hs"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("tmpfs"), "{err}");
}

/// A dead run's staging directory: journal with fragments, markers, samples, output.
fn dead_run(store: &Path, name: &str, seed: u64) {
    let dir = store.join("staging").join(name);
    std::fs::create_dir_all(dir.join("frames")).unwrap();
    let j = SynthJournal::at(&dir.join("journal"));
    let t0 = 1_000_000_000_000u64 + seed;
    j.fragment(
        "run",
        json!({"start_ns": t0, "boot_id": "not-this-boot", "hostname": "box-a"}),
    );
    j.fragment("rung", json!({"name": "7"}));
    j.fragment("levers", json!({"staging": "serial"}));
    let ms = 1_000_000u64;
    let events = [
        Marker::Open {
            t_ns: t0 + 10 * ms,
            name: "load.dit".into(),
            attrs: Attrs::new(),
        },
        Marker::Close {
            t_ns: t0 + 500 * ms,
            name: "load.dit".into(),
            attrs: Attrs::new(),
        },
        Marker::Open {
            t_ns: t0 + 500 * ms,
            name: "denoise".into(),
            attrs: Attrs::new(),
        },
        Marker::Open {
            t_ns: t0 + 500 * ms,
            name: "denoise.step".into(),
            attrs: Attrs::new(),
        },
    ];
    for (i, m) in events.iter().enumerate() {
        j.marker(m.t_ns() + 1, m);
        j.output(m.t_ns() + 2, Stream::Stderr, format!("line {i}"));
    }
    for k in 0..12u64 {
        let mut s = Sample::empty(t0 + k * 100 * ms);
        s.set("rss_bytes", Some((1_000_000 + k * 4096 + seed) as f64));
        s.set("gpu_util_pct", Some(if k > 5 { 90.0 } else { 0.0 }));
        s.set("cpu_cores", Some(1.0 + k as f64 / 8.0));
        j.sample(s);
    }
    j.finish();
}

#[test]
fn recover_ls_verify_show_on_a_real_store() {
    let d = fresh_dir("cli-commands");
    let store = d.join("store");
    let st = store.to_str().unwrap();
    // Create the layout, then two dead runs.
    let (code, out, err) = run(harness().args(["ls", "--store", st]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no bundles"), "{out}");
    dead_run(&store, "run-a", 1);
    dead_run(&store, "run-b", 2);

    let (code, out, err) = run(harness().args(["recover"]).env("HARNESS_STORE", st));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("(host-lost)").count(), 2, "{out}");
    let (code, out, _) = run(harness().args(["recover", "--store", st]));
    assert_eq!(code, 0);
    assert!(out.contains("nothing to recover"), "{out}");

    let (code, out, err) = run(harness().args(["ls", "--store", st]));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{out}");
    for l in &lines {
        assert!(
            l.contains(" 7 ")
                && l.contains("staging=serial")
                && l.contains("host-lost*")
                && l.contains("box-a"),
            "{l}"
        );
    }
    let prefix = lines[0].split_whitespace().next().unwrap().to_string();
    assert_eq!(prefix.len(), 12);

    let (code, out, err) = run(harness().args(["verify", &prefix, "--store", st]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ok "), "{out}");

    let (code, out, err) = run(harness().args(["show", &prefix, "--store", st]));
    assert_eq!(code, 0, "{err}");
    for needle in [
        "bundle   ",
        "host-lost",
        "load.dit",
        "denoise.step (open)",
        "coverage: leaves sum",
        "containment",
        "exclusivity",
        "still open at the end: denoise, denoise.step",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }

    // A flipped byte: verify fails naming the file, exit 1; by path too.
    let ids: Vec<PathBuf> = std::fs::read_dir(store.join("bundles"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let bundle = ids
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&prefix)
        })
        .unwrap();
    let f = bundle.join("samples.parquet");
    let mut b = std::fs::read(&f).unwrap();
    b[100] ^= 0x08;
    std::fs::write(&f, b).unwrap();
    let (code, out, _) = run(harness().args(["verify", bundle.to_str().unwrap()]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("samples.parquet: sha256"), "{out}");

    // Unknown id: usage error, exit 2.
    let (code, _, err) = run(harness().args(["verify", "ffffffffffff", "--store", st]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no bundle matches"), "{err}");
    let (code, _, _) = run(harness().args(["show", "zz-not-hex", "--store", st]));
    assert_eq!(code, 2);
}
