//! Every crate's module tree, from the `mod` declarations of its files, and
//! the file-to-file import graph: each path a file writes is resolved to
//! the file that defines what it names, through re-exports (`pub use`) and
//! globs, so an import of `crate::a::Thing` that `a/mod.rs` re-exports from
//! `a/thing.rs` is an arrow to `a/thing.rs`, as a module-graph drawing of
//! names counts it. Paths into other crates are not arrows.

use super::scan::{FileScan, PathRef, UseLeaf};
use std::collections::{BTreeMap, BTreeSet};

/// A module: a file's own or one declared inline in it.
#[derive(Debug)]
pub struct Module {
    pub file: usize,
    scope: usize,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// The first module below the crate root on the way here (`None` for
    /// the root itself): what the layer table names.
    pub top: Option<String>,
    /// The crate root module.
    pub root: usize,
}

/// One import: `from` names `path` (as written, on `line`), defined in `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub line: u32,
    pub path: String,
    pub test: bool,
}

/// The files, their modules and the imports between files.
#[derive(Debug)]
pub struct Graph {
    pub files: Vec<String>,
    pub modules: Vec<Module>,
    /// The module each file is (its scope 0), when a crate reaches it.
    pub module_of: Vec<Option<usize>>,
    pub edges: Vec<Edge>,
    scans: Vec<FileScan>,
}

/// How many re-exports a path is followed through before giving up.
const MAX_HOPS: usize = 8;

