//! The staged campaign spec (`specs/device-residency.md`) stays executable: its
//! nine sections are there in order, every stage names a lever of
//! `specs/levers.toml` (and every lever has a stage), every stage's measuring
//! command is a campaign the real harness schedules against the real engine, and
//! every test the hazard table cites as proof still exists under that name.
//!
//! These read the committed files; a rename in the code or a lever added to the
//! spec file without a stage turns them red.

use std::path::Path;
use std::process::Command;

use harness::levers_spec::LeverSpec;

use crate::support::bins::{engine, repo, text, HARNESS};
use crate::support::dirs::vacant_dir;

const SPEC: &str = "specs/device-residency.md";

fn spec() -> String {
    std::fs::read_to_string(repo().join(SPEC)).expect("the spec is committed")
}

/// The body of section `## N. title` (up to the next `## `).
fn section(text: &str, heading: &str) -> String {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("{SPEC}: no section {heading:?}"));
    let body = &text[start + heading.len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    body[..end].to_string()
}

/// The cells of a markdown table row (`| a | b |` -> ["a", "b"]).
fn cells(row: &str) -> Vec<String> {
    row.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

/// Every backticked span of `s`.
fn ticks(s: &str) -> Vec<String> {
    s.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, t)| t.to_string())
        .collect()
}

/// The stage rows of section 4: (stage, lever id, rungs, command cell).
fn stages() -> Vec<(String, String, String, String)> {
    section(&spec(), "## 4. Stages")
        .lines()
        .filter(|l| l.starts_with("| S"))
        .map(cells)
        .filter(|c| c.len() >= 4 && c[1] != "—")
        .map(|c| {
            let lever = ticks(&c[1]).into_iter().next().unwrap_or_default();
            (c[0].clone(), lever, c[2].clone(), c[3].clone())
        })
        .collect()
}

#[test]
fn the_spec_has_the_nine_sections_in_order() {
    let text = spec();
    let want = [
        "Now",
        "Scope",
        "Baseline",
        "Stages",
        "Gates",
        "Close conditions",
        "Hazards as gates",
        "Dependencies",
        "Owed",
    ];
    let got: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let want: Vec<String> = want
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{}. {t}", i + 1))
        .collect();
    assert_eq!(got, want, "{SPEC}: sections");
}

#[test]
fn every_stage_names_a_lever_of_the_spec_file_and_every_lever_has_one_stage() {
    let levers = LeverSpec::load(&repo().join("specs/levers.toml")).expect("levers.toml loads");
    let st = stages();
    assert!(st.len() >= 7, "{SPEC}: stage rows {st:?}");
    for (stage, lever, _, _) in &st {
        assert!(
            levers.lever(lever).is_some(),
            "{SPEC}: stage {stage} names lever {lever:?}, which specs/levers.toml does not define"
        );
    }
    for l in &levers.levers {
        let n = st.iter().filter(|(_, id, _, _)| id == &l.id).count();
        assert_eq!(n, 1, "{SPEC}: lever {} has {n} stages, want 1", l.id);
    }
}

/// Runs `harness campaign ARGS --dry-run` with the real engine into a fresh store
/// and returns its stdout; panics with both streams when it does not exit 0.
fn dry_run(args: &[String], store: &Path) -> String {
    let out = Command::new(HARNESS)
        .current_dir(repo())
        .args(args)
        .arg("--dry-run")
        .arg("--engine")
        .arg(engine())
        .arg("--store")
        .arg(store)
        .output()
        .expect("harness runs");
    let so = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{SPEC}: `harness {}` was refused:\nstdout:\n{so}\nstderr:\n{}",
        args.join(" "),
        text(&out.stderr)
    );
    so
}

#[test]
fn every_stage_command_is_a_campaign_the_harness_schedules() {
    let store = vacant_dir("spec-campaign-dry");
    let mut checked = 0;
    for (stage, lever, rungs, command) in stages() {
        // Section 4's general form, from the row's own rungs and lever...
        let rung_list: Vec<String> = rungs
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        assert!(!rung_list.is_empty(), "{SPEC}: stage {stage} has no rungs");
        let general: Vec<String> = [
            "campaign",
            "--rungs",
            &rung_list.join(","),
            "--levers",
            &lever,
            "--repeat",
            "3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // ...and every literal `harness campaign ...` the row spells out.
        let literal = ticks(&command)
            .into_iter()
            .filter_map(|t| t.strip_prefix("harness ").map(str::to_string))
            .filter(|t| t.starts_with("campaign "))
            .map(|t| t.split_whitespace().map(str::to_string).collect::<Vec<_>>());
        for args in std::iter::once(general).chain(literal) {
            let so = dry_run(&args, &store);
            let todo = || so.lines().filter(|l| l.ends_with(" todo"));
            let warmups = todo().filter(|l| l.contains(" warm-up ")).count();
            let positions = todo().count() - warmups;
            // At most one warm-up per rung by default (1 on a cuda rung).
            assert!(
                warmups <= rung_list.len(),
                "{SPEC}: stage {stage}: `harness {}` scheduled:\n{so}",
                args.join(" ")
            );
            // Two arms, three rounds, every rung of the row.
            assert_eq!(
                positions,
                2 * 3 * rung_list.len(),
                "{SPEC}: stage {stage}: `harness {}` scheduled:\n{so}",
                args.join(" ")
            );
            for r in &rung_list {
                assert!(
                    so.contains(&format!(" rung {r} {lever}=")),
                    "{SPEC}: stage {stage}: no rung {r} position for {lever}:\n{so}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} stage commands checked");
}

/// Whether some `.rs` file under `dir` named `module.rs` (or `module/mod.rs`)
/// defines `fn name(`: a module of this test binary (`harness/tests/it/run.rs`
/// for `run::...`) or a unit-test module of the crate (`harness/src/run/gate_checks.rs`
/// for `gate_checks::tests::...`).
fn defines(dir: &Path, module: &str, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if defines(&p, module, name) {
                return true;
            }
            continue;
        }
        let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
        let parent = p
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|f| f.to_str())
            .unwrap_or("");
        let is_module = file == format!("{module}.rs") || (file == "mod.rs" && parent == module);
        if is_module
            && std::fs::read_to_string(&p)
                .map(|t| t.contains(&format!("fn {name}(")))
                .unwrap_or(false)
        {
            return true;
        }
    }
    false
}

#[test]
fn every_test_the_hazard_table_cites_exists_under_that_name() {
    let table = section(&spec(), "## 7. Hazards as gates");
    let rows: Vec<Vec<String>> = table
        .lines()
        .filter(|l| l.starts_with("| H"))
        .map(cells)
        .collect();
    let hazards: Vec<String> = rows
        .iter()
        .map(|c| c[0].split_whitespace().next().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        hazards,
        ["H1", "H2", "H3", "H4", "H5"],
        "{SPEC}: hazard rows"
    );
    let crate_dir = repo().join("harness");
    for c in &rows {
        let tests = ticks(c.last().expect("a row has cells"));
        assert!(!tests.is_empty(), "{SPEC}: {} cites no test", c[0]);
        for t in tests {
            let parts: Vec<&str> = t.split("::").collect();
            let (module, name) = (parts[0], parts[parts.len() - 1]);
            assert!(
                parts.len() >= 2 && defines(&crate_dir, module, name),
                "{SPEC}: {} cites test `{t}`, but no {module}.rs under harness/ defines fn {name}",
                c[0]
            );
        }
    }
}
