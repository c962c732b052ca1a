//! The harness's layout holds: no two modules of `harness/src` depend on each
//! other through any chain of imports (a module may use its parent's items;
//! siblings form no circle); every subcommand lives in `cmd/` (its clap arguments
//! and its `run`), and nothing outside `cmd/` (and `main.rs`, which dispatches) is
//! one; and no code names a manifest fragment's key by string: every reader and
//! writer goes through the fragment's record ([`evidence::fragments`], where the
//! evidence crate's own layout test holds its readers to the same rule).
//!
//! The scan reads code lines (comments and nested test modules are skipped) for
//! `crate::...` and `super::...` paths, resolved to the deepest module that is a
//! file.

use std::path::PathBuf;

use evidence::module_graph::{circles, code_lines, module_graph, rust_files};

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_two_modules_of_the_harness_depend_on_each_other() {
    let g = module_graph(&src());
    assert!(g.len() > 10, "only {} modules found", g.len());
    let c = circles(&g);
    assert!(c.is_empty(), "module circles in harness/src: {c:?}");
}

#[test]
fn every_subcommand_lives_in_cmd_and_nothing_else_is_one() {
    let mut bad = Vec::new();
    let root = src();
    let cmd = root.join("cmd");
    for f in rust_files(&root) {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let in_cmd = f.starts_with(&cmd);
        if rel == "main.rs" || rel.starts_with("bin/") {
            continue;
        }
        let mut derive_args = false;
        for (n, line) in code_lines(&text) {
            if line.starts_with("#[derive(") {
                derive_args = line.contains("Args") && !line.contains("ValueEnum");
                if line.contains("Subcommand") || line.contains("Parser") {
                    bad.push(format!("{rel}:{n}: a clap command outside main.rs"));
                }
                continue;
            }
            if derive_args && line.starts_with("pub struct ") {
                let name = line["pub struct ".len()..]
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap_or("");
                if name.ends_with("Args") && !in_cmd {
                    bad.push(format!(
                        "{rel}:{n}: subcommand arguments {name} outside cmd/"
                    ));
                }
                derive_args = false;
            }
        }
        if in_cmd && rel != "cmd/mod.rs" && !text.contains("pub fn run(") {
            bad.push(format!("{rel}: a file of cmd/ without its `pub fn run`"));
        }
    }
    // main.rs dispatches to cmd/ alone; besides, it only touches the process's
    // edges: exit codes, a closed stdout and the redaction of its last message.
    let main = std::fs::read_to_string(root.join("main.rs")).unwrap();
    let edges = [
        "harness::cmd",
        "harness::exit",
        "harness::closed_stdout",
        "harness::redact",
    ];
    for (n, line) in code_lines(&main) {
        if line.contains("harness::") && !edges.iter().any(|e| line.contains(e)) {
            bad.push(format!("main.rs:{n}: dispatches outside cmd/: {line}"));
        }
    }
    assert!(
        bad.is_empty(),
        "subcommands outside cmd/:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_code_names_a_fragment_key_by_string() {
    let root = src();
    let mut bad = Vec::new();
    for f in rust_files(&root) {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in code_lines(&text) {
            if line.contains("// not a manifest") {
                continue;
            }
            for key in evidence::fragments::KEYS {
                for access in [
                    format!("fragment(\"{key}\""),
                    format!("get(\"{key}\")"),
                    format!("[\"{key}\"]"),
                    format!("&[\"{key}\""),
                    format!("get(m, \"{key}"),
                    format!("key: \"{key}\""),
                ] {
                    if line.contains(&access) {
                        bad.push(format!("{rel}:{n}: {line}"));
                    }
                }
            }
        }
    }
    // Fragment calls whose key is on the next line.
    for f in rust_files(&root) {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            if w[0].trim_end().ends_with("fragment(") && w[1].trim().starts_with('"') {
                bad.push(format!("{}: {}", f.display(), w[1].trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "fragment keys named by string (use the fragment's record in evidence::fragments):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checks_would_see_a_violation() {
    let text = "fn f() {\n    m.fragment(\"levers\")\n}\n#[cfg(test)]\nmod tests { x.fragment(\"levers\") }";
    let lines: Vec<(usize, &str)> = code_lines(text).collect();
    assert!(lines.iter().any(|(_, l)| l.contains("fragment(\"levers\"")));
    assert!(!lines.iter().any(|(n, _)| *n == 5));
    assert!(evidence::fragments::KEYS.contains(&"levers"));
}
