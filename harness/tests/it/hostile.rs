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
    // Rank once before the swap; rank keeps no cache (every byte is hashed
    // in the process that ranks), so the swap is seen whatever was before.
    let before = rank_json(&swapped, &cache);
    assert!(before["used"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u == PAIR[0]));
    swap(&a, &b, "phases.parquet");
    let got = rank_json(&swapped, &cache);
    assert_eq!(
        std::fs::read_dir(&cache).unwrap().count(),
        0,
        "no cache kept"
    );
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
    // Without frames (the geometry check of verify has nothing to hold the
    // rung against), so that the reader's own overflow guard is what refuses.
    for f in ["first.png", "middle.png", "last.png", "frames.parquet"] {
        m["files"].as_object_mut().unwrap().remove(f);
        std::fs::remove_file(dir.join(f)).unwrap();
    }
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

// ---------------------------------------------------------------------------
// The second round (issue 35): one test per finding, numbered as there.
// ---------------------------------------------------------------------------

/// A store under `fresh_dir(name)` holding (as hard links) only the committed
/// bundles `ids`.
fn linked_only(name: &str, ids: &[&str]) -> PathBuf {
    let all: Vec<String> = std::fs::read_dir(repo().join("reports/evidence/bundles"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|id| !ids.contains(&id.as_str()))
        .collect();
    let skip: Vec<&str> = all.iter().map(String::as_str).collect();
    linked_store(name, &skip)
}

/// Give the bundle `id` of the store at `root` the manifest `edit` makes of
/// its own, re-committed under the new id (a self-consistent crafted bundle).
fn craft(root: &Path, id: &str, edit: impl FnOnce(&mut Value)) -> String {
    let dir = root.join("bundles").join(id);
    let mut m: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    edit(&mut m);
    let to = recommit(&dir, &m);
    to.file_name().unwrap().to_string_lossy().into_owned()
}

/// Finding 1: a destination holding only a bundle's directory, or only its
/// manifest, is not "present": the copy is verified, replaced, counted, named.
#[test]
fn sync_replaces_a_destination_copy_that_is_only_a_directory_or_a_manifest() {
    let src = linked_only("hostile2-sync-src", &PAIR);
    let dst = fresh_dir("hostile2-sync-dst");
    std::fs::create_dir_all(dst.join("bundles").join(PAIR[0])).unwrap();
    std::fs::create_dir_all(dst.join("bundles").join(PAIR[1])).unwrap();
    std::fs::copy(
        src.join("bundles").join(PAIR[1]).join("manifest.json"),
        dst.join("bundles").join(PAIR[1]).join("manifest.json"),
    )
    .unwrap();
    let (code, so, se) = run(harness().arg("sync").arg(&src).arg(&dst));
    assert_eq!(code, 0, "{so}{se}");
    for id in PAIR {
        let l = so
            .lines()
            .find(|l| l.contains(&id[..12]))
            .unwrap_or_else(|| panic!("{id} not named: {so}"));
        assert!(
            l.starts_with("replaced") && l.contains("did not verify"),
            "{l}"
        );
    }
    assert!(
        so.contains("0 copied, 0 already there, 0 refused, 2 replaced"),
        "{so}"
    );
    for id in PAIR {
        let (code, so, _) = run(harness().args(["verify", "--store"]).arg(&dst).arg(id));
        assert_eq!(code, 0, "{so}");
    }
    // Again: both are there now, verified, counted as present.
    let (code, so, _) = run(harness().arg("sync").arg(&src).arg(&dst));
    assert_eq!(code, 0);
    assert!(
        so.contains("0 copied, 2 already there, 0 refused, 0 replaced"),
        "{so}"
    );
}

/// Finding 2: a `.harness-report` file of any content does not make a
/// directory ours: `report --out D` refuses it with exit 2 and touches nothing.
#[test]
fn report_refuses_a_directory_with_a_planted_marker_and_deletes_nothing() {
    let store = linked_only("hostile2-report-store", &PAIR);
    let out = fresh_dir("hostile2-report-out");
    std::fs::write(out.join("precious.txt"), "x\n").unwrap();
    std::fs::write(out.join(".harness-report"), "").unwrap();
    let (code, so, se) = run(harness()
        .current_dir(repo())
        .env("HARNESS_VERIFY_CACHE", "off")
        .args(["report", "--store"])
        .arg(&store)
        .arg("--out")
        .arg(&out));
    assert_eq!(code, 2, "{so}{se}");
    assert!(se.contains(".harness-report"), "{se}");
    assert_eq!(
        std::fs::read_to_string(out.join("precious.txt")).unwrap(),
        "x\n"
    );
    // A report of ours is replaced; a file added to it since is refused.
    let ours = fresh_dir("hostile2-report-ours").join("r");
    let rep = |o: &Path| {
        run(harness()
            .current_dir(repo())
            .env("HARNESS_VERIFY_CACHE", "off")
            .args(["report", "--store"])
            .arg(&store)
            .arg("--out")
            .arg(o))
    };
    assert_eq!(rep(&ours).0, 0);
    assert_eq!(rep(&ours).0, 0);
    std::fs::write(ours.join("mine.txt"), "keep").unwrap();
    let (code, _, se) = rep(&ours);
    assert_eq!(code, 2, "{se}");
    assert!(se.contains("mine.txt"), "{se}");
    assert!(ours.join("mine.txt").is_file() && ours.join("index.html").is_file());
}

/// The stamps `bundle::verified` records for the bundle at `dir`, as JSON.
fn stamps_json(dir: &Path) -> Value {
    use std::os::unix::fs::MetadataExt;
    let mut v: Vec<Value> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            serde_json::json!({
                "name": e.file_name().to_string_lossy(),
                "bytes": md.len(),
                "mtime_ns": md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
                "ctime_ns": md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128,
                "inode": md.ino(),
            })
        })
        .collect();
    v.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Value::Array(v)
}

