//! Applying layers to the staging tree: only `srv/repo/**` (and the
//! directories leading to it) is written, with OCI whiteouts honoured, and
//! nothing ever written through a symlink.
//!
//! Every path is resolved one component at a time from the staging
//! directory's fd with `O_NOFOLLOW`; missing parents are created as
//! directories; a parent that is a symlink or a non-directory is an error.
//!
//! Entry rules (anywhere in the layer):
//! - an absolute path, a `..` component or a NUL byte is an error, even
//!   outside `srv/repo` (no sane writer produces one);
//! - GNU sparse entries are an error (unsupported);
//! - everything outside `srv/repo` is skipped (its data is still
//!   decompressed, and counted against the limits).
//!
//! Inside `srv/repo` (and for `srv`, `srv/repo` themselves):
//! - `srv` and `srv/repo` must be directories;
//! - regular files are written 0644 with the entry's mtime (so every
//!   replica serves the same Last-Modified); directories are 0755; owners,
//!   setuid bits and xattrs are dropped;
//! - a symlink must be relative and have no `..` component, so that
//!   however it is resolved it stays inside `srv/repo` (stricter than
//!   "does not escape", and enough: ostree repos have no symlinks);
//! - a hardlink must name an already extracted regular file inside
//!   `srv/repo`;
//! - device nodes and FIFOs are an error.
//!
//! Whiteouts (OCI image spec, "Representing Changes"): `.wh.NAME` removes
//! NAME from lower layers; `.wh..wh..opq` hides everything the lower layers
//! put in its directory. Neither touches what the same layer created (in
//! whatever order the entries come). Other `.wh..wh.*` names are ignored.

use super::error::{SourceError, Subject};
use super::verify::VerifyingReader;
use super::Limits;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

/// The only subtree extracted.
const KEEP: [&[u8]; 2] = [b"srv", b"repo"];
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// How a layer's bytes are compressed (from its media type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The staging tree being built: a directory fd, never a path walked by
/// the kernel.
pub struct Tree {
    fs: Fs,
    /// Bytes written into files.
    pub written_bytes: u64,
    /// Tar entries seen, all layers.
    pub entries: u64,
    /// Decompressed bytes, all layers.
    pub decompressed: u64,
}

/// Where an entry's path falls relative to `srv/repo`.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// `.` (the layer root).
    Root,
    /// `srv`.
    Srv,
    /// `srv/repo`.
    Repo,
    /// Below `srv/repo`.
    Inside,
    Outside,
}

fn place(comps: &[&[u8]]) -> Place {
    match comps {
        [] => Place::Root,
        [a] if *a == KEEP[0] => Place::Srv,
        [a, b] if *a == KEEP[0] && *b == KEEP[1] => Place::Repo,
        [a, b, ..] if *a == KEEP[0] && *b == KEEP[1] => Place::Inside,
        _ => Place::Outside,
    }
}

/// Splits a tar path into components, refusing what could escape.
fn components(p: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if p.is_empty() {
        return Err("empty path");
    }
    if p.starts_with(b"/") {
        return Err("absolute path");
    }
    if p.contains(&0) {
        return Err("NUL byte in path");
    }
    let mut out = Vec::new();
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("`..` component"),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

fn join(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

/// Decompressed bytes, counted against the size and ratio limits.
struct Counted<'a, R, C> {
    inner: R,
    compressed: C,
    layer: u64,
    total: &'a mut u64,
    limits: &'a Limits,
    subject: &'a Subject,
    failure: &'a mut Option<SourceError>,
}

impl<R: Read, C: Fn() -> u64> Read for Counted<'_, R, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.layer += n as u64;
        *self.total += n as u64;
        let err = if *self.total > self.limits.max_decompressed_bytes {
            Some(SourceError::LimitExceeded {
                subject: self.subject.clone(),
                limit: "decompressed size",
                detail: format!(
                    "more than {} bytes decompressed",
                    self.limits.max_decompressed_bytes
                ),
            })
        } else if self.layer > self.limits.ratio_grace_bytes
            && self.layer
                > self
                    .limits
                    .max_ratio
                    .saturating_mul((self.compressed)().max(1))
        {
            Some(SourceError::LimitExceeded {
                subject: self.subject.clone(),
                limit: "compression ratio",
                detail: format!(
                    "{} bytes decompressed from {} compressed, over the {}:1 limit",
                    self.layer,
                    (self.compressed)(),
                    self.limits.max_ratio
                ),
            })
        } else {
            None
        };
        if let Some(e) = err {
            let msg = e.to_string();
            self.failure.get_or_insert(e);
            return Err(io::Error::other(msg));
        }
        Ok(n)
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
    fn insert(&mut self, comps: &[&[u8]]) {
        let k = self.key(comps);
        self.set.insert(k);
    }
    fn contains(&self, comps: &[&[u8]]) -> bool {
        self.set.contains(&self.key(comps))
    }
}

