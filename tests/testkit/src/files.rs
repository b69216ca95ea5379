//! Copies, snapshots and planted secrets: what a test checks a server never
//! wrote or leaked.

use crate::process::check_output;
use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Bytes planted in files outside served repos; no response may contain them.
pub const SECRET_MARKER: &str = "OSCONTENT-E2E-SECRET-d0d1d2d3";

/// `cp -a SRC DST` (DST must not exist). Use it before planting anything in
/// a fixture repo: the shared fixtures are read-only.
pub fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    ensure!(!dst.exists(), "{} already exists", dst.display());
    check_output(
        Command::new("cp")
            .arg("-a")
            .arg("--reflink=auto")
            .arg(src)
            .arg(dst),
        Duration::from_secs(300),
    )?;
    Ok(())
}

/// Bound on the entries of one walked tree (the full fixtures have ~35,000).
const MAX_WALK_ENTRIES: usize = 1_000_000;

/// `dir`, `file`, `symlink` or `other`.
pub fn kind_name(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "other"
    }
}

/// Every entry under `root` (the root itself as `.`), keyed by relative
/// path, described by `describe(path, metadata)`. Symlinks are described,
/// never followed; at most a million entries.
pub fn walk_tree<V>(
    root: &Path,
    mut describe: impl FnMut(&Path, &std::fs::Metadata) -> Result<V>,
) -> Result<BTreeMap<String, V>> {
    let mut out = BTreeMap::new();
    let top =
        std::fs::symlink_metadata(root).with_context(|| format!("stat {}", root.display()))?;
    out.insert(".".into(), describe(root, &top)?);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let m =
                std::fs::symlink_metadata(&p).with_context(|| format!("stat {}", p.display()))?;
            if m.is_dir() {
                stack.push(r.clone());
            }
            out.insert(r.display().to_string(), describe(&p, &m)?);
            ensure!(
                out.len() <= MAX_WALK_ENTRIES,
                "{} has more than {MAX_WALK_ENTRIES} entries",
                root.display()
            );
        }
    }
    Ok(out)
}

/// A recursive listing of a tree with everything a write would change:
/// type, mode, size, mtime, ctime, inode and symlink target. Symlinks are
/// listed, never followed.
pub type Snapshot = BTreeMap<String, String>;

pub fn snapshot(root: &Path) -> Result<Snapshot> {
    walk_tree(root, |p, m| {
        let ft = m.file_type();
        let target = if ft.is_symlink() {
            std::fs::read_link(p)
                .map(|t| t.display().to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(format!(
            "{} mode={:o} size={} mtime={}.{:09} ctime={}.{:09} ino={} {target}",
            kind_name(ft),
            m.mode(),
            if ft.is_dir() { 0 } else { m.len() },
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.ino()
        ))
    })
}

/// Differences between two snapshots, for assertion messages ("" if none).
pub fn snapshot_diff(before: &Snapshot, after: &Snapshot) -> String {
    let mut lines = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => lines.push(format!("- removed {k}: {v}")),
            Some(w) if w != v => {
                lines.push(format!("~ changed {k}:\n    before {v}\n    after  {w}"))
            }
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            lines.push(format!("+ added {k}: {v}"));
        }
    }
    let n = lines.len();
    lines.truncate(30);
    if n > 30 {
        lines.push(format!("... and {} more", n - 30));
    }
    lines.join("\n")
}

/// Asserts that nothing under `root` changed since `before`.
pub fn assert_unchanged(root: &Path, before: &Snapshot, what: &str) {
    let after = snapshot(root).unwrap_or_else(|e| panic!("{e:#}"));
    let diff = snapshot_diff(before, &after);
    assert!(
        diff.is_empty(),
        "{what}: {} was written:\n{diff}",
        root.display()
    );
}

/// Writes a file outside any served tree with the secret marker in it.
pub fn plant_secret(path: &Path) -> Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(path, format!("root:x:0:0:{SECRET_MARKER}:/root:/bin/sh\n"))?;
    Ok(())
}

/// Whether `haystack` contains a secret: the marker, or bytes of the host's
/// `/etc/passwd`.
pub fn leaks_secret(haystack: &[u8]) -> bool {
    fn contains(h: &[u8], n: &[u8]) -> bool {
        !n.is_empty() && h.windows(n.len()).any(|w| w == n)
    }
    if contains(haystack, SECRET_MARKER.as_bytes()) || contains(haystack, b"root:x:0:0") {
        return true;
    }
    if let Ok(passwd) = std::fs::read("/etc/passwd") {
        if let Some(first) = passwd.split(|b| *b == b'\n').next() {
            if first.len() > 8 && contains(haystack, first) {
                return true;
            }
        }
    }
    false
}

/// Deterministic bytes that do not compress (xorshift), so that an object
/// made of them stays as big on the wire and on disk as it is.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Bytes of disk the files under `root` take (allocated blocks, so sparse
/// files count for what they hold), not following symlinks; bounded.
pub fn disk_used(root: &Path) -> Result<u64> {
    const MAX_ENTRIES: usize = 1_000_000;
    let (mut total, mut seen) = (0u64, 0usize);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let e = e?;
            seen += 1;
            ensure!(
                seen <= MAX_ENTRIES,
                "more than {MAX_ENTRIES} entries under {}",
                root.display()
            );
            let m = e.path().symlink_metadata()?;
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(total)
}
