//! The two lever profiles, end to end through the binary: `--profile baseline`
//! selects every lever's baseline arm and `--profile default` every lever's
//! default arm, as `engine levers --json` lists them (so a lever added later is
//! covered without editing this file); a rung file's `profile = "baseline"` does
//! the same; and every registered lever matches its entry in specs/levers.toml
//! (the arms and the baseline that `harness campaign` and `harness rank` use).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use evidence::rung::{Profile, Rung};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_engine")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "engine {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `engine levers --json`: lever id -> (arms, default, baseline).
fn registry() -> BTreeMap<String, (Vec<String>, String, String)> {
    let v = json(&["levers", "--json"]);
    let levers = v["levers"].as_object().expect("levers object");
    levers
        .iter()
        .map(|(id, l)| {
            let arms = l["arms"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            let s = |k: &str| l[k].as_str().unwrap().to_string();
            (id.clone(), (arms, s("default"), s("baseline")))
        })
        .collect()
}

/// The arms `engine plan` resolved for `rung` with `extra` flags.
fn resolved(rung: &Path, extra: &[&str]) -> BTreeMap<String, String> {
    let mut args = vec!["plan", "--json", "--rung", rung.to_str().unwrap()];
    args.extend(extra);
    let v = json(&args);
    serde_json::from_value(v["levers"].clone()).unwrap()
}

fn want(
    reg: &BTreeMap<String, (Vec<String>, String, String)>,
    p: Profile,
) -> BTreeMap<String, String> {
    reg.iter()
        .map(|(id, (_, d, b))| {
            let arm = match p {
                Profile::Default => d,
                Profile::Baseline => b,
            };
            (id.clone(), arm.clone())
        })
        .collect()
}

#[test]
fn each_profile_selects_every_levers_arm_of_that_profile() {
    let reg = registry();
    for id in [
        "widen-f32",
        "release-pages",
        "host-threads",
        "staging",
        "denoise-graph",
    ] {
        assert!(
            reg.contains_key(id),
            "lever {id} missing from engine levers --json"
        );
    }
    for (id, (arms, d, b)) in &reg {
        assert!(
            arms.contains(d) && arms.contains(b),
            "{id}: {arms:?} {d} {b}"
        );
    }
    // On the CPU rung and on a device rung (the plan needs no GPU).
    for rung in ["rungs/0.toml", "rungs/1.toml"] {
        let rung = repo().join(rung);
        let base = resolved(&rung, &["--profile", "baseline"]);
        let def = resolved(&rung, &["--profile", "default"]);
        assert_eq!(base, want(&reg, Profile::Baseline), "{}", rung.display());
        assert_eq!(def, want(&reg, Profile::Default), "{}", rung.display());
        // A flag still overrides the profile, one lever only.
        let one = resolved(
            &rung,
            &["--profile", "baseline", "--lever", "denoise-graph=on"],
        );
        let mut w = want(&reg, Profile::Baseline);
        w.insert("denoise-graph".into(), "on".into());
        assert_eq!(one, w);
    }
}

#[test]
fn every_rung_file_accepts_the_baseline_profile() {
    let reg = registry();
    let dir = repo()
        .join("target/test-scratch")
        .join(format!("profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = 0;
    for e in std::fs::read_dir(repo().join("rungs")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().and_then(|x| x.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("profile = \"default\""),
            "{}: expected a profile line",
            path.display()
        );
        let p = dir.join(path.file_name().unwrap());
        std::fs::write(
            &p,
            text.replace("profile = \"default\"", "profile = \"baseline\""),
        )
        .unwrap();
        let r = Rung::load(&p).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(r.profile, Profile::Baseline, "{}", path.display());
        // Without --profile the rung's profile decides every arm (its
        // [levers] table is empty in every committed rung).
        assert!(r.levers.is_empty(), "{}", path.display());
        assert_eq!(
            resolved(&p, &[]),
            want(&reg, Profile::Baseline),
            "{}",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 5, "only {seen} rung files");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_registered_lever_matches_the_committed_spec() {
    let reg = registry();
    let text = std::fs::read_to_string(repo().join("specs/levers.toml")).unwrap();
    let spec: toml::Value = toml::from_str(&text).unwrap();
    let entries = spec["lever"].as_array().unwrap();
    for (id, (arms, _, baseline)) in &reg {
        let e = entries
            .iter()
            .find(|e| e["id"].as_str() == Some(id))
            .unwrap_or_else(|| panic!("lever {id} is not in specs/levers.toml"));
        let spec_arms: Vec<String> = e["arms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(&spec_arms, arms, "{id}: arms");
        assert_eq!(
            e["baseline"].as_str(),
            Some(baseline.as_str()),
            "{id}: baseline"
        );
    }
}
