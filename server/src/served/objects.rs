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
use std::sync::atomic::{AtomicUsize, Ordering};
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
        let mut file_name = [0u8; ObjectName::FILE_NAME_MAX];
        let file_name = name.file_name(&mut file_name);
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
            let opened = match self.fanout(usize::from(i), dir.as_fd(), name, nonblocking)? {
                Some(Lookup::Found(fanout)) => fsutil::open_entry(fanout, file_name, nonblocking)?,
                Some(Lookup::Absent) => continue,
                Some(Lookup::WouldBlock) => return Ok(Loaded::WouldBlock),
                // Past the fan-out budget: the whole path beneath the root.
                None => fsutil::open_beneath(dir.as_fd(), &name.path(), nonblocking)?,
            };
            let (file, meta) = match opened {
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
            return Ok(match read_whole(&file, meta.len(), nonblocking)? {
                Some(bytes) => Loaded::Whole(bytes, meta),
                None => Loaded::WouldBlock,
            });
        }
        Ok(Loaded::Missing)
    }

    /// Root `i`'s fan-out directory for `name`, opened on first use;
    /// `None` when the budget of open fan-out directories is spent.
    fn fanout(
        &self,
        i: usize,
        root: BorrowedFd<'_>,
        name: &ObjectName,
        nonblocking: bool,
    ) -> io::Result<Option<Lookup<BorrowedFd<'_>>>> {
        let roots = self.objects.fanouts.get_or_init(|| {
            let fanout = || (0..256).map(|_| OnceLock::new()).collect();
            self.root_fds().iter().map(|_| fanout()).collect()
        });
        let Some(cell) = roots
            .get(i)
            .and_then(|r| r.get(usize::from(name.checksum.as_bytes()[0])))
        else {
            return Ok(Some(Lookup::Absent));
        };
        if cell.get().is_none() {
            let Some(held) = Budget::take() else {
                return Ok(None);
            };
            let opened = match fsutil::open_dir_beneath(root, &name.fanout_dir(), nonblocking)? {
                Lookup::Found(fd) => Some(fd),
                Lookup::Absent => None,
                Lookup::WouldBlock => return Ok(Some(Lookup::WouldBlock)),
            };
            // Another thread may have set it meanwhile: the first is kept,
            // and only a kept fd keeps its share of the budget (given back
            // when the generation goes, `Drop for ObjectRoots`).
            let is_fd = opened.is_some();
            if cell.set(opened).is_ok() && is_fd {
                std::mem::forget(held);
            }
        }
        Ok(Some(match cell.get() {
            Some(Some(fd)) => Lookup::Found(fd.as_fd()),
            _ => Lookup::Absent,
        }))
    }
}

/// The most object fan-out directories held open across generations (256
/// a root): one generation of a few roots, and the next while it takes
/// over. Past the budget, objects are opened by their whole path. The
/// listener leaves room for them in `nofile` (`listen::limits`).
pub const FANOUT_FDS: u64 = 1024;

/// Fan-out directories held open now, across generations.
static FANOUT_OPEN: AtomicUsize = AtomicUsize::new(0);
/// The most that may be: `set_fanout_budget`, from the open-file limit.
static FANOUT_BUDGET: AtomicUsize = AtomicUsize::new(FANOUT_FDS as usize);

/// How many object fan-out directories may be held open at once, across
/// generations (`listen::limits::fanout_fds`): the listener's caps leave
/// room for exactly this many.
pub fn set_fanout_budget(fds: u64) {
    FANOUT_BUDGET.store(
        usize::try_from(fds).unwrap_or(usize::MAX),
        Ordering::Relaxed,
    );
}

/// One fan-out directory's share of the budget, given back when dropped
/// unless it is kept (forgotten) with the fd it was taken for.
struct Budget;

impl Budget {
    fn take() -> Option<Self> {
        let budget = FANOUT_BUDGET.load(Ordering::Relaxed);
        FANOUT_OPEN
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < budget).then_some(n + 1)
            })
            .ok()
            .map(|_| Budget)
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        FANOUT_OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for ObjectRoots {
    fn drop(&mut self) {
        let held = self
            .fanouts
            .get()
            .into_iter()
            .flatten()
            .flat_map(|root| root.iter())
            .filter(|cell| matches!(cell.get(), Some(Some(_))))
            .count();
        FANOUT_OPEN.fetch_sub(held, Ordering::Relaxed);
    }
}

impl ObjectRoots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectName, u8>> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// An object file of `len` bytes read whole; `None` if `nonblocking` and
/// the kernel does not have all of it. A file that shrank under us is
/// served as it now is, and its length is what Content-Length says.
pub fn read_whole(file: &File, len: u64, nonblocking: bool) -> io::Result<Option<Bytes>> {
    let mut buf = vec![0u8; len as usize];
    let n = if nonblocking {
        match fsutil::read_cached(file, &mut buf, 0)? {
            Some(n) if n == buf.len() => n,
            _ => return Ok(None),
        }
    } else {
        fsutil::read_at(file, &mut buf, 0)?
    };
    buf.truncate(n);
    Ok(Some(Bytes::from(buf)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::ObjectGate;
    use oscontent_format::Checksum;
    use std::os::unix::fs::symlink;

    fn object(seed: &str) -> ObjectName {
        ObjectName {
            checksum: Checksum::digest(seed.as_bytes()),
            kind: ObjectKind::File,
        }
    }

    /// Objects are found through their fan-out directories, from the
    /// source first, then the overlay; a symlink is never followed, be it
    /// the object's file or its fan-out directory.
    #[test]
    fn objects_are_opened_in_their_held_fan_out_directories() {
        let outside = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        let overlay = tempfile::tempdir().unwrap();
        let put = |root: &Path, o: &ObjectName, body: &[u8]| {
            let p = root.join(o.path());
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        };
        let (a, b, c) = (object("a"), object("b"), object("c"));
        put(src.path(), &a, b"in the source");
        put(overlay.path(), &b, b"in the overlay");
        // `c`'s file in the source is a symlink to a real file outside,
        // and a fan-out directory that is a symlink leads outside too.
        put(outside.path(), &c, b"outside");
        let c_path = src.path().join(c.path());
        std::fs::create_dir_all(c_path.parent().unwrap()).unwrap();
        symlink(outside.path().join(c.path()), &c_path).unwrap();
        let linked = object("linked fan-out");
        put(outside.path(), &linked, b"outside");
        let fan = ObjectName::fanout_dir;
        if !src.path().join(fan(&linked)).exists() {
            symlink(
                outside.path().join(fan(&linked)),
                src.path().join(fan(&linked)),
            )
            .unwrap();
        }

        let mut g = Generation::new(
            1,
            vec![src.path().to_owned()],
            overlay.path().to_owned(),
            vec![],
        );
        g.gate = ObjectGate::VerifiedStore;
        let cases: &[(&ObjectName, Option<&[u8]>)] = &[
            (&a, Some(b"in the source")),
            (&b, Some(b"in the overlay")),
            (&c, None),
            (&linked, None),
            (&object("missing"), None),
        ];
        // Twice: the second time through the fan-out fds held.
        for _ in 0..2 {
            for (o, want) in cases {
                let got = match g.load_object(o, 1 << 20, false).unwrap() {
                    Loaded::Whole(bytes, _) => Some(bytes.to_vec()),
                    Loaded::Missing => None,
                    other => panic!("{other:?}"),
                };
                assert_eq!(got.as_deref(), *want, "{}", o.path());
            }
        }
    }
}