/// Extension headers waiting for the entry they describe.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

fn strip_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

fn walk_err(e: Errno) -> bool {
    matches!(e, Errno::LOOP | Errno::NOTDIR | Errno::MLINK)
}

/// The staging directory's fd and the no-follow operations on it.
struct Fs {
    root: OwnedFd,
}

impl Tree {
    /// Opens the (new, empty) staging directory.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            fs: Fs { root },
            written_bytes: 0,
            entries: 0,
            decompressed: 0,
        })
    }

    /// Flushes everything written to stable storage (the whole filesystem:
    /// one syscall instead of one fsync per file).
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::syncfs(&self.fs.root)?)
    }

    /// Applies one layer, read (compressed) from `blob`. On success the
    /// layer's tar stream has been fully applied; the caller still has to
    /// `blob.finish()` to verify the digest.
    pub fn apply_layer<R: Read>(
        &mut self,
        blob: &mut VerifyingReader<R>,
        compression: Compression,
        subject: &Subject,
        limits: &Limits,
    ) -> Result<(), SourceError> {
        let count = blob.count_handle();
        let mut failure = None;
        let result = {
            let decoder: Box<dyn Read + '_> = match compression {
                Compression::None => Box::new(&mut *blob),
                Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&mut *blob)),
                Compression::Zstd => match zstd::stream::read::Decoder::new(&mut *blob) {
                    Ok(d) => Box::new(d),
                    Err(e) => {
                        return Err(SourceError::Invalid {
                            subject: subject.clone(),
                            reason: format!("zstd: {e}"),
                        })
                    }
                },
            };
            let counted = Counted {
                inner: decoder,
                compressed: || count.get(),
                layer: 0,
                total: &mut self.decompressed,
                limits,
                subject,
                failure: &mut failure,
            };
            let mut archive = tar::Archive::new(counted);
            apply_entries(
                &self.fs,
                &mut self.written_bytes,
                &mut self.entries,
                &mut archive,
                subject,
                limits,
            )
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                // The root cause first: a broken stream (digest, size,
                // truncation, network) or a limit hit while decompressing.
                if let Some(f) = blob.failure.take() {
                    return Err(f);
                }
                if let Some(f) = failure {
                    return Err(f);
                }
                if let SourceError::Invalid { .. } = e {
                    // Corrupt data is often a corrupted transfer: if the
                    // blob's digest does not match, say that.
                    blob.finish()?;
                }
                Err(e)
            }
        }
    }
}

