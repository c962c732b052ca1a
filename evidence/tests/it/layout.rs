//! The evidence crate's layout holds: no two modules of `evidence/src` depend on
//! each other through any chain of imports (a module may use its parent's items;
//! siblings form no circle). The scan reads code lines (comments and nested test
//! modules are skipped) for `crate::...` and `super::...` paths, resolved to the
//! deepest module that is a file.

use std::path::PathBuf;

use evidence::module_graph::{circles, module_graph};

#[test]
fn no_two_modules_of_evidence_depend_on_each_other() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = module_graph(&root);
    assert!(g.len() > 10, "only {} modules found", g.len());
    let c = circles(&g);
    assert!(c.is_empty(), "module circles in evidence/src: {c:?}");
}
