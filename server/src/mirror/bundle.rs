//! Bundles: a self-contained, served remote in a directory, to carry
//! across an air gap.
//!
//! A bundle is an ostree archive repo as a remote serves it (`config`,
//! `summary`, `summary.sig`, `refs/`, `objects/` with `.commitmeta`
//! signatures, `deltas/`), so any static web server serves it and stock
//! `ostree pull --mirror` reads it, plus `oscontent-bundle.json`: the list
//! of every file with its SHA-256 and size, the summary's SHA-256 and the
//! releases it holds. The manifest is the "complete" marker: an update
//! first moves it aside and writes it again only after everything else is
//! in place and synced, so a bundle that is being (or was, when a mirror
//! was killed) updated never looks complete. `.oscontent-mirror/` holds a
//! mirror's work: temporary files, the previous manifest while an update
//! runs (how a resumed run knows what it can trust without reading it), and
//! staged images.
//!
//! At the site, [`verify_bundle`] checks every listed file before anything
//! is imported, and the import ([`super::upstream`]) verifies every object
//! and, with trusted keys, every signature again: a bundle tampered with in
//! transit is refused, and nothing of it is served.

use super::remote::{copy_bounded, DirRemote, RateLimit, Remote};
use super::store::{hash_file, FileEntry, Store};
use super::sync::{Metadata, PublishedRef, Snapshot};
use anyhow::{bail, Context, Result};
use oscontent_format::{Checksum, Commit, ObjectKind, ObjectName, RepoPath};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The manifest (and "complete" marker) of a bundle.
pub const MANIFEST: &str = "oscontent-bundle.json";
/// A mirror's work directory inside the destination.
pub const WORK_DIR: &str = ".oscontent-mirror";
/// Where the manifest waits while an update runs.
const PREVIOUS: &str = "previous.json";
/// Serializes mirrors into one destination.
const LOCK: &str = "lock";
/// What `kind` says, so that a stray JSON file is not taken for a manifest.
pub const KIND: &str = "oscontent-bundle";
/// Manifest format written and understood.
pub const FORMAT: u32 = 1;
/// Largest manifest read (about 150 bytes per file: a million files).
pub const MAX_MANIFEST_SIZE: u64 = 256 << 20;
/// Mismatches listed in one error before "and N more".
const MAX_LISTED: usize = 10;

/// A release a bundle (or a site server's store) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseEntry {
    pub commit: String,
    /// The refs that name it in the current summary (empty: kept for
    /// pulls by checksum until pruned).
    pub refs: Vec<String>,
    pub version: Option<String>,
    /// Commit timestamp, seconds since the epoch.
    pub timestamp: u64,
}

/// `oscontent-bundle.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    /// Always [`KIND`].
    pub kind: String,
    /// [`FORMAT`].
    pub format: u32,
    /// Where the current content was mirrored from.
    pub source: String,
    /// SHA-256 (hex) of `summary`.
    pub summary_sha256: String,
    /// Whether `summary.sig` is there.
    pub summary_signed: bool,
    /// Every release held, oldest mirrored first (what `--keep` counts).
    pub releases: Vec<ReleaseEntry>,
    /// Every file (path relative to the bundle) with its SHA-256 and size.
    pub files: BTreeMap<String, FileEntry>,
}

impl BundleManifest {
    pub fn parse(bytes: &[u8], what: &str) -> Result<Self> {
        let m: Self = serde_json::from_slice(bytes)
            .with_context(|| format!("{what}: not a bundle manifest"))?;
        anyhow::ensure!(m.kind == KIND, "{what}: kind {:?}, not {KIND:?}", m.kind);
        anyhow::ensure!(
            m.format == FORMAT,
            "{what}: format {} is not supported (this build reads format {FORMAT})",
            m.format
        );
        for p in m.files.keys() {
            anyhow::ensure!(
                RepoPath::parse(p).is_some(),
                "{what}: lists {p:?}, which is not an archive repo path"
            );
        }
        Ok(m)
    }

    /// The releases' commits, oldest first.
    pub fn commits(&self) -> Vec<Checksum> {
        self.releases
            .iter()
            .filter_map(|r| Checksum::from_hex(&r.commit).ok())
            .collect()
    }
}

