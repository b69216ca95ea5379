//! The small metadata files served whole (`config`, `summary`,
//! `summary.sig`, refs, `.commitmeta`, delta indexes): each capped at a
//! size that fits what it holds, and read and hashed once per version of
//! the file, not per request. Every request shares the same `Bytes`, so a
//! hundred slow readers of one file hold one copy, and the same prepared
//! validators and header values.

use crate::fsutil;
use crate::prepared::Prepared;
use bytes::Bytes;
use oscontent_format::{summary::MAX_SUMMARY_SIZE, Checksum, ObjectKind, RepoPath};
use oscontent_parse::conditional::Validators;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

/// A ref file holds a checksum and a newline.
pub const MAX_REF: u64 = 4096;
/// `config` is a short key file.
pub const MAX_CONFIG: u64 = 1 << 20;
/// Detached metadata: a few signatures and small keys.
pub const MAX_COMMITMETA: u64 = 1 << 20;
/// `summary.sig`: signatures only.
pub const MAX_SUMMARY_SIG: u64 = 1 << 20;
/// A delta index: the deltas to one commit.
pub const MAX_DELTA_INDEX: u64 = 1 << 20;
/// What one generation's cache holds at most: the largest file it may be
/// asked for (a 64 MiB summary) plus room for the rest. Past it the cache
/// starts again empty, which only costs re-reads.
const CACHE_BUDGET: usize = 96 << 20;
/// Entries at most (one per ref, config, commitmeta... of the generation).
const CACHE_ENTRIES: usize = 16 * 1024;

/// The cap for a path served whole, or `None` for what is streamed
/// (objects other than detached metadata, delta parts and superblocks).
pub fn cap(p: &RepoPath) -> Option<u64> {
    match p {
        RepoPath::Config => Some(MAX_CONFIG),
        RepoPath::Summary => Some(MAX_SUMMARY_SIZE as u64),
        RepoPath::SummarySig => Some(MAX_SUMMARY_SIG),
        RepoPath::Ref { .. } => Some(MAX_REF),
        RepoPath::Object(o) if o.kind == ObjectKind::CommitMeta => Some(MAX_COMMITMETA),
        RepoPath::DeltaIndex { .. } => Some(MAX_DELTA_INDEX),
        RepoPath::Blob(_) => Some(oscontent_format::staging::MAX_BLOB_SIZE),
        RepoPath::Object(_) | RepoPath::Delta { .. } => None,
    }
}

/// A strong validator from the bytes themselves.
pub fn digest_etag(bytes: &[u8]) -> String {
    format!("\"{}\"", &Checksum::digest(bytes).to_hex()[..32])
}

/// The validators, and their header values, of `bytes` served whole: a
/// strong ETag from the bytes, and `last_modified` matched exactly.
pub fn whole(bytes: &[u8], last_modified: Option<SystemTime>) -> Arc<Prepared> {
    Arc::new(Prepared::new(Validators {
        etag: digest_etag(bytes),
        last_modified,
        exact_date: true,
    }))
}

/// A metadata file as served.
#[derive(Debug, Clone)]
pub struct MetadataFile {
    pub bytes: Bytes,
    /// Its ETag (of the bytes) and Last-Modified (the file's).
    pub prepared: Arc<Prepared>,
}

/// Why a metadata file could not be served.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("{rel} in {root} is {len} bytes, over the {cap}-byte cap for this kind of file")]
    TooLarge {
        root: PathBuf,
        rel: String,
        len: u64,
        cap: u64,
    },
    #[error("reading {rel} in {root}: {source}")]
    Io {
        root: PathBuf,
        rel: String,
        source: std::io::Error,
    },
}

/// Which version of a file a cache entry is: a file replaced, rewritten
/// or touched gets a new identity.
pub(super) type Identity = (u64, u64, u64, i64, i64, i64, i64);

