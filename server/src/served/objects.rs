//! Objects on the request path: a directory fd per root of the generation
//! and per object fan-out directory (`objects/XX`) in it, each opened once,
//! and one `openat` of the object's file name in its fan-out directory
//! (`fsutil::open_entry`): one lookup where the whole path beneath the
//! root was three under `RESOLVE_BENEATH`, 10% of an open and close.
//! Which root held an object is remembered per generation when there are
//! several. Small objects are read whole in the same step, so a request
//! costs at most one trip to the blocking pool, and none when the lookup
//! and the bytes are already in the kernel's caches.

use super::{Generation, Layer};
use crate::fsutil::{self, Lookup, Opened};
use bytes::Bytes;
use oscontent_format::{ObjectKind, ObjectName, RepoPath};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Objects whose root is remembered, at most (then it starts afresh).
const MAX_REMEMBERED: usize = 1 << 18;

/// The roots of a generation, opened on first use, in precedence order
/// for objects: sources, then the overlay.
#[derive(Debug, Default)]
pub struct ObjectRoots {
    dirs: OnceLock<Vec<(Layer, Option<OwnedFd>)>>,
    /// Per root of `dirs`, its 256 fan-out directories, each opened on
    /// first use (`None`: not there). An fd each, so a generation holds at
    /// most 256 per root; the roots never change once published.
    fanouts: OnceLock<Vec<Fanout>>,
    /// Object → index in `dirs`, when there are more than two roots (with
    /// one source and the overlay, the source is simply tried first).
    remembered: Mutex<HashMap<ObjectName, u8>>,
}

/// One root's fan-out directories, by the checksum's first byte.
type Fanout = Box<[OnceLock<Option<OwnedFd>>]>;

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
        let mut file_name = [0u8; FILE_NAME_MAX];
        let file_name = object_file_name(name, &mut file_name);
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
            let fanout = match self.fanout(usize::from(i), dir.as_fd(), name, nonblocking)? {
                Lookup::Found(fd) => fd,
                Lookup::Absent => continue,
                Lookup::WouldBlock => return Ok(Loaded::WouldBlock),
            };
            let (file, meta) = match fsutil::open_entry(fanout, file_name, nonblocking)? {
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

impl Generation {
    /// Root `i`'s fan-out directory for `name`, opened on first use.
    fn fanout(
        &self,
        i: usize,
        root: BorrowedFd<'_>,
        name: &ObjectName,
        nonblocking: bool,
    ) -> io::Result<Lookup<BorrowedFd<'_>>> {
        let roots = self.objects.fanouts.get_or_init(|| {
            let fanout = || (0..256).map(|_| OnceLock::new()).collect();
            self.root_fds().iter().map(|_| fanout()).collect()
        });
        let Some(cell) = roots
            .get(i)
            .and_then(|r| r.get(usize::from(name.checksum.as_bytes()[0])))
        else {
            return Ok(Lookup::Absent);
        };
        if cell.get().is_none() {
            let mut hex = [0u8; 2];
            // Cannot fail: two digits for one byte.
            let _ = hex::encode_to_slice(&name.checksum.as_bytes()[..1], &mut hex);
            let rel = format!("objects/{}", std::str::from_utf8(&hex).unwrap_or_default());
            let opened = match fsutil::open_dir_beneath(root, &rel, nonblocking)? {
                Lookup::Found(fd) => Some(fd),
                Lookup::Absent => None,
                Lookup::WouldBlock => return Ok(Lookup::WouldBlock),
            };
            // Another thread may have opened it meanwhile: one is kept.
            let _ = cell.set(opened);
        }
        Ok(match cell.get() {
            Some(Some(fd)) => Lookup::Found(fd.as_fd()),
            _ => Lookup::Absent,
        })
    }
}

/// The longest object file name: 62 hex digits, a dot, the longest
/// extension.
const FILE_NAME_MAX: usize = 80;

/// `name`'s file name in its fan-out directory (`REST.EXT`), written into
/// `buf`: every object request makes one.
fn object_file_name<'b>(name: &ObjectName, buf: &'b mut [u8; FILE_NAME_MAX]) -> &'b str {
    let rest = &name.checksum.as_bytes()[1..];
    let ext = name.kind.extension().as_bytes();
    let hex_len = 2 * rest.len();
    // Cannot fail: the buffer holds twice the bytes, a dot and any
    // extension.
    let _ = hex::encode_to_slice(rest, &mut buf[..hex_len]);
    buf[hex_len] = b'.';
    buf[hex_len + 1..hex_len + 1 + ext.len()].copy_from_slice(ext);
    std::str::from_utf8(&buf[..hex_len + 1 + ext.len()]).unwrap_or_default()
}

impl ObjectRoots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectName, u8>> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oscontent_format::Checksum;

    #[test]
    fn an_object_file_name_is_its_path_after_the_fan_out() {
        for kind in ObjectKind::ALL {
            let name = ObjectName {
                checksum: Checksum::digest(kind.extension().as_bytes()),
                kind,
            };
            let path = name.path();
            let mut buf = [0u8; FILE_NAME_MAX];
            let want = path.rsplit_once('/').unwrap().1;
            assert_eq!(object_file_name(&name, &mut buf), want);
            let hex = name.checksum.to_hex();
            assert_eq!(path, format!("objects/{}/{want}", &hex[..2]));
        }
    }
}
