//! The hostile tester's cases (issue 27), one test per case, named for it: a
//! bundle that was tampered with is never read as evidence, a crafted manifest
//! cannot take a command down, input errors exit 2, gates 3, and nothing a
//! refusal started is left behind.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::bins::{harness, repo, run};
use crate::support::dirs::fresh_dir;

/// The two runs of one committed conditioning pair (campaign at rung 2).
const PAIR: [&str; 2] = [
    "dc068fb8d3470c98ae1b5cf84e3a3a35ecc4ccdf6c5103266711357b57932e3d",
    "54b8d15fa3bafcf151ba9da0e8ba07fdd8be36d314019c2be2b0caaeb1d218e0",
];

/// A store under `fresh_dir(name)` whose bundles are hard links to the committed
/// ones (no copy of 350 MB; renaming a link inside it never touches the
/// committed file), leaving out the ids in `skip`.
fn linked_store(name: &str, skip: &[&str]) -> PathBuf {
    let root = fresh_dir(name);
    let src = repo().join("reports/evidence/bundles");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        let id = e.file_name().to_string_lossy().into_owned();
        if skip.contains(&id.as_str()) {
            continue;
        }
        let dir = root.join("bundles").join(&id);
        std::fs::create_dir_all(&dir).unwrap();
        for f in std::fs::read_dir(e.path()).unwrap() {
            let f = f.unwrap();
            std::fs::hard_link(f.path(), dir.join(f.file_name())).unwrap();
        }
    }
    root
}

/// `harness rank --store root --json` with its own verify cache; the JSON.
fn rank_json(root: &Path, cache: &Path) -> Value {
    let (code, so, se) = run(harness()
        .current_dir(repo())
        .env("HARNESS_VERIFY_CACHE", cache)
        .args(["rank", "--json", "--store"])
        .arg(root));
    assert_eq!(code, 0, "{se}");
    serde_json::from_str(&so).unwrap()
}

/// How many bundle ids the one cache file under `cache` holds as verified.
fn cached_ids(cache: &Path) -> usize {
    let files: Vec<_> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let v: Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    v["verified"].as_object().map_or(0, |o| o.len())
}

/// Swap one file between two bundle directories (a rename of links).
fn swap(a: &Path, b: &Path, file: &str) {
    let t = a.join(format!("{file}.swap"));
    std::fs::rename(a.join(file), &t).unwrap();
    std::fs::rename(b.join(file), a.join(file)).unwrap();
    std::fs::rename(&t, b.join(file)).unwrap();
}

#[test]
fn swapped_phases_parquet_excludes_both_bundles_and_rank_otherwise_equals_the_store_without_the_pair(
) {
    let cache = fresh_dir("hostile-swap-cache");
    let without = linked_store("hostile-swap-without", &PAIR);
    let swapped = linked_store("hostile-swap", &[]);
    let (a, b) = (
        swapped.join("bundles").join(PAIR[0]),
        swapped.join("bundles").join(PAIR[1]),
    );
    // Rank once before the swap: the cache then holds both ids as verified,
    // and the swap must still be seen (the files' stamps changed).
    let before = rank_json(&swapped, &cache);
    assert!(before["used"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u == PAIR[0]));
    let all = std::fs::read_dir(swapped.join("bundles")).unwrap().count();
    assert_eq!(cached_ids(&cache), all);
    swap(&a, &b, "phases.parquet");
    let got = rank_json(&swapped, &cache);
    // The cache forgot the two (the store without them adds none).
    assert_eq!(cached_ids(&cache), all - 2);
    let want = rank_json(&without, &cache);

    // Both runs are excluded, each naming the file.
    let excluded = got["excluded"].as_array().unwrap();
    for id in PAIR {
        let e = excluded
            .iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("{id} is not excluded: {excluded:?}"));
        let why = e["reason"].as_str().unwrap();
        assert!(
            why.starts_with("does not verify:") && why.contains("phases.parquet"),
            "{id}: {why}"
        );
    }
    // Everything else is what the store without the pair says.
    let others: Vec<&Value> = excluded
        .iter()
        .filter(|e| !PAIR.contains(&e["id"].as_str().unwrap_or("")))
        .collect();
    let want_excluded: Vec<&Value> = want["excluded"].as_array().unwrap().iter().collect();
    assert_eq!(others, want_excluded);
    for key in ["levers", "fit", "used", "reference_rung"] {
        assert_eq!(got[key], want[key], "{key}");
    }
    assert_eq!(
        got["bundles_seen"].as_u64(),
        want["bundles_seen"].as_u64().map(|n| n + 2)
    );
    // The input digest covers what was read: it differs from before the swap's.
    assert_ne!(got["input_digest"], before["input_digest"]);
}

