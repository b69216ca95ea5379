//! The destination of a mirror: a directory in the ostree archive layout
//! (`objects/`, `deltas/`, and for a bundle the refs, summary and config
//! too), written only through verified, atomic steps.
//!
//! Every file arrives in a temporary file on the same filesystem, is
//! hashed while it is written, is verified (a metadata object must hash to
//! its name, a content object must have libostree's content checksum of
//! its name), and only then renamed to its final path. So a file at an
//! object path is either verified or left over from a run that was killed
//! between the rename and its record; the second kind is verified again
//! before it is trusted (that is how a resumed mirror reads what is already
//! there instead of fetching it again).
//!
//! What is trusted without reading it: files listed, with the same size,
//! in the last complete manifest ([`FileEntry`]s handed to [`Store::open`]),
//! and files this process wrote.

use super::remote::{Interrupted, Remote};
use crate::fsutil;
use crate::treewalk::max_object_size;
use crate::verify::Corrupt;
use anyhow::{bail, Context, Result};
use oscontent_format::{check_dirmeta, Checksum, ObjectKind, ObjectName, RepoPath};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Attempts at fetching one object whose body broke off mid-transfer. Not
/// one the remote refused (it retried the request already), nor one that
/// arrived and failed verification (an attack or a broken upstream).
const FETCH_ATTEMPTS: u32 = 3;

/// One file as a manifest lists it (with the manifest's parser, in
/// `oscontent-parse`).
pub use oscontent_parse::bundle::FileEntry;

/// Counters of one run.
#[derive(Debug, Default)]
pub struct Stats {
    /// Files written by this run (objects, deltas, metadata).
    pub files_written: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Objects found in place and trusted or re-verified.
    pub objects_present: AtomicU64,
    /// Of those, left by an interrupted run and verified again.
    pub objects_reverified: AtomicU64,
}

/// A writer that hashes and counts what goes through it.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    n: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The content checksum of an archive (`.filez`) object file, as libostree
/// computes it (`oscontent_format::content::archive_checksum`).
pub fn content_checksum(path: &Path) -> Result<Checksum> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    oscontent_format::content::archive_checksum(std::io::BufReader::new(f))
}

/// SHA-256 and size of a file's bytes.
pub fn hash_file(path: &Path) -> Result<FileEntry> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok(FileEntry {
        sha256: hex::encode(h.finalize()),
        size,
    })
}

/// Checks that the file at `path` is the object `obj`; `entry` is its
/// SHA-256 and size. Detached metadata is not content-addressed and is
/// checked by signature verification instead.
fn verify_object(path: &Path, obj: &ObjectName, entry: &FileEntry) -> Result<(), Corrupt> {
    let what = obj.path();
    let corrupt = |detail: String| Corrupt {
        what: what.clone(),
        detail,
    };
    if entry.size > max_object_size(obj.kind) {
        return Err(corrupt(format!(
            "{} bytes, over the {} byte limit for a {}",
            entry.size,
            max_object_size(obj.kind),
            obj.kind.extension()
        )));
    }
    match obj.kind {
        ObjectKind::Commit | ObjectKind::DirTree | ObjectKind::DirMeta => {
            if entry.sha256 != obj.checksum.to_hex() {
                return Err(corrupt(format!(
                    "checksum mismatch: the bytes hash to {}",
                    entry.sha256
                )));
            }
            if obj.kind == ObjectKind::DirMeta {
                let bytes = std::fs::read(path).map_err(|e| corrupt(e.to_string()))?;
                check_dirmeta(&bytes).map_err(|e| corrupt(e.to_string()))?;
            }
            Ok(())
        }
        ObjectKind::File => {
            let got = content_checksum(path).map_err(|e| corrupt(format!("{e:#}")))?;
            if got != obj.checksum {
                return Err(corrupt(format!(
                    "content checksum mismatch: the object is {got}"
                )));
            }
            Ok(())
        }
        ObjectKind::CommitMeta => Ok(()),
    }
}

