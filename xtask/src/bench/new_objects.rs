//! What an update brings to a node that holds v1: the objects v2's commit
//! reaches and v1's does not (v2's commit object included), and their
//! bytes as an archive repo stores them (`.filez` compressed, metadata as
//! is). It is the least an ostree-protocol fetch of v2 over v1 moves, the
//! yardstick `fleet` and `update-bytes` measure transfers against.

use anyhow::{Context, Result};
use oscontent_testkit::checkout::{commit_closure, object_difference};
use oscontent_testkit::objects::{ObjectSet, CONTENT};
use oscontent_testkit::Ostree;
use std::path::{Path, PathBuf};

/// The objects v2 adds over v1, and their archive bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct NewObjects {
    pub count: usize,
    pub bytes: u64,
}

/// [`NewObjects`] of `v2` over `v1`, both in the archive repo `archive`.
pub fn new_objects(archive: &Path, v1: &str, v2: &str) -> Result<NewObjects> {
    let repo = Ostree::at(archive);
    // `commit_closure` lists the commit object with the tree it reaches.
    let new = object_difference(&commit_closure(&repo, v2)?, &commit_closure(&repo, v1)?);
    Ok(NewObjects {
        count: new.len(),
        bytes: bytes_of(archive, &new)?,
    })
}

/// The archive file of an object kind (`content` is `.filez`).
fn object_path(repo: &Path, kind: &str, checksum: &str) -> PathBuf {
    let ext = if kind == CONTENT { "filez" } else { kind };
    repo.join("objects")
        .join(&checksum[..2])
        .join(format!("{}.{ext}", &checksum[2..]))
}

fn bytes_of(repo: &Path, set: &ObjectSet) -> Result<u64> {
    let mut total = 0;
    for (kind, sums) in &set.0 {
        for c in sums {
            let p = object_path(repo, kind, c);
            total += std::fs::metadata(&p)
                .with_context(|| format!("stat {}", p.display()))?
                .len();
        }
    }
    Ok(total)
}