#[test]
fn an_edited_manifest_id_is_excluded_not_listed_as_used() {
    let cache = fresh_dir("hostile-id-cache");
    let root = linked_store("hostile-id", &[]);
    let dir = root.join("bundles").join(PAIR[0]);
    let m = dir.join("manifest.json");
    // A new file (not the committed link) with the id edited.
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::remove_file(&m).unwrap();
    let edited = text.replacen('{', &format!("{{\"id\":\"{}\",", "0".repeat(64)), 1);
    assert_ne!(edited, text);
    std::fs::write(&m, edited).unwrap();
    let got = rank_json(&root, &cache);
    let used = got["used"].as_array().unwrap();
    assert!(!used.iter().any(|u| u == PAIR[0] || u == &"0".repeat(64)));
    let e = got["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == PAIR[0])
        .expect("the edited bundle is excluded");
    assert!(
        e["reason"].as_str().unwrap().contains("manifest.json"),
        "{e}"
    );
}

/// Give the bundle at `dir` the manifest `m` and rename it to the new manifest's
/// id: a self-consistent bundle whose manifest says what a crafter wants.
fn recommit(dir: &Path, m: &Value) -> PathBuf {
    let text = evidence::manifest::canonical_json(m);
    let id = evidence::manifest::sha256_hex(text.as_bytes());
    let m_path = dir.join("manifest.json");
    std::fs::remove_file(&m_path).unwrap();
    std::fs::write(&m_path, text).unwrap();
    let to = dir.parent().unwrap().join(id);
    std::fs::rename(dir, &to).unwrap();
    to
}

#[test]
fn a_verified_manifest_with_a_rung_of_2_to_the_32_is_excluded_and_diff_refuses_it() {
    let cache = fresh_dir("hostile-huge-cache");
    let root = linked_store("hostile-huge", &[]);
    let dir = root.join("bundles").join(PAIR[0]);
    let mut m: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    m["rung"]["config"]["width"] = Value::from(1u64 << 32);
    m["rung"]["config"]["height"] = Value::from(1u64 << 32);
    let crafted = recommit(&dir, &m);
    let id = crafted.file_name().unwrap().to_string_lossy().into_owned();
    let v = evidence::verify::verify_dir(&crafted);
    assert!(v.ok(), "the crafted bundle is self-consistent: {v:?}");

    let got = rank_json(&root, &cache);
    let e = got["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id.as_str())
        .expect("the crafted bundle is excluded");
    assert!(e["reason"].as_str().unwrap().contains("rung.config"), "{e}");

    let (code, _, se) = run(harness()
        .env("HARNESS_VERIFY_CACHE", &cache)
        .args(["diff", "--store"])
        .arg(&root)
        .args([&id, PAIR[1]]));
    assert_eq!(code, 2, "{se}");
    assert!(
        se.contains("rung.config") && se.contains("manifest.json"),
        "{se}"
    );
    assert!(!se.contains("panicked"), "{se}");
}

#[test]
fn show_diff_plot_and_export_refuse_a_tampered_bundle_with_exit_1_naming_the_file() {
    let cache = fresh_dir("hostile-readers-cache");
    let root = linked_store("hostile-readers", &[]);
    let dir = root.join("bundles").join(PAIR[0]);
    // A copy of samples.parquet with one byte changed (not the committed link).
    let p = dir.join("samples.parquet");
    let mut bytes = std::fs::read(&p).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, bytes).unwrap();
    let out = fresh_dir("hostile-readers-out");
    let cases: Vec<Vec<String>> = vec![
        vec!["show".into(), PAIR[0].into()],
        vec!["diff".into(), PAIR[0].into(), PAIR[1].into()],
        vec!["diff".into(), PAIR[1].into(), PAIR[0].into()],
        vec![
            "plot".into(),
            PAIR[0].into(),
            "--out".into(),
            out.join("t.svg").display().to_string(),
        ],
        vec![
            "export".into(),
            PAIR[0].into(),
            "--perfetto".into(),
            "--out".into(),
            out.join("t.json").display().to_string(),
        ],
    ];
    for args in cases {
        let (code, so, se) = run(harness()
            .env("HARNESS_VERIFY_CACHE", &cache)
            .args(&args)
            .arg("--store")
            .arg(&root));
        assert_eq!(code, 1, "{args:?}: {so}{se}");
        assert!(
            se.contains("samples.parquet") && se.contains(&PAIR[0][..12]),
            "{args:?}: {se}"
        );
    }
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn a_store_child_linked_into_tmp_is_refused_with_exit_3_and_nothing_left() {
    for sub in ["bundles", "staging", "bin"] {
        let root = fresh_dir(&format!("hostile-link-{sub}"));
        let target = PathBuf::from(format!("/tmp/harness-hostile-{}-{sub}", std::process::id()));
        let _ = std::fs::remove_dir_all(&target);
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.join(sub)).unwrap();
        let (code, so, se) = run(harness()
            .env_remove("HARNESS_LEASE_ID")
            .args(["run", "--store"])
            .arg(&root)
            .args(["--exec", "--", crate::support::bins::TEST_ENGINE, "--hello"]));
        assert_eq!(code, 3, "{sub}: {so}{se}");
        assert!(
            se.contains(sub) && se.contains("/tmp") && se.contains("store-durable"),
            "{sub}: {se}"
        );
        let left: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from(sub)], "{sub}");
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "{sub}");
        // recover is refused the same way (no phantom bundle from a staging dir).
        let (code, _, se) = run(harness().args(["recover", "--store"]).arg(&root));
        assert_eq!(code, 3, "{sub}: recover: {se}");
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "{sub}");
        let _ = std::fs::remove_dir_all(&target);
    }
}

