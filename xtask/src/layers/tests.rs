//! The whole check over a small made-up workspace, one failure of each
//! kind and the cases that must pass.

use super::table::{Allowed, Table};
use super::*;

const LAYERS: &[&[&str]] = &[&["low"], &["mid", "side"], &["top"]];
const ALLOWED: &[Allowed] = &[
    Allowed {
        file: "server/src/low.rs",
        path: "crate::top::T",
        reason: "the one named exception",
    },
    Allowed {
        file: "server/src/mid.rs",
        path: "crate::top::Gone",
        reason: "no longer imported upward",
    },
];
const TABLE: Table = Table {
    layers: LAYERS,
    allowed: ALLOWED,
};
const DOC: &str = "# A\n### Layers of `server/src`\n\n- `top`: the top\n- `side`, `mid`\n- `low`\n";

fn body(lines: usize) -> String {
    (0..lines)
        .map(|i| format!("    let _x{i} = {i};\n"))
        .collect()
}

fn workspace() -> Vec<(String, String)> {
    let files = [
        ("server/src/lib.rs", "pub mod low;\npub mod mid;\npub mod side;\npub mod top;\npub fn root_item() {}\n".to_owned()),
        ("server/src/low.rs", "use crate::top::T;\nuse crate::mid::M;\npub struct L;\n".to_owned()),
        ("server/src/mid.rs", "use crate::side::S;\npub struct M;\n".to_owned()),
        ("server/src/side.rs", "pub struct S;\nfn f() {\n    crate::root_item();\n}\n".to_owned()),
        ("server/src/top.rs", "use crate::mid::M;\npub struct T;\n".to_owned()),
        ("other/src/lib.rs", "mod a;\nmod b;\n".to_owned()),
        ("other/src/a.rs", "use crate::b::B;\npub struct A;\n".to_owned()),
        ("other/src/b.rs", "pub struct B;\nfn g() {\n    let _ = crate::a::A;\n}\n".to_owned()),
        ("other/src/long.rs", format!("fn long() {{\n{}}}\n\n// long-fn: a table, one row a case\nfn excused() {{\n{}}}\n\nfn short() {{\n{}}}\n", body(99), body(200), body(98))),
        ("other/src/big.rs", "// a line\n".repeat(701)),
    ];
    files.into_iter().map(|(n, t)| (n.to_owned(), t)).collect()
}

fn run(files: Vec<(String, String)>, doc: &str) -> Report {
    let (names, texts): (Vec<String>, Vec<String>) = files.into_iter().unzip();
    judge(&TABLE, names, &texts, doc)
}

#[test]
fn every_kind_of_failure_is_named_where_it_is() {
    let report = run(workspace(), DOC);
    let want = [
        "other/src/long.rs:1: fn long is 101 lines, over 100 (or say why above it: `// long-fn: <why>`)",
        "other/src/big.rs: 701 lines, over 700",
        "import circle of 2 files:\n    other/src/a.rs:1 -> other/src/b.rs: crate::b::B\n    other/src/b.rs:3 -> other/src/a.rs: crate::a::A",
        "upward import server/src/low.rs:2: crate::mid::M (layer 1 `low` -> layer 2 `mid`)",
        "upward import server/src/side.rs:3: crate::root_item (layer 2 `side` -> layer 3 `the crate root`)",
        "xtask/src/layers/table.rs: allows crate::top::Gone in server/src/mid.rs, which no longer imports it upward",
    ];
    assert_eq!(report.failures, want);
    assert_eq!(
        report.allowed,
        ["server/src/low.rs:1: crate::top::T (layer 1 `low` -> layer 3 `top`): the one named exception"]
    );
}

#[test]
fn a_clean_workspace_passes() {
    let clean: Vec<(String, String)> = workspace()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("other/"))
        .map(|(n, t)| match n.as_str() {
            "server/src/low.rs" => (n, "use crate::top::T;\npub struct L;\n".to_owned()),
            "server/src/side.rs" => (n, "pub struct S;\n".to_owned()),
            "server/src/mid.rs" => (
                n,
                "use crate::low::L;\npub struct M;\nfn f() { let _ = crate::top::Gone; }\n"
                    .to_owned(),
            ),
            "server/src/top.rs" => (n, "pub struct T;\n".to_owned()),
            _ => (n, t),
        })
        .collect();
    let report = run(clean, DOC);
    assert_eq!(report.failures, Vec::<String>::new());
    assert_eq!(report.allowed.len(), 2);
}

#[test]
fn the_docs_table_must_match_and_every_module_have_a_layer() {
    let mut files = workspace();
    files[0].1.push_str("pub mod stray;\n");
    files.push((
        "server/src/stray.rs".to_owned(),
        "pub struct X;\n".to_owned(),
    ));
    let report = run(
        files,
        "### Layers of `server/src`\n- `top`\n- `mid`\n- `low`, `side`\n",
    );
    let has = |s: &str| report.failures.iter().any(|f| f.contains(s));
    assert!(
        has("server/src: module `stray` has no layer"),
        "{:?}",
        report.failures
    );
    assert!(has("ARCHITECTURE.md: its layers"), "{:?}", report.failures);
    let missing = run(workspace(), "# no table\n");
    assert!(missing
        .failures
        .iter()
        .any(|f| f.contains("ARCHITECTURE.md: no `### Layers")));
}
