//! Checked-out trees compared entry by entry: what two ways of getting the
//! same commit onto a node (ostree-ext's importer, stock `ostree pull`)
//! must agree on. Every path, its type, mode (setuid and friends
//! included), uid, gid, content, symlink target and xattrs. And a commit's
//! closure, the objects a node needs for it.

use crate::files::{kind_name, walk_tree};
use crate::objects::{ObjectSet, CONTENT};
use crate::ostree::Ostree;
use anyhow::{ensure, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bound on one entry's xattr names and on one xattr value.
const MAX_XATTR_BYTES: usize = 64 * 1024;
/// Differences shown in a report.
const MAX_REPORTED: usize = 30;

/// One entry of a checked-out tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `dir`, `file`, `symlink` or `other`.
    pub kind: &'static str,
    /// Permission bits, setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// SHA-256 of a regular file's content.
    pub sha256: Option<String>,
    /// A symlink's target.
    pub target: Option<PathBuf>,
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

/// Relative path (`.` for the root) to entry.
pub type Listing = BTreeMap<String, Entry>;

/// `ostree checkout COMMIT DEST` (as root: ownership, modes and xattrs
/// applied, whatever the repo's mode).
pub fn checkout(repo: &Ostree, commit: &str, dest: &Path) -> Result<()> {
    repo.run(["checkout".as_ref(), commit.as_ref(), dest.as_os_str()])
        .map(drop)
        .with_context(|| format!("checking out {commit} of {}", repo.repo.display()))
}

/// Lists the tree at `root`, never following symlinks.
pub fn listing(root: &Path) -> Result<Listing> {
    walk_tree(root, entry)
}

fn entry(p: &Path, m: &std::fs::Metadata) -> Result<Entry> {
    let ft = m.file_type();
    let sha256 = if ft.is_file() {
        let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", p.display()))?;
        Some(hex::encode(h.finalize()))
    } else {
        None
    };
    let target = if ft.is_symlink() {
        Some(std::fs::read_link(p).with_context(|| format!("readlink {}", p.display()))?)
    } else {
        None
    };
    Ok(Entry {
        kind: kind_name(ft),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        sha256,
        target,
        xattrs: xattrs(p)?,
    })
}

/// The xattrs of `p` itself (not of a symlink's target).
fn xattrs(p: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut names = vec![0u8; MAX_XATTR_BYTES];
    let n = rustix::fs::llistxattr(p, &mut names)
        .with_context(|| format!("listing xattrs of {}", p.display()))?;
    let mut out = BTreeMap::new();
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        let mut value = vec![0u8; MAX_XATTR_BYTES];
        let len = rustix::fs::lgetxattr(p, name.as_str(), &mut value)
            .with_context(|| format!("reading xattr {name} of {}", p.display()))?;
        value.truncate(len);
        out.insert(name, value);
    }
    Ok(out)
}

/// Every difference between two listings, named `a` and `b` in the
/// report; empty if they are identical.
pub fn listing_diff(a: &Listing, b: &Listing, a_name: &str, b_name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (path, ea) in a {
        match b.get(path) {
            None => out.push(format!("{path}: only in {a_name}")),
            Some(eb) if eb != ea => {
                out.push(format!("{path}:\n  {a_name}: {ea:?}\n  {b_name}: {eb:?}"))
            }
            Some(_) => {}
        }
    }
    out.extend(
        b.keys()
            .filter(|p| !a.contains_key(*p))
            .map(|p| format!("{p}: only in {b_name}")),
    );
    out
}