/// `harness run --exec -- test-engine ARGS...` into `store`: (exit, manifest).
fn exec_run(store: &Path, args: &[&str]) -> (i32, Value) {
    let out = harness()
        .env_remove("HARNESS_LEASE_ID")
        .env_remove("TEST_ENGINE_SCRIPT")
        .args(["run", "--store"])
        .arg(store)
        .args(["--exec", "--", crate::support::bins::TEST_ENGINE])
        .args(args)
        .output()
        .unwrap();
    let m_path = crate::support::bins::bundle_path(&out).join("manifest.json");
    let m = serde_json::from_slice(&std::fs::read(&m_path).unwrap()).unwrap();
    (out.status.code().unwrap_or(-1), m)
}

#[test]
fn marker_times_off_the_harness_clock_are_rejected_counted_and_build_no_phase() {
    let store = crate::support::dirs::vacant_dir("hostile-clock");
    // A close stamped 2^63 ns (clamped to i64::MAX before), and a close from
    // before the run started (time going backwards: t_ns 1).
    let (code, m) = exec_run(
        &store,
        &[
            "--hello",
            "--open",
            "load",
            "--sleep-ms",
            "50",
            "--raw",
            r#"{"ev":"close","t_ns":9223372036854775808,"name":"load"}"#,
            "--open",
            "denoise",
            "--raw",
            r#"{"ev":"close","t_ns":1,"name":"denoise"}"#,
            "--close",
            "denoise",
            "--close",
            "load",
            "--frames",
            "good",
            "64x48",
            "9",
        ],
    );
    assert_eq!(m["markers"]["clock_rejected"], 2, "{}", m["markers"]);
    let first = m["markers"]["first_clock_error"].as_str().unwrap();
    assert!(
        first.contains("9223372036854775808") && first.contains("after the harness read"),
        "{first}"
    );
    // The phases come from the believable markers only: the real closes end
    // both phases, and the engine wall is this run's, not 9.2e9 s or hours.
    let p = &m["phases"];
    let wall = p["wall_s"].as_f64().unwrap_or(f64::NAN);
    assert!(wall > 0.04 && wall < 60.0, "engine wall {wall} s: {p}");
    assert_eq!(p["unmatched_closes"], 0, "{p}");
    assert_eq!(p["open_at_end"], Value::Array(vec![]), "{p}");
    assert_eq!(p["instances"], 2, "{p}");
    // Flagged: rank does not compare such a run (bundle::manifest's
    // a_run_with_clock_rejected_markers_is_not_compared pins that).
    assert_eq!(code, 0);
}

