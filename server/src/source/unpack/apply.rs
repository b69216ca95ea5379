//! The applier: writes validated entries ([`super::decode::Entry`]) into
//! the staging tree, through directory fds and `O_NOFOLLOW` only, and
//! honours whiteouts against what lower layers wrote.
//!
//! What is decided here depends on the tree: whether a parent is a plain
//! directory, whether a hardlink's target was extracted, what the current
//! layer wrote (which its whiteouts must not remove).

use super::decode::{join, show, unsafe_entry, At, Entry, Kind};
use crate::source::{SourceError, Subject};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn walk_err(e: Errno) -> bool {
    matches!(e, Errno::LOOP | Errno::NOTDIR | Errno::MLINK)
}

/// The staging directory's fd and the no-follow operations on it.
#[derive(Debug)]
pub(super) struct Fs {
    root: OwnedFd,
    /// Directories created for parents no entry named: each costs an
    /// inode like an entry, so they count against the entry limit.
    implicit_dirs: std::cell::Cell<u64>,
}

impl Fs {
    /// Opens the (new, empty) staging directory.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            root,
            implicit_dirs: std::cell::Cell::new(0),
        })
    }

    /// The staging directory (for [`super::limits::check_room`]).
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Parent directories created so far that no entry named.
    pub fn implicit_dirs(&self) -> u64 {
        self.implicit_dirs.get()
    }

    /// Flushes the whole filesystem.
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::syncfs(&self.root)?)
    }

    /// Opens the directory `comps` (relative to the root) without following
    /// symlinks, creating missing components if `create`. `Ok(None)` if it
    /// does not exist (or is not a plain directory) and `create` is false.
    fn walk(&self, comps: &[&[u8]], create: bool) -> Result<Option<OwnedFd>, Errno> {
        let mut dir = rustix::io::dup(&self.root)?;
        for c in comps {
            dir = match rustix::fs::openat(&dir, *c, DIR_FLAGS, Mode::empty()) {
                Ok(d) => d,
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&dir, *c, Mode::from_raw_mode(0o755)) {
                        Ok(()) => self.implicit_dirs.set(self.implicit_dirs.get() + 1),
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(e),
                    }
                    rustix::fs::openat(&dir, *c, DIR_FLAGS, Mode::empty())?
                }
                Err(e) if !create && (e == Errno::NOENT || walk_err(e)) => return Ok(None),
                Err(e) => return Err(e),
            };
        }
        Ok(Some(dir))
    }

    /// The directory `comps`, if it is there as a plain directory.
    fn open_dir(&self, comps: &[&[u8]]) -> Result<Option<OwnedFd>, Errno> {
        self.walk(comps, false)
    }

    /// The directory `comps`, created (0755) where missing.
    fn create_dir(&self, comps: &[&[u8]]) -> Result<OwnedFd, Errno> {
        // `walk` only says "absent" when not creating.
        self.walk(comps, true)?.ok_or(Errno::NOENT)
    }

    /// Removes `name` in `dir`, recursively if it is a directory, never
    /// following symlinks. Absent is fine.
    fn remove_at(dir: &OwnedFd, name: &[u8], depth: usize) -> Result<(), Errno> {
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return rustix::fs::unlinkat(dir, name, AtFlags::empty());
        }
        if depth > 256 {
            // The tree is built at most max_depth deep; this is a backstop.
            return Err(Errno::LOOP);
        }
        let sub = rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?;
        for child in Self::list(&sub)? {
            Self::remove_at(&sub, &child, depth + 1)?;
        }
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
    }

    fn list(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, Errno> {
        let mut names = Vec::new();
        for ent in rustix::fs::Dir::read_from(dir)? {
            let ent = ent?;
            let n = ent.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(n.to_vec());
            }
        }
        Ok(names)
    }

    /// Hides everything lower layers put under `comps`, keeping what this
    /// layer wrote (recursing into directories it touched).
    fn clear_lower(&self, comps: &[&[u8]], touched: &Touched, depth: usize) -> Result<(), Errno> {
        let Some(dir) = self.open_dir(comps)? else {
            return Ok(());
        };
        for child in Self::list(&dir)? {
            let mut path = comps.to_vec();
            path.push(&child);
            if !touched.contains(&path) {
                Self::remove_at(&dir, &child, 0)?;
                continue;
            }
            let st = rustix::fs::statat(&dir, child.as_slice(), AtFlags::SYMLINK_NOFOLLOW)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory && depth < 256 {
                self.clear_lower(&path, touched, depth + 1)?;
            }
        }
        Ok(())
    }
}