/// Reads a manifest file, if there is one.
pub fn read_manifest(path: &Path) -> Result<Option<BundleManifest>> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let mut buf = Vec::new();
    f.take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        buf.len() as u64 <= MAX_MANIFEST_SIZE,
        "{} is over the {MAX_MANIFEST_SIZE} byte limit",
        path.display()
    );
    BundleManifest::parse(&buf, &path.display().to_string()).map(Some)
}

/// Whether `dir` is (or was meant to be) a bundle: it has a manifest, or a
/// mirror's work directory (an update in progress or interrupted).
pub fn is_bundle(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file() || dir.join(WORK_DIR).is_dir()
}

/// Writes `bytes` to `path` through a synced temporary file and a rename,
/// then syncs the directory: after a crash, `path` holds the old bytes or
/// the new ones.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path.parent().context("a file path has a parent")?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(parent)
        .with_context(|| format!("creating a temporary file in {}", parent.display()))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .with_context(|| format!("setting the mode of {}", tmp.path().display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming into {}", path.display()))?;
    sync_dir(parent)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

/// Checks every file a bundle's manifest lists (size and SHA-256), and that
/// the summary is the one it names. The error lists what does not match.
pub fn verify_bundle(dir: &Path) -> Result<BundleManifest> {
    let Some(m) = read_manifest(&dir.join(MANIFEST))? else {
        if dir.join(WORK_DIR).is_dir() {
            bail!(
                "{} is an incomplete bundle (no {MANIFEST}): a mirror into it is running or was interrupted; run the mirror again to complete it",
                dir.display()
            );
        }
        bail!("{} is not a bundle: it has no {MANIFEST}", dir.display());
    };
    let summary = m
        .files
        .get("summary")
        .with_context(|| format!("{}: the manifest lists no summary", dir.display()))?;
    anyhow::ensure!(
        summary.sha256 == m.summary_sha256,
        "{}: the manifest's summary entry and summary_sha256 disagree",
        dir.display()
    );
    let mut bad = Vec::new();
    for (rel, want) in &m.files {
        let problem = match crate::fsutil::open_file(dir, rel) {
            Ok(None) => Some("missing (or not a regular file)".to_owned()),
            Err(e) => Some(format!("unreadable: {e}")),
            Ok(Some((f, meta))) if meta.len() != want.size => {
                drop(f);
                Some(format!(
                    "{} bytes, the manifest says {}",
                    meta.len(),
                    want.size
                ))
            }
            Ok(Some((f, _))) => {
                let mut h = HashSink(Sha256::new());
                match copy_bounded(f, &mut h, want.size, rel, None) {
                    Err(e) => Some(format!("{e:#}")),
                    Ok(_) => {
                        let got = hex::encode(h.0.finalize());
                        (got != want.sha256)
                            .then(|| format!("SHA-256 {got}, the manifest says {}", want.sha256))
                    }
                }
            }
        };
        if let Some(p) = problem {
            bad.push(format!("{rel}: {p}"));
        }
    }
    if !bad.is_empty() {
        let n = bad.len();
        bad.truncate(MAX_LISTED);
        if n > MAX_LISTED {
            bad.push(format!("... and {} more", n - MAX_LISTED));
        }
        bail!(
            "bundle {} does not match its manifest ({n} file{}; tampered with or damaged in transit):\n  {}",
            dir.display(),
            if n == 1 { "" } else { "s" },
            bad.join("\n  ")
        );
    }
    Ok(m)
}

struct HashSink(Sha256);

impl Write for HashSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A verified bundle as a [`Remote`]: only the files its manifest lists,
/// each checked against its manifest entry as it is read.
pub struct BundleRemote {
    dir: DirRemote,
    pub manifest: BundleManifest,
}

impl BundleRemote {
    /// Verifies the bundle ([`verify_bundle`]) and opens it.
    pub fn open(dir: &Path, limit: Option<Arc<RateLimit>>) -> Result<Self> {
        let manifest = verify_bundle(dir)?;
        Ok(Self {
            dir: DirRemote::new(dir, limit),
            manifest,
        })
    }
}

struct Tee<'a> {
    out: &'a mut dyn Write,
    hash: Sha256,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Remote for BundleRemote {
    fn describe(&self) -> String {
        format!("bundle {}", self.dir.root.display())
    }

    fn copy_to(&self, rel: &str, out: &mut dyn Write, max: u64) -> Result<Option<u64>> {
        let Some(want) = self.manifest.files.get(rel) else {
            return Ok(None);
        };
        let mut tee = Tee {
            out,
            hash: Sha256::new(),
        };
        let n = self
            .dir
            .copy_to(rel, &mut tee, max.min(want.size))?
            .with_context(|| format!("{}: {rel} is listed but missing", self.describe()))?;
        let got = hex::encode(tee.hash.finalize());
        anyhow::ensure!(
            got == want.sha256 && n == want.size,
            "{}: {rel} changed since it was verified (SHA-256 {got}, the manifest says {})",
            self.describe(),
            want.sha256
        );
        Ok(Some(n))
    }
}

/// A destination being updated: the bundle itself, or a site server's
/// store. Holds the lock; knows what the last complete run left.
pub struct Destination {
    /// Where the archive layout lives.
    pub root: PathBuf,
    /// Work directory (same filesystem).
    pub work: PathBuf,
    /// The marker: `root/oscontent-bundle.json` for a bundle.
    pub manifest_path: PathBuf,
    /// The last complete manifest, if any.
    pub previous: Option<BundleManifest>,
    pub store: Store,
    _lock: std::fs::File,
}

impl Destination {
    /// Opens `root` for an update: takes the lock, reads the last complete
    /// manifest (or, after an interrupted update, the one it moved aside),
    /// and opens the store trusting what that manifest lists. Nothing is
    /// changed until [`Self::start_update`].
    pub fn begin(root: &Path, manifest_path: &Path) -> Result<Self> {
        refuse_foreign_dir(root, &[MANIFEST, WORK_DIR])?;
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let work = root.join(WORK_DIR);
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(work.join(LOCK))
            .with_context(|| format!("opening {}/{LOCK}", work.display()))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |e| {
                anyhow::anyhow!(
                    "{} is being updated by another mirror ({e}); wait for it to finish",
                    root.display()
                )
            },
        )?;
        let parked = work.join(PREVIOUS);
        let previous = match read_manifest(manifest_path)? {
            Some(m) => Some(m),
            // An interrupted update: its predecessor's manifest still says
            // what was verified.
            None => read_manifest(&parked).unwrap_or_else(|e| {
                tracing::warn!("ignoring {}: {e:#}", parked.display());
                None
            }),
        };
        let known = previous
            .as_ref()
            .map(|m| m.files.clone())
            .unwrap_or_default();
        let store = Store::open(root, &work.join("tmp"), known)?;
        Ok(Self {
            root: root.to_path_buf(),
            work,
            manifest_path: manifest_path.to_path_buf(),
            previous,
            store,
            _lock: lock,
        })
    }

    /// Moves the manifest aside: from now on, until [`Self::commit`], the
    /// destination does not look complete. Called once the source's
    /// metadata and signatures verified, so a refused source leaves a
    /// complete destination as it was.
    pub fn start_update(&self) -> Result<()> {
        if self.manifest_path.exists() {
            let parked = self.work.join(PREVIOUS);
            std::fs::rename(&self.manifest_path, &parked)
                .with_context(|| format!("moving {} aside", self.manifest_path.display()))?;
            sync_dir(self.manifest_path.parent().unwrap_or(&self.root))?;
        }
        Ok(())
    }

    /// The release history after `snap`: the previous releases (their refs
    /// updated), then the newly published commits, oldest first.
    pub fn history(&self, snap: &Snapshot) -> Vec<ReleaseEntry> {
        let names = |c: &Checksum| -> Vec<String> {
            snap.meta
                .refs
                .iter()
                .filter(|r| r.commit == *c)
                .map(|r| r.name.clone())
                .collect()
        };
        let mut out: Vec<ReleaseEntry> = Vec::new();
        let mut seen = BTreeSet::new();
        for r in self.previous.iter().flat_map(|m| m.releases.iter()) {
            let Ok(c) = Checksum::from_hex(&r.commit) else {
                continue;
            };
            if seen.insert(c) {
                out.push(ReleaseEntry {
                    refs: names(&c),
                    ..r.clone()
                });
            }
        }
        let mut new: Vec<&Commit> = snap
            .commits
            .values()
            .filter(|c| !seen.contains(&c.checksum))
            .collect();
        new.sort_by_key(|c| (c.timestamp, c.version(), c.checksum));
        for c in new {
            out.push(ReleaseEntry {
                commit: c.checksum.to_hex(),
                refs: names(&c.checksum),
                version: c.version(),
                timestamp: c.timestamp,
            });
        }
        out
    }

    /// Writes the detached metadata (signatures) of the published commits
    /// into the store, next to their objects.
    pub fn write_commitmeta(&self, snap: &Snapshot) -> Result<()> {
        for (c, bytes) in &snap.commitmeta {
            self.store
                .write_file(&ObjectName::new(*c, ObjectKind::CommitMeta).path(), bytes)?;
        }
        Ok(())
    }

    /// Keeps the last `keep` releases (and whatever is published now) and
    /// removes every object, signature and delta nothing kept reaches.
    pub fn prune(
        &self,
        history: &mut Vec<ReleaseEntry>,
        snap: &Snapshot,
        keep: usize,
    ) -> Result<Pruned> {
        let published: BTreeSet<Checksum> = snap.commits.keys().copied().collect();
        let n = history.len();
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for (i, r) in history.drain(..).enumerate() {
            let c = Checksum::from_hex(&r.commit)?;
            if i + keep >= n || published.contains(&c) {
                kept.push(r);
            } else {
                dropped.push(r);
            }
        }
        *history = kept;
        let commits: Vec<Checksum> = history
            .iter()
            .map(|r| Checksum::from_hex(&r.commit))
            .collect::<Result<_, _>>()?;
        let keep_objects = super::sync::reachable(&self.store, &commits)?;
        let mut freed = Pruned {
            releases: dropped,
            ..Default::default()
        };
        for rel in list_files(&self.root, "objects")? {
            let keep = match RepoPath::parse(&rel) {
                Some(RepoPath::Object(o)) => keep_objects.contains(&o),
                _ => false,
            };
            if !keep {
                freed.bytes += self.store.remove(&rel)?;
                freed.objects += 1;
            }
        }
        for rel in list_files(&self.root, "deltas")? {
            if !snap.delta_files.contains(&rel) {
                freed.bytes += self.store.remove(&rel)?;
                freed.deltas += 1;
            }
        }
        remove_empty_dirs(&self.root.join("deltas"))?;
        Ok(freed)
    }

    /// Syncs everything and writes the manifest: from now on the
    /// destination is complete. Returns it.
    pub fn commit(
        self,
        source: &str,
        meta: &Metadata,
        releases: Vec<ReleaseEntry>,
    ) -> Result<BundleManifest> {
        let mut files = self.store.entries();
        files.retain(|rel, _| RepoPath::parse(rel).is_some() && self.root.join(rel).is_file());
        let manifest = BundleManifest {
            kind: KIND.into(),
            format: FORMAT,
            source: source.to_owned(),
            summary_sha256: meta.summary_digest().to_hex(),
            summary_signed: meta.summary_sig.is_some(),
            releases,
            files,
        };
        self.store.sync()?;
        let mut bytes = serde_json::to_vec_pretty(&manifest).context("serializing the manifest")?;
        bytes.push(b'\n');
        write_atomic(&self.manifest_path, &bytes)?;
        let parked = self.work.join(PREVIOUS);
        if parked.exists() {
            std::fs::remove_file(&parked)
                .with_context(|| format!("removing {}", parked.display()))?;
        }
        let tmp = self.work.join("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        Ok(manifest)
    }
}

/// Refuses to write into an existing, non-empty directory that has none
/// of `markers`: that is someone's data (a mistyped destination), not a
/// mirror's.
pub fn refuse_foreign_dir(dir: &Path, markers: &[&str]) -> Result<()> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    if entries.next().is_none() || markers.iter().any(|m| dir.join(m).exists()) {
        return Ok(());
    }
    bail!(
        "{} exists, is not empty, and is not a mirror destination (it has none of {}); refusing to write into it",
        dir.display(),
        markers.join(", ")
    )
}

/// What pruning removed.
#[derive(Debug, Default, Clone)]
pub struct Pruned {
    pub releases: Vec<ReleaseEntry>,
    /// Object files (including detached metadata) removed.
    pub objects: u64,
    /// Delta files removed.
    pub deltas: u64,
    pub bytes: u64,
}

/// Writes `config`, refs (removing stale ones), `summary` and
/// `summary.sig` of `meta` into `store`'s root.
pub fn write_remote_files(store: &Store, meta: &Metadata) -> Result<()> {
    let root = store.root().to_path_buf();
    // The directories a local ostree repo has, so that stock tools also
    // open a bundle in place (`ostree fsck --repo=DIR`).
    for d in ["refs/heads", "refs/mirrors", "refs/remotes"] {
        std::fs::create_dir_all(root.join(d))
            .with_context(|| format!("creating {}/{d}", root.display()))?;
    }
    let wanted: BTreeSet<String> = meta.refs.iter().map(PublishedRef::path).collect();
    for rel in list_files(&root, "refs")? {
        if !wanted.contains(&rel) {
            store.remove(&rel)?;
        }
    }
    for d in ["refs/heads", "refs/mirrors", "refs/remotes"] {
        remove_empty_dirs(&root.join(d))?;
    }
    for r in &meta.refs {
        store.write_file(&r.path(), format!("{}\n", r.commit).as_bytes())?;
    }
    store.write_file("config", &meta.config)?;
    // The signature goes first and the summary last: a client reading
    // during an update may see a new signature with an old summary (and
    // retry), but a stale signature never outlives a summary swap.
    match &meta.summary_sig {
        Some(sig) => store.write_file("summary.sig", sig)?,
        None => {
            store.remove("summary.sig")?;
        }
    }
    store.write_file("summary", &meta.summary)?;
    Ok(())
}

/// Every regular file under `root/sub`, as repo-relative paths (bounded).
pub fn list_files(root: &Path, sub: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![(sub.to_owned(), 0usize)];
    while let Some((rel, depth)) = stack.pop() {
        let dir = root.join(&rel);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        for ent in rd {
            let ent = ent.with_context(|| format!("listing {}", dir.display()))?;
            let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let child = format!("{rel}/{name}");
            let ft = ent.file_type()?;
            if ft.is_dir() && depth < crate::fsutil::MAX_DEPTH {
                stack.push((child, depth + 1));
            } else if ft.is_file() {
                out.push(child);
            }
            anyhow::ensure!(
                out.len() <= super::sync::MAX_OBJECTS,
                "{} holds more than {} files",
                root.join(sub).display(),
                super::sync::MAX_OBJECTS
            );
        }
    }
    Ok(out)
}

/// Removes empty directories under `dir` (not `dir` itself).
fn remove_empty_dirs(dir: &Path) -> Result<()> {
    fn walk(d: &Path, depth: usize) -> Result<bool> {
        let rd = match std::fs::read_dir(d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e).with_context(|| format!("listing {}", d.display())),
        };
        let mut empty = true;
        for ent in rd {
            let ent = ent?;
            if ent.file_type()?.is_dir() && depth < crate::fsutil::MAX_DEPTH {
                if walk(&ent.path(), depth + 1)? {
                    let _ = std::fs::remove_dir(ent.path());
                } else {
                    empty = false;
                }
            } else {
                empty = false;
            }
        }
        Ok(empty)
    }
    walk(dir, 0).map(|_| ())
}

