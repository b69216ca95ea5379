//! `cargo xtask layers` (and a step of `check` and `test`): the structure
//! guard rails of ARCHITECTURE.md, read from the sources without building
//! them.
//!
//! - No module import circle, file by file, in any crate of the workspace
//!   (xtask's and the fuzz targets' included). Imports made only by test
//!   code are left out (the product's module graph never holds them), and
//!   so is a file reading its own enclosing module (`super::` up to the
//!   folder's `mod.rs`): a module's items are its children's to use.
//! - `server/src` is layered (`table.rs`): an import from one layer to a
//!   higher one fails unless the table allows it with a reason, and at
//!   most six are allowed.
//! - No `.rs` file over [`MAX_FILE_LINES`] lines, and no function over
//!   [`MAX_FN_LINES`] lines of code (from `fn` to its closing brace, blank
//!   and comment-only lines not counted, as clippy's `too_many_lines`)
//!   unless a comment right above it, among its doc and attributes, says
//!   `// long-fn: <why>`.
//!
//! Parsing is our own lexer (`lex.rs`): comments and strings are read
//! past, so a path in a doc comment is no import.

mod graph;
mod lex;
mod scan;
pub mod table;

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

pub const MAX_FILE_LINES: usize = 700;
pub const MAX_FN_LINES: u32 = 100;

/// The marker that states why a function is long.
pub const LONG_FN_MARKER: &str = "// long-fn:";

/// The crate whose modules are layered.
const LAYERED_ROOT: &str = "server/src/lib.rs";

/// What the check found; `failures` empty means it passed.
#[derive(Debug, Default)]
pub struct Report {
    pub failures: Vec<String>,
    /// Upward imports the table allows, as lines to print.
    pub allowed: Vec<String>,
    pub files: usize,
    pub imports: usize,
}

/// Runs the check over the workspace and prints what it found; fails
/// when anything is wrong.
pub fn check() -> Result<()> {
    let root = crate::fixtures::workspace_root();
    let report = measure(&root)?;
    print!("{}", render(&report));
    if !report.failures.is_empty() {
        bail!("layers: {} problem(s), listed above", report.failures.len());
    }
    Ok(())
}

/// The report as text: failures, then the allowed upward imports, then a
/// count.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.failures {
        let _ = writeln!(out, "layers: FAIL {f}");
    }
    for a in &report.allowed {
        let _ = writeln!(out, "layers: allowed upward {a}");
    }
    let _ = writeln!(
        out,
        "layers: {} files, {} imports between files, {} upward import(s) allowed of {}, {} problem(s)",
        report.files,
        report.imports,
        report.allowed.len(),
        table::MAX_ALLOWED,
        report.failures.len()
    );
    out
}

/// Reads every `.rs` file under `root` (build outputs and hidden folders
/// left out) and checks it.
pub fn measure(root: &Path) -> Result<Report> {
    let mut names = Vec::new();
    collect(root, root, &mut names)?;
    names.sort();
    let mut texts = Vec::with_capacity(names.len());
    for name in &names {
        let path = root.join(name);
        texts.push(
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?,
        );
    }
    let doc_path = root.join("ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path)
        .with_context(|| format!("reading {}", doc_path.display()))?;
    Ok(judge(&table::TABLE, names, &texts, &doc))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry
            .file_type()
            .with_context(|| format!("stat {}", entry.path().display()))?;
        if kind.is_dir() && !name.starts_with('.') && name != "target" {
            collect(root, &entry.path(), out)?;
        } else if kind.is_file() && name.ends_with(".rs") {
            let rel = entry
                .path()
                .strip_prefix(root)
                .unwrap_or(&entry.path())
                .to_string_lossy()
                .into_owned();
            out.push(rel);
        }
    }
    Ok(())
}

/// The whole check over sources already read: `names[i]` (relative to the
/// workspace root) holds `texts[i]`; `doc` is ARCHITECTURE.md.
pub fn judge(tab: &table::Table, names: Vec<String>, texts: &[String], doc: &str) -> Report {
    let mut report = Report {
        files: names.len(),
        ..Report::default()
    };
    let scans: Vec<scan::FileScan> = texts.iter().map(|t| scan::scan(&lex::lex(t))).collect();
    for (i, text) in texts.iter().enumerate() {
        lengths(&names[i], text, &scans[i], &mut report.failures);
    }
    let g = graph::Graph::build(names, scans);
    report.imports = g.edges.iter().filter(|e| !e.test).count();
    for set in g.cycles() {
        report.failures.push(cycle_text(&g, &set));
    }
    layering(tab, &g, &mut report);
    doc_matches(tab, doc, &mut report.failures);
    report
}

/// Files over the limit, and long functions without a stated reason.
fn lengths(name: &str, text: &str, scan: &scan::FileScan, failures: &mut Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() > MAX_FILE_LINES {
        failures.push(format!(
            "{name}: {} lines, over {MAX_FILE_LINES}",
            lines.len()
        ));
    }
    for f in &scan.fns {
        if f.lines > MAX_FN_LINES && !long_reason(&lines, f.line) {
            failures.push(format!(
                "{name}:{}: fn {} is {} lines, over {MAX_FN_LINES} (or say why above it: `{LONG_FN_MARKER} <why>`)",
                f.line, f.name, f.lines
            ));
        }
    }
}