/// The paths (under `srv`) the current layer wrote, which its whiteouts
/// must not remove. Kept as keyed 64-bit hashes: 8 bytes an entry however
/// long the path (a collision could only keep a lower-layer file that a
/// whiteout meant to hide; never write anything).
struct Touched {
    keys: std::collections::hash_map::RandomState,
    set: HashSet<u64>,
}

impl Default for Touched {
    fn default() -> Self {
        Self {
            keys: std::collections::hash_map::RandomState::new(),
            set: HashSet::new(),
        }
    }
}

impl Touched {
    fn key(&self, comps: &[&[u8]]) -> u64 {
        use std::hash::BuildHasher;
        self.keys.hash_one(join(comps))
    }
    /// Records `at` and every directory leading to it.
    fn insert(&mut self, at: &At<'_>) {
        let comps = at.components();
        for i in 1..=comps.len() {
            let k = self.key(&comps[..i]);
            self.set.insert(k);
        }
    }
    fn contains(&self, comps: &[&[u8]]) -> bool {
        self.set.contains(&self.key(comps))
    }
}

/// The last parent directory opened: entries of a directory come together
/// (objects/XX/…), so this saves walking from the root each time. Only
/// whiteouts remove anything but entries of that directory, and they clear
/// it.
#[derive(Default)]
struct Parent(Option<(Vec<u8>, OwnedFd)>);

impl Parent {
    /// The directory `comps`, created where missing.
    fn open(&mut self, fs: &Fs, comps: &[&[u8]]) -> Result<&OwnedFd, Errno> {
        let key = join(comps);
        let fd = match self.0.take() {
            Some((k, fd)) if k == key => fd,
            _ => fs.create_dir(comps)?,
        };
        Ok(&self.0.insert((key, fd)).1)
    }
}

/// The errors about one entry, naming it (the subject names image and
/// layer).
struct Blame<'a> {
    subject: &'a Subject,
    path: &'a [u8],
}

impl Blame<'_> {
    fn refuse(&self, why: String) -> SourceError {
        unsafe_entry(self.subject, self.path, why)
    }

    /// An error writing the entry: a walk error means a parent is not a
    /// plain directory, which the layer is refused for.
    fn writing(&self, e: io::Error) -> SourceError {
        if let Some(errno) = e.raw_os_error() {
            if walk_err(Errno::from_raw_os_error(errno)) {
                return self.refuse("a parent directory is a symlink or not a directory; refusing to write through it".into());
            }
        }
        SourceError::from_io(self.subject, show(self.path), e)
    }

    /// An error honouring a whiteout.
    fn removing(&self, e: Errno) -> SourceError {
        SourceError::from_io(self.subject, show(self.path), e.into())
    }
}

/// Applies the entries of one layer, in order.
pub(super) struct Applier<'a> {
    fs: &'a Fs,
    subject: &'a Subject,
    /// Bytes written into files, all layers.
    written: &'a mut u64,
    touched: Touched,
    parent: Parent,
    buf: Vec<u8>,
}

impl<'a> Applier<'a> {
    pub fn new(fs: &'a Fs, subject: &'a Subject, written: &'a mut u64) -> Self {
        Self {
            fs,
            subject,
            written,
            touched: Touched::default(),
            parent: Parent::default(),
            buf: vec![0u8; 128 * 1024],
        }
    }

    /// Applies `entry`; `data` is its content (read for files only).
    pub fn apply(&mut self, entry: &Entry<'_>, data: &mut impl Read) -> Result<(), SourceError> {
        let blame = Blame {
            subject: self.subject,
            path: entry.path,
        };
        match &entry.kind {
            Kind::Opaque => {
                self.parent = Parent::default();
                self.fs
                    .clear_lower(&entry.at.dir, &self.touched, 0)
                    .map_err(|e| blame.removing(e))
            }
            Kind::Whiteout { victim } => {
                self.parent = Parent::default();
                self.remove_lower(victim).map_err(|e| blame.removing(e))
            }
            _ => self.write(entry, data, &blame),
        }
    }

    /// Removes `victim` unless this layer wrote it.
    fn remove_lower(&self, victim: &At<'_>) -> Result<(), Errno> {
        if self.touched.contains(&victim.components()) {
            return Ok(());
        }
        match self.fs.open_dir(&victim.dir)? {
            Some(dir) => Fs::remove_at(&dir, victim.name, 0),
            None => Ok(()),
        }
    }

