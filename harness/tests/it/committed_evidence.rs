//! The committed evidence stays re-derivable: every bundle under
//! `reports/evidence` verifies, and `harness rank --store reports/evidence`
//! regenerates `reports/levers.md` byte for byte (`--check` writes nothing).

use std::path::PathBuf;
use std::process::Command;

use crate::support::bins::{repo, HARNESS};

#[test]
fn every_committed_bundle_verifies() {
    let dir = repo().join("reports/evidence/bundles");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let report = evidence::verify::verify_dir(&p);
        assert!(report.ok(), "{}: {report:?}", p.display());
        n += 1;
    }
    assert!(n > 0, "no bundles under {}", dir.display());
}

#[test]
fn the_committed_lever_table_reproduces_from_the_committed_bundles() {
    let out = Command::new(HARNESS)
        .current_dir(repo())
        .args([
            "rank",
            "--store",
            "reports/evidence",
            "--check",
            "reports/levers.md",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stale_lever_table_is_caught_naming_the_line() {
    let stale = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("levers-stale.md");
    let mut text = std::fs::read_to_string(repo().join("reports/levers.md")).unwrap();
    // The copy's own regenerate line names its path, so that only the edit differs.
    text = text.replacen(
        "--out reports/levers.md",
        &format!("--out {}", stale.display()),
        1,
    );
    text = text.replacen("## Verdicts", "## Verdict", 1);
    std::fs::write(&stale, text).unwrap();
    let out = Command::new(HARNESS)
        .current_dir(repo())
        .args(["rank", "--store", "reports/evidence", "--check"])
        .arg(&stale)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{so}");
    assert!(
        so.contains("differs from the regenerated report at line"),
        "{so}"
    );
    assert!(so.contains("## Verdicts"), "{so}");
}

/// The device re-derivation (`just rederive`) stays complete: at rungs 2 and 3 (both on the CUDA arm)
/// every lever that applies has at least 3 interleaved pairs in the committed
/// bundles. A lever rank marks not applicable at the reference rung (rung 2) is
/// exempt at rung 3 too, since both rungs run on the same device. Deleting one run of
/// a rung-3 pair (or a campaign) turns this red even if someone regenerates
/// `reports/levers.md` from the thinner store.
#[test]
fn every_lever_that_applies_at_rungs_2_and_3_has_three_pairs() {
    let out = Command::new(HARNESS)
        .current_dir(repo())
        .args(["rank", "--store", "reports/evidence", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let levers = v["levers"].as_array().expect("rank --json has levers");
    assert!(levers.len() >= 7, "{} levers", levers.len());
    let mut checked = 0;
    for l in levers {
        let id = l["id"].as_str().unwrap_or("?");
        let reference = &l["reference"];
        assert_eq!(reference["rung"], "2", "{id}: reference rung");
        if reference["verdict"]["verdict"] == "notapplicable" {
            continue;
        }
        let rung3 = l["other_rungs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["rung"] == "3");
        for (rung, r) in [("2", Some(reference)), ("3", rung3)] {
            let r = r.unwrap_or_else(|| panic!("{id}: no runs at rung {rung}"));
            let n = r["effect"]["n"].as_u64().unwrap_or(0);
            assert!(n >= 3, "{id} at rung {rung}: {n} pairs, want at least 3");
            checked += 1;
        }
    }
    // conditioning, vae, staging, release-pages, host-threads, denoise-graph at both.
    assert_eq!(checked, 12, "levers checked at rungs 2 and 3");
}
