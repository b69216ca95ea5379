//! The write half: every file the server writes from remote data (a
//! mirror's store, a generation's overlay, a bundle) goes in beneath a
//! directory fd, one component at a time with `O_NOFOLLOW`, missing
//! directories made with `mkdirat`, the file itself created under a
//! temporary name and renamed over the destination with `renameat`. A
//! symlink planted anywhere below the root (by another tool, or an
//! earlier bug) is refused, never followed; the callers have already
//! checked the path against the archive grammar (`RepoPath`, refs,
//! collection IDs), and this is the second lock on the same door.

use super::{open_root, valid_component, MAX_DEPTH};
use rustix::fs::{mkdirat, openat, renameat, unlinkat, AtFlags, Mode, OFlags, CWD};
use rustix::io::Errno;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// Directories the server makes: readable by a static web server.
const DIR_MODE: u32 = 0o755;
/// Files the server writes: readable by a static web server.
pub const FILE_MODE: u32 = 0o644;

/// Splits `rel` into its components, refusing `..`, `.`, empty ones and
/// paths deeper than [`MAX_DEPTH`] before any syscall.
fn components(rel: &str) -> io::Result<Vec<&str>> {
    let comps: Vec<&str> = rel.split('/').collect();
    if comps.len() > MAX_DEPTH || !comps.iter().all(|c| valid_component(c)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to write {rel:?}: not a plain relative path"),
        ));
    }
    Ok(comps)
}

/// Opens `root/dirs...`, making missing directories, never following a
/// symlink below the root.
fn open_dirs(root: &Path, dirs: &[&str], rel: &str) -> io::Result<OwnedFd> {
    let mut dir = open_root(root)?;
    for c in dirs {
        dir = match openat(&dir, *c, DIR_FLAGS, Mode::empty()) {
            Ok(d) => d,
            Err(Errno::NOENT) => {
                match mkdirat(&dir, *c, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                openat(&dir, *c, DIR_FLAGS, Mode::empty()).map_err(|e| refused(e, rel, c))?
            }
            Err(e) => return Err(refused(e, rel, c)),
        };
    }
    Ok(dir)
}

/// A component that is a symlink or not a directory says so by name.
fn refused(e: Errno, rel: &str, component: &str) -> io::Error {
    match e {
        Errno::LOOP | Errno::NOTDIR => io::Error::other(format!(
            "refusing to write {rel:?}: {component:?} is a symlink or not a directory \
             (never followed)"
        )),
        e => e.into(),
    }
}

/// Makes `root/rel` and every missing directory on the way (none of them
/// a symlink).
pub fn create_dirs(root: &Path, rel: &str) -> io::Result<()> {
    open_dirs(root, &components(rel)?, rel).map(drop)
}

/// The directory `rel` goes in (made if missing) and its last component.
fn parent_of<'a>(root: &Path, rel: &'a str) -> io::Result<(OwnedFd, &'a str)> {
    let comps = components(rel)?;
    let (last, dirs) = comps.split_last().expect("split yields at least one");
    Ok((open_dirs(root, dirs, rel)?, last))
}

/// A name for a temporary file beside the destination: unique within the
/// process, and never a name of the archive layout (a leading dot).
fn temp_name(last: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(".tmp-{}-{n}-{last}", std::process::id())
}

/// Writes `bytes` to `root/rel` atomically (a reader sees the old file or
/// the new one), mode [`FILE_MODE`]. Nothing is left behind on error.
pub fn write_atomic(root: &Path, rel: &str, bytes: &[u8]) -> io::Result<()> {
    write_new(root, rel, bytes, false)
}

/// [`write_atomic`], durable when it returns: the file is fsynced before
/// the rename and its directory after it, so a power cut leaves the old
/// file or the new one, whole (for state that must survive a restart).
pub fn write_durable(root: &Path, rel: &str, bytes: &[u8]) -> io::Result<()> {
    write_new(root, rel, bytes, true)
}

