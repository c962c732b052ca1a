//! The module graph of a crate's sources, for the layout tests every crate of
//! the workspace runs on itself: which file modules a module's code lines name
//! (`crate::...` and `super::...` paths, resolved to the deepest module that is
//! a file; comments and nested `mod` blocks skipped), and the circles in it.
//! It reads the crate's own source tree, so an unreadable file is a panic
//! naming it, not an error to handle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// For each module path, the module paths it depends on.
pub type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// Every `.rs` file under `dir`, sorted; panics naming the folder it cannot
/// read (a layout check over the crate's own sources).
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries {
            let p = e.unwrap_or_else(|e| panic!("{}: {e}", d.display())).path();
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
pub fn module_in(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file);
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
pub fn module_graph(root: &Path) -> Graph {
    let files = rust_files(root);
    let mods: BTreeSet<Vec<String>> = files.iter().map(|f| module_in(root, f)).collect();
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for f in &files {
        let m = module_in(root, f);
        let deps = g.entry(m.clone()).or_default();
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
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
pub fn circles(g: &Graph) -> Vec<Vec<String>> {
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
                    if let Some(lv) = t.low.get_mut(v) {
                        *lv = (*lv).min(lw);
                    }
                } else if t.stack.contains(&w) {
                    let iw = t.idx[w];
                    if let Some(lv) = t.low.get_mut(v) {
                        *lv = (*lv).min(iw);
                    }
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

/// The lines of `text` outside `#[cfg(test)]` modules and comments, numbered
/// from 1 and trimmed: what the layout tests read as code (everything after
/// the first `#[cfg(test)]` line counts as test code).
pub fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut in_test = false;
    text.lines().enumerate().filter_map(move |(i, raw)| {
        if raw.starts_with("#[cfg(test)]") {
            in_test = true;
        }
        let line = raw.trim();
        (!in_test && !line.starts_with("//")).then_some((i + 1, line))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_circle_finder_finds_a_circle() {
        let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        let mut g: Graph = BTreeMap::new();
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
        if let Some(s) = g.get_mut(&m("weights::safetensors")) {
            s.clear();
        }
        assert!(circles(&g).is_empty());
    }

    #[test]
    fn module_paths_name_their_folder_for_mod_lib_and_main() {
        let r = Path::new("/src");
        assert_eq!(
            module_in(r, Path::new("/src/cuda/kit/mod.rs")),
            ["cuda", "kit"]
        );
        assert_eq!(
            module_in(r, Path::new("/src/cuda/kit/gemm.rs")),
            ["cuda", "kit", "gemm"]
        );
        assert!(module_in(r, Path::new("/src/lib.rs")).is_empty());
    }
}
