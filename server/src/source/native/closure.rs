//! The last check before a native image is staged: the label's commit and
//! everything it reaches (every dirtree, dirmeta and content object) are
//! in the staged repo. Each got there only after it was verified, so a
//! complete closure is a verified one.

use super::objects::{max_metadata_size, Objects, WriteError};
use oscontent_format::{self as format, Checksum, Commit, ObjectKind, ObjectName};
use std::collections::HashSet;

/// How far the walk got, for the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Closure {
    pub dirtrees: u64,
    pub dirmetas: u64,
    pub files: u64,
}

/// Why the closure is not complete: the object at fault (`HEX.ext`) and
/// the reason, or an I/O failure.
#[derive(Debug)]
pub enum ClosureError {
    Object { object: String, reason: String },
    Write(WriteError),
}

fn object(name: &ObjectName, reason: String) -> ClosureError {
    ClosureError::Object {
        object: format!("{}.{}", name.checksum, bare_extension(name.kind)),
        reason,
    }
}

/// The extension as the image names it (`.file`, not the archive `.filez`).
pub fn bare_extension(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::File => "file",
        k => k.extension(),
    }
}

/// Reads a metadata object the closure needs; absent is an error naming
/// where the commit reaches it.
fn need(objects: &Objects, name: &ObjectName, at: &str) -> Result<Vec<u8>, ClosureError> {
    match objects.read(name, max_metadata_size(name.kind)) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(object(name, missing(at))),
        Err(WriteError::Bad(why)) => Err(object(name, why)),
        Err(e) => Err(ClosureError::Write(e)),
    }
}

fn missing(at: &str) -> String {
    format!("missing: the commit reaches it at {at:?}, but no ostree layer of the image carries it")
}

/// Walks the commit's tree. `max_depth` bounds the directory nesting.
pub fn check(
    objects: &Objects,
    commit: &Checksum,
    max_depth: usize,
) -> Result<Closure, ClosureError> {
    let name = ObjectName::new(*commit, ObjectKind::Commit);
    let bytes = need(objects, &name, "/")?;
    let c = Commit::parse(&bytes).map_err(|e| object(&name, e.to_string()))?;
    let mut out = Closure::default();
    let mut seen_trees = HashSet::new();
    let mut seen_metas = HashSet::new();
    // (dirtree, dirmeta, path, depth): one entry per directory still to
    // walk; each dirtree is walked once however often it is shared.
    let mut stack = vec![(c.root_tree, c.root_meta, "/".to_owned(), 0usize)];
    while let Some((tree, meta, path, depth)) = stack.pop() {
        if seen_metas.insert(meta) {
            let m = ObjectName::new(meta, ObjectKind::DirMeta);
            need(objects, &m, &path)?;
            out.dirmetas += 1;
        }
        if !seen_trees.insert(tree) {
            continue;
        }
        if depth > max_depth {
            let t = ObjectName::new(tree, ObjectKind::DirTree);
            return Err(object(
                &t,
                format!("{path:?} is nested deeper than {max_depth} directories"),
            ));
        }
        let t = ObjectName::new(tree, ObjectKind::DirTree);
        let dt = format::parse_dirtree(&need(objects, &t, &path)?)
            .map_err(|e| object(&t, e.to_string()))?;
        out.dirtrees += 1;
        for (file, checksum) in &dt.files {
            let f = ObjectName::new(*checksum, ObjectKind::File);
            match objects.has(&f) {
                Ok(true) => out.files += 1,
                Ok(false) => return Err(object(&f, missing(&join(&path, file)))),
                Err(e) => return Err(ClosureError::Write(e)),
            }
        }
        for (dir, sub_tree, sub_meta) in &dt.dirs {
            stack.push((*sub_tree, *sub_meta, join(&path, dir), depth + 1));
        }
    }
    Ok(out)
}

/// `name` in directory `dir` (`/` for the root), as errors show paths.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}
