use super::*;
use std::collections::HashMap;

/// A checksum named by a label, so cases read as trees of names.
fn c(label: &str) -> Checksum {
    Checksum::digest(label.as_bytes())
}

/// A tree by labels: its own, its files', and its directories' (dirtree,
/// dirmeta).
type Tree = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
);
/// A case: what it shows, the parent's root, the tip's, and the metadata
/// and content it should find.
type Case = (
    &'static str,
    Root,
    Root,
    &'static [&'static str],
    &'static [&'static str],
);

/// The trees every case draws on.
#[rustfmt::skip]
const TREES: &[Tree] = &[
    // The parent: two files and a subdirectory.
    ("p", &["a", "b"], &[("s", "m")]),
    ("s", &["c"], &[]),
    // One file changed at the root.
    ("t1", &["a", "b2"], &[("s", "m")]),
    // Only the subdirectory's mode changed: same subtree, new dirmeta.
    ("t2", &["a", "b"], &[("s", "m2")]),
    // A new directory holding a file moved from `s` and a new one.
    ("t3", &["a", "b"], &[("s", "m"), ("n", "m3")]),
    ("n", &["c", "d"], &[]),
    // The parent's subtree at another path, under a new root.
    ("t4", &[], &[("s", "m")]),
    // One new subtree twice, under two names.
    ("t5", &["e"], &[("q", "m4"), ("q", "m4")]),
    ("q", &["e", "f"], &[]),
];

fn trees() -> HashMap<Checksum, DirTree> {
    TREES
        .iter()
        .map(|(label, files, dirs)| {
            let t = DirTree {
                files: files.iter().map(|f| (f.to_string(), c(f))).collect(),
                dirs: dirs
                    .iter()
                    .enumerate()
                    .map(|(i, (t, m))| (format!("d{i}"), c(t), c(m)))
                    .collect(),
            };
            (c(label), t)
        })
        .collect()
}

fn root(tree: &str, meta: &str) -> Root {
    Root {
        tree: c(tree),
        meta: c(meta),
    }
}

/// Names as labels: `t:` dirtree, `m:` dirmeta, `f:` content.
fn labelled(names: &[ObjectName]) -> Vec<String> {
    let labels: HashMap<Checksum, &str> = TREES
        .iter()
        .flat_map(|(t, files, dirs)| {
            let dirs = dirs.iter().flat_map(|(t, m)| [*t, *m]);
            std::iter::once(*t).chain(files.iter().copied()).chain(dirs)
        })
        .chain(["rm", "rm2", "gone"])
        .map(|l| (c(l), l))
        .collect();
    names
        .iter()
        .map(|n| {
            let kind = match n.kind {
                ObjectKind::DirTree => "t",
                ObjectKind::DirMeta => "m",
                _ => "f",
            };
            format!("{kind}:{}", labels[&n.checksum])
        })
        .collect()
}

#[test]
fn new_objects_are_what_the_tip_reaches_and_the_parent_does_not() {
    let all = trees();
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("the same tree", root("p", "rm"), root("p", "rm"), &[], &[]),
        ("one file changed", root("p", "rm"), root("t1", "rm"), &["t:t1"], &["f:b2"]),
        ("a new root dirmeta", root("p", "rm"), root("t1", "rm2"), &["m:rm2", "t:t1"], &["f:b2"]),
        ("a subtree kept, its dirmeta new", root("p", "rm"), root("t2", "rm"), &["t:t2", "m:m2"], &[]),
        ("a moved file is not new", root("p", "rm"), root("t3", "rm"), &["t:t3", "m:m3", "t:n"], &["f:d"]),
        ("an old subtree elsewhere", root("p", "rm"), root("t4", "rm"), &["t:t4"], &[]),
        ("a new subtree twice, once", root("p", "rm"), root("t5", "rm"), &["t:t5", "m:m4", "t:q"], &["f:e", "f:f"]),
        ("a pruned parent: all new", root("gone", "rm"), root("t1", "rm"), &["t:t1", "m:m", "t:s"], &["f:a", "f:b2", "f:c"]),
    ];
    for (what, parent, tip, metadata, content) in cases {
        let mut reads = 0;
        let got = new_objects(*parent, *tip, |c| {
            reads += 1;
            Ok(all.get(c).cloned())
        })
        .unwrap();
        assert_eq!(labelled(&got.metadata), *metadata, "{what}: metadata");
        assert_eq!(labelled(&got.content), *content, "{what}: content");
        // Each dirtree read at most once per side.
        assert!(reads <= 2 * TREES.len(), "{what}: {reads} reads");
    }
}

#[test]
fn a_failed_read_fails_the_walk() {
    let all = trees();
    let err = new_objects(root("p", "rm"), root("t3", "rm"), |t| {
        if *t == c("n") {
            anyhow::bail!("disk on fire");
        }
        Ok(all.get(t).cloned())
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("disk on fire"), "{err:#}");
}

#[test]
fn nesting_is_bounded() {
    // A chain of distinct trees deeper than any verified commit may hold.
    let deep = |i: usize| c(&format!("deep{i}"));
    let tree = |t: &Checksum| {
        let i = (0..=MAX_TREE_DEPTH + 1).find(|i| deep(*i) == *t);
        Ok(i.map(|i| DirTree {
            files: Vec::new(),
            dirs: vec![("d".into(), deep(i + 1), c("m"))],
        }))
    };
    let tip = Root {
        tree: deep(0),
        meta: c("m"),
    };
    let err = new_objects(root("p", "rm"), tip, tree).unwrap_err();
    assert!(format!("{err}").contains("nested deeper"), "{err}");
}
