//! The harness's layout holds: no two modules of `harness/src` depend on each
//! other through any chain of imports (a module may use its parent's items;
//! siblings form no circle); every subcommand lives in `cmd/` (its clap arguments
//! and its `run`), and nothing outside `cmd/` (and `main.rs`, which dispatches) is
//! one; and no code names a manifest fragment's key by string: every reader and
//! writer goes through the fragment's record ([`harness::fragments`]).
//!
//! The scan reads code lines (comments and nested test modules are skipped) for
//! `crate::...` and `super::...` paths, resolved to the deepest module that is a
//! file.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The module path of `file` under the crate source folder `root` (`main.rs`,
/// `lib.rs` and `mod.rs` name their folder).
fn module_in(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The module-level dependency graph of the crate at `root`: for each file's
/// module, the file modules its code lines name (outside nested `mod` blocks
/// and comments), less its own ancestors.
fn module_graph(
    root: &Path,
) -> std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>> {
    use std::collections::{BTreeMap, BTreeSet};
    let files = rust_files(root);
    let mods: BTreeSet<Vec<String>> = files.iter().map(|f| module_in(root, f)).collect();
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for f in &files {
        let m = module_in(root, f);
        let deps = g.entry(m.clone()).or_default();
        let text = std::fs::read_to_string(f).unwrap();
        let mut nested = false;
        for raw in text.lines() {
            if raw.starts_with("mod ")
                || raw.starts_with("pub mod ")
                || raw.starts_with("pub(crate) mod ")
            {
                nested = raw.trim_end().ends_with('{');
            } else if raw == "}" {
                nested = false;
            }
            let line = raw.trim();
            if nested || line.starts_with("//") {
                continue;
            }
            for w in line
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .filter(|w| w.starts_with("crate::") || w.starts_with("super::"))
            {
                let segs: Vec<&str> = w.split("::").filter(|s| !s.is_empty()).collect();
                let path: Vec<String> = if segs[0] == "crate" {
                    segs[1..].iter().map(|s| s.to_string()).collect()
                } else {
                    let ups = segs.iter().take_while(|s| **s == "super").count();
                    if ups > m.len() {
                        continue;
                    }
                    let mut p = m[..m.len() - ups].to_vec();
                    p.extend(segs[ups..].iter().map(|s| s.to_string()));
                    p
                };
                let target = (1..=path.len())
                    .rev()
                    .map(|n| path[..n].to_vec())
                    .find(|p| mods.contains(p));
                if let Some(t) = target {
                    if t != m && !m.starts_with(&t) {
                        deps.insert(t);
                    }
                }
            }
        }
    }
    g
}

/// The circles of `g` (strongly connected components of more than one module).
fn circles(
    g: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
) -> Vec<Vec<String>> {
    use std::collections::BTreeMap;
    struct T<'a> {
        g: &'a BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        idx: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Vec<String>) {
        let n = t.idx.len();
        t.idx.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        if let Some(ws) = t.g.get(v) {
            for w in ws {
                let Some((w, _)) = t.g.get_key_value(w) else {
                    continue;
                };
                if !t.idx.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if t.stack.contains(&w) {
                    let iw = t.idx[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.idx[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                comp.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        idx: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.idx.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

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

/// The lines of `text` outside `#[cfg(test)]` modules and comments.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut in_test = false;
    text.lines().enumerate().filter_map(move |(i, raw)| {
        if raw.starts_with("#[cfg(test)]") {
            in_test = true;
        }
        let line = raw.trim();
        (!in_test && !line.starts_with("//")).then_some((i + 1, line))
    })
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
        if rel == "fragments.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in code_lines(&text) {
            if line.contains("// not a manifest") {
                continue;
            }
            for key in harness::fragments::KEYS {
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
        "fragment keys named by string (use the fragment's record in harness::fragments):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checks_would_see_a_violation() {
    let text = "fn f() {\n    m.fragment(\"levers\")\n}\n#[cfg(test)]\nmod tests { x.fragment(\"levers\") }";
    let lines: Vec<(usize, &str)> = code_lines(text).collect();
    assert!(lines.iter().any(|(_, l)| l.contains("fragment(\"levers\"")));
    assert!(!lines.iter().any(|(n, _)| *n == 5));
    assert!(harness::fragments::KEYS.contains(&"levers"));
}

#[test]
fn the_circle_finder_finds_a_circle() {
    use std::collections::{BTreeMap, BTreeSet};
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    g.insert(m("levers"), [m("cuda::staging")].into());
    g.insert(m("cuda::staging"), [m("weights::safetensors")].into());
    g.insert(m("weights::safetensors"), [m("levers")].into());
    g.insert(m("pipeline"), [m("levers")].into());
    assert_eq!(
        circles(&g),
        vec![vec![
            "cuda::staging".to_string(),
            "levers".into(),
            "weights::safetensors".into()
        ]]
    );
    g.get_mut(&m("weights::safetensors")).unwrap().clear();
    assert!(circles(&g).is_empty());
}
