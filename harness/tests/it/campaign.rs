//! End to end: `harness campaign` drives real `harness run`s of rung 0 with the real
//! engine, interleaving a lever's arms; a second invocation resumes (runs nothing
//! already sealed); a gate refusal stops the campaign cleanly; `harness rank`
//! reads what it sealed. Stores live under `CARGO_TARGET_TMPDIR`, never /tmp.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::bins::{engine, repo, text, HARNESS};
use crate::support::dirs::{fresh_dir, vacant_dir};

fn campaign(store: &Path, extra: &[&str]) -> Output {
    Command::new(HARNESS)
        .current_dir(repo())
        .args([
            "campaign",
            "--rungs",
            "0",
            "--levers",
            "host-threads",
            "--repeat",
            "2",
            "--order",
            "abba",
            "--store",
        ])
        .arg(store)
        .arg("--engine")
        .arg(engine())
        .args(extra)
        .env_remove("HARNESS_LEASE_ID")
        .output()
        .unwrap()
}

fn manifests(store: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(store.join("bundles")) else {
        return out;
    };
    for e in rd {
        let p = e.unwrap().path().join("manifest.json");
        out.push(serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap());
    }
    out.sort_by_key(|m| m["schedule"]["position"].as_u64());
    out
}

/// `harness rank --store STORE --json`, run from the repository root.
fn rank_json(store: &std::path::Path) -> std::process::Output {
    Command::new(HARNESS)
        .current_dir(repo())
        .args(["rank", "--store"])
        .arg(store)
        .args(["--json"])
        .output()
        .unwrap()
}

#[test]
fn a_campaign_interleaves_arms_resumes_and_feeds_rank() {
    let store = vacant_dir("campaign-e2e");

    let out = campaign(&store, &["--", "--cadence-ms", "50"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}\n{}", text(&out.stderr));
    assert!(so.contains("4 sealed complete"), "{so}");

    // Four bundles, one per position, arms alternating ABBA (baseline first in
    // round 1), each run with only the lever under test set.
    let ms = manifests(&store);
    assert_eq!(ms.len(), 4);
    let arms: Vec<&str> = ms
        .iter()
        .map(|m| m["schedule"]["arm"].as_str().unwrap())
        .collect();
    assert_eq!(arms, ["1", "n", "n", "1"]);
    let campaign_id = ms[0]["schedule"]["campaign"].as_str().unwrap().to_string();
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(m["complete"], true, "{m}");
        assert_eq!(m["schedule"]["position"], i as u64);
        assert_eq!(m["schedule"]["campaign"], campaign_id.as_str());
        assert_eq!(m["schedule"]["lever"], "host-threads");
        assert_eq!(m["levers"]["host-threads"], m["schedule"]["arm"], "{m}");
    }

    // Resume: everything is sealed, nothing runs again.
    let again = campaign(&store, &["--", "--cadence-ms", "50"]);
    let so2 = text(&again.stdout);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{so2}\n{}",
        text(&again.stderr)
    );
    assert!(so2.contains("4 already sealed"), "{so2}");
    assert!(so2.contains("0 sealed complete"), "{so2}");
    assert_eq!(manifests(&store).len(), 4);

    // rank reads the campaign's bundles and names the lever.
    let rank = rank_json(&store);
    let rs = text(&rank.stdout);
    assert!(
        rank.status.code().is_some_and(|c| c <= 1),
        "{rs}\n{}",
        text(&rank.stderr)
    );
    assert!(rs.contains("host-threads"), "{rs}");
}

