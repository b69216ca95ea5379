//! The file writes and listings of a bundle update: atomic writes, the
//! remote's own files (config, refs, summary), and bounded listings.

use crate::mirror::store::{hash_file, FileEntry, Store};
use crate::mirror::sync::{Metadata, PublishedRef};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a synced temporary file and a rename,
/// then syncs the directory: after a crash, `path` holds the old bytes or
/// the new ones.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path.parent().context("a file path has a parent")?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(parent)
        .with_context(|| format!("creating a temporary file in {}", parent.display()))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .with_context(|| format!("setting the mode of {}", tmp.path().display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming into {}", path.display()))?;
    sync_dir(parent)
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

/// Refuses to write into an existing, non-empty directory that has none
/// of `markers`: that is someone's data (a mistyped destination), not a
/// mirror's.
pub fn refuse_foreign_dir(dir: &Path, markers: &[&str]) -> Result<()> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    if entries.next().is_none() || markers.iter().any(|m| dir.join(m).exists()) {
        return Ok(());
    }
    bail!(
        "{} exists, is not empty, and is not a mirror destination (it has none of {}); refusing to write into it",
        dir.display(),
        markers.join(", ")
    )
}

/// Writes `config`, refs (removing stale ones), `summary` and
/// `summary.sig` of `meta` into `store`'s root.
pub fn write_remote_files(store: &Store, meta: &Metadata) -> Result<()> {
    let root = store.root().to_path_buf();
    // The directories a local ostree repo has, so that stock tools also
    // open a bundle in place (`ostree fsck --repo=DIR`).
    for d in ["refs/heads", "refs/mirrors", "refs/remotes"] {
        crate::fsutil::create_dirs(&root, d)
            .with_context(|| format!("creating {}/{d}", root.display()))?;
    }
    let wanted: BTreeSet<String> = meta.refs.iter().map(PublishedRef::path).collect();
    for rel in list_files(&root, "refs")? {
        if !wanted.contains(&rel) {
            store.remove(&rel)?;
        }
    }
    for d in ["refs/heads", "refs/mirrors", "refs/remotes"] {
        remove_empty_dirs(&root.join(d))?;
    }
    for r in &meta.refs {
        store.write_file(&r.path(), format!("{}\n", r.commit).as_bytes())?;
    }
    store.write_file("config", &meta.config)?;
    // The signature goes first and the summary last: a client reading
    // during an update may see a new signature with an old summary (and
    // retry), but a stale signature never outlives a summary swap.
    match &meta.summary_sig {
        Some(sig) => store.write_file("summary.sig", sig)?,
        None => {
            store.remove("summary.sig")?;
        }
    }
    store.write_file("summary", &meta.summary)?;
    Ok(())
}

/// Every regular file under `root/sub`, as repo-relative paths (bounded).
pub fn list_files(root: &Path, sub: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![(sub.to_owned(), 0usize)];
    while let Some((rel, depth)) = stack.pop() {
        let dir = root.join(&rel);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        for ent in rd {
            let ent = ent.with_context(|| format!("listing {}", dir.display()))?;
            let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let child = format!("{rel}/{name}");
            let ft = ent.file_type()?;
            if ft.is_dir() && depth < crate::fsutil::MAX_DEPTH {
                stack.push((child, depth + 1));
            } else if ft.is_file() {
                out.push(child);
            }
            anyhow::ensure!(
                out.len() <= crate::treewalk::MAX_OBJECTS,
                "{} holds more than {} files",
                root.join(sub).display(),
                crate::treewalk::MAX_OBJECTS
            );
        }
    }
    Ok(out)
}

/// Removes empty directories under `dir` (not `dir` itself).
pub(super) fn remove_empty_dirs(dir: &Path) -> Result<()> {
    fn walk(d: &Path, depth: usize) -> Result<bool> {
        let rd = match std::fs::read_dir(d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e).with_context(|| format!("listing {}", d.display())),
        };
        let mut empty = true;
        for ent in rd {
            let ent = ent?;
            if ent.file_type()?.is_dir() && depth < crate::fsutil::MAX_DEPTH {
                if walk(&ent.path(), depth + 1)? {
                    let _ = std::fs::remove_dir(ent.path());
                } else {
                    empty = false;
                }
            } else {
                empty = false;
            }
        }
        Ok(empty)
    }
    walk(dir, 0).map(|_| ())
}

/// Re-hashes a file the manifest lists (for tests and `fsck`-like checks).
pub fn entry_of(path: &Path) -> Result<FileEntry> {
    hash_file(path)
}