/// `harness run --rung R --store S --engine E [extra...]`: (exit, stderr).
fn run_rung(store: &Path, rung: &Path, engine: &Path, extra: &[&str]) -> (i32, String) {
    let (code, _, se) = run(harness()
        .env_remove("HARNESS_LEASE_ID")
        .args(["run", "--store"])
        .arg(store)
        .arg("--rung")
        .arg(rung)
        .arg("--engine")
        .arg(engine)
        .args(extra));
    (code, se)
}

/// Nothing under the store but its empty layout (or nothing at all).
fn nothing_left(store: &Path) {
    for sub in ["bundles", "staging"] {
        let d = store.join(sub);
        let n = std::fs::read_dir(&d).map(|r| r.count()).unwrap_or(0);
        assert_eq!(n, 0, "{} holds {n} entries", d.display());
    }
}

#[test]
fn input_errors_exit_2_before_any_gate_and_leave_nothing() {
    let dir = fresh_dir("hostile-input");
    let good = std::fs::read_to_string(repo().join("rungs/0.toml")).unwrap();
    let engine = crate::support::bins::engine();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let set = |key: &str, value: &str| -> String {
        good.lines()
            .map(|l| {
                if l.split('=').next().map(str::trim) == Some(key) {
                    format!("{key} = {value}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    };
    let cases: Vec<(&str, PathBuf, Vec<&str>, &str)> = vec![
        (
            "one step",
            write("steps1.toml", &set("steps", "1")),
            vec![],
            "at least 2 steps",
        ),
        (
            "the documented maximum size",
            write(
                "huge.toml",
                &set("width", "8192").replace("height = 64", "height = 8192"),
            ),
            vec![],
            "65536 latent tokens",
        ),
        (
            "a 100 KB prompt",
            write(
                "prompt.toml",
                &set("prompt", &format!("\"{}\"", "x".repeat(100_000))),
            ),
            vec![],
            "'prompt'",
        ),
        (
            "a 50 MB rung file",
            write(
                "fifty.toml",
                &format!("{good}\n# {}\n", "x".repeat(50 << 20)),
            ),
            vec![],
            "at most 1048576 bytes",
        ),
        (
            "an unknown preset",
            write("preset.toml", &set("preset", "\"nosuch\"")),
            vec![],
            "unknown preset 'nosuch'",
        ),
        (
            "an unknown lever",
            repo().join("rungs/0.toml"),
            vec!["--lever", "nosuch=x"],
            "unknown lever 'nosuch'",
        ),
        (
            "an unknown arm",
            repo().join("rungs/0.toml"),
            vec!["--lever", "staging=nosuch"],
            "no arm 'nosuch'",
        ),
    ];
    for (what, rung, extra, says) in cases {
        let store = dir.join(format!("store-{}", what.replace(' ', "-")));
        let (code, se) = run_rung(&store, &rung, &engine, &extra);
        assert_eq!(code, 2, "{what}: {se}");
        assert!(se.contains(says), "{what}: {se}");
        assert!(se.len() < 4096, "{what}: a message of {} bytes", se.len());
        nothing_left(&store);
    }
}

#[test]
fn a_grandchild_that_calls_setsid_is_killed_and_named_in_the_bundle() {
    let store = crate::support::dirs::vacant_dir("hostile-setsid");
    let pidfile = fresh_dir("hostile-setsid-pid").join("pid");
    // The engine starts a grandchild in a new session (out of the engine's
    // process group, beyond killpg), writes its pid, and exits at once.
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 300' </dev/null >/dev/null 2>&1 & \
         while [ ! -s {} ]; do sleep 0.05; done",
        pidfile.display(),
        pidfile.display()
    );
    let started = std::time::Instant::now();
    let out = harness()
        .env_remove("HARNESS_LEASE_ID")
        .args(["run", "--store"])
        .arg(&store)
        .args(["--exec", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let m: Value = serde_json::from_slice(
        &std::fs::read(crate::support::bins::bundle_path(&out).join("manifest.json")).unwrap(),
    )
    .unwrap();
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let killed = m["escaped"]["killed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        killed
            .iter()
            .any(|k| k["pid"] == pid && k["comm"] == "sleep"),
        "{}\n{}",
        m["escaped"],
        String::from_utf8_lossy(&out.stderr)
    );
    // Gone (reaped, not a zombie), and the run did not wait for it.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} still exists"
    );
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}
