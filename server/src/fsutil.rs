//! Reading the served tree without ever leaving it.
//!
//! Every path is opened one component at a time with `O_NOFOLLOW`, relative
//! to a directory fd: a symlink anywhere inside the repo (planted by an
//! image, or by a tool writing the repo) is never followed, and `..`/`.`/empty
//! components are refused before any syscall. This is portable to kernels
//! and seccomp profiles without `openat2`, and the URL grammar in
//! `oscontent_format::RepoPath` already refuses such names; this layer is
//! the second lock on the same door.
//!
//! The request path opens with one `openat2` from a directory fd held for
//! the generation ([`open_beneath`]): `RESOLVE_BENEATH` and
//! `RESOLVE_NO_SYMLINKS` give the same guarantee as the walk in one
//! syscall; where `openat2` is refused (old kernels, seccomp profiles) it
//! falls back to the walk. Objects go one step further: their fan-out
//! directories are held too ([`open_dir_beneath`]), and an object's file
//! name, a single component, is opened in its one with `O_NOFOLLOW`
//! ([`open_entry`]).
//!
//! [`mod@write`] is the same walk for what the server writes from remote data.

mod write;

pub use write::{create_dirs, remove_file, rename_into, write_atomic, write_durable, FILE_MODE};

use rustix::fs::{openat, openat2, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::{Errno, ReadWriteFlags};
use std::fs::File;
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Largest directory depth walked (refs nest a few levels; deltas two).
pub const MAX_DEPTH: usize = 32;

fn valid_component(c: &str) -> bool {
    !c.is_empty() && c != "." && c != ".." && !c.contains('\0')
}

/// Opens a served root directory (following a symlink at the root
/// itself, as [`open_file`] does). `Ok(None)` if it does not exist.
pub fn open_dir(root: &Path) -> io::Result<Option<OwnedFd>> {
    match open_root(root) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn open_root(root: &Path) -> io::Result<OwnedFd> {
    // The root itself may be a symlink (a mount path, a Kubernetes volume
    // `..data` link): that is the operator's choice, so it is followed.
    Ok(openat(
        CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Maps "this is not a plain file/dir beneath the root" to `None`.
fn absent(e: Errno) -> io::Result<Option<OwnedFd>> {
    match e {
        // ELOOP: a symlink met with O_NOFOLLOW; ENOTDIR: a non-directory in
        // the middle, or a symlink where a directory was expected.
        Errno::NOENT | Errno::NOTDIR | Errno::LOOP => Ok(None),
        e => Err(e.into()),
    }
}

fn walk(root: &Path, rel: &str, last_flags: OFlags) -> io::Result<Option<OwnedFd>> {
    if !valid_rel(rel) {
        return Ok(None);
    }
    let dir = match open_root(root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    walk_from(dir.as_fd(), rel, last_flags)
}

fn valid_rel(rel: &str) -> bool {
    let mut n = 0;
    rel.split('/').all(|c| {
        n += 1;
        n <= MAX_DEPTH && valid_component(c)
    })
}

/// The component walk from an open directory; `rel` already checked.
fn walk_from(root: BorrowedFd<'_>, rel: &str, last_flags: OFlags) -> io::Result<Option<OwnedFd>> {
    let comps: Vec<&str> = rel.split('/').collect();
    let (last, parents) = comps.split_last().expect("split yields at least one");
    let mut dir: Option<OwnedFd> = None;
    for c in parents {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let at = dir.as_ref().map_or(root, |d| d.as_fd());
        dir = match openat(at, *c, flags, Mode::empty()) {
            Ok(d) => Some(d),
            Err(e) => return absent(e),
        };
    }
    let at = dir.as_ref().map_or(root, |d| d.as_fd());
    match openat(
        at,
        *last,
        last_flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(f) => Ok(Some(f)),
        Err(e) => absent(e),
    }
}

/// Cleared the first time the kernel refuses `openat2` itself.
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// What [`open_beneath`] and [`open_entry`] found.
#[derive(Debug)]
pub enum Opened {
    File(File, std::fs::Metadata),
    /// Not there, or not a regular file reached without a symlink.
    Absent,
    /// `nonblocking` was asked and the path is not all in the dentry
    /// cache: open it again from a thread that may block.
    WouldBlock,
}

/// What [`open_dir_beneath`] found (a directory fd, or what its holder
/// lends).
#[derive(Debug)]
pub enum Lookup<T = OwnedFd> {
    Found(T),
    /// Not there, or not reached without a symlink.
    Absent,
    /// As [`Opened::WouldBlock`].
    WouldBlock,
}

/// How files are opened for reading: O_NONBLOCK so that a FIFO planted in
/// the tree never hangs us; never through a symlink.
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens `rel` beneath the directory `root` (an fd the caller holds) if it
/// is a regular file reached without any symlink or `..` leaving it:
/// one `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`. With
/// `nonblocking`, also `RESOLVE_CACHED`, so the runtime's threads never
/// wait on the disk for a lookup. Falls back to the component walk where
/// `openat2` is unavailable.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &str, nonblocking: bool) -> io::Result<Opened> {
    Ok(match lookup_beneath(root, rel, READ_FLAGS, nonblocking)? {
        Lookup::Found(fd) => regular(fd)?,
        Lookup::Absent => Opened::Absent,
        Lookup::WouldBlock => Opened::WouldBlock,
    })
}

/// The directory `rel` beneath `root`, as [`open_beneath`] opens a file.
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &str, nonblocking: bool) -> io::Result<Lookup> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    lookup_beneath(root, rel, flags, nonblocking)
}

/// The metadata of whatever `rel` beneath `root` is (a file, a directory,
/// a symlink itself), found as [`open_beneath`] finds a file: it names what
/// is there by identity without opening it for reading.
pub fn stat_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
    nonblocking: bool,
) -> io::Result<Lookup<std::fs::Metadata>> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(match lookup_beneath(root, rel, flags, nonblocking)? {
        Lookup::Found(fd) => Lookup::Found(File::from(fd).metadata()?),
        Lookup::Absent => Lookup::Absent,
        Lookup::WouldBlock => Lookup::WouldBlock,
    })
}

/// Opens `name`, one plain component, in the directory `dir` (an fd the
/// caller holds, itself opened beneath a root) if it is a regular file.
/// A single component cannot leave `dir`, and `O_NOFOLLOW` refuses a
/// symlink, so this is [`open_beneath`]'s guarantee without a scoped walk:
/// with the object fan-out directories held, an object's open is one
/// lookup instead of three under `RESOLVE_BENEATH` (`served/objects.rs`).
pub fn open_entry(dir: BorrowedFd<'_>, name: &str, nonblocking: bool) -> io::Result<Opened> {
    if name.contains('/') || !valid_component(name) {
        return Ok(Opened::Absent);
    }
    let opened = if !nonblocking {
        openat(dir, name, READ_FLAGS, Mode::empty())
    } else if OPENAT2.load(Ordering::Relaxed) {
        match openat2(dir, name, READ_FLAGS, Mode::empty(), ResolveFlags::CACHED) {
            Err(Errno::AGAIN) => return Ok(Opened::WouldBlock),
            Err(Errno::NOSYS | Errno::PERM) => {
                openat2_refused();
                return Ok(Opened::WouldBlock);
            }
            other => other,
        }
    } else {
        return Ok(Opened::WouldBlock);
    };
    match opened {
        Ok(fd) => regular(fd),
        Err(Errno::NOENT | Errno::LOOP) => Ok(Opened::Absent),
        Err(e) => Err(e.into()),
    }
}

fn openat2_refused() {
    tracing::info!("openat2 unavailable; reading the tree one component at a time");
    OPENAT2.store(false, Ordering::Relaxed);
}

/// `rel` beneath `root` with `flags` (which must hold `O_NOFOLLOW`): one
/// `openat2`, or the component walk where it is refused.
fn lookup_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    nonblocking: bool,
) -> io::Result<Lookup> {
    if !valid_rel(rel) {
        return Ok(Lookup::Absent);
    }
    let fd = if OPENAT2.load(Ordering::Relaxed) {
        let mut resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        if nonblocking {
            resolve |= ResolveFlags::CACHED;
        }
        match openat2(root, rel, flags, Mode::empty(), resolve) {
            Ok(fd) => Some(fd),
            Err(Errno::AGAIN) if nonblocking => return Ok(Lookup::WouldBlock),
            // EXDEV: the path would leave the root.
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => None,
            Err(Errno::NOSYS | Errno::PERM) => {
                openat2_refused();
                if nonblocking {
                    return Ok(Lookup::WouldBlock);
                }
                walk_from(root, rel, flags)?
            }
            Err(e) => return Err(e.into()),
        }
    } else if nonblocking {
        return Ok(Lookup::WouldBlock);
    } else {
        walk_from(root, rel, flags)?
    };
    Ok(fd.map_or(Lookup::Absent, Lookup::Found))
}