impl Graph {
    /// `files[i]` is a path from the workspace root (`/`-separated) and
    /// `scans[i]` what its tokens hold.
    pub fn build(files: Vec<String>, scans: Vec<FileScan>) -> Self {
        let index: BTreeMap<&str, usize> = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.as_str(), i))
            .collect();
        let declared = declarations(&files, &scans, &index);
        let reached: BTreeSet<usize> = declared.values().flatten().map(|d| d.1).collect();
        let mut graph = Graph {
            module_of: vec![None; files.len()],
            files,
            modules: Vec::new(),
            edges: Vec::new(),
            scans,
        };
        for root in 0..graph.files.len() {
            if !reached.contains(&root) {
                graph.add_module(root, 0, None, None, &declared);
            }
        }
        graph.edges = graph.resolve_all();
        graph
    }

    /// Adds the module of `file`'s `scope` and everything below it.
    fn add_module(
        &mut self,
        file: usize,
        scope: usize,
        parent: Option<(usize, String)>,
        top: Option<String>,
        declared: &BTreeMap<(usize, usize), Vec<(String, usize)>>,
    ) -> usize {
        let id = self.modules.len();
        let root = parent.as_ref().map_or(id, |(p, _)| self.modules[*p].root);
        self.modules.push(Module {
            file,
            scope,
            parent: parent.as_ref().map(|(p, _)| *p),
            children: BTreeMap::new(),
            top: top.clone(),
            root,
        });
        if scope == 0 {
            self.module_of[file] = Some(id);
        }
        if let Some((p, name)) = parent {
            self.modules[p].children.insert(name, id);
        }
        let below = |name: &str| top.clone().or_else(|| Some(name.to_owned()));
        let inline: Vec<(usize, String)> = (0..self.scans[file].scopes.len())
            .filter_map(|s| match &self.scans[file].scopes[s].parent {
                Some((p, name)) if *p == scope => Some((s, name.clone())),
                _ => None,
            })
            .collect();
        for (s, name) in inline {
            let t = below(&name);
            self.add_module(file, s, Some((id, name)), t, declared);
        }
        for (name, child) in declared.get(&(file, scope)).cloned().unwrap_or_default() {
            if self.module_of[child].is_none() {
                let t = below(&name);
                self.add_module(child, 0, Some((id, name)), t, declared);
            }
        }
        id
    }

    fn scope(&self, m: usize) -> &super::scan::Scope {
        &self.scans[self.modules[m].file].scopes[self.modules[m].scope]
    }

    /// Every path of every module, resolved to the file defining it.
    fn resolve_all(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        let mut seen = BTreeSet::new();
        for m in 0..self.modules.len() {
            let scope = self.scope(m);
            let refs = scope.uses.iter().map(|u| &u.path).chain(&scope.paths);
            for r in refs {
                let Some(to) = self.target(m, r) else {
                    continue;
                };
                let from = self.modules[m].file;
                let path = r.segs.join("::");
                if to != from && seen.insert((from, to, r.line, path.clone())) {
                    edges.push(Edge {
                        from,
                        to,
                        line: r.line,
                        path,
                        test: r.test,
                    });
                }
            }
        }
        edges
    }

    /// The file defining what `r`, written in module `m`, names.
    fn target(&self, m: usize, r: &PathRef) -> Option<usize> {
        let (start, rest) = self.absolute(m, &r.segs, 0)?;
        let defining = self.walk(start, &rest, 0)?;
        Some(self.modules[defining].file)
    }

    /// Where a path starts (a module) and the segments after that start;
    /// `None` for another crate's path or a local name.
    fn absolute(&self, m: usize, segs: &[String], hops: usize) -> Option<(usize, Vec<String>)> {
        let first = segs.first()?;
        match first.as_str() {
            "crate" => Some((self.modules[m].root, segs[1..].to_vec())),
            "self" => Some((m, segs[1..].to_vec())),
            "super" => {
                let mut at = m;
                let mut k = 0;
                while segs.get(k).map(String::as_str) == Some("super") {
                    at = self.modules[at].parent?;
                    k += 1;
                }
                Some((at, segs[k..].to_vec()))
            }
            name if self.modules[m].children.contains_key(name) => Some((m, segs.to_vec())),
            name if hops < MAX_HOPS => {
                let bound = self.bound(m, name)?;
                let mut whole = bound.path.segs.clone();
                whole.extend_from_slice(&segs[1..]);
                self.absolute(m, &whole, hops + 1)
            }
            _ => None,
        }
    }

    /// The item-level `use` of module `m` binding `name`.
    fn bound(&self, m: usize, name: &str) -> Option<&UseLeaf> {
        self.scope(m).uses.iter().find(|u| {
            u.item_level
                && u.bind.as_deref() == Some(name)
                && u.path.segs.last().map(String::as_str) != Some("self")
        })
    }

    /// From module `m`, follows `segs` down to the module that defines the
    /// item they name (the last module when they name a module).
    fn walk(&self, m: usize, segs: &[String], hops: usize) -> Option<usize> {
        let mut at = m;
        for (k, seg) in segs.iter().enumerate() {
            if let Some(&child) = self.modules[at].children.get(seg) {
                at = child;
                continue;
            }
            let scope = self.scope(at);
            if scope.defs.contains(seg) || hops >= MAX_HOPS {
                return Some(at);
            }
            if let Some(bound) = self.bound(at, seg) {
                let mut whole = bound.path.segs.clone();
                whole.extend_from_slice(&segs[k + 1..]);
                // A name re-exported from another crate is no arrow.
                let (start, rest) = self.absolute(at, &whole, hops + 1)?;
                return self.walk(start, &rest, hops + 1);
            }
            for glob in scope
                .uses
                .iter()
                .filter(|u| u.item_level && u.bind.is_none())
            {
                let Some((start, rest)) = self.absolute(at, &glob.path.segs, hops + 1) else {
                    continue;
                };
                let Some(there) = self.walk(start, &rest, hops + 1) else {
                    continue;
                };
                let provides = self.scope(there).defs.contains(seg)
                    || self.modules[there].children.contains_key(seg)
                    || self.bound(there, seg).is_some();
                if provides {
                    return self.walk(there, &segs[k..], hops + 1);
                }
            }
            return Some(at);
        }
        Some(at)
    }

    /// Whether `e` is a file reading its own enclosing module (`super::`
    /// up to a folder's `mod.rs`, or the crate root): the items of a
    /// module are its children's to use, so such an arrow belongs to the
    /// folder and closes no circle; a folder's `mod.rs` orders its steps.
    pub fn reads_enclosing(&self, e: &Edge) -> bool {
        let Some(mut m) = self.module_of[e.from] else {
            return false;
        };
        while let Some(p) = self.modules[m].parent {
            if self.modules[p].file == e.to {
                return true;
            }
            m = p;
        }
        false
    }

    /// The arrows circles are made of: product code (test-only imports
    /// left out) between files neither of which encloses the other's
    /// reader ([`Self::reads_enclosing`]).
    pub fn circle_edges(&self) -> impl Iterator<Item = &Edge> {
        self.edges
            .iter()
            .filter(|e| !e.test && !self.reads_enclosing(e))
    }

    /// Files in import circles: each strongly connected set of more than
    /// one file over [`Self::circle_edges`], sorted.
    pub fn cycles(&self) -> Vec<Vec<usize>> {
        let mut adj = vec![BTreeSet::new(); self.files.len()];
        for e in self.circle_edges() {
            adj[e.from].insert(e.to);
        }
        let adj: Vec<Vec<usize>> = adj.into_iter().map(|s| s.into_iter().collect()).collect();
        let mut sets = strongly_connected(&adj);
        sets.retain(|s| s.len() > 1);
        for s in &mut sets {
            s.sort_by(|a, b| self.files[*a].cmp(&self.files[*b]));
        }
        sets.sort_by(|a, b| self.files[a[0]].cmp(&self.files[b[0]]));
        sets
    }
}