/// A lever with `with` in the spec: the dry run (which runs nothing) shows the
/// setting on every position of the lever, and the campaign id differs from the
/// same campaign's without it; a setting the engine lacks is refused before any
/// run. Mutations that turn this red: the dry-run line without the `with`, the
/// `with` left out of the campaign id, no engine check of the `with` arms.
#[test]
fn a_dry_run_shows_a_levers_with_and_the_campaign_id_names_it() {
    let dir = fresh_dir("campaign-with");
    let store = dir.join("store");
    let committed = std::fs::read_to_string(repo().join("specs/levers.toml")).unwrap();
    let spec_with = |setting: &str| {
        let t = committed.replacen(
            "id = \"host-threads\"\n",
            &format!("id = \"host-threads\"\nwith = {{ release-pages = \"{setting}\" }}\n"),
            1,
        );
        assert_ne!(t, committed);
        let p = dir.join(format!("levers-{setting}.toml"));
        std::fs::write(&p, t).unwrap();
        p
    };
    let id_of = |so: &str| -> String {
        so.strip_prefix("campaign ")
            .and_then(|r| r.split(' ').next())
            .unwrap_or_else(|| panic!("{so}"))
            .to_string()
    };
    let plain = campaign(&store, &["--dry-run"]);
    let plain_so = text(&plain.stdout);
    assert_eq!(
        plain.status.code(),
        Some(0),
        "{plain_so}{}",
        text(&plain.stderr)
    );
    let on = spec_with("on");
    let out = campaign(&store, &["--dry-run", "--spec", on.to_str().unwrap()]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}{}", text(&out.stderr));
    let lines: Vec<&str> = so.lines().filter(|l| l.ends_with(" todo")).collect();
    assert_eq!(lines.len(), 4, "{so}");
    for (l, arm) in lines.iter().zip(["1", "n", "n", "1"]) {
        assert!(
            l.ends_with(&format!(
                "rung 0 host-threads={arm} with release-pages=on todo"
            )),
            "{l}"
        );
    }
    assert!(!plain_so.contains(" with "), "{plain_so}");
    assert_ne!(id_of(&so), id_of(&plain_so));
    // The engine's release-pages has no arm `half`: refused, naming it.
    let half = committed.replacen(
        "arms = [\"off\", \"on\"]\nbaseline = \"off\"\ntreatment = \"on\"\napplies_to = [\"cpu\", \"cuda\"]",
        "arms = [\"off\", \"on\", \"half\"]\nbaseline = \"off\"\ntreatment = \"on\"\napplies_to = [\"cpu\", \"cuda\"]",
        1,
    );
    assert_ne!(half, committed);
    let p = dir.join("levers-half.toml");
    std::fs::write(
        &p,
        half.replacen(
            "id = \"host-threads\"\n",
            "id = \"host-threads\"\nwith = { release-pages = \"half\" }\n",
            1,
        ),
    )
    .unwrap();
    let out = campaign(&store, &["--dry-run", "--spec", p.to_str().unwrap()]);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}{se}", text(&out.stdout));
    assert!(
        se.contains(
            "lever 'host-threads' with.release-pages = 'half': the engine's arms are off|on"
        ),
        "{se}"
    );
}

/// `--warmup 1` on rung 0 (a CPU rung, whose default is 0): one throw-away run
/// sealed first, marked `warmup` in its schedule, with the arm of the run it
/// precedes; a resume runs nothing again; rank lists it as a warm-up and pairs
/// the four measured runs only.
#[test]
fn a_warm_up_is_sealed_first_marked_never_repeated_and_never_paired() {
    let store = vacant_dir("campaign-warmup");
    let flags = ["--warmup", "1", "--", "--cadence-ms", "50"];
    let out = campaign(&store, &flags);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}\n{}", text(&out.stderr));
    assert!(so.contains("5 sealed complete"), "{so}");
    let ms = manifests(&store);
    assert_eq!(ms.len(), 5);
    assert_eq!(ms[0]["schedule"]["warmup"], true, "{}", ms[0]["schedule"]);
    assert_eq!(ms[0]["schedule"]["round"], 0);
    assert_eq!(ms[0]["schedule"]["arm"], ms[1]["schedule"]["arm"]);
    assert!(ms[1..]
        .iter()
        .all(|m| m["schedule"].get("warmup").is_none()));

    let again = campaign(&store, &flags);
    let so2 = text(&again.stdout);
    assert!(
        so2.contains("5 already sealed") && so2.contains("0 sealed complete"),
        "{so2}"
    );
    assert_eq!(manifests(&store).len(), 5);

    let rank = rank_json(&store);
    let r: Value = serde_json::from_slice(&rank.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&rank.stdout), text(&rank.stderr)));
    let warm: Vec<&Value> = r["excluded"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"]
                .as_str()
                .is_some_and(|w| w.starts_with("warm-up: "))
        })
        .collect();
    assert_eq!(warm.len(), 1, "{}", r["excluded"]);
    assert!(
        r["used"]
            .as_array()
            .is_some_and(|u| !u.contains(&warm[0]["id"])),
        "{r}"
    );
    // Rank honestly drops a run taken while other work kept the host busy (the
    // contention gate: the test suite runs beside it on two cores); only where none
    // was dropped must both pairs be used, and never the warm-up.
    let contended = r["excluded"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"]
                .as_str()
                .is_some_and(|w| w.starts_with("contended"))
        })
        .count();
    let used = r["used"].as_array().map_or(0, Vec::len);
    if contended == 0 {
        assert_eq!(used, 4, "{}", r["used"]);
    } else {
        assert!(used % 2 == 0 && used <= 4, "{}", r["used"]);
    }
}

