//! One file's tokens to what the module graph is made of: its modules
//! (the file's own and those declared inline), the `mod` declarations that
//! name other files, every `use` leaf and every path expression with its
//! line, the names each module defines, and the extent of every function.
//! Paths are kept as written (`crate`, `super`, `self` or a bare first
//! segment); `graph` resolves them.

use super::lex::{Kind, Token};
use std::collections::BTreeSet;

/// A path as written, one segment a string, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRef {
    pub segs: Vec<String>,
    pub line: u32,
    /// Under `#[cfg(test)]`: not part of the module graph the product builds.
    pub test: bool,
}

/// One leaf of a `use` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseLeaf {
    pub path: PathRef,
    /// The name it binds (`as` honoured); `None` for a glob.
    pub bind: Option<String>,
    /// Written at the module's own level (not inside a function or block),
    /// so it names something for other modules' paths too.
    pub item_level: bool,
}

/// `mod name;`: a module in a file of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModDecl {
    pub name: String,
    pub test: bool,
}

/// A module of this file: the file's own (index 0) or an inline `mod x {}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// `(parent scope, name)`; `None` for the file's own module.
    pub parent: Option<(usize, String)>,
    pub test: bool,
    pub mods: Vec<ModDecl>,
    pub uses: Vec<UseLeaf>,
    pub paths: Vec<PathRef>,
    pub defs: BTreeSet<String>,
}

/// A function with a body: its name, the line of `fn` and how many lines
/// of code (not blank, not only a comment) it spans to its closing brace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSpan {
    pub name: String,
    pub line: u32,
    pub lines: u32,
}

/// What `graph` and the length check need of one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileScan {
    pub scopes: Vec<Scope>,
    pub fns: Vec<FnSpan>,
}

/// Item keywords whose next identifier is a name the module defines.
const DEFINING: &[&str] = &[
    "fn", "struct", "enum", "trait", "type", "const", "static", "union",
];

