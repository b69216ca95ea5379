//! What every walk of a repo's objects shares, whatever it reads (a
//! generation being verified, a mirror's remote, the object cache being
//! warmed): the bounds on what external input may make it visit or read
//! (invariant 5: how many objects, how deep, how big each kind, how many
//! deltas), the listing of a repo's deltas within them, and the loop that
//! runs one level's items on threads.

use crate::fsutil;
use anyhow::Result;
use oscontent_format::{DeltaName, ObjectKind, RepoPath};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Most objects one walk may reach (a full OS image has ~100,000).
pub const MAX_OBJECTS: usize = 20_000_000;
/// Tree depth bound.
pub const MAX_TREE_DEPTH: usize = 256;
/// Most deltas one repo may list.
pub const MAX_DELTAS: usize = 10_000;
/// Most entries one directory listing may hold.
pub const MAX_DIR_ENTRIES: usize = 1_000_000;

/// Largest content object accepted (streamed to disk, so this bounds disk
/// use by a hostile upstream, not memory).
pub const MAX_CONTENT_SIZE: u64 = 32 << 30;
/// Largest dirtree (a directory of 100,000 entries is ~5 MiB).
pub const MAX_DIRTREE_SIZE: u64 = oscontent_format::tree::MAX_DIRTREE_SIZE as u64;
/// Largest dirmeta.
pub const MAX_DIRMETA_SIZE: u64 = oscontent_format::tree::MAX_DIRMETA_SIZE as u64;
/// Largest commit object.
pub const MAX_COMMIT_SIZE: u64 = oscontent_format::commit::MAX_COMMIT_SIZE as u64;
/// Largest detached metadata (signatures).
pub const MAX_COMMITMETA_SIZE: u64 = oscontent_format::gpgsigs::MAX_DETACHED_METADATA_SIZE as u64;

/// The size bound for an object kind.
pub fn max_object_size(kind: ObjectKind) -> u64 {
    match kind {
        ObjectKind::Commit => MAX_COMMIT_SIZE,
        ObjectKind::DirTree => MAX_DIRTREE_SIZE,
        ObjectKind::DirMeta => MAX_DIRMETA_SIZE,
        ObjectKind::File => MAX_CONTENT_SIZE,
        ObjectKind::CommitMeta => MAX_COMMITMETA_SIZE,
    }
}

/// Runs `f` over `items` on `jobs` threads; the first error stops the rest
/// (they finish the item in hand) and is returned.
pub fn parallel<T: Send>(
    items: Vec<T>,
    jobs: usize,
    f: impl Fn(T) -> Result<()> + Sync,
) -> Result<()> {
    let queue = Mutex::new(items);
    let failed = AtomicBool::new(false);
    let first: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                if failed.load(Ordering::Relaxed) {
                    return;
                }
                let Some(item) = queue.lock().expect("queue lock").pop() else {
                    return;
                };
                if let Err(e) = f(item) {
                    failed.store(true, Ordering::Relaxed);
                    first.lock().expect("error lock").get_or_insert(e);
                    return;
                }
            });
        }
    });
    match first.into_inner().expect("error lock") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The static deltas `root` holds (`deltas/XX/REST/superblock`), by name
/// and superblock path, within [`MAX_DELTAS`].
pub fn list_deltas(root: &Path) -> Result<Vec<(DeltaName, String)>> {
    let mut out = Vec::new();
    let Some(prefixes) = fsutil::list_dir(root, "deltas", MAX_DIR_ENTRIES)? else {
        return Ok(out);
    };
    for p in prefixes.into_iter().filter(|e| e.is_dir) {
        let dir = format!("deltas/{}", p.name);
        for d in fsutil::list_dir(root, &dir, MAX_DIR_ENTRIES)?.unwrap_or_default() {
            let rel = format!("{dir}/{}/superblock", d.name);
            if let Some(RepoPath::Delta { name, .. }) = RepoPath::parse(&rel) {
                out.push((name, rel));
            }
            anyhow::ensure!(
                out.len() <= MAX_DELTAS,
                "{} has more than {MAX_DELTAS} deltas",
                root.display()
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn parallel_stops_at_the_first_error() {
        // One worker: items are taken from the end, and none after the
        // failing one.
        let seen = AtomicU64::new(0);
        let r = parallel((0..1000).collect(), 1, |i: u32| {
            seen.fetch_add(1, Ordering::Relaxed);
            if i == 990 {
                bail!("item {i}");
            }
            Ok(())
        });
        assert!(r.unwrap_err().to_string().contains("990"));
        assert_eq!(seen.load(Ordering::Relaxed), 10);
        // Several: the error comes back whatever the interleaving.
        let r = parallel((0..1000).collect(), 4, |i: u32| {
            if i % 100 == 7 {
                bail!("item {i}");
            }
            Ok(())
        });
        assert!(r.unwrap_err().to_string().starts_with("item "));
        let total = AtomicU64::new(0);
        parallel((1..=100).collect(), 3, |i: u64| {
            total.fetch_add(i, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(total.load(Ordering::Relaxed), 5050);
    }
}