/// `fd` as an open file, if it is a regular one.
fn regular(fd: OwnedFd) -> io::Result<Opened> {
    let file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(Opened::Absent);
    }
    Ok(Opened::File(file, meta))
}

/// Reads up to `buf.len()` bytes at `offset` only if they are in the page
/// cache (`preadv2` with `RWF_NOWAIT`): `Ok(None)` means the read would
/// wait on the disk (or the filesystem cannot say), so the caller reads
/// from a thread that may block. A short count is what was cached.
pub fn read_cached(file: &File, buf: &mut [u8], offset: u64) -> io::Result<Option<usize>> {
    match rustix::io::preadv2(
        file,
        &mut [IoSliceMut::new(buf)],
        offset,
        ReadWriteFlags::NOWAIT,
    ) {
        Ok(0) if !buf.is_empty() => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(Errno::AGAIN | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Fills `buf` from `offset`, blocking as needed; fewer bytes only at the
/// end of the file.
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Opens `root/rel` for reading if it is a regular file reached without any
/// symlink. `Ok(None)` if it does not exist (or is not a plain file).
pub fn open_file(root: &Path, rel: &str) -> io::Result<Option<(File, std::fs::Metadata)>> {
    // O_NONBLOCK: never hang on a FIFO planted in the tree.
    let Some(fd) = walk(root, rel, OFlags::RDONLY | OFlags::NONBLOCK)? else {
        return Ok(None);
    };
    let file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Some((file, meta)))
}

/// What [`open_plain`] found where a regular file should be.
#[derive(Debug)]
pub enum Plain {
    File(File, std::fs::Metadata),
    Absent,
    /// A symlink, not followed.
    Symlink,
    /// A FIFO, socket, device or directory: opened without waiting
    /// (`O_NONBLOCK`) and not read.
    Other(std::fs::FileType),
}

/// Opens `name`, one component of the directory `dir` (itself followed
/// if a symlink, as [`open_dir`] does), only if it is a regular file:
/// never through a symlink, never waiting on a FIFO, and saying what was
/// there instead, so a caller can name it in its error.
pub fn open_plain(dir: &Path, name: &str) -> io::Result<Plain> {
    if name.contains('/') || !valid_component(name) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not one path component"),
        ));
    }
    let Some(dir) = open_dir(dir)? else {
        return Ok(Plain::Absent);
    };
    match openat(&dir, name, READ_FLAGS, Mode::empty()) {
        Ok(fd) => {
            let file = File::from(fd);
            let meta = file.metadata()?;
            Ok(if meta.is_file() {
                Plain::File(file, meta)
            } else {
                Plain::Other(meta.file_type())
            })
        }
        Err(Errno::NOENT) => Ok(Plain::Absent),
        // With O_NOFOLLOW, ELOOP is the last component being a symlink.
        Err(Errno::LOOP) => Ok(Plain::Symlink),
        Err(e) => Err(e.into()),
    }
}

