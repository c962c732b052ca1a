//! The CUDA arm's layout holds: every import in `engine/src/cuda/` points down
//! its layers, and nothing outside the checks and benchmarks imports them but
//! the command line.
//!
//! Layers, bottom up (`engine/src/cuda/mod.rs` documents them):
//! 0. `cuda/mod.rs` (the error type), 1. `kit/` (device kit), 2. `staging.rs`,
//! 3. `models/` (dit, t5, vae), 4. `denoise.rs`, `burn.rs`, then the test side,
//! which the production code never imports: 5. `fixtures.rs`, 6. `bench/`,
//! 7. `selftest/` (the `selftest-cuda` runner, which also runs the benchmarks).
//!
//! A file may use a lower layer, or its own module (a model its own files;
//! `kit/` its own files); code outside `cuda/` may use layers 0-4 only, except
//! `cli.rs`, which runs `selftest-cuda`. Unit tests inside production files
//! (`#[cfg(test)]` modules) may use `fixtures` too, never `bench` or `selftest`.
//! The scan reads code lines (comments are skipped) for `crate::cuda::...` and
//! `super::...` paths, resolved from the file's place.
//!
//! And beyond `cuda/`: no two files of the engine depend on each other through
//! any chain of imports (a module may use its parent's items; siblings form no
//! circle). The same scan, resolved to the deepest module that is a file.
//! (`evidence` and `harness` guard their own graphs in their own layout tests.)

use std::path::{Path, PathBuf};

use evidence::module_graph::{circles, module_graph, module_in, rust_files};

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module path of a file under `src/` (`cuda/kit/gemm.rs` -> [cuda, kit, gemm];
/// `mod.rs` and `lib.rs` name their folder).
fn module_of(file: &Path) -> Vec<String> {
    module_in(&src(), file)
}

/// The layer of a module path under `cuda` (`None` outside it).
fn layer(m: &[String]) -> Option<u8> {
    if m.first().map(String::as_str) != Some("cuda") {
        return None;
    }
    Some(match m.get(1).map(String::as_str) {
        None => 0,
        Some("kit") => 1,
        Some("staging") => 2,
        Some("models") => 3,
        Some("denoise" | "burn") => 4,
        Some("fixtures") => 5,
        Some("bench") => 6,
        Some("selftest") => 7,
        // An item of the root module (`CudaError`, `DriverContext`, ...).
        Some(_) => 0,
    })
}

/// The module a file's layer rule treats as "its own": `cuda/models/vae/...`
/// -> [cuda, models, vae]; `cuda/kit/...` -> [cuda, kit].
fn home(m: &[String]) -> Vec<String> {
    let n = if m.get(1).map(String::as_str) == Some("models") {
        3
    } else {
        2
    };
    m.iter().take(n).cloned().collect()
}

/// The module paths a line of code refers to, resolved from module `m`.
fn references(line: &str, m: &[String], in_test: bool) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let words: Vec<&str> = line
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.contains("::"))
        .collect();
    for w in words {
        let segs: Vec<&str> = w.split("::").filter(|s| !s.is_empty()).collect();
        let resolved: Option<Vec<String>> = if segs.first() == Some(&"crate") {
            Some(segs[1..].iter().map(|s| s.to_string()).collect())
        } else if segs.first() == Some(&"super") {
            let ups = segs.iter().take_while(|s| **s == "super").count();
            // Inside a nested test module the first `super` is the file itself.
            let ups = if in_test { ups - 1 } else { ups };
            if ups > m.len() {
                None
            } else {
                let mut base: Vec<String> = m[..m.len() - ups].to_vec();
                base.extend(
                    segs[segs.iter().take_while(|s| **s == "super").count()..]
                        .iter()
                        .map(|s| s.to_string()),
                );
                Some(base)
            }
        } else {
            None
        };
        if let Some(r) = resolved {
            if r.first().map(String::as_str) == Some("cuda") {
                out.push(r);
            }
        }
    }
    out
}