/// For each `(file, scope)`, the `(name, file)` of the modules its `mod`
/// declarations name, found as rustc finds them: beside a crate root or a
/// `mod.rs`, else in the folder named after the file, inline modules adding
/// folders. A file no other declares is a crate root (or is not compiled).
fn declarations(
    files: &[String],
    scans: &[FileScan],
    index: &BTreeMap<&str, usize>,
) -> BTreeMap<(usize, usize), Vec<(String, usize)>> {
    let mut roots: BTreeSet<usize> = (0..files.len()).collect();
    loop {
        let mut out: BTreeMap<(usize, usize), Vec<(String, usize)>> = BTreeMap::new();
        for (f, scan) in scans.iter().enumerate() {
            let path = &files[f];
            let dir = match path.rsplit_once('/') {
                Some((d, name)) if roots.contains(&f) || name == "mod.rs" => d.to_owned(),
                _ => path.trim_end_matches(".rs").to_owned(),
            };
            for (s, scope) in scan.scopes.iter().enumerate() {
                let mut folder = dir.clone();
                for name in inline_chain(scan, s) {
                    folder = format!("{folder}/{name}");
                }
                for decl in &scope.mods {
                    let flat = format!("{folder}/{}.rs", decl.name);
                    let nested = format!("{folder}/{}/mod.rs", decl.name);
                    if let Some(&child) = index
                        .get(flat.as_str())
                        .or_else(|| index.get(nested.as_str()))
                    {
                        out.entry((f, s))
                            .or_default()
                            .push((decl.name.clone(), child));
                    }
                }
            }
        }
        let reached: BTreeSet<usize> = out.values().flatten().map(|d| d.1).collect();
        let next: BTreeSet<usize> = (0..files.len()).filter(|f| !reached.contains(f)).collect();
        if next == roots {
            return out;
        }
        roots = next;
    }
}

/// The names of the inline modules enclosing scope `s`, outermost first.
fn inline_chain(scan: &FileScan, mut s: usize) -> Vec<String> {
    let mut names = Vec::new();
    while let Some((p, name)) = &scan.scopes[s].parent {
        names.push(name.clone());
        s = *p;
    }
    names.reverse();
    names
}