pub(super) fn identity(m: &std::fs::Metadata) -> Identity {
    (
        m.dev(),
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// By root, then path beneath it: looked up with borrowed keys, so a hit
/// allocates nothing.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<PathBuf, HashMap<String, (Identity, MetadataFile)>>,
    bytes: usize,
}

/// A generation's metadata files, by root and path.
#[derive(Debug, Default)]
pub struct MetadataCache(Mutex<Entries>);

impl MetadataCache {
    /// `root/rel` whole, if it exists, from the cache while the file is
    /// unchanged. Over `cap` bytes is an error that names the file.
    pub fn read(
        &self,
        root: &Path,
        rel: &str,
        cap: u64,
    ) -> Result<Option<MetadataFile>, MetadataError> {
        let Some((file, meta)) =
            fsutil::open_file(root, rel).map_err(|source| MetadataError::Io {
                root: root.to_owned(),
                rel: rel.to_owned(),
                source,
            })?
        else {
            return Ok(None);
        };
        let read = self.read_opened(root, rel, (&file, &meta), cap, false)?;
        Ok(Some(read.expect("a blocking read does not ask to block")))
    }

    /// As [`Self::read`], for `root/rel` already open. With `nonblocking`,
    /// a file not in the cache is read only from the page cache, and
    /// `Ok(None)` says it would have waited on the disk: ask again from a
    /// thread that may block.
    pub fn read_opened(
        &self,
        root: &Path,
        rel: &str,
        (file, meta): (&std::fs::File, &std::fs::Metadata),
        cap: u64,
        nonblocking: bool,
    ) -> Result<Option<MetadataFile>, MetadataError> {
        let io = |source| MetadataError::Io {
            root: root.to_owned(),
            rel: rel.to_owned(),
            source,
        };
        if meta.len() > cap {
            return Err(MetadataError::TooLarge {
                root: root.to_owned(),
                rel: rel.to_owned(),
                len: meta.len(),
                cap,
            });
        }
        let id = identity(meta);
        let hit = self
            .lock()
            .map
            .get(root)
            .and_then(|files| files.get(rel))
            .filter(|(i, _)| *i == id)
            .map(|(_, hit)| hit.clone());
        if hit.is_some() {
            return Ok(hit);
        }
        // Read outside the lock: a big summary must not stall every other
        // metadata request of the generation. The length is the one just
        // checked against the cap; a file that changes meanwhile is read
        // as it was when opened or refused by the identity next time.
        let mut buf = vec![0u8; meta.len() as usize];
        let n = if nonblocking {
            match fsutil::read_cached(file, &mut buf, 0).map_err(io)? {
                Some(n) if n == buf.len() => n,
                _ => return Ok(None),
            }
        } else {
            fsutil::read_at(file, &mut buf, 0).map_err(io)?
        };
        buf.truncate(n);
        let entry = MetadataFile {
            prepared: whole(&buf, meta.modified().ok()),
            bytes: buf.into(),
        };
        self.insert(root, rel, id, entry.clone());
        Ok(Some(entry))
    }

    fn insert(&self, root: &Path, rel: &str, id: Identity, entry: MetadataFile) {
        let mut e = self.lock();
        let size = entry.bytes.len();
        // A root or two (source, overlay): counted, not tracked.
        let entries: usize = e.map.values().map(HashMap::len).sum();
        if e.bytes + size > CACHE_BUDGET || entries >= CACHE_ENTRIES {
            e.map.clear();
            e.bytes = 0;
        }
        e.bytes += size;
        let files = e.map.entry(root.to_owned()).or_default();
        if let Some((_, old)) = files.insert(rel.to_owned(), (id, entry)) {
            e.bytes -= old.bytes.len();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Every update is complete before the guard drops: a panic
        // elsewhere cannot leave a half-made entry.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_by_path_kind() {
        let c = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        #[rustfmt::skip]
        let cases = [
            ("config", Some(MAX_CONFIG)),
            ("summary", Some(MAX_SUMMARY_SIZE as u64)),
            ("summary.sig", Some(MAX_SUMMARY_SIG)),
            ("refs/heads/os/stable", Some(MAX_REF)),
            (&format!("objects/{}/{}.commitmeta", &c[..2], &c[2..]), Some(MAX_COMMITMETA)),
            (&format!("objects/{}/{}.commit", &c[..2], &c[2..]), None),
            (&format!("objects/{}/{}.filez", &c[..2], &c[2..]), None),
        ];
        for (path, want) in cases {
            let p = RepoPath::parse(path).unwrap();
            assert_eq!(cap(&p), want, "{path}");
        }
    }

    #[test]
    fn a_file_is_read_once_per_version_and_capped() {
        let d = tempfile::tempdir().unwrap();
        let cache = MetadataCache::default();
        std::fs::write(d.path().join("config"), "one\n").unwrap();
        let a = cache.read(d.path(), "config", 16).unwrap().unwrap();
        let b = cache.read(d.path(), "config", 16).unwrap().unwrap();
        // Shared, not copied: the same allocation.
        assert_eq!(a.bytes.as_ptr(), b.bytes.as_ptr());
        assert_eq!(a.prepared.validators.etag, digest_etag(b"one\n"));
        assert!(Arc::ptr_eq(&a.prepared, &b.prepared));

        // Replaced (a new inode): the new bytes.
        std::fs::write(d.path().join("new"), "two!\n").unwrap();
        std::fs::rename(d.path().join("new"), d.path().join("config")).unwrap();
        let c = cache.read(d.path(), "config", 16).unwrap().unwrap();
        assert_eq!(&c.bytes[..], b"two!\n");

        std::fs::write(d.path().join("config"), vec![b'x'; 17]).unwrap();
        let e = cache.read(d.path(), "config", 16).unwrap_err();
        assert!(
            matches!(
                e,
                MetadataError::TooLarge {
                    len: 17,
                    cap: 16,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("config"), "{e}");
        assert!(cache.read(d.path(), "absent", 16).unwrap().is_none());
    }
}