/// `root/rel`, once `rel` passes the archive layout's grammar. Names of
/// refs, collections and deltas come from remote data (a summary, a
/// bundle): the grammar has no `..`, no absolute path and no empty
/// component, so whatever passes it stays under `root`.
pub fn layout_path(root: &Path, rel: &str) -> Result<PathBuf> {
    anyhow::ensure!(
        RepoPath::parse(rel).is_some(),
        "refusing to write {rel:?}: not a path of the ostree archive layout"
    );
    Ok(root.join(rel))
}

/// The destination directory.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    tmp: PathBuf,
    known: HashMap<String, FileEntry>,
    verified: Mutex<BTreeMap<String, FileEntry>>,
    pub stats: Stats,
}

impl Store {
    /// `root` holds the archive layout; `tmp` (created, emptied of what an
    /// earlier run left) must be on the same filesystem. `known` are the
    /// files of the last complete manifest.
    pub fn open(root: &Path, tmp: &Path, known: BTreeMap<String, FileEntry>) -> Result<Self> {
        std::fs::create_dir_all(root.join("objects"))
            .with_context(|| format!("creating {}/objects", root.display()))?;
        if tmp.exists() {
            std::fs::remove_dir_all(tmp)
                .with_context(|| format!("removing stale {}", tmp.display()))?;
        }
        std::fs::create_dir_all(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            root: root.to_path_buf(),
            tmp: tmp.to_path_buf(),
            known: known.into_iter().collect(),
            verified: Mutex::new(BTreeMap::new()),
            stats: Stats::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn record(&self, rel: &str, e: FileEntry) {
        self.verified
            .lock()
            .expect("store lock")
            .insert(rel.to_owned(), e);
    }

    /// What this run verified or wrote at `rel`, if anything.
    pub fn verified_entry(&self, rel: &str) -> Option<FileEntry> {
        self.verified.lock().expect("store lock").get(rel).cloned()
    }

    /// Whether `obj` is in place and trusted (see the module docs). A file
    /// that fails verification is removed.
    pub fn has_object(&self, obj: &ObjectName) -> Result<bool> {
        let rel = obj.path();
        if self.verified_entry(&rel).is_some() {
            return Ok(true);
        }
        let path = self.root.join(&rel);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e).with_context(|| format!("inspecting {}", path.display())),
        };
        if !meta.is_file() {
            bail!("{} is not a regular file", path.display());
        }
        if let Some(k) = self.known.get(&rel).filter(|k| k.size == meta.len()) {
            self.record(&rel, k.clone());
            self.stats.objects_present.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        // Left by an interrupted run: trusted only once verified again.
        let entry = hash_file(&path)?;
        match verify_object(&path, obj, &entry) {
            Ok(()) => {
                self.record(&rel, entry);
                self.stats.objects_present.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .objects_reverified
                    .fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "removing a file that does not verify: {e}");
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
                Ok(false)
            }
        }
    }

    /// Fetches `rel` from `remote` into a temporary file, hashing it, and
    /// lets `check` refuse it before it is renamed into place. `Ok(None)`
    /// if the remote does not have it.
    fn fetch_checked(
        &self,
        remote: &dyn Remote,
        rel: &str,
        max: u64,
        check: &dyn Fn(&Path, &FileEntry) -> Result<(), Corrupt>,
    ) -> Result<Option<u64>> {
        let mut attempt = 0;
        let (tmp, entry) = loop {
            attempt += 1;
            let tmp = tempfile::Builder::new()
                .prefix("fetch-")
                .tempfile_in(&self.tmp)
                .with_context(|| format!("creating a temporary file in {}", self.tmp.display()))?;
            let mut w = HashingWriter {
                inner: BufWriter::new(tmp.as_file()),
                hasher: Sha256::new(),
                n: 0,
            };
            match remote.copy_to(rel, &mut w, max) {
                Ok(None) => return Ok(None),
                Ok(Some(_)) => {
                    w.flush()
                        .with_context(|| format!("writing {}", tmp.path().display()))?;
                    let entry = FileEntry {
                        sha256: hex::encode(std::mem::take(&mut w.hasher).finalize()),
                        size: w.n,
                    };
                    drop(w);
                    break (tmp, entry);
                }
                Err(e) if attempt < FETCH_ATTEMPTS && Interrupted::caused(&e) => {
                    tracing::warn!(path = rel, attempt, "transfer failed, retrying: {e:#}");
                }
                Err(e) => return Err(e),
            }
        };
        check(tmp.path(), &entry).map_err(|c| {
            anyhow::Error::new(Corrupt {
                what: format!("{}/{rel}", remote.describe()),
                detail: c.detail,
            })
        })?;
        self.persist(tmp, rel)?;
        let n = entry.size;
        self.stats.files_written.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_written.fetch_add(n, Ordering::Relaxed);
        self.record(rel, entry);
        Ok(Some(n))
    }