fn apply_entries<R: Read>(
    tree: &Fs,
    written: &mut u64,
    entries: &mut u64,
    archive: &mut tar::Archive<R>,
    subject: &Subject,
    limits: &Limits,
) -> Result<(), SourceError> {
    let invalid = |e: io::Error| SourceError::Invalid {
        subject: subject.clone(),
        reason: format!("tar: {e}"),
    };
    let mut iter = archive.entries().map_err(invalid)?;
    iter = iter.raw(true);
    let mut pending = Pending::default();
    let mut touched = Touched::default();
    // The last parent directory opened: entries of a directory come
    // together (objects/XX/…), so this saves walking from the root each
    // time. Only whiteouts remove anything but entries of that directory,
    // and they clear it.
    let mut parent_cache: Option<(Vec<u8>, OwnedFd)> = None;
    let mut buf = vec![0u8; 128 * 1024];
    for entry in iter {
        let mut entry = entry.map_err(invalid)?;
        *entries += 1;
        if *entries > limits.max_entries {
            return Err(SourceError::LimitExceeded {
                subject: subject.clone(),
                limit: "tar entries",
                detail: format!("more than {} entries", limits.max_entries),
            });
        }
        let et = entry.header().entry_type();
        let size = entry.header().entry_size().map_err(invalid)?;
        let ext_limit = |what: &str| SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: "tar extension header",
            detail: format!(
                "a {what} header of {size} bytes (limit {})",
                limits.max_extension_bytes
            ),
        };
        let read_ext =
            |entry: &mut tar::Entry<'_, R>, what: &str| -> Result<Vec<u8>, SourceError> {
                if size > limits.max_extension_bytes {
                    return Err(ext_limit(what));
                }
                let mut v = Vec::with_capacity(size as usize);
                entry.read_to_end(&mut v).map_err(invalid)?;
                Ok(v)
            };
        match et {
            tar::EntryType::GNULongName => {
                pending.path = Some(strip_nuls(read_ext(&mut entry, "GNU long name")?));
                continue;
            }
            tar::EntryType::GNULongLink => {
                pending.link = Some(strip_nuls(read_ext(&mut entry, "GNU long link")?));
                continue;
            }
            tar::EntryType::XHeader => {
                let data = read_ext(&mut entry, "PAX")?;
                for ext in tar::PaxExtensions::new(&data) {
                    let ext = ext.map_err(invalid)?;
                    match ext.key_bytes() {
                        b"path" => pending.path = Some(ext.value_bytes().to_vec()),
                        b"linkpath" => pending.link = Some(ext.value_bytes().to_vec()),
                        b"size" => {
                            let v = std::str::from_utf8(ext.value_bytes())
                                .ok()
                                .and_then(|s| s.parse().ok());
                            pending.size = Some(v.ok_or_else(|| SourceError::Invalid {
                                subject: subject.clone(),
                                reason: "tar: bad PAX size".into(),
                            })?);
                        }
                        _ => {}
                    }
                }
                continue;
            }
            tar::EntryType::XGlobalHeader => {
                read_ext(&mut entry, "PAX global")?;
                continue;
            }
            _ => {}
        }
        let ext = std::mem::take(&mut pending);
        let path = match ext.path {
            Some(p) => p,
            None => entry.header().path_bytes().into_owned(),
        };
        let link = match ext.link {
            Some(l) => Some(l),
            None => entry.header().link_name_bytes().map(|c| c.into_owned()),
        };
        let unsafe_entry = |why: String| SourceError::UnsafeEntry {
            subject: subject.clone(),
            path: show(&path),
            why,
        };
        if ext.size.is_some_and(|s| s != size) {
            return Err(SourceError::Unsupported {
                subject: subject.clone(),
                reason: format!(
                    "tar entry {:?} has a PAX size (files over 8 GiB are not supported)",
                    show(&path)
                ),
            });
        }
        if et == tar::EntryType::GNUSparse {
            return Err(SourceError::Unsupported {
                subject: subject.clone(),
                reason: format!("GNU sparse tar entry {:?}", show(&path)),
            });
        }
        if path.len() > limits.max_path_bytes
            || link
                .as_ref()
                .is_some_and(|l| l.len() > limits.max_path_bytes)
        {
            return Err(unsafe_entry(format!(
                "path or link target longer than {} bytes",
                limits.max_path_bytes
            )));
        }
        let comps = components(&path).map_err(|why| unsafe_entry(why.into()))?;
        let Some((name, parent)) = comps.split_last() else {
            continue;
        };

        // Whiteouts.
        if let Some(target) = name.strip_prefix(WHITEOUT) {
            parent_cache = None;
            if *name == OPAQUE {
                if place(parent) != Place::Outside {
                    tree.clear_lower(parent, &touched, 0)
                        .map_err(|e| SourceError::from_io(subject, show(&path), e.into()))?;
                }
            } else if !target.starts_with(WHITEOUT) {
                if target.is_empty() || target == b"." || target == b".." {
                    return Err(unsafe_entry("whiteout of an invalid name".into()));
                }
                let mut victim = parent.to_vec();
                victim.push(target);
                if place(&victim) != Place::Outside && !touched.contains(&victim) {
                    if let Some(dir) = tree
                        .open_dir(parent, false)
                        .map_err(|e| SourceError::from_io(subject, show(&path), e.into()))?
                    {
                        Fs::remove_at(&dir, target, 0)
                            .map_err(|e| SourceError::from_io(subject, show(&path), e.into()))?;
                    }
                }
            }
            continue;
        }

        let here = place(&comps);
        if here == Place::Outside || here == Place::Root {
            continue;
        }
        if comps.len() > limits.max_depth {
            return Err(unsafe_entry(format!(
                "deeper than {} components",
                limits.max_depth
            )));
        }
        if matches!(here, Place::Srv | Place::Repo) && et != tar::EntryType::Directory {
            return Err(unsafe_entry("srv and srv/repo must be directories".into()));
        }
        for i in 1..=comps.len() {
            touched.insert(&comps[..i]);
        }
        let io_err = |e: io::Error| {
            if let Some(errno) = e.raw_os_error() {
                if walk_err(Errno::from_raw_os_error(errno)) {
                    return unsafe_entry("a parent directory is a symlink or not a directory; refusing to write through it".into());
                }
            }
            SourceError::from_io(subject, show(&path), e)
        };
        let key = join(parent);
        if parent_cache.as_ref().is_none_or(|(k, _)| *k != key) {
            let fd = tree
                .open_dir(parent, true)
                .map_err(|e| io_err(e.into()))?
                .expect("created");
            parent_cache = Some((key, fd));
        }
        let dir = &parent_cache.as_ref().expect("just set").1;
        match et {
            tar::EntryType::Directory => {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = match rustix::fs::openat(dir, *name, flags, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(e) if e == Errno::NOENT || walk_err(e) => {
                        Fs::remove_at(dir, name, 0).map_err(|e| io_err(e.into()))?;
                        rustix::fs::mkdirat(dir, *name, Mode::from_raw_mode(0o755))
                            .map_err(|e| io_err(e.into()))?;
                        rustix::fs::openat(dir, *name, flags, Mode::empty())
                            .map_err(|e| io_err(e.into()))?
                    }
                    Err(e) => return Err(io_err(e.into())),
                };
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))
                    .map_err(|e| io_err(e.into()))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                Fs::remove_at(dir, name, 0).map_err(|e| io_err(e.into()))?;
                let fd = rustix::fs::openat(
                    dir,
                    *name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .map_err(|e| io_err(e.into()))?;
                let mut file = std::fs::File::from(fd);
                let n = copy(&mut entry, &mut file, &mut buf).map_err(|e| match e {
                    CopyError::Read(e) => invalid(e),
                    CopyError::Write(e) => io_err(e),
                })?;
                *written += n;
                let mtime = entry.header().mtime().unwrap_or(0).min(i64::MAX as u64) as i64;
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
                )
                .map_err(|e| io_err(e.into()))?;
                rustix::fs::fchmod(&file, Mode::from_raw_mode(0o644))
                    .map_err(|e| io_err(e.into()))?;
            }
            tar::EntryType::Symlink => {
                let target = link.unwrap_or_default();
                let bad = target.is_empty()
                    || target.starts_with(b"/")
                    || target.contains(&0)
                    || target.split(|&b| b == b'/').any(|c| c == b"..");
                if bad {
                    return Err(unsafe_entry(format!(
                            "symlink to {:?}: inside srv/repo a symlink must be relative and have no `..` (it could point outside)",
                            show(&target)
                        )));
                }
                Fs::remove_at(dir, name, 0).map_err(|e| io_err(e.into()))?;
                rustix::fs::symlinkat(target.as_slice(), dir, *name)
                    .map_err(|e| io_err(e.into()))?;
            }
            tar::EntryType::Link => {
                let target = link.unwrap_or_default();
                let tcomps = components(&target).map_err(|why| {
                    unsafe_entry(format!("hardlink target {:?}: {why}", show(&target)))
                })?;
                if place(&tcomps) != Place::Inside {
                    return Err(unsafe_entry(format!(
                        "hardlink to {:?}, outside srv/repo",
                        show(&target)
                    )));
                }
                let (tname, tparent) = tcomps.split_last().expect("inside has components");
                let not_there = || {
                    unsafe_entry(format!(
                        "hardlink to {:?}, which is not an extracted regular file",
                        show(&target)
                    ))
                };
                let tdir = tree
                    .open_dir(tparent, false)
                    .map_err(|e| io_err(e.into()))?
                    .ok_or_else(not_there)?;
                let st = match rustix::fs::statat(&tdir, *tname, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    Err(Errno::NOENT) => return Err(not_there()),
                    Err(e) => return Err(io_err(e.into())),
                };
                if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                    return Err(not_there());
                }
                if tcomps == comps {
                    continue;
                }
                Fs::remove_at(dir, name, 0).map_err(|e| io_err(e.into()))?;
                rustix::fs::linkat(&tdir, *tname, dir, *name, AtFlags::empty())
                    .map_err(|e| io_err(e.into()))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(unsafe_entry(
                    "device nodes and FIFOs are not allowed in srv/repo".into(),
                ));
            }
            other => {
                return Err(SourceError::Unsupported {
                    subject: subject.clone(),
                    reason: format!("tar entry {:?} of type {other:?}", show(&path)),
                })
            }
        }
    }
    if pending.path.is_some() || pending.link.is_some() {
        return Err(SourceError::Invalid {
            subject: subject.clone(),
            reason: "tar: extension header without the entry it describes".into(),
        });
    }
    Ok(())
}

