//! What a generation may serve from its sources: the objects and static
//! deltas its publication verified (invariant 1: nothing is served, with
//! immutable caching or at all, before its checksum was checked).
//!
//! Publication walks the closure of every published commit (commit →
//! dirtree → dirmeta → content), reading each object from the first
//! source that has it (the one the generation will serve): commits,
//! dirtrees and dirmetas must hash to their names, content objects must
//! have libostree's content checksum of theirs
//! (`oscontent_format::content::archive_checksum`); a delta's parts must
//! have the checksums its superblock lists. The result is a
//! [`VerifiedSet`]; anything else in the sources answers 404.
//!
//! Sources that hold only verified objects by construction (a native
//! image's converted repo, a mirror's store) are walked but not hashed
//! again. For a live `--repo`, a [`VerdictCache`] remembers each object
//! verified by file identity (dev, inode, size, mtime, ctime), so a
//! refresh hashes only what changed.

mod walk;

#[cfg(test)]
mod tests;

use oscontent_format::{DeltaName, ObjectKind, ObjectName, RepoPath};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use walk::{recheck, verify_closure, verify_deltas, verify_with_history};

/// Bytes on disk that are not what their name says (an object, a commit,
/// a delta part), found by a check of the source. Callers branch on it: a
/// publisher whose served generation reads the same files can no longer
/// trust that generation either (see `refresh`).
#[derive(Debug, thiserror::Error)]
#[error("{what} is corrupt: {detail}")]
pub struct Corrupt {
    pub what: String,
    pub detail: String,
}

/// Whether `e` is, or was caused by, [`Corrupt`] bytes.
pub fn is_corruption(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Corrupt>())
}

/// Commits besides the published ones (their ancestors, and the other
/// commits a `--repo` holds, newest first) that a publication verifies and
/// serves, by checksum (rollbacks); any more answer 404.
pub const MAX_HISTORY: usize = 64;

/// Verification threads: enough to keep a disk and a core busy, few enough
/// to leave the serving threads (and the neighbours of a 2-core node) room.
pub const MAX_JOBS: usize = 4;

/// The objects and deltas a publication verified.
#[derive(Debug, Default, Clone)]
pub struct VerifiedSet {
    /// Looked up at every object request (`ObjectGate::allows`).
    objects: HashSet<ObjectName, rustc_hash::FxBuildHasher>,
    deltas: HashSet<DeltaName>,
    /// Objects whose bytes this publication read and hashed (the others
    /// were verified before, or come from a preverified root).
    pub hashed: usize,
}

impl VerifiedSet {
    pub fn contains(&self, o: &ObjectName) -> bool {
        self.objects.contains(o)
    }

    pub fn contains_delta(&self, d: &DeltaName) -> bool {
        self.deltas.contains(d)
    }

    /// Every verified delta (in no particular order).
    pub fn deltas(&self) -> impl Iterator<Item = &DeltaName> {
        self.deltas.iter()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Every verified object (in no particular order).
    pub fn objects(&self) -> impl Iterator<Item = &ObjectName> {
        self.objects.iter()
    }

    pub fn insert(&mut self, o: ObjectName) -> bool {
        self.objects.insert(o)
    }

    pub fn insert_delta(&mut self, d: DeltaName) {
        self.deltas.insert(d);
    }
}

/// Which objects and deltas of its sources a generation serves.
#[derive(Debug, Clone)]
pub enum ObjectGate {
    /// Only these. Every publication from a source the server did not
    /// itself fill through verification.
    Only(Arc<VerifiedSet>),
    /// All of them: the sources are a mirror's store, into which every
    /// file was renamed only after it verified (`mirror::store`).
    VerifiedStore,
}

impl Default for ObjectGate {
    /// Closed: a generation nobody verified serves no object.
    fn default() -> Self {
        ObjectGate::Only(Arc::default())
    }
}

impl ObjectGate {
    /// Whether `path` may be answered from the sources. Detached metadata
    /// is not content-addressed (it is never cached as immutable, and its
    /// signatures are what a client verifies), so it is not gated; refs,
    /// summaries and config are not objects.
    pub fn allows(&self, path: &RepoPath) -> bool {
        let ObjectGate::Only(set) = self else {
            return true;
        };
        match path {
            RepoPath::Object(o) if o.kind == ObjectKind::CommitMeta => true,
            RepoPath::Object(o) => set.contains(o),
            RepoPath::Delta { name, .. } => set.contains_delta(name),
            _ => true,
        }
    }
}

/// A file's identity: a file replaced or rewritten gets a new one. The
/// ctime is in it because, unlike the mtime, no writer can set it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    pub fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Verdicts of the last publication from a live repo, by object and the
/// identity of the file that verified. Replaced whole by each publication,
/// so it holds no more than one closure.
#[derive(Debug, Default)]
pub struct VerdictCache(Mutex<HashMap<ObjectName, (PathBuf, FileId)>>);

impl VerdictCache {
    /// Whether `o`, found at `root` as the file `id`, verified before.
    pub fn verified(&self, o: &ObjectName, root: &std::path::Path, id: FileId) -> bool {
        self.0
            .lock()
            .expect("verdict cache lock")
            .get(o)
            .is_some_and(|(r, i)| r == root && *i == id)
    }

    fn replace(&self, verdicts: HashMap<ObjectName, (PathBuf, FileId)>) {
        *self.0.lock().expect("verdict cache lock") = verdicts;
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("verdict cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One source to verify from, in the generation's precedence order.
#[derive(Debug, Clone)]
pub struct Root {
    pub path: PathBuf,
    /// Holds only objects verified as they were written (a native image's
    /// converted repo): walked, not hashed again.
    pub preverified: bool,
}

impl Root {
    pub fn plain(path: PathBuf) -> Self {
        Self {
            path,
            preverified: false,
        }
    }
}

/// How a verification runs.
#[derive(Debug, Default, Clone)]
pub struct VerifyOptions {
    /// Threads; 0 means [`default_jobs`].
    pub jobs: usize,
    /// Verdicts to reuse and to replace with this run's.
    pub cache: Option<Arc<VerdictCache>>,
}

/// The cores there are, up to [`MAX_JOBS`].
pub fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_JOBS)
}