/// Tarjan's strongly connected components of `adj`.
fn strongly_connected(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(st: &mut State<'_>, v: usize) {
        st.index[v] = Some(st.next);
        st.low[v] = st.next;
        st.next += 1;
        st.stack.push(v);
        st.on_stack[v] = true;
        for &w in &st.adj[v] {
            match st.index[w] {
                None => {
                    visit(st, w);
                    st.low[v] = st.low[v].min(st.low[w]);
                }
                Some(iw) if st.on_stack[w] => st.low[v] = st.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(st.low[v]) == st.index[v] {
            let mut set = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            st.out.push(set);
        }
    }
    let n = adj.len();
    let mut st = State {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if st.index[v].is_none() {
            visit(&mut st, v);
        }
    }
    st.out
}

#[cfg(test)]
mod tests {
    use super::super::{lex::lex, scan::scan};
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        let names = files.iter().map(|(n, _)| (*n).to_owned()).collect();
        let scans = files.iter().map(|(_, src)| scan(&lex(src))).collect();
        Graph::build(names, scans)
    }

    fn arrows(g: &Graph) -> Vec<String> {
        g.edges
            .iter()
            .map(|e| format!("{} -> {} ({})", g.files[e.from], g.files[e.to], e.path))
            .collect()
    }

    #[test]
    fn resolves_paths_through_reexports() {
        let g = graph(&[
            ("src/lib.rs", "mod a; mod b; pub use b::Thing;"),
            ("src/a.rs", "use crate::b::{Thing, inner::Deep}; use crate::Thing as T; fn f() { crate::b::g(); }"),
            ("src/b/mod.rs", "pub mod inner; mod thing; pub use thing::Thing; pub fn g() {}"),
            ("src/b/inner.rs", "pub struct Deep;"),
            ("src/b/thing.rs", "pub struct Thing; use std::fmt;"),
        ]);
        assert_eq!(
            arrows(&g),
            [
                "src/lib.rs -> src/b/thing.rs (b::Thing)",
                "src/a.rs -> src/b/thing.rs (crate::b::Thing)",
                "src/a.rs -> src/b/inner.rs (crate::b::inner::Deep)",
                "src/a.rs -> src/b/thing.rs (crate::Thing)",
                "src/a.rs -> src/b/mod.rs (crate::b::g)",
                "src/b/mod.rs -> src/b/thing.rs (thing::Thing)",
            ]
        );
        assert_eq!(g.modules[g.module_of[4].unwrap()].top.as_deref(), Some("b"));
        assert!(g.cycles().is_empty());
    }

    #[test]
    fn globs_super_and_inline_modules() {
        let g = graph(&[
            ("src/main.rs", "mod x; mod y;"),
            (
                "src/x.rs",
                "mod deep { pub fn d() { super::super::y::q(); } } pub use self::deep::*;",
            ),
            ("src/y.rs", "pub fn q() { crate::x::d(); }"),
        ]);
        assert_eq!(
            arrows(&g),
            [
                "src/x.rs -> src/y.rs (super::super::y::q)",
                "src/y.rs -> src/x.rs (crate::x::d)"
            ]
        );
        let cycles = g.cycles();
        assert_eq!(cycles, [vec![1, 2]]);
    }

    #[test]
    fn other_crates_and_test_code_are_left_out() {
        let g = graph(&[
            ("a/src/lib.rs", "mod m; mod n; pub use ext::conditional;"),
            (
                "a/src/m.rs",
                "use crate::conditional::Range; use crate::n::N; use anyhow::Result;",
            ),
            (
                "a/src/n.rs",
                "pub struct N; #[cfg(test)] mod tests { use crate::m::X; }",
            ),
            ("b/src/lib.rs", "mod m;"),
            ("b/src/m.rs", "use a::m::X;"),
        ]);
        assert_eq!(
            arrows(&g),
            [
                "a/src/m.rs -> a/src/n.rs (crate::n::N)",
                "a/src/n.rs -> a/src/m.rs (crate::m::X)"
            ]
        );
        assert!(g.edges[1].test);
        assert!(g.cycles().is_empty(), "a test-only import closes no circle");
    }

    #[test]
    fn a_file_reading_its_own_module_closes_no_circle() {
        let g = graph(&[
            ("src/lib.rs", "mod f; pub struct Root;"),
            (
                "src/f/mod.rs",
                "mod a; mod b; pub struct Shared; fn go() { a::run(); }",
            ),
            (
                "src/f/a.rs",
                "use super::Shared; use crate::Root; pub fn run() { super::b::step(); }",
            ),
            ("src/f/b.rs", "pub fn step() { crate::f::a::run(); }"),
        ]);
        let cycles: Vec<Vec<&str>> = g
            .cycles()
            .iter()
            .map(|c| c.iter().map(|f| g.files[*f].as_str()).collect())
            .collect();
        assert_eq!(
            cycles,
            [vec!["src/f/a.rs", "src/f/b.rs"]],
            "only the siblings' circle"
        );
    }
}
