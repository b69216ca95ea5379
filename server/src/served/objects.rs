//! Objects on the request path: a directory fd per root of the generation,
//! opened once, and one `openat2` per object beneath it (`fsutil`); which
//! root held an object is remembered per generation when there are
//! several. Small objects are read whole in the same step, so a request
//! costs at most one trip to the blocking pool, and none when the lookup
//! and the bytes are already in the kernel's caches.

use super::{Generation, Layer};
use crate::fsutil::{self, Opened};
use bytes::Bytes;
use oscontent_format::{ObjectKind, ObjectName, RepoPath};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Objects whose root is remembered, at most (then it starts afresh).
const MAX_REMEMBERED: usize = 1 << 18;

/// The roots of a generation, opened on first use, in precedence order
/// for objects: sources, then the overlay.
#[derive(Debug, Default)]
pub struct ObjectRoots {
    dirs: OnceLock<Vec<(Layer, Option<OwnedFd>)>>,
    /// Object → index in `dirs`, when there are more than two roots (with
    /// one source and the overlay, the source is simply tried first).
    remembered: Mutex<HashMap<ObjectName, u8>>,
}

/// What loading an object found.
#[derive(Debug)]
pub enum Loaded {
    Missing,
    /// Read whole (it was small enough), with its file's metadata.
    Whole(Bytes, std::fs::Metadata),
    /// Open, to be streamed.
    Open(File, std::fs::Metadata),
    /// Not all in the kernel's caches: ask again with `nonblocking` off,
    /// from a thread that may block.
    WouldBlock,
}

fn open_dirs(g: &Generation) -> Vec<(Layer, Option<OwnedFd>)> {
    let open = |layer: Layer, p: &Path| {
        let fd = fsutil::open_dir(p).unwrap_or_else(|e| {
            tracing::warn!(root = %p.display(), "opening a served root: {e}");
            None
        });
        (layer, fd)
    };
    g.sources
        .iter()
        .map(|p| open(Layer::Source, p))
        .chain(std::iter::once(open(Layer::Overlay, &g.overlay)))
        .collect()
}

impl Generation {
    /// The generation's roots as directory fds, opened on first use:
    /// sources in precedence order, then the overlay (`None` for a root
    /// that did not exist then).
    pub(super) fn root_fds(&self) -> &[(Layer, Option<OwnedFd>)] {
        self.objects.dirs.get_or_init(|| open_dirs(self))
    }

    /// The one place a request for an immutable object (commit, dirtree,
    /// dirmeta, content) finds its file: sources first, then the overlay,
    /// and only if the publication verified it. Objects of `whole_upto` bytes or fewer
    /// are read whole. With `nonblocking`, nothing waits on the disk:
    /// [`Loaded::WouldBlock`] says to ask again from the blocking pool.
    pub fn load_object(
        &self,
        name: &ObjectName,
        whole_upto: u64,
        nonblocking: bool,
    ) -> io::Result<Loaded> {
        debug_assert!(
            name.kind != ObjectKind::CommitMeta,
            "detached metadata is not an object file"
        );
        // An object the publication did not verify does not exist
        // (invariant 1); the object cache only ever holds what this returns.
        if !self.gate.allows(&RepoPath::Object(*name)) {
            return Ok(Loaded::Missing);
        }
        let dirs = self.root_fds();
        let rel = name.path();
        let remember = dirs.len() > 2;
        let hint = if remember {
            self.objects.lock().get(name).copied()
        } else {
            None
        };
        let order = hint
            .into_iter()
            .chain((0..dirs.len() as u8).filter(|i| Some(*i) != hint));
        for i in order {
            let Some((_, Some(dir))) = dirs.get(usize::from(i)) else {
                continue;
            };
            let (file, meta) = match fsutil::open_beneath(dir.as_fd(), &rel, nonblocking)? {
                Opened::File(f, m) => (f, m),
                Opened::Absent => continue,
                Opened::WouldBlock => return Ok(Loaded::WouldBlock),
            };
            if remember && hint != Some(i) {
                let mut r = self.objects.lock();
                if r.len() >= MAX_REMEMBERED {
                    r.clear();
                }
                r.insert(*name, i);
            }
            if meta.len() > whole_upto {
                return Ok(Loaded::Open(file, meta));
            }
            let mut buf = vec![0u8; meta.len() as usize];
            let n = if nonblocking {
                match fsutil::read_cached(&file, &mut buf, 0)? {
                    Some(n) if n == buf.len() => n,
                    _ => return Ok(Loaded::WouldBlock),
                }
            } else {
                fsutil::read_at(&file, &mut buf, 0)?
            };
            // A file that shrank under us is served as it now is, and its
            // length is what Content-Length says.
            buf.truncate(n);
            return Ok(Loaded::Whole(Bytes::from(buf), meta));
        }
        Ok(Loaded::Missing)
    }
}

impl ObjectRoots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectName, u8>> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