    fn persist(&self, tmp: tempfile::NamedTempFile, rel: &str) -> Result<()> {
        let dest = layout_path(&self.root, rel)?;
        // Readable by a static web server, whoever runs it.
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(fsutil::FILE_MODE),
        )
        .with_context(|| format!("setting the mode of {}", tmp.path().display()))?;
        // Kept (not removed on drop) only once renamed; an error removes it.
        let tmp = tmp.into_temp_path();
        fsutil::rename_into(&tmp, &self.root, rel)
            .with_context(|| format!("renaming into {}", dest.display()))?;
        tmp.keep()
            .with_context(|| format!("keeping {}", dest.display()))?;
        Ok(())
    }

    /// Fetches and verifies one object; an error if the remote lacks it.
    /// Returns the bytes written.
    pub fn fetch_object(&self, remote: &dyn Remote, obj: &ObjectName) -> Result<u64> {
        let rel = obj.path();
        let o = *obj;
        self.fetch_checked(remote, &rel, max_object_size(obj.kind), &move |p, e| {
            verify_object(p, &o, e)
        })?
        .with_context(|| format!("{}/{rel}: not found", remote.describe()))
    }

    /// Fetches a file whose SHA-256 is known in advance (a delta superblock
    /// from the summary, a part from its superblock).
    pub fn fetch_file(
        &self,
        remote: &dyn Remote,
        rel: &str,
        max: u64,
        sha256: &Checksum,
    ) -> Result<u64> {
        if let Some(e) = self.verified_entry(rel) {
            if e.sha256 == sha256.to_hex() {
                return Ok(0);
            }
        }
        let path = layout_path(&self.root, rel)?;
        if path.is_file() {
            let want = sha256.to_hex();
            let e = match self.known.get(rel) {
                Some(k) if k.sha256 == want && std::fs::metadata(&path)?.len() == k.size => {
                    k.clone()
                }
                _ => hash_file(&path)?,
            };
            if e.sha256 == want {
                self.record(rel, e);
                return Ok(0);
            }
        }
        let want = *sha256;
        self.fetch_checked(remote, rel, max, &move |_, e| {
            if e.sha256 == want.to_hex() {
                Ok(())
            } else {
                Err(Corrupt {
                    what: String::new(),
                    detail: format!("SHA-256 mismatch: expected {want}, got {}", e.sha256),
                })
            }
        })?
        .with_context(|| format!("{}/{rel}: not found", remote.describe()))
    }

    /// Reads a stored file (bounded).
    pub fn read(&self, rel: &str, max: u64) -> Result<Vec<u8>> {
        let p = self.root.join(rel);
        let f = std::fs::File::open(&p).with_context(|| format!("opening {}", p.display()))?;
        let mut buf = Vec::new();
        f.take(max + 1)
            .read_to_end(&mut buf)
            .with_context(|| format!("reading {}", p.display()))?;
        anyhow::ensure!(
            buf.len() as u64 <= max,
            "{} is over its {max} byte limit",
            p.display()
        );
        Ok(buf)
    }

    /// Writes a small file (ref, summary, signatures, config) atomically,
    /// unless it already has these bytes.
    pub fn write_file(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let entry = FileEntry {
            sha256: hex::encode(Sha256::digest(bytes)),
            size: bytes.len() as u64,
        };
        layout_path(&self.root, rel)?;
        let max = bytes.len() as u64;
        let same = fsutil::read_file(&self.root, rel, max).ok().flatten();
        if same.is_some_and(|(b, _)| b == bytes) {
            self.record(rel, entry);
            return Ok(());
        }
        let mut tmp = tempfile::Builder::new()
            .prefix("write-")
            .tempfile_in(&self.tmp)
            .with_context(|| format!("creating a temporary file in {}", self.tmp.display()))?;
        tmp.write_all(bytes)
            .with_context(|| format!("writing {}", tmp.path().display()))?;
        self.persist(tmp, rel)?;
        self.stats.files_written.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_written
            .fetch_add(entry.size, Ordering::Relaxed);
        self.record(rel, entry);
        Ok(())
    }

    /// Removes a file (and forgets it); returns the bytes freed (0 if it
    /// was not there).
    pub fn remove(&self, rel: &str) -> Result<u64> {
        self.verified.lock().expect("store lock").remove(rel);
        let p = self.root.join(rel);
        let size = match fsutil::open_file(&self.root, rel) {
            Ok(Some((_, m))) => m.len(),
            Ok(None) => 0,
            Err(e) => return Err(e).with_context(|| format!("inspecting {}", p.display())),
        };
        let removed = fsutil::remove_file(&self.root, rel)
            .with_context(|| format!("removing {}", p.display()))?;
        Ok(if removed { size } else { 0 })
    }

    /// Every file this store trusts now: verified or written by this run,
    /// plus the known ones still in place.
    pub fn entries(&self) -> BTreeMap<String, FileEntry> {
        let mut out = self.verified.lock().expect("store lock").clone();
        for (rel, e) in &self.known {
            if out.contains_key(rel) {
                continue;
            }
            if std::fs::metadata(self.root.join(rel)).is_ok_and(|m| m.len() == e.size) {
                out.insert(rel.clone(), e.clone());
            }
        }
        out
    }

    /// Makes everything written so far durable (one barrier for the whole
    /// filesystem, rather than one fsync per object).
    pub fn sync(&self) -> Result<()> {
        let d = std::fs::File::open(&self.root)
            .with_context(|| format!("opening {}", self.root.display()))?;
        rustix::fs::syncfs(&d).with_context(|| format!("syncing {}", self.root.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::remote::DirRemote;

    /// A fixture-like archive repo made by the stock ostree CLI.
    fn ostree_repo(dir: &Path) -> (PathBuf, String) {
        let repo = dir.join("repo");
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("a"), b"hello").unwrap();
        std::fs::write(tree.join("sub/b"), vec![7u8; 100_000]).unwrap();
        std::os::unix::fs::symlink("a", tree.join("link")).unwrap();
        let run = |args: &[&str]| {
            let o = std::process::Command::new("ostree")
                .args(args)
                .output()
                .expect("the ostree CLI must be installed");
            assert!(o.status.success(), "{args:?}: {o:?}");
            String::from_utf8(o.stdout).unwrap()
        };
        let r = format!("--repo={}", repo.display());
        run(&["init", "--mode=archive", &r]);
        let t = format!("--tree=dir={}", tree.display());
        let c = run(&[
            "commit",
            &r,
            "-b",
            "x",
            &t,
            "--owner-uid=0",
            "--owner-gid=0",
        ]);
        (repo, c.trim().to_owned())
    }

    fn objects(repo: &Path) -> Vec<ObjectName> {
        let mut out = Vec::new();
        for d in std::fs::read_dir(repo.join("objects")).unwrap() {
            let d = d.unwrap();
            for f in std::fs::read_dir(d.path()).unwrap() {
                let rel = format!(
                    "objects/{}/{}",
                    d.file_name().to_str().unwrap(),
                    f.unwrap().file_name().to_str().unwrap()
                );
                if let Some(oscontent_format::RepoPath::Object(o)) =
                    oscontent_format::RepoPath::parse(&rel)
                {
                    out.push(o);
                }
            }
        }
        out
    }

    #[test]
    fn copies_verify_and_refuse_corruption() {
        let t = tempfile::tempdir().unwrap();
        let (repo, _) = ostree_repo(t.path());
        let dest = t.path().join("dest");
        let store = Store::open(&dest, &t.path().join("tmp"), BTreeMap::new()).unwrap();
        let remote = DirRemote::new(&repo, None);
        let objs = objects(&repo);
        assert!(objs.iter().any(|o| o.kind == ObjectKind::File));
        for o in &objs {
            assert!(!store.has_object(o).unwrap());
            store.fetch_object(&remote, o).unwrap();
            assert!(store.has_object(o).unwrap());
            assert_eq!(
                std::fs::read(dest.join(o.path())).unwrap(),
                std::fs::read(repo.join(o.path())).unwrap(),
                "copied verbatim"
            );
        }

        // Each kind, one byte flipped: refused, and nothing lands in place.
        for kind in [ObjectKind::File, ObjectKind::DirTree, ObjectKind::Commit] {
            let o = objs.iter().find(|o| o.kind == kind).unwrap();
            let bad = t.path().join(format!("bad-{}", kind.extension()));
            std::fs::create_dir_all(bad.join(o.path()).parent().unwrap()).unwrap();
            let mut bytes = std::fs::read(repo.join(o.path())).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x01;
            std::fs::write(bad.join(o.path()), &bytes).unwrap();
            let fresh = Store::open(
                &t.path().join(format!("d-{}", kind.extension())),
                &t.path().join("tmp2"),
                BTreeMap::new(),
            )
            .unwrap();
            let e = fresh
                .fetch_object(&DirRemote::new(&bad, None), o)
                .unwrap_err();
            assert!(e.chain().any(|c| c.is::<Corrupt>()), "{kind:?}: {e:#}");
            assert!(!fresh.root().join(o.path()).exists());
        }
    }

    #[test]
    fn leftovers_are_verified_before_they_are_trusted() {
        let t = tempfile::tempdir().unwrap();
        let (repo, _) = ostree_repo(t.path());
        let dest = t.path().join("dest");
        let objs = objects(&repo);
        let file = objs.iter().find(|o| o.kind == ObjectKind::File).unwrap();
        let tree = objs.iter().find(|o| o.kind == ObjectKind::DirTree).unwrap();
        // As an interrupted run leaves them: one intact, one corrupted.
        for o in [file, tree] {
            std::fs::create_dir_all(dest.join(o.path()).parent().unwrap()).unwrap();
            std::fs::copy(repo.join(o.path()), dest.join(o.path())).unwrap();
        }
        let mut b = std::fs::read(dest.join(tree.path())).unwrap();
        b[0] ^= 0xff;
        std::fs::write(dest.join(tree.path()), b).unwrap();
        let store = Store::open(&dest, &t.path().join("tmp"), BTreeMap::new()).unwrap();
        assert!(store.has_object(file).unwrap());
        assert!(!store.has_object(tree).unwrap());
        assert!(!dest.join(tree.path()).exists(), "removed");
        assert_eq!(store.stats.objects_reverified.load(Ordering::Relaxed), 1);
        // A known entry is trusted without reading (size must match).
        let mut known = BTreeMap::new();
        known.insert(file.path(), hash_file(&dest.join(file.path())).unwrap());
        let store = Store::open(&dest, &t.path().join("tmp"), known).unwrap();
        assert!(store.has_object(file).unwrap());
        assert_eq!(store.stats.objects_reverified.load(Ordering::Relaxed), 0);
    }
}