/// Every violation in the tree: `file:line: what`.
fn violations() -> Vec<String> {
    let mut bad = Vec::new();
    for file in rust_files(&src()) {
        let m = module_of(&file);
        let text = std::fs::read_to_string(&file).unwrap();
        let mine = layer(&m);
        let cli = m == ["cli"];
        let mut in_test = false;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if raw.starts_with("mod ")
                || raw.starts_with("pub mod ")
                || raw.starts_with("pub(crate) mod ")
            {
                in_test = raw.trim_end().ends_with('{');
            } else if raw == "}" {
                in_test = false;
            }
            if line.starts_with("//") {
                continue;
            }
            for r in references(line, &m, in_test) {
                let theirs = layer(&r).unwrap_or(0);
                let at = format!("{}:{}", file.strip_prefix(src()).unwrap().display(), i + 1);
                let what = r.join("::");
                match mine {
                    None => {
                        if theirs >= 5 && !(cli && theirs == 7) {
                            bad.push(format!(
                                "{at}: `{what}` (outside cuda/ only cli.rs may use the checks)"
                            ));
                        }
                    }
                    Some(l) => {
                        let own = r.starts_with(&home(&m));
                        let ok = theirs < l
                            || own
                            || (l == 7 && theirs == 6)
                            || (in_test && l <= 4 && theirs == 5);
                        if !ok {
                            bad.push(format!("{at}: layer {l} uses `{what}` (layer {theirs})"));
                        }
                    }
                }
            }
        }
    }
    bad
}

#[test]
fn cuda_imports_point_down_and_only_the_cli_uses_the_checks() {
    let bad = violations();
    assert!(
        bad.is_empty(),
        "{} import(s) against the layout of engine/src/cuda (see engine/src/cuda/mod.rs):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn the_scan_resolves_paths_and_would_see_a_violation() {
    let m: Vec<String> = ["cuda", "models", "t5"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let r = references("use crate::cuda::selftest::Check;", &m, false);
    assert_eq!(r, vec![vec!["cuda", "selftest", "Check"]]);
    assert_eq!(layer(&r[0]), Some(7));
    let r = references("use super::super::kit::gemm::Gemm;", &m, false);
    assert_eq!(r[0][..3], ["cuda", "kit", "gemm"]);
    // Inside a test module the first `super` is the file.
    let r = references("use super::super::dit::X;", &m, true);
    assert_eq!(r[0][..3], ["cuda", "models", "dit"]);
    assert_eq!(home(&m), ["cuda", "models", "t5"]);
    // The tree itself holds the files the rule names.
    let files: Vec<Vec<String>> = rust_files(&src()).iter().map(|f| module_of(f)).collect();
    for want in [
        &["cuda", "kit"][..],
        &["cuda", "selftest"],
        &["cuda", "bench"],
        &["cuda", "models", "dit"],
    ] {
        assert!(
            files
                .iter()
                .any(|f| f.starts_with(&want.iter().map(|s| s.to_string()).collect::<Vec<_>>())),
            "{want:?}"
        );
    }
}

#[test]
fn no_two_modules_of_the_engine_depend_on_each_other() {
    let g = module_graph(&src());
    assert!(g.len() > 10, "only {} modules found", g.len());
    let c = circles(&g);
    assert!(c.is_empty(), "module circles in engine/src: {c:?}");
}

/// The lines of `text` that include another file by a path attribute.
fn path_includes(text: &str) -> Vec<String> {
    // Built so that this file's own source does not match itself.
    let needle = format!("#[{}", "path");
    text.lines()
        .filter(|l| l.trim_start().starts_with(&needle))
        .map(|l| l.trim().to_string())
        .collect()
}

/// No file of the engine (library, tests, examples, benches) pulls another in
/// with a path attribute: what targets share lives in `src/test_kit/` behind
/// the `test-kit` feature. Red on: a path attribute anywhere, as
/// `examples/golden_inputs.rs` had for `tests/it/golden_case.rs`.
#[test]
fn no_file_includes_another_by_path() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for dir in ["src", "tests", "examples", "benches"] {
        let d = root.join(dir);
        if !d.exists() {
            continue;
        }
        for f in rust_files(&d) {
            let text = std::fs::read_to_string(&f).unwrap();
            for l in path_includes(&text) {
                bad.push(format!("{}: {l}", f.display()));
            }
        }
    }
    assert!(bad.is_empty(), "path includes:\n{}", bad.join("\n"));
    let planted = format!("//! doc\n#[{}= \"../x.rs\"]\nmod x;\n", "path ");
    assert_eq!(
        path_includes(&planted).len(),
        1,
        "the scan sees a planted one"
    );
}