    /// Writes a directory, file or link into its (created) parent.
    fn write(
        &mut self,
        entry: &Entry<'_>,
        data: &mut impl Read,
        blame: &Blame<'_>,
    ) -> Result<(), SourceError> {
        self.touched.insert(&entry.at);
        let dir = self
            .parent
            .open(self.fs, &entry.at.dir)
            .map_err(|e| blame.writing(e.into()))?;
        let name = entry.at.name;
        match &entry.kind {
            Kind::Dir => make_dir(dir, name).map_err(|e| blame.writing(e.into())),
            Kind::File { mtime } => {
                let n =
                    write_file(dir, name, data, &mut self.buf, *mtime).map_err(|e| match e {
                        Failed::Stream(e) => super::decode::invalid(self.subject, e),
                        Failed::Disk(e) => blame.writing(e),
                    })?;
                *self.written += n;
                Ok(())
            }
            Kind::Symlink { target } => Fs::remove_at(dir, name, 0)
                .and_then(|()| rustix::fs::symlinkat(*target, dir, name))
                .map_err(|e| blame.writing(e.into())),
            Kind::Hardlink { target, to } => hardlink(self.fs, dir, &entry.at, target, to, blame),
            // `apply` honours whiteouts without coming here.
            Kind::Opaque | Kind::Whiteout { .. } => Ok(()),
        }
    }
}

/// A directory, 0755: one already there is kept (with what is in it);
/// anything else in its place is replaced.
fn make_dir(dir: &OwnedFd, name: &[u8]) -> Result<(), Errno> {
    let fd = match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) if e == Errno::NOENT || walk_err(e) => {
            Fs::remove_at(dir, name, 0)?;
            rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755))?;
            rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?
        }
        Err(e) => return Err(e),
    };
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))
}

/// Why writing a file failed: the layer stream, or the disk.
enum Failed {
    Stream(io::Error),
    Disk(io::Error),
}

impl From<Errno> for Failed {
    fn from(e: Errno) -> Self {
        Failed::Disk(e.into())
    }
}

/// A regular file, 0644 with the entry's mtime (so every replica serves
/// the same Last-Modified), replacing whatever was there. Returns the
/// bytes written.
fn write_file(
    dir: &OwnedFd,
    name: &[u8],
    data: &mut impl Read,
    buf: &mut [u8],
    mtime: i64,
) -> Result<u64, Failed> {
    Fs::remove_at(dir, name, 0)?;
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let mut file = std::fs::File::from(fd);
    let n = copy(data, &mut file, buf)?;
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    rustix::fs::futimens(
        &file,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
    )?;
    rustix::fs::fchmod(&file, Mode::from_raw_mode(0o644))?;
    Ok(n)
}

/// `io::copy` that tells read errors (the stream) from write errors (the
/// disk), with a buffer big enough for decompressed layer data.
fn copy(r: &mut impl Read, w: &mut impl Write, buf: &mut [u8]) -> Result<u64, Failed> {
    let mut n = 0u64;
    loop {
        let k = match r.read(buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failed::Stream(e)),
        };
        w.write_all(&buf[..k]).map_err(Failed::Disk)?;
        n += k as u64;
    }
}

/// A hardlink at `at` (in `dir`) to `to`, which must be a regular file
/// already extracted. A link to itself is a no-op.
fn hardlink(
    fs: &Fs,
    dir: &OwnedFd,
    at: &At<'_>,
    target: &[u8],
    to: &At<'_>,
    blame: &Blame<'_>,
) -> Result<(), SourceError> {
    let not_there = || {
        blame.refuse(format!(
            "hardlink to {:?}, which is not an extracted regular file",
            show(target)
        ))
    };
    let writing = |e: Errno| blame.writing(e.into());
    let tdir = fs
        .open_dir(&to.dir)
        .map_err(writing)?
        .ok_or_else(not_there)?;
    let st = match rustix::fs::statat(&tdir, to.name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Err(not_there()),
        Err(e) => return Err(writing(e)),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(not_there());
    }
    if to == at {
        return Ok(());
    }
    Fs::remove_at(dir, at.name, 0).map_err(writing)?;
    rustix::fs::linkat(&tdir, to.name, dir, at.name, AtFlags::empty()).map_err(writing)
}