/// Reads a small file fully; files over `max` bytes are an error, because
/// the callers (refs, config, summary) expect small metadata.
pub fn read_file(
    root: &Path,
    rel: &str,
    max: u64,
) -> io::Result<Option<(Vec<u8>, std::fs::Metadata)>> {
    let Some((file, meta)) = open_file(root, rel)? else {
        return Ok(None);
    };
    if meta.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{rel} is {} bytes, over the {max} byte limit", meta.len()),
        ));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut buf)?;
    Ok(Some((buf, meta)))
}

/// An entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
    pub is_file: bool,
}

/// Lists `root/rel` (without following symlinks; they appear as neither
/// file nor dir). At most `max` entries; more is an error. Non-UTF-8 names
/// are skipped: no valid ostree name needs them.
pub fn list_dir(root: &Path, rel: &str, max: usize) -> io::Result<Option<Vec<Entry>>> {
    let dir = if rel.is_empty() {
        match open_root(root) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
    } else {
        match walk(root, rel, OFlags::RDONLY | OFlags::DIRECTORY)? {
            Some(d) => d,
            None => return Ok(None),
        }
    };
    let mut out = Vec::new();
    for ent in rustix::fs::Dir::read_from(&dir)? {
        let ent = ent?;
        let Ok(name) = ent.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        // d_type may be DT_UNKNOWN on some filesystems: fall back to a
        // no-follow stat.
        let ft = match ent.file_type() {
            rustix::fs::FileType::Unknown => {
                rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))?
            }
            t => t,
        };
        out.push(Entry {
            name: name.to_owned(),
            is_dir: ft == rustix::fs::FileType::Directory,
            is_file: ft == rustix::fs::FileType::RegularFile,
        });
        if out.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}/{rel} has more than {max} entries", root.display()),
            ));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    // long-fn: one planted tree, asked every way a path could escape it
    #[test]
    fn never_follows_symlinks_or_dotdot() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s3cret").unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("refs/heads")).unwrap();
        std::fs::write(r.join("refs/heads/ok"), b"x").unwrap();
        symlink(outside.path().join("secret"), r.join("refs/heads/link")).unwrap();
        symlink(outside.path(), r.join("refs/escape")).unwrap();
        std::fs::create_dir(r.join("fifo-dir")).unwrap();
        rustix::fs::mknodat(
            CWD,
            r.join("fifo-dir/fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();

        let cases: &[(&str, bool)] = &[
            ("refs/heads/ok", true),
            ("refs/heads/link", false),
            ("refs/escape/secret", false),
            ("refs/heads/../heads/ok", false),
            ("./refs/heads/ok", false),
            ("refs//heads/ok", false),
            ("fifo-dir/fifo", false),
            ("refs/heads", false),
            ("missing", false),
        ];
        for (rel, found) in cases {
            let got = open_file(r, rel).unwrap();
            assert_eq!(got.is_some(), *found, "{rel}");
        }
        let dir = open_dir(r).unwrap().unwrap();
        for nonblocking in [false, true] {
            for (rel, found) in cases {
                let got = match open_beneath(dir.as_fd(), rel, nonblocking).unwrap() {
                    Opened::File(..) => true,
                    Opened::Absent => false,
                    // Not in the dentry cache yet: the blocking open says.
                    Opened::WouldBlock => {
                        matches!(
                            open_beneath(dir.as_fd(), rel, false).unwrap(),
                            Opened::File(..)
                        )
                    }
                };
                assert_eq!(got, *found, "openat2 {rel} (nonblocking {nonblocking})");
            }
        }
        // One component in a directory held: what the object path opens.
        let Lookup::Found(heads) = open_dir_beneath(dir.as_fd(), "refs/heads", false).unwrap()
        else {
            panic!("refs/heads is a directory beneath the root");
        };
        for (rel, want) in [
            ("refs/escape", false),
            ("refs/heads/ok", false),
            ("refs/../refs", false),
            ("fifo-dir", true),
        ] {
            let got = open_dir_beneath(dir.as_fd(), rel, false).unwrap();
            assert_eq!(matches!(got, Lookup::Found(_)), want, "{rel}");
        }
        // What is there, by identity: a symlink is named, never followed.
        let ino = |p: &str| std::fs::symlink_metadata(r.join(p)).unwrap().ino();
        for (rel, want) in [
            ("refs/heads/ok", Some(ino("refs/heads/ok"))),
            ("refs/heads", Some(ino("refs/heads"))),
            ("refs/heads/link", Some(ino("refs/heads/link"))),
            ("refs/escape/secret", None),
            ("refs/heads/../heads/ok", None),
            ("missing", None),
        ] {
            for nonblocking in [false, true] {
                let got = match stat_beneath(dir.as_fd(), rel, nonblocking).unwrap() {
                    Lookup::Found(m) => Some(m.ino()),
                    Lookup::Absent => None,
                    Lookup::WouldBlock => {
                        assert!(nonblocking, "{rel}: only a nonblocking lookup waits");
                        continue;
                    }
                };
                assert_eq!(got, want, "stat {rel} (nonblocking {nonblocking})");
            }
        }
        let names: &[(&str, BorrowedFd<'_>, bool)] = &[
            ("ok", heads.as_fd(), true),
            ("link", heads.as_fd(), false),
            ("..", heads.as_fd(), false),
            (".", heads.as_fd(), false),
            ("", heads.as_fd(), false),
            ("heads/ok", dir.as_fd(), false),
            ("refs", dir.as_fd(), false),
            ("missing", heads.as_fd(), false),
        ];
        for nonblocking in [false, true] {
            for (name, at, found) in names {
                let got = match open_entry(*at, name, nonblocking).unwrap() {
                    Opened::File(..) => true,
                    Opened::Absent => false,
                    Opened::WouldBlock => {
                        matches!(open_entry(*at, name, false).unwrap(), Opened::File(..))
                    }
                };
                assert_eq!(got, *found, "entry {name:?} (nonblocking {nonblocking})");
            }
        }
        let Lookup::Found(fifos) = open_dir_beneath(dir.as_fd(), "fifo-dir", false).unwrap() else {
            panic!("fifo-dir is a directory");
        };
        assert!(matches!(
            open_entry(fifos.as_fd(), "fifo", false).unwrap(),
            Opened::Absent
        ));

        let listing = list_dir(r, "refs", 10).unwrap().unwrap();
        let escape = listing.iter().find(|e| e.name == "escape").unwrap();
        assert!(
            !escape.is_dir && !escape.is_file,
            "symlink listed as {escape:?}"
        );
        assert!(list_dir(r, "refs/escape", 10).unwrap().is_none());
    }

    #[test]
    fn read_file_bounds_size() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("big"), vec![0u8; 100]).unwrap();
        assert!(read_file(root.path(), "big", 99).is_err());
        assert_eq!(
            read_file(root.path(), "big", 100).unwrap().unwrap().0.len(),
            100
        );
    }
}