/// Asserts two listings are identical, reporting the first differences.
pub fn assert_same_listing(a: &Listing, b: &Listing, a_name: &str, b_name: &str) {
    let diff = listing_diff(a, b, a_name, b_name);
    assert!(
        diff.is_empty(),
        "{} differences between {a_name} and {b_name}, first ones:\n{}",
        diff.len(),
        diff.iter()
            .take(MAX_REPORTED)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every object `commit` reaches (itself, dirtrees, dirmetas, content), as
/// `ostree ls -R -C` lists them in `repo`.
pub fn commit_closure(repo: &Ostree, commit: &str) -> Result<ObjectSet> {
    let ls = repo.run(["ls", "-R", "-C", commit])?;
    let mut set = parse_ls_checksums(&ls)?;
    set.0
        .entry("commit".into())
        .or_default()
        .insert(commit.to_owned());
    Ok(set)
}

/// The objects named in `ostree ls -R -C` output: directories name their
/// dirtree then dirmeta, files and symlinks their content object.
pub fn parse_ls_checksums(ls: &str) -> Result<ObjectSet> {
    let mut set = ObjectSet::default();
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    for line in ls.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        ensure!(
            f.len() >= 6 && hex(f[4]),
            "unexpected `ostree ls -C` line {line:?}"
        );
        if line.starts_with('d') {
            ensure!(hex(f[5]), "directory without dirmeta: {line:?}");
            set.0
                .entry("dirtree".into())
                .or_default()
                .insert(f[4].to_owned());
            set.0
                .entry("dirmeta".into())
                .or_default()
                .insert(f[5].to_owned());
        } else {
            set.0
                .entry(CONTENT.into())
                .or_default()
                .insert(f[4].to_owned());
        }
    }
    Ok(set)
}

/// What `a` has and `b` lacks, kind by kind.
pub fn object_difference(a: &ObjectSet, b: &ObjectSet) -> ObjectSet {
    let mut out = ObjectSet::default();
    for (kind, set) in &a.0 {
        let missing: std::collections::BTreeSet<String> =
            set.difference(&b.get(kind)).cloned().collect();
        if !missing.is_empty() {
            out.0.insert(kind.clone(), missing);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls_checksums_and_differences() {
        let (t, m, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let ls = format!(
            "d00755 0 0      0 {t} {m} /\n-00644 0 0   12 {c} /x\nl00777 0 0 0 {c} /l -> x\n"
        );
        let set = parse_ls_checksums(&ls).unwrap();
        assert_eq!(set.len(), 3);
        assert!(set.contains("dirtree", &t) && set.contains("dirmeta", &m));
        assert!(set.contains(CONTENT, &c));
        for bad in ["d00755 0 0 0 xyz /", "-00644 0 0 12"] {
            assert!(parse_ls_checksums(bad).is_err(), "{bad}");
        }
        let mut other = ObjectSet::default();
        other.0.entry(CONTENT.into()).or_default().insert(c.clone());
        let d = object_difference(&set, &other);
        assert_eq!(d.len(), 2);
        assert!(!d.contains(CONTENT, &c));
        assert!(object_difference(&other, &set).is_empty());
    }

    /// Each kind of difference is found, and identical trees give none.
    #[test]
    fn listings_differ_in_every_attribute() {
        let tmp = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let root = tmp.path().join(name);
            std::fs::create_dir_all(root.join("d")).unwrap();
            std::fs::write(root.join("d/f"), b"content").unwrap();
            std::os::unix::fs::symlink("f", root.join("d/l")).unwrap();
            root
        };
        let base = listing(&make("base")).unwrap();
        assert_eq!(base.len(), 4);
        type Change = fn(&Path);
        let cases: &[(&str, Change, &str)] = &[
            ("same", |_| {}, ""),
            (
                "content",
                |r| std::fs::write(r.join("d/f"), b"other").unwrap(),
                "d/f",
            ),
            (
                "mode",
                |r| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(r.join("d/f"), std::fs::Permissions::from_mode(0o4755))
                        .unwrap()
                },
                "d/f",
            ),
            (
                "target",
                |r| {
                    std::fs::remove_file(r.join("d/l")).unwrap();
                    std::os::unix::fs::symlink("g", r.join("d/l")).unwrap()
                },
                "d/l",
            ),
            (
                "xattr",
                |r| {
                    rustix::fs::setxattr(
                        r.join("d"),
                        "user.k",
                        b"v",
                        rustix::fs::XattrFlags::empty(),
                    )
                    .unwrap()
                },
                "d",
            ),
            (
                "owner",
                |r| {
                    rustix::fs::chownat(
                        rustix::fs::CWD,
                        r.join("d/f"),
                        Some(rustix::process::Uid::from_raw(1)),
                        None,
                        rustix::fs::AtFlags::empty(),
                    )
                    .unwrap()
                },
                "d/f",
            ),
            (
                "extra",
                |r| std::fs::write(r.join("d/new"), b"").unwrap(),
                "d/new: only in changed",
            ),
        ];
        for (what, change, want) in cases {
            let root = make(what);
            change(&root);
            let diff = listing_diff(&base, &listing(&root).unwrap(), "base", "changed");
            if want.is_empty() {
                assert!(diff.is_empty(), "{what}: {diff:?}");
            } else {
                assert_eq!(diff.len(), 1, "{what}: {diff:?}");
                assert!(diff[0].starts_with(want), "{what}: {diff:?}");
            }
        }
    }
}