/// Scans one file's tokens.
pub fn scan(toks: &[Token<'_>]) -> FileScan {
    let test = test_mask(toks);
    let mut scopes = vec![Scope::default()];
    // (scope, brace depth just outside its block); the file's own is -1.
    let mut stack: Vec<(usize, i64)> = vec![(0, -1)];
    let mut depth: i64 = 0;
    let mut i = 0;
    while i < toks.len() {
        let (scope, outer) = *stack.last().unwrap_or(&(0, -1));
        let item_level = depth == outer + 1;
        match toks[i].kind {
            Kind::Punct('{') => depth += 1,
            Kind::Punct('}') => {
                depth -= 1;
                if depth == outer && stack.len() > 1 {
                    stack.pop();
                }
            }
            Kind::Ident("mod") => {
                if let (Some(name), Some(next)) = (ident(toks, i + 1), toks.get(i + 2)) {
                    if next.kind == Kind::Punct(';') {
                        scopes[scope].mods.push(ModDecl {
                            name: name.to_owned(),
                            test: test[i],
                        });
                    } else if next.kind == Kind::Punct('{') {
                        scopes.push(Scope {
                            parent: Some((scope, name.to_owned())),
                            test: test[i] || scopes[scope].test,
                            ..Scope::default()
                        });
                        stack.push((scopes.len() - 1, depth));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
            }
            Kind::Ident("use") if toks.get(i + 1).map(|t| t.kind) != Some(Kind::Punct('<')) => {
                let mut leaves = Vec::new();
                let mut j = i + 1;
                use_tree(toks, &mut j, Vec::new(), &mut leaves);
                let in_test = test[i] || scopes[scope].test;
                for (segs, bind) in leaves {
                    scopes[scope].uses.push(UseLeaf {
                        path: PathRef {
                            segs,
                            line: toks[i].line,
                            test: in_test,
                        },
                        bind,
                        item_level,
                    });
                }
                i = j.max(i + 1);
                continue;
            }
            Kind::Ident("macro_rules") if item_level => {
                if let Some(name) = ident(toks, i + 2) {
                    scopes[scope].defs.insert(name.to_owned());
                }
            }
            Kind::Ident(kw) if item_level && DEFINING.contains(&kw) => {
                if let Some(name) = ident(toks, i + 1).filter(|n| !DEFINING.contains(n)) {
                    scopes[scope].defs.insert(name.to_owned());
                }
            }
            Kind::Ident(first) if starts_path(toks, i) => {
                let (segs, end) = path_at(toks, i, first);
                let in_test = test[i] || scopes[scope].test;
                scopes[scope].paths.push(PathRef {
                    segs,
                    line: toks[i].line,
                    test: in_test,
                });
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    FileScan {
        scopes,
        fns: fn_spans(toks),
    }
}

fn ident<'a>(toks: &[Token<'a>], i: usize) -> Option<&'a str> {
    match toks.get(i)?.kind {
        Kind::Ident(s) => Some(s),
        _ => None,
    }
}

/// An identifier followed by `::` and not itself after one: a path's start.
fn starts_path(toks: &[Token<'_>], i: usize) -> bool {
    let next = toks.get(i + 1).map(|t| t.kind);
    let prev = i.checked_sub(1).map(|p| toks[p].kind);
    next == Some(Kind::PathSep) && prev != Some(Kind::PathSep)
}

/// The identifiers of the path starting at `i`, and the index after it.
fn path_at(toks: &[Token<'_>], i: usize, first: &str) -> (Vec<String>, usize) {
    let mut segs = vec![first.to_owned()];
    let mut j = i + 1;
    while toks.get(j).map(|t| t.kind) == Some(Kind::PathSep) {
        match ident(toks, j + 1) {
            Some(s) => {
                segs.push(s.to_owned());
                j += 2;
            }
            None => break,
        }
    }
    (segs, j)
}

/// Flattens one `use` tree from `*i` into `(path, bound name)` leaves,
/// leaving `*i` past what it read (past the `;` at the top level).
fn use_tree(
    toks: &[Token<'_>],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut segs = prefix;
    if toks.get(*i).map(|t| t.kind) == Some(Kind::PathSep) {
        *i += 1;
    }
    while let Some(tok) = toks.get(*i) {
        match tok.kind {
            Kind::Ident(s) => {
                segs.push(s.to_owned());
                *i += 1;
                if toks.get(*i).map(|t| t.kind) == Some(Kind::PathSep) {
                    *i += 1;
                    continue;
                }
                if s == "self" {
                    segs.pop();
                }
                let mut bind = segs.last().cloned();
                if ident(toks, *i) == Some("as") {
                    bind = ident(toks, *i + 1).map(str::to_owned);
                    *i += 2;
                }
                out.push((segs, bind));
                break;
            }
            Kind::Punct('*') => {
                *i += 1;
                out.push((segs, None));
                break;
            }
            Kind::Punct('{') => {
                *i += 1;
                while let Some(tok) = toks.get(*i) {
                    match tok.kind {
                        Kind::Punct('}') => {
                            *i += 1;
                            break;
                        }
                        Kind::Punct(',') => *i += 1,
                        _ => {
                            let before = *i;
                            use_tree(toks, i, segs.clone(), out);
                            if *i == before {
                                // Not a tree: give up on this group.
                                *i += 1;
                            }
                        }
                    }
                }
                break;
            }
            _ => break,
        }
    }
    // Only the whole tree ends in `;` (a group holds none).
    if toks.get(*i).map(|t| t.kind) == Some(Kind::Punct(';')) {
        *i += 1;
    }
}

/// For each token, whether it belongs to an item under `#[cfg(test)]`
/// (or `#[cfg(all(test, …))]`; `not(test)` and `any(test, …)` are not
/// test code).
fn test_mask(toks: &[Token<'_>]) -> Vec<bool> {
    let mut mask = vec![false; toks.len()];
    let mut i = 0;
    while i < toks.len() {
        if let Some(after) = cfg_test_attr(toks, i) {
            let end = item_end(toks, after);
            for m in &mut mask[i..end] {
                *m = true;
            }
            i = end;
        } else {
            i += 1;
        }
    }
    mask
}

/// At `#[cfg(…test…)]`, the index after its `]`.
fn cfg_test_attr(toks: &[Token<'_>], i: usize) -> Option<usize> {
    if toks.get(i)?.kind != Kind::Punct('#')
        || toks.get(i + 1)?.kind != Kind::Punct('[')
        || ident(toks, i + 2)? != "cfg"
    {
        return None;
    }
    let end = matching(toks, i + 1)?;
    // `(test)`, or `(all(…test…))` without a `not`: `any(test, …)` is
    // product code too.
    let words: Vec<&str> = toks[i + 3..end]
        .iter()
        .filter_map(|t| match t.kind {
            Kind::Ident(w) => Some(w),
            _ => None,
        })
        .collect();
    let test = words == ["test"]
        || (words.first() == Some(&"all") && words.contains(&"test") && !words.contains(&"not"));
    test.then_some(end + 1)
}

/// The index after the item starting at `i`: its `;` or its block's `}`
/// at nesting depth 0.
fn item_end(toks: &[Token<'_>], i: usize) -> usize {
    let mut depth = 0i64;
    let mut j = i;
    while j < toks.len() {
        match toks[j].kind {
            Kind::Punct('(' | '[') => depth += 1,
            Kind::Punct(')' | ']') => depth -= 1,
            Kind::Punct('{') if depth == 0 => {
                return matching(toks, j).map_or(toks.len(), |e| e + 1)
            }
            Kind::Punct(';') if depth == 0 => return j + 1,
            _ => {}
        }
        j += 1;
    }
    toks.len()
}

/// The index of the bracket closing the one at `open` (`(`, `[` or `{`).
fn matching(toks: &[Token<'_>], open: usize) -> Option<usize> {
    let (o, c) = match toks.get(open)?.kind {
        Kind::Punct('(') => ('(', ')'),
        Kind::Punct('[') => ('[', ']'),
        Kind::Punct('{') => ('{', '}'),
        _ => return None,
    };
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(open) {
        if t.kind == Kind::Punct(o) {
            depth += 1;
        } else if t.kind == Kind::Punct(c) {
            depth -= 1;
            if depth == 0 {
                return Some(j);
            }
        }
    }
    None
}

/// Lines on which a token starts: blank and comment-only lines are not
/// code (as clippy's `too_many_lines` counts).
fn code_lines(toks: &[Token<'_>]) -> u32 {
    let mut n = 0;
    let mut last = 0;
    for t in toks {
        if t.line != last {
            n += 1;
            last = t.line;
        }
    }
    n
}

/// Every `fn name … { … }`: declarations without a body (`;`) and `fn`
/// pointer types (no name) are not functions here.
fn fn_spans(toks: &[Token<'_>]) -> Vec<FnSpan> {
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t.kind != Kind::Ident("fn") {
            continue;
        }
        let Some(name) = ident(toks, i + 1) else {
            continue;
        };
        let mut depth = 0i64;
        for j in i + 2..toks.len() {
            match toks[j].kind {
                Kind::Punct('(' | '[') => depth += 1,
                Kind::Punct(')' | ']') => depth -= 1,
                Kind::Punct(';') if depth == 0 => break,
                Kind::Punct('{') if depth == 0 => {
                    if let Some(end) = matching(toks, j) {
                        out.push(FnSpan {
                            name: name.to_owned(),
                            line: t.line,
                            lines: code_lines(&toks[i..=end]),
                        });
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::lex::lex;
    use super::*;

    fn uses(src: &str) -> Vec<String> {
        let toks = lex(src);
        let scan = scan(&toks);
        scan.scopes
            .iter()
            .flat_map(|s| &s.uses)
            .map(|u| {
                let bind = u.bind.as_deref().unwrap_or("*");
                format!("{}={bind}", u.path.segs.join("::"))
            })
            .collect()
    }

    #[test]
    fn flattens_use_trees() {
        let cases: &[(&str, &[&str])] = &[
            ("use crate::a::B;", &["crate::a::B=B"]),
            ("pub(crate) use crate::a::B as C;", &["crate::a::B=C"]),
            (
                "use crate::{a, b::{c, D as E}, f::*};",
                &["crate::a=a", "crate::b::c=c", "crate::b::D=E", "crate::f=*"],
            ),
            ("use super::x::{self, Y};", &["super::x=x", "super::x::Y=Y"]),
            ("use ::std::fmt;", &["std::fmt=fmt"]),
            ("use a::b; use c::d;", &["a::b=b", "c::d=d"]),
            ("fn f() -> impl Sized + use<'a> {}", &[]),
        ];
        for (src, want) in cases {
            assert_eq!(uses(src), *want, "{src}");
        }
    }

    #[test]
    fn finds_paths_outside_use() {
        let toks = lex("fn f() { crate::a::b(x::y::Z); self::q::<u8>(); }");
        let scan = scan(&toks);
        let paths: Vec<String> = scan.scopes[0]
            .paths
            .iter()
            .map(|p| p.segs.join("::"))
            .collect();
        assert_eq!(paths, ["crate::a::b", "x::y::Z", "self::q"]);
    }

    #[test]
    fn inline_modules_and_test_code() {
        let src = "mod a;\n#[cfg(test)]\nmod t;\npub mod inner { use crate::x::Y; fn g() {} }\n\
                   #[cfg(test)]\nmod tests { use crate::z::W; }\n#[cfg(not(test))] use crate::k::L;\n#[cfg(any(test, unix))] use crate::k::M;";
        let toks = lex(src);
        let scan = scan(&toks);
        let decls: Vec<(&str, bool)> = scan.scopes[0]
            .mods
            .iter()
            .map(|m| (m.name.as_str(), m.test))
            .collect();
        assert_eq!(decls, [("a", false), ("t", true)]);
        assert_eq!(scan.scopes.len(), 3);
        assert_eq!(scan.scopes[1].parent, Some((0, "inner".to_owned())));
        assert!(scan.scopes[1].defs.contains("g"));
        assert!(!scan.scopes[0].defs.contains("g"));
        assert!(!scan.scopes[1].test && scan.scopes[2].test);
        assert!(scan.scopes[2].uses[0].path.test);
        assert!(
            !scan.scopes[0].uses[0].path.test,
            "not(test) is product code"
        );
        assert!(!scan.scopes[0].uses[1].path.test, "so is any(test, …)");
    }

    #[test]
    fn measures_functions() {
        let src = "fn a() {\n  let s = \"}\";\n}\ntrait T { fn decl(&self); }\n\
                   fn b<F: Fn() -> u8>(f: F) -> [u8; 2]\nwhere F: Copy\n{\n\n  // a comment\n  [0; 2]\n}\nstatic P: fn() = a;";
        let toks = lex(src);
        let spans: Vec<(String, u32, u32)> = scan(&toks)
            .fns
            .into_iter()
            .map(|f| (f.name, f.line, f.lines))
            .collect();
        assert_eq!(spans, [("a".to_owned(), 1, 3), ("b".to_owned(), 5, 5)]);
    }
}
