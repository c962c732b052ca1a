//! The evidence crate's layout holds: no two modules of `evidence/src` depend on
//! each other through any chain of imports (a module may use its parent's items;
//! siblings form no circle); and no code names a manifest fragment's key by
//! string: the seal, verify, recover and the manifest read every fragment through
//! its record in [`evidence::fragments`] (`F::KEY`, `read_lenient::<F>`), the one
//! place each key is written.
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
fn no_two_modules_of_evidence_depend_on_each_other() {
    let g = module_graph(&src());
    assert!(g.len() > 10, "only {} modules found", g.len());
    let c = circles(&g);
    assert!(c.is_empty(), "module circles in evidence/src: {c:?}");
}

/// The places in `text` (a file named `rel`) that name a fragment key by string:
/// a key looked up, indexed, matched on, compared or journalled as a literal.
/// A line saying `// not a manifest key:` is exempt (a literal that happens to
/// spell a key but names something else).
fn keys_named_by_string(rel: &str, text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for (n, line) in code_lines(text) {
        if line.contains("// not a manifest") {
            continue;
        }
        let named = evidence::fragments::KEYS.iter().any(|key| {
            [
                format!("fragment(\"{key}\""),
                format!("get(\"{key}\")"),
                format!("[\"{key}\"]"),
                format!("&[\"{key}\""),
                format!("key: \"{key}\""),
                format!("(\"{key}\".to_string()"),
                format!("insert(\"{key}\""),
                format!("remove(\"{key}\""),
                format!("entry(\"{key}\""),
                format!("contains_key(\"{key}\")"),
                format!("\"{key}\" =>"),
                format!("== \"{key}\""),
            ]
            .iter()
            .any(|access| line.contains(access))
        });
        if named {
            bad.push(format!("{rel}:{n}: {line}"));
        }
    }
    // Fragment calls whose key is on the next line.
    let lines: Vec<(usize, &str)> = code_lines(text).collect();
    for w in lines.windows(2) {
        let (call, key) = (w[0].1, w[1].1);
        if (call.ends_with("fragment(") || call.ends_with(".get(")) && key.starts_with('"') {
            let lit = key.trim_start_matches('"');
            if evidence::fragments::KEYS
                .iter()
                .any(|k| lit.starts_with(&format!("{k}\"")))
            {
                bad.push(format!("{rel}:{}: {key}", w[1].0));
            }
        }
    }
    bad
}

#[test]
fn no_code_names_a_fragment_key_by_string() {
    let root = src();
    let mut bad = Vec::new();
    let mut scanned = 0;
    for f in rust_files(&root) {
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        if rel == "fragments.rs" {
            continue;
        }
        scanned += 1;
        let text = std::fs::read_to_string(&f).unwrap();
        bad.extend(keys_named_by_string(&rel, &text));
    }
    assert!(scanned > 10, "only {scanned} files scanned");
    assert!(
        bad.is_empty(),
        "fragment keys named by string (use the fragment's record in evidence::fragments):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_fragment_key_check_would_see_a_violation() {
    // Every form the seal, verify and recover used before their records moved here.
    let planted = [
        "    m.fragment(\"rung\")?.get(\"config\")?",
        "        .get(\"sensors_unavailable\")",
        "        fragments.insert(\"sensors_unavailable\".into(), v);",
        "    if su.len() != before || fragments.contains_key(\"sampler\") {",
        "                \"exit\" => exit = Some(value.clone()),",
        "                vec![(\"exit\".to_string(), recovered_exit(reason, detail))],",
        "        key: \"run\".into(),",
        "    if key == \"run\" {",
        "    m[\"levers\"]",
    ];
    for p in planted {
        let text = format!("fn f() {{\n{p}\n}}\n");
        assert_eq!(
            keys_named_by_string("x.rs", &text).len(),
            1,
            "not seen: {p}"
        );
    }
    let split = "fn f() {\n    fragments\n        .get(\n            \"exit\",\n        )\n}\n";
    assert_eq!(keys_named_by_string("x.rs", split).len(), 1);
    // Exempt: test modules, comments, the exemption, and keys through records.
    let fine = "fn f() {\n    // m.fragment(\"rung\")\n    m.get(Rung::KEY);\n    \
                let x = [\"exit\"]; // not a manifest key: a word\n}\n\
                #[cfg(test)]\nmod tests { x.fragment(\"levers\") }";
    assert_eq!(keys_named_by_string("x.rs", fine), Vec::<String>::new());
    assert!(evidence::fragments::KEYS.contains(&"levers"));
}