/// Whether the doc, attributes and comments right above line `fn_line`
/// (1-based) hold the marker with a reason.
fn long_reason(lines: &[&str], fn_line: u32) -> bool {
    let above = lines[..(fn_line as usize).saturating_sub(1).min(lines.len())]
        .iter()
        .rev();
    for line in above {
        let t = line.trim();
        if let Some(reason) = t.strip_prefix(LONG_FN_MARKER) {
            return reason.trim().len() >= 3;
        }
        let decoration =
            t.starts_with("//") || t.starts_with("#[") || t.starts_with(')') || t.starts_with(']');
        if !decoration {
            return false;
        }
    }
    false
}

fn cycle_text(g: &graph::Graph, set: &[usize]) -> String {
    // One line a pair of files: the first line of the pair and every name.
    let mut pairs: BTreeMap<(usize, usize), (u32, Vec<&str>)> = BTreeMap::new();
    for e in g
        .circle_edges()
        .filter(|e| set.contains(&e.from) && set.contains(&e.to))
    {
        let entry = pairs.entry((e.from, e.to)).or_insert((e.line, Vec::new()));
        entry.0 = entry.0.min(e.line);
        if !entry.1.contains(&e.path.as_str()) {
            entry.1.push(&e.path);
        }
    }
    let mut text = format!("import circle of {} files:", set.len());
    for ((from, to), (line, paths)) in pairs {
        let _ = write!(
            text,
            "\n    {}:{line} -> {}: {}",
            g.files[from],
            g.files[to],
            paths.join(", ")
        );
    }
    text
}

/// Every import of the layered crate checked against the table.
fn layering(tab: &table::Table, g: &graph::Graph, report: &mut Report) {
    let Some(root) = g
        .files
        .iter()
        .position(|f| f == LAYERED_ROOT)
        .and_then(|f| g.module_of[f])
    else {
        report.failures.push(format!("{LAYERED_ROOT}: not found"));
        return;
    };
    let tops: BTreeSet<&str> = g
        .modules
        .iter()
        .filter(|m| m.root == root)
        .filter_map(|m| m.top.as_deref())
        .collect();
    for t in &tops {
        if tab.layer_of(t).is_none() {
            report.failures.push(format!(
                "server/src: module `{t}` has no layer in xtask/src/layers/table.rs"
            ));
        }
    }
    for name in tab.layers.iter().flat_map(|r| r.iter()) {
        if !tops.contains(name) {
            report.failures.push(format!(
                "xtask/src/layers/table.rs: layer names `{name}`, no module of server/src"
            ));
        }
    }
    let mut used = vec![false; tab.allowed.len()];
    for e in g.edges.iter().filter(|e| !e.test) {
        let (Some(from), Some(to)) = (g.module_of[e.from], g.module_of[e.to]) else {
            continue;
        };
        let (from, to) = (&g.modules[from], &g.modules[to]);
        if from.root != root {
            continue;
        }
        // The crate root stands above every layer: nothing is upward from it.
        let Some(from_name) = from.top.as_deref() else {
            continue;
        };
        let Some(lf) = tab.layer_of(from_name) else {
            continue;
        };
        let (lt, to_name) = match to.top.as_deref() {
            // The crate root (`run`, the public face) is on the top layer.
            None => (tab.layers.len() - 1, "the crate root"),
            Some(name) => match tab.layer_of(name) {
                Some(l) => (l, name),
                None => continue,
            },
        };
        if lt <= lf {
            continue;
        }
        let text = format!(
            "{}:{}: {} (layer {} `{from_name}` -> layer {} `{to_name}`)",
            g.files[e.from],
            e.line,
            e.path,
            lf + 1,
            lt + 1,
        );
        match tab
            .allowed
            .iter()
            .position(|a| a.file == g.files[e.from] && a.path == e.path)
        {
            Some(k) => {
                used[k] = true;
                report
                    .allowed
                    .push(format!("{text}: {}", tab.allowed[k].reason));
            }
            None => report.failures.push(format!("upward import {text}")),
        }
    }
    for (a, used) in tab.allowed.iter().zip(used) {
        if !used {
            report.failures.push(format!(
                "xtask/src/layers/table.rs: allows {} in {}, which no longer imports it upward",
                a.path, a.file
            ));
        }
    }
    if tab.allowed.len() > table::MAX_ALLOWED {
        report.failures.push(format!(
            "{} upward imports allowed, over {}",
            tab.allowed.len(),
            table::MAX_ALLOWED
        ));
    }
}

/// ARCHITECTURE.md must carry the same table.
fn doc_matches(tab: &table::Table, doc: &str, failures: &mut Vec<String>) {
    let want: Vec<Vec<String>> = tab
        .layers
        .iter()
        .map(|r| r.iter().map(|s| (*s).to_owned()).collect())
        .collect();
    match table::doc_layers(doc) {
        None => failures.push(format!(
            "ARCHITECTURE.md: no `{}` section",
            table::DOC_HEADING
        )),
        Some(rows) => {
            let sorted = |rows: &[Vec<String>]| -> Vec<Vec<String>> {
                rows.iter()
                    .map(|r| {
                        let mut r = r.clone();
                        r.sort();
                        r
                    })
                    .collect()
            };
            if sorted(&rows) != sorted(&want) {
                failures.push(format!(
                    "ARCHITECTURE.md: its layers (bottom first) {rows:?} differ from xtask/src/layers/table.rs {want:?}"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests;