/// Re-hashes a file the manifest lists (for tests and `fsck`-like checks).
pub fn entry_of(path: &Path) -> Result<FileEntry> {
    hash_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(files: &[(&str, &[u8])]) -> BundleManifest {
        let mut m = BundleManifest {
            kind: KIND.into(),
            format: FORMAT,
            source: "test".into(),
            summary_sha256: String::new(),
            summary_signed: false,
            releases: Vec::new(),
            files: BTreeMap::new(),
        };
        for (p, b) in files {
            let e = FileEntry {
                sha256: hex::encode(Sha256::digest(b)),
                size: b.len() as u64,
            };
            if *p == "summary" {
                m.summary_sha256 = e.sha256.clone();
            }
            m.files.insert(p.to_string(), e);
        }
        m
    }

    fn write_bundle(dir: &Path, files: &[(&str, &[u8])]) {
        for (p, b) in files {
            let path = dir.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b).unwrap();
        }
        std::fs::write(
            dir.join(MANIFEST),
            serde_json::to_vec(&manifest(files)).unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn verification_refuses_what_does_not_match() {
        let obj = format!("objects/aa/{}.dirmeta", "b".repeat(62));
        let files: Vec<(&str, &[u8])> = vec![
            ("summary", b"summary bytes"),
            ("config", b"[core]\nmode=archive-z2\n"),
            ("refs/heads/x", b"abc\n"),
            (obj.as_str(), b"object bytes"),
        ];
        type Damage = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Damage, Option<&str>)> = vec![
            ("intact", Box::new(|_| {}), None),
            (
                "flipped byte",
                Box::new(|d: &Path| {
                    let p = d.join(format!("objects/aa/{}.dirmeta", "b".repeat(62)));
                    let mut b = std::fs::read(&p).unwrap();
                    b[3] ^= 1;
                    std::fs::write(p, b).unwrap();
                }),
                Some("SHA-256"),
            ),
            (
                "swapped summary",
                Box::new(|d: &Path| std::fs::write(d.join("summary"), b"other bytes!!").unwrap()),
                Some("summary: SHA-256"),
            ),
            (
                "missing file",
                Box::new(|d: &Path| std::fs::remove_file(d.join("refs/heads/x")).unwrap()),
                Some("refs/heads/x: missing"),
            ),
            (
                "truncated",
                Box::new(|d: &Path| std::fs::write(d.join("config"), b"[core]").unwrap()),
                Some("config: 6 bytes"),
            ),
            (
                "no manifest",
                Box::new(|d: &Path| std::fs::remove_file(d.join(MANIFEST)).unwrap()),
                Some("not a bundle"),
            ),
            (
                "interrupted",
                Box::new(|d: &Path| {
                    std::fs::remove_file(d.join(MANIFEST)).unwrap();
                    std::fs::create_dir(d.join(WORK_DIR)).unwrap();
                }),
                Some("incomplete bundle"),
            ),
        ];
        for (name, damage, want) in cases {
            let t = tempfile::tempdir().unwrap();
            write_bundle(t.path(), &files);
            damage(t.path());
            match (verify_bundle(t.path()), want) {
                (Ok(_), None) => {}
                (Err(e), Some(w)) => assert!(format!("{e:#}").contains(w), "{name}: {e:#}"),
                (r, w) => panic!("{name}: {r:?}, wanted {w:?}"),
            }
        }
    }

    #[test]
    fn foreign_directories_are_not_written() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        refuse_foreign_dir(&d, &[MANIFEST]).unwrap();
        std::fs::create_dir(&d).unwrap();
        refuse_foreign_dir(&d, &[MANIFEST]).unwrap();
        std::fs::write(d.join("notes.txt"), b"mine").unwrap();
        let e = refuse_foreign_dir(&d, &[MANIFEST, WORK_DIR]).unwrap_err();
        assert!(e.to_string().contains("refusing to write"), "{e}");
        std::fs::create_dir(d.join(WORK_DIR)).unwrap();
        refuse_foreign_dir(&d, &[MANIFEST, WORK_DIR]).unwrap();
    }

    #[test]
    fn manifests_are_checked() {
        let good = serde_json::to_vec(&manifest(&[("summary", b"s")])).unwrap();
        assert!(BundleManifest::parse(&good, "m").is_ok());
        let mut m = manifest(&[("summary", b"s")]);
        m.files.insert(
            "../etc/passwd".into(),
            FileEntry {
                sha256: String::new(),
                size: 0,
            },
        );
        let e = BundleManifest::parse(&serde_json::to_vec(&m).unwrap(), "m").unwrap_err();
        assert!(e.to_string().contains("not an archive repo path"), "{e}");
        let mut m = manifest(&[]);
        m.kind = "something".into();
        assert!(BundleManifest::parse(&serde_json::to_vec(&m).unwrap(), "m").is_err());
        assert!(BundleManifest::parse(b"{}", "m").is_err());
    }

    #[test]
    fn a_bundle_remote_serves_only_listed_verified_files() {
        let t = tempfile::tempdir().unwrap();
        write_bundle(t.path(), &[("summary", b"s1"), ("config", b"c")]);
        std::fs::write(t.path().join("summary.sig"), b"unlisted").unwrap();
        let r = BundleRemote::open(t.path(), None).unwrap();
        assert_eq!(r.get("summary", 100).unwrap().unwrap(), b"s1");
        assert!(r.get("summary.sig", 100).unwrap().is_none(), "unlisted");
        // Changed after verification: refused at read time.
        std::fs::write(t.path().join("config"), b"X").unwrap();
        assert!(r.get("config", 100).is_err());
    }
}