#[test]
fn a_gate_refusal_stops_the_campaign_and_says_where() {
    let store = vacant_dir("campaign-refused");
    // A memory floor no machine meets: the headroom gate refuses position 0.
    let out = campaign(&store, &["--", "--mem-floor", "900TiB"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{so}\n{}", text(&out.stderr));
    assert!(
        so.contains("stopped: position 0") && so.contains("'headroom'"),
        "{so}"
    );
    assert!(so.contains("resume: rerun the same command"), "{so}");
}

/// `--budget-s` stops before a position expected to overrun the budget (learned
/// from the run this invocation sealed), not in the middle of it; a rerun without
/// the budget resumes and finishes; and a nonsense budget is a usage error.
#[test]
fn a_budget_stops_between_runs_and_a_rerun_resumes() {
    let store = vacant_dir("campaign-budget");
    // Nothing is known at first: position 0 starts. A rung-0 run takes over a
    // second (the watchdog control alone is more), so with a 0.5 s budget the
    // second position is expected to overrun and does not start.
    let out = campaign(&store, &["--budget-s", "0.5"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{so}\n{}", text(&out.stderr));
    assert!(so.contains("1 sealed complete, 0 incomplete"), "{so}");
    assert!(
        so.contains("stopped: budget: position 1 (round 1, rung 0, host-threads="),
        "{so}"
    );
    assert!(
        so.contains("in this campaign) and 0.0 s of the budget"),
        "{so}"
    );
    assert_eq!(manifests(&store).len(), 1, "no run was cut off");
    // Progress lines say what is left: nothing was known before the first run.
    let se = text(&out.stderr);
    assert!(
        se.contains(": start: expected ~? s; 4 left ~0 s + 4 with no history yet"),
        "{se}"
    );
    // A dry run with a budget shows each remaining position's expected wall (rung
    // 0's one sealed run teaches every arm of the rung) and how many fit.
    let out = campaign(&store, &["--dry-run", "--budget-s", "3600"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}");
    let todo: Vec<&str> = so.lines().filter(|l| l.contains(" todo")).collect();
    assert_eq!(todo.len(), 3, "{so}");
    assert!(todo.iter().all(|l| l.contains(" s, ends ~")), "{so}");
    assert!(
        so.contains("budget 3600 s: 3 of 3 positions to run expected to fit")
            && so.contains("0 have no history"),
        "{so}"
    );
    assert_eq!(manifests(&store).len(), 1, "a dry run runs nothing");
    let out = campaign(&store, &[]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}\n{}", text(&out.stderr));
    assert!(
        so.contains("3 sealed complete, 0 incomplete, 1 already done"),
        "{so}"
    );
    // The rerun knows rung 0's wall from the first run's bundle.
    let se = text(&out.stderr);
    assert!(
        se.contains(": start: expected ~") && se.contains("; 3 left ~"),
        "{se}"
    );
    assert!(!se.contains("no history"), "{se}");
    for bad in ["0", "-3", "nan", "soon"] {
        let out = campaign(&store, &[&format!("--budget-s={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--budget-s {bad}");
        assert!(
            text(&out.stderr).contains("--budget-s"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// The observer as a lever (issue 26): `harness campaign --levers observer` runs the
/// test engine (which lists no levers: the harness applies this one itself), each
/// bundle records `levers.observer` in interleaved pairs, its sampler ran with the
/// observer as the arm says, the engine was never told, and `harness rank` ranks
/// the lever from those bundles.
///
/// Mutation: pass the observer to the engine (drop the filter in preflight's
/// `lever_args`) and the engine-args assertion turns red; drop the harness-lever
/// lookup in `reconcile` and the campaign skips the lever (no bundles).
#[test]
fn an_observer_campaign_records_the_lever_and_rank_ranks_it() {
    use crate::support::bins::TEST_ENGINE;
    let store = vacant_dir("campaign-observer");
    let out = Command::new(HARNESS)
        .current_dir(repo())
        .args([
            "campaign", "--rungs", "0", "--levers", "observer", "--repeat", "3", "--store",
        ])
        .arg(&store)
        .args(["--engine", TEST_ENGINE, "--", "--cadence-ms", "50"])
        .env_remove("HARNESS_LEASE_ID")
        .env_remove("TEST_ENGINE_SCRIPT")
        .output()
        .unwrap();
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so}\n{}", text(&out.stderr));
    let ms = manifests(&store);
    assert_eq!(ms.len(), 6, "{so}");
    for (round, pair) in ms.chunks(2).enumerate() {
        let arms: Vec<&str> = pair
            .iter()
            .map(|m| m["levers"]["observer"].as_str().unwrap())
            .collect();
        assert!(
            arms == ["off", "on"] || arms == ["on", "off"],
            "round {round}: {arms:?}"
        );
        for m in pair {
            assert_eq!(m["schedule"]["round"], round as u64 + 1);
            assert_eq!(m["schedule"]["lever"], "observer");
            assert_eq!(m["levers"]["observer"], m["schedule"]["arm"], "{m}");
            assert_eq!(m["sampler"]["observer"], m["levers"]["observer"], "{m}");
            let args = m["engine"]["args"].as_array().unwrap();
            assert!(
                !args
                    .iter()
                    .any(|a| a.as_str().unwrap_or("").starts_with("observer=")),
                "the engine was told: {args:?}"
            );
        }
    }
    let rank = Command::new(HARNESS)
        .current_dir(repo())
        .args(["rank", "--json", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&rank.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&rank.stderr)));
    let lever = r["levers"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["id"] == "observer"))
        .unwrap_or_else(|| panic!("rank has no observer lever: {r}"));
    assert_eq!(lever["direction"], "increase");
    assert_eq!(lever["min_effect"], 0.03);
    // Rank honestly drops a run taken while other work kept the host busy (the
    // contention gate); only where none was dropped must all three pairs be there.
    let ids: Vec<String> = std::fs::read_dir(store.join("bundles"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let contended: Vec<&Value> = r["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| ids.iter().any(|id| e["id"] == id.as_str()))
        .inspect(|e| {
            let why = e["reason"].as_str().unwrap_or("");
            // A contended run's partner is left unpaired.
            assert!(
                why.starts_with("contended") || why.starts_with("unpaired"),
                "excluded for another reason: {e}"
            );
        })
        .collect();
    let rung0 = lever["other_rungs"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["rung"] == "0"));
    let contended: Vec<&Value> = contended
        .into_iter()
        .filter(|e| e["reason"].as_str().unwrap_or("").starts_with("contended"))
        .collect();
    // Each contended run costs at most its own round's pair; every other round
    // must be paired, contended host or not.
    let want = 3usize.saturating_sub(contended.len());
    let pairs = rung0
        .and_then(|r| r["rounds"].as_array())
        .map_or(0, Vec::len);
    assert!(
        pairs >= want,
        "{pairs} pairs, want {want} ({} contended): {lever}",
        contended.len()
    );
    if contended.is_empty() {
        let rung0 = rung0.unwrap_or_else(|| panic!("no rung-0 row: {lever}"));
        assert!(rung0["effect"].is_object(), "{rung0}");
    } else {
        eprintln!(
            "{} of 6 observer runs were contended on this host: {pairs} of 3 rounds paired (at least {want} required)",
            contended.len()
        );
    }
}