fn write_new(root: &Path, rel: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let (dir, last) = parent_of(root, rel)?;
    let tmp = temp_name(last);
    let fd = openat(
        &dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )?;
    let written = (|| {
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes)?;
        // The umask may have narrowed the mode.
        rustix::fs::fchmod(&f, Mode::from_raw_mode(FILE_MODE))?;
        if durable {
            f.sync_all()?;
        }
        renameat(&dir, tmp.as_str(), &dir, last)?;
        if durable {
            rustix::fs::fsync(&dir)?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = unlinkat(&dir, tmp.as_str(), AtFlags::empty());
    }
    written
}

/// Renames the file at `src` (the caller's own temporary file, on the
/// same filesystem) to `root/rel`.
pub fn rename_into(src: &Path, root: &Path, rel: &str) -> io::Result<()> {
    let (dir, last) = parent_of(root, rel)?;
    Ok(renameat(CWD, src, &dir, last)?)
}

/// Removes the file `root/rel` (not following symlinks on the way; a
/// symlink as the last component is itself removed). Returns whether it
/// was there.
pub fn remove_file(root: &Path, rel: &str) -> io::Result<bool> {
    let comps = components(rel)?;
    let (last, dirs) = comps.split_last().expect("split yields at least one");
    let mut dir = match open_root(root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for c in dirs {
        dir = match openat(&dir, *c, DIR_FLAGS, Mode::empty()) {
            Ok(d) => d,
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(refused(e, rel, c)),
        };
    }
    match unlinkat(&dir, *last, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn writes_beneath_the_root_and_never_through_a_symlink() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("refs/heads")).unwrap();
        symlink(outside.path(), r.join("refs/mirrors")).unwrap();
        symlink(outside.path().join("summary"), r.join("summary")).unwrap();
        std::fs::write(outside.path().join("victim"), b"keep").unwrap();
        symlink(outside.path(), r.join("objects")).unwrap();

        // (path, written, what the refusal says)
        let cases: &[(&str, bool, &str)] = &[
            ("refs/heads/os/stable", true, ""),
            ("config", true, ""),
            // The last component, a symlink, is replaced, not followed.
            ("summary", true, ""),
            (
                "refs/mirrors/org.example/os",
                false,
                "\"mirrors\" is a symlink",
            ),
            ("objects/victim", false, "\"objects\" is a symlink"),
            ("../escaped", false, "not a plain relative path"),
            ("refs//heads/x", false, "not a plain relative path"),
            ("/etc/x", false, "not a plain relative path"),
        ];
        for (rel, ok, says) in cases {
            let got = write_atomic(r, rel, b"new\n");
            match got {
                Ok(()) => {
                    assert!(ok, "{rel} was written");
                    let meta = std::fs::symlink_metadata(r.join(rel)).unwrap();
                    assert!(meta.is_file(), "{rel} is a plain file");
                    assert_eq!(std::fs::read(r.join(rel)).unwrap(), b"new\n");
                }
                Err(e) => {
                    assert!(!ok, "{rel}: {e}");
                    assert!(e.to_string().contains(says), "{rel}: {e}");
                }
            }
        }
        let left: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["victim"], "nothing written outside");
        assert_eq!(
            std::fs::read(outside.path().join("victim")).unwrap(),
            b"keep"
        );
        let tmp_left = std::fs::read_dir(r)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".tmp-")
            })
            .count();
        assert_eq!(tmp_left, 0, "no temporary file left");

        assert!(remove_file(r, "objects/victim").is_err());
        assert!(outside.path().join("victim").exists());
        assert!(remove_file(r, "config").unwrap());
        assert!(!remove_file(r, "config").unwrap());
        assert!(create_dirs(r, "refs/mirrors/x").is_err());
        create_dirs(r, "refs/remotes/a").unwrap();
        assert!(r.join("refs/remotes/a").is_dir());
    }
}