/// Plant a cache entry under `cache` saying the bundle at `dir` of the store
/// at `root` verified with its files as they are now: what an edit through a
/// writable shared mapping (stamps unchanged) or another user leaves behind.
fn plant_verified(cache: &Path, root: &Path, dir: &Path) {
    // Let the harness name and shape the cache file, then add the entry.
    let id = dir.file_name().unwrap().to_string_lossy().into_owned();
    let canonical = root.canonicalize().unwrap();
    let key: String = {
        use sha2::{Digest, Sha256};
        Sha256::digest(canonical.to_string_lossy().as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let file = cache.join(format!("verified-{key}.json"));
    let mut v: Value = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(
            || serde_json::json!({"store": root.display().to_string(), "verified": {}}),
        );
    v["verified"][id] = stamps_json(dir);
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Flip one byte of `file` in a new inode (never the committed link).
fn flip_byte(file: &Path) {
    let mut b = std::fs::read(file).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x01;
    std::fs::remove_file(file).unwrap();
    std::fs::write(file, b).unwrap();
}

/// Findings 3 and 5: `rank` (and so `report` and a campaign's resume, which
/// read through the same function) hashes every byte in this process: a
/// cache entry that vouches for a tampered bundle, whether left by an edit
/// through a shared mapping (stamps unchanged) or planted, is not consulted.
#[test]
fn rank_never_rests_on_a_cache_entry_for_a_tampered_bundle() {
    let cache = fresh_dir("hostile2-plant-cache");
    let root = linked_only("hostile2-plant", &PAIR);
    let dir = root.join("bundles").join(PAIR[0]);
    flip_byte(&dir.join("phases.parquet"));
    plant_verified(&cache, &root, &dir);
    let got = rank_json(&root, &cache);
    let e = got["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == PAIR[0])
        .unwrap_or_else(|| panic!("the tampered bundle is not excluded: {got}"));
    assert!(
        e["reason"].as_str().unwrap().contains("phases.parquet"),
        "{e}"
    );
}

/// Finding 5: a cache directory other users can write is not used: the
/// interactive readers verify in full and say why on stderr.
#[test]
fn a_cache_directory_writable_by_others_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let cache = fresh_dir("hostile2-shared-cache");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let root = linked_only("hostile2-shared", &PAIR);
    let dir = root.join("bundles").join(PAIR[0]);
    flip_byte(&dir.join("samples.parquet"));
    plant_verified(&cache, &root, &dir);
    let (code, so, se) = run(harness()
        .env("HARNESS_VERIFY_CACHE", &cache)
        .args(["show", "--store"])
        .arg(&root)
        .arg(PAIR[0]));
    assert_eq!(code, 1, "{so}{se}");
    assert!(se.contains("samples.parquet"), "{se}");
    assert!(se.contains("not used") && se.contains("writable"), "{se}");
}

/// Finding 6: `bundles/` swapped for a link into /tmp while the engine runs:
/// the seal is refused by the gate (exit 3), nothing lands in /tmp, the
/// bundle stays in staging, and no `path:` is printed.
#[test]
fn a_bundles_link_swapped_in_during_the_run_cannot_redirect_the_seal() {
    let root = crate::support::dirs::vacant_dir("hostile2-swap-bundles");
    let target = PathBuf::from(format!("/tmp/harness-hostile2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir_all(&target).unwrap();
    let child = harness()
        .env_remove("HARNESS_LEASE_ID")
        .args(["run", "--store"])
        .arg(&root)
        .args([
            "--exec",
            "--",
            crate::support::bins::TEST_ENGINE,
            "--hello",
            "--sleep-ms",
            "3000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the run's staging directory, then swap `bundles`.
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(root.join("staging"))
        .map(|r| r.count())
        .unwrap_or(0)
        == 0
    {
        assert!(t0.elapsed().as_secs() < 30, "no staging directory");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::rename(root.join("bundles"), root.join("bundles.old")).unwrap();
    std::os::unix::fs::symlink(&target, root.join("bundles")).unwrap();
    let out = child.wait_with_output().unwrap();
    let (so, se) = (
        crate::support::bins::text(&out.stdout),
        crate::support::bins::text(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(3), "{so}{se}");
    assert!(
        se.contains("store-durable") && se.contains("stays in staging"),
        "{se}"
    );
    assert!(!so.contains("path:"), "{so}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "in /tmp");
    assert_eq!(
        std::fs::read_dir(root.join("bundles.old")).unwrap().count(),
        0
    );
    let staged: Vec<PathBuf> = std::fs::read_dir(root.join("staging"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        staged
            .iter()
            .any(|s| s.join("bundle.tmp/manifest.json").is_file()),
        "{staged:?}"
    );
    let _ = std::fs::remove_dir_all(&target);
}

/// Finding 7: a rung name with `|`, newlines and a heading, and an HTML tag,
/// stay text in `levers.md`: no row, heading or tag is added.
#[test]
fn user_text_in_levers_md_cannot_add_a_row_a_heading_or_a_tag() {
    let cache = fresh_dir("hostile2-md-cache");
    let root = linked_only("hostile2-md", &PAIR);
    let forged = "r|b\n| injected | row |\n# H <img src=x onerror=alert(1)> `x`";
    craft(&root, PAIR[0], |m| {
        m["rung"]["name"] = Value::from(forged);
    });
    let (code, md, se) = run(harness()
        .current_dir(repo())
        .env("HARNESS_VERIFY_CACHE", &cache)
        .args(["rank", "--out", "-", "--store"])
        .arg(&root));
    assert_eq!(code, 0, "{se}");
    assert!(
        md.contains("r\\|b\\n\\| injected"),
        "the name is not shown: {md}"
    );
    for l in md.lines() {
        assert!(!l.starts_with("| injected"), "a forged row: {l}");
        assert!(!l.starts_with("# H"), "a forged heading: {l}");
        assert!(!l.contains("<img"), "a tag: {l}");
    }
}

/// Finding 8: control characters in a lever value reach no terminal raw
/// from `ls` or `show`, and a newline adds no row.
#[test]
fn ls_and_show_render_control_characters_visibly() {
    let root = linked_only("hostile2-term", &PAIR[..1]);
    let id = craft(&root, PAIR[0], |m| {
        m["levers"]["staging"] = Value::from("\u{1b}]0;T\u{7}\u{1b}[2J\nforged row");
    });
    let (code, so, se) = run(harness().args(["ls", "--store"]).arg(&root));
    assert_eq!(code, 0, "{se}");
    assert!(!so.contains('\u{1b}') && !so.contains('\u{7}'), "{so:?}");
    assert!(!so.lines().any(|l| l.starts_with("forged")), "{so}");
    assert!(so.contains("\\x1b]0;T\\x07"), "{so}");
    let (code, so, se) = run(harness()
        .env("HARNESS_VERIFY_CACHE", "off")
        .args(["show", "--store"])
        .arg(&root)
        .arg(&id));
    assert_eq!(code, 0, "{se}");
    assert!(!so.contains('\u{1b}'), "{so:?}");
    assert!(!so.lines().any(|l| l.starts_with("forged")), "{so}");
}

/// Finding 9: a secret in `AWS_ENDPOINT_URL` is never printed.
#[test]
fn a_secret_in_aws_endpoint_url_is_redacted_from_every_message() {
    let secret = "endpoint-secret-7d1e";
    let store = fresh_dir("hostile2-endpoint");
    for args in [
        vec!["ls", "--store", "s3://evidence/x"],
        vec!["rank", "--store", "s3://evidence/x"],
    ] {
        let (code, so, se) = run(harness()
            .current_dir(repo())
            .env("AWS_ACCESS_KEY_ID", "k")
            .env("AWS_SECRET_ACCESS_KEY", "s")
            .env("AWS_REGION", "us-east-1")
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://key:{secret}@127.0.0.1:1"),
            )
            .env("AWS_CONFIG_FILE", store.join("none"))
            .env("AWS_SHARED_CREDENTIALS_FILE", store.join("none"))
            .env("HARNESS_LOCAL_STORE", store.join("local"))
            .env("HARNESS_VERIFY_CACHE", "off")
            .args(&args));
        assert_ne!(code, 0, "{args:?}");
        assert!(
            !so.contains(secret) && !se.contains(secret),
            "{args:?}: {se}"
        );
        assert!(
            se.contains("<redacted>") || se.contains("127.0.0.1"),
            "{se}"
        );
    }
}

/// Finding 10: a reader that closed its end of the pipe ends `ls` and `show`
/// quietly with exit 4, never a panic.
#[test]
fn a_closed_stdout_ends_ls_and_show_quietly_with_exit_4() {
    let root = linked_only("hostile2-pipe", &PAIR);
    for args in [
        vec!["ls".to_string()],
        vec!["show".to_string(), PAIR[0].into()],
    ] {
        let (r, w) = std::io::pipe().unwrap();
        drop(r);
        let out = harness()
            .env("HARNESS_VERIFY_CACHE", "off")
            .args(&args)
            .arg("--store")
            .arg(&root)
            .stdout(w)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let se = crate::support::bins::text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {se}");
        assert!(se.is_empty(), "{args:?}: {se}");
    }
}

/// Finding 11: a program that is a symbolic link loop is said to be one;
/// `sync` from a bucket it cannot reach creates nothing at the destination.
#[test]
fn a_symlink_loop_is_named_and_a_failed_sync_creates_nothing() {
    let d = fresh_dir("hostile2-messages");
    std::os::unix::fs::symlink(d.join("loop"), d.join("loop")).unwrap();
    let store = d.join("store");
    let (code, _, se) = run(harness()
        .env_remove("HARNESS_LEASE_ID")
        .args(["run", "--store"])
        .arg(&store)
        .arg("--exec")
        .arg("--")
        .arg(d.join("loop")));
    assert_ne!(code, 0, "{se}");
    assert!(se.contains("loop of symbolic links"), "{se}");
    assert!(!se.contains("not found"), "{se}");
    let dst = d.join("dst");
    let (code, _, se) = run(harness()
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        .env("AWS_CONFIG_FILE", d.join("none"))
        .env("AWS_SHARED_CREDENTIALS_FILE", d.join("none"))
        .args(["sync", "s3://evidence/x"])
        .arg(&dst));
    assert_ne!(code, 0, "{se}");
    assert!(!dst.exists(), "sync created {}", dst.display());
}

/// Finding 12: a self-consistent manifest whose rung geometry disagrees with
/// its frames (width 2^32, or 0x0x0, over 768x512 frames) is excluded by
/// `rank` and fails `verify`, naming both.
#[test]
fn a_rung_geometry_that_disagrees_with_the_frames_is_excluded_and_fails_verify() {
    let cache = fresh_dir("hostile2-geom-cache");
    let root = linked_only("hostile2-geom", &PAIR);
    let wide = craft(&root, PAIR[0], |m| {
        m["rung"]["config"]["width"] = Value::from(1u64 << 32);
    });
    let zero = craft(&root, PAIR[1], |m| {
        for k in ["width", "height", "frames"] {
            m["rung"]["config"][k] = Value::from(0);
        }
    });
    let got = rank_json(&root, &cache);
    for (id, says) in [(&wide, "4294967296x512"), (&zero, "0x0")] {
        let e = got["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} is not excluded: {got}"));
        let why = e["reason"].as_str().unwrap();
        assert!(
            why.contains("first.png") && why.contains("768x512") && why.contains(says),
            "{why}"
        );
        let (code, so, _) = run(harness().args(["verify", "--store"]).arg(&root).arg(id));
        assert_eq!(code, 1, "{so}");
        assert!(
            so.contains("rung.config") && so.contains("first.png"),
            "{so}"
        );
    }
    assert!(got["used"].as_array().unwrap().is_empty(), "{got}");
    let (_, so, _) = run(harness().args(["verify", "--store"]).arg(&root).arg(&zero));
    assert!(
        so.contains("frames.parquet") && so.contains("121 frames"),
        "{so}"
    );
}

/// Not a check: seals 1,000 synthetic bundles (the rank bench's mix) into
/// `target/verify-cost-store`, for measuring what full verification costs
/// `rank` (`specs/bundle.md`, "What is trusted"):
/// `cargo test -p harness --test it -- --ignored verify_cost_store`, then
/// `time target/debug/harness rank --json --store target/verify-cost-store >/dev/null`.
#[test]
#[ignore]
fn verify_cost_store_of_1000_synthetic_bundles() {
    use crate::support::ranked::{render, seal, Noise};
    let root = repo().join("target/verify-cost-store");
    let _ = std::fs::remove_dir_all(&root);
    let store = evidence::store::Store::resolve(Some(&root)).unwrap();
    let spec = harness::levers_spec::LeverSpec::load(&repo().join("specs/levers.toml")).unwrap();
    let mut noise = Noise::new(1);
    let (mut n, mut round) = (0usize, 1u32);
    'fill: loop {
        for (rung, dims) in [("0", (64u64, 64u64, 9u64)), ("2", (256, 128, 25))] {
            for l in &spec.levers {
                for arm in [&l.baseline, &l.treatment] {
                    let k = if arm == &l.treatment { 0.8 } else { 1.0 };
                    let mut x = |v: f64| v * (1.0 + 0.05 * noise.next());
                    let mut r = render(rung, dims, x(20.0) * k, x(8.0), x(16.0), x(6.0) * k, 5.0);
                    r.schedule = Some(("cost".into(), round, n as u32, l.id.clone(), arm.clone()));
                    seal(&store, &r);
                    n += 1;
                    if n == 1000 {
                        break 'fill;
                    }
                }
            }
        }
        round += 1;
    }
}