impl Fs {
    /// Opens the directory `comps` (relative to the root) without following
    /// symlinks, creating missing components if `create`. `Ok(None)` if it
    /// does not exist (or is not a plain directory) and `create` is false.
    fn open_dir(&self, comps: &[&[u8]], create: bool) -> Result<Option<OwnedFd>, Errno> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut dir = rustix::io::dup(&self.root)?;
        for c in comps {
            dir = match rustix::fs::openat(&dir, *c, flags, Mode::empty()) {
                Ok(d) => d,
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&dir, *c, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e),
                    }
                    rustix::fs::openat(&dir, *c, flags, Mode::empty())?
                }
                Err(e) if !create && (e == Errno::NOENT || walk_err(e)) => return Ok(None),
                Err(e) => return Err(e),
            };
        }
        Ok(Some(dir))
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
        let sub = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
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
        let Some(dir) = self.open_dir(comps, false)? else {
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

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// `io::copy` that tells read errors (the stream) from write errors (the
/// disk), with a buffer big enough for decompressed layer data.
fn copy(r: &mut impl Read, w: &mut impl Write, buf: &mut [u8]) -> Result<u64, CopyError> {
    let mut n = 0u64;
    loop {
        let k = match r.read(buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        w.write_all(&buf[..k]).map_err(CopyError::Write)?;
        n += k as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_refuse_escapes() {
        assert_eq!(
            components(b"./srv//repo/./x").unwrap(),
            vec![&b"srv"[..], b"repo", b"x"]
        );
        assert_eq!(components(b"./").unwrap(), Vec::<&[u8]>::new());
        for (p, why) in [
            (&b"/etc/passwd"[..], "absolute"),
            (b"srv/../x", "`..`"),
            (b"..", "`..`"),
            (b"", "empty"),
            (b"a\0b", "NUL"),
        ] {
            assert!(components(p).unwrap_err().contains(why), "{p:?}");
        }
    }

    #[test]
    fn places() {
        let p = |s: &str| place(&components(s.as_bytes()).unwrap());
        assert_eq!(p("."), Place::Root);
        assert_eq!(p("srv"), Place::Srv);
        assert_eq!(p("srv/repo/"), Place::Repo);
        assert_eq!(p("srv/repo/objects"), Place::Inside);
        assert_eq!(p("srv/repository"), Place::Outside);
        assert_eq!(p("usr/srv/repo"), Place::Outside);
    }
}
