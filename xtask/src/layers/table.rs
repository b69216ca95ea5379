//! The layers of `server/src`, bottom to top, and the few imports allowed
//! to run up them. This table is the one the check enforces;
//! ARCHITECTURE.md's "Layers" section must list the same rows (the check
//! compares them), so the design and the code cannot drift apart.
//!
//! A module may import its own layer and any below it. The crate root
//! (`lib.rs`: the module list and a few re-exports) is on the top layer.

/// Each row is a layer, bottom first; each name a top-level module of
/// `server/src`.
pub const LAYERS: &[&[&str]] = &[
    &[
        "fsutil", "prepared", "metrics", "redact", "redirect", "clients", "slots", "ages",
        "request", "treewalk",
    ],
    &["verify"],
    &["served"],
    &["state", "signing", "cache"],
    &["sink", "source"],
    &["publish", "deltas", "refresh", "http"],
    &["images", "mirror", "listen"],
    &["serve"],
    &["cli"],
];

/// An import allowed to run up the table: in `file`, the path `path`
/// exactly as written there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub file: &'static str,
    pub path: &'static str,
    pub reason: &'static str,
}

/// The upward imports that stay, each with why. At most [`MAX_ALLOWED`].
pub const ALLOWED: &[Allowed] = &[];

/// How many upward imports the design tolerates at all.
pub const MAX_ALLOWED: usize = 6;

/// A layer table and its allowances (the check's is [`TABLE`]).
#[derive(Debug, Clone, Copy)]
pub struct Table {
    pub layers: &'static [&'static [&'static str]],
    pub allowed: &'static [Allowed],
}

/// What the check enforces.
pub const TABLE: Table = Table {
    layers: LAYERS,
    allowed: ALLOWED,
};

impl Table {
    /// The layer (0 = bottom) of a top-level module, if the table names it.
    pub fn layer_of(&self, module: &str) -> Option<usize> {
        self.layers.iter().position(|row| row.contains(&module))
    }
}

/// The heading of ARCHITECTURE.md's copy of the table.
pub const DOC_HEADING: &str = "### Layers of `server/src`";

/// ARCHITECTURE.md's copy of the table, read back: under [`DOC_HEADING`],
/// one list item a layer, top first (as the doc reads), each naming its
/// modules in backticks; the section ends at the next heading. Returned
/// bottom first, as [`LAYERS`] is.
pub fn doc_layers(doc: &str) -> Option<Vec<Vec<String>>> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != DOC_HEADING);
    lines.next()?;
    let mut rows: Vec<Vec<String>> = lines
        .take_while(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with("- "))
        .map(|l| {
            // The modules are the backticked words before the first colon.
            let names = l.split_once(':').map_or(l, |(head, _)| head);
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        })
        .collect();
    rows.reverse();
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_well_formed() {
        assert!(ALLOWED.len() <= MAX_ALLOWED);
        let mut names: Vec<&str> = LAYERS.iter().flat_map(|r| r.iter().copied()).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a module on two layers");
        for a in ALLOWED {
            assert!(a.reason.len() > 10, "{}: a reason, not a word", a.path);
        }
    }

    #[test]
    fn reads_the_docs_copy() {
        let doc = "# A\n### Layers of `server/src`\n\nIntro.\n\n- `cli`, `serve`: the top\n\
                   - `a`: uses `b` below it\n- `b`\n### Next\n- `x`\n";
        let want = vec![
            vec!["b".to_owned()],
            vec!["a".to_owned()],
            vec!["cli".to_owned(), "serve".to_owned()],
        ];
        assert_eq!(doc_layers(doc), Some(want));
        assert_eq!(doc_layers("# no table\n"), None);
    }
}
