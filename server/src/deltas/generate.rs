//! One round of delta generation, blocking: a scratch archive repo in the
//! state dir holding the commits' closures (hard links to the verified
//! files of the generation's sources, opened beneath them without
//! following a link; the sources are never opened through libostree,
//! which would write into them), libostree's delta compiler in a bounded
//! process of its own (`child.rs`), and the result moved into the store
//! once it verifies.

use super::child::{self, Bounds};
use super::store::{Store, StoredDelta, TMP_PREFIX};
use crate::fsutil;
use crate::served::Generation;
use crate::verify::{self, Root, VerifiedSet, VerifyOptions};
use anyhow::{Context, Result};
use oscontent_format::{Checksum, DeltaName, ObjectKind, ObjectName};
use ostree::gio;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

/// What the free space check keeps free on the state volume, as the image
/// unpacker does: 256 MiB or 1/20 of a smaller volume.
const RESERVE_BYTES: u64 = 256 << 20;

/// The compiler's `TMPDIR`, inside the scratch repo (on the state volume).
const COMPILER_TMP: &str = "compiler-tmp";

/// The scratch repo of one round, removed when dropped.
pub struct Scratch {
    dir: tempfile::TempDir,
    /// Each commit's closure.
    closures: HashMap<Checksum, VerifiedSet>,
    /// Each linked object's size.
    sizes: HashMap<ObjectName, u64>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Scratch {
    /// An archive repo under `store` holding the closures of `commits`,
    /// each object linked (copied across filesystems) from the first of
    /// `g`'s sources that has it, as `g` serves it.
    pub fn build(store: &Path, g: &Generation, commits: &[Checksum]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{TMP_PREFIX}scratch-"))
            .tempdir_in(store)
            .with_context(|| format!("creating a scratch repo in {}", store.display()))?;
        let repo = ostree::Repo::new_for_path(dir.path());
        repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE)
            .context("creating the scratch repo")?;
        // Already verified by publication: walked, not hashed again.
        let roots: Vec<Root> = g
            .sources
            .iter()
            .map(|p| Root {
                path: p.clone(),
                preverified: true,
            })
            .collect();
        let mut closures = HashMap::new();
        for c in commits {
            let set = verify::verify_closure(&roots, &[*c], &VerifyOptions::default())
                .with_context(|| format!("walking commit {c}"))?;
            closures.insert(*c, set);
        }
        let mut sizes = HashMap::new();
        for set in closures.values() {
            for o in set.objects() {
                if !sizes.contains_key(o) {
                    let len = link_object(g, o, dir.path())?;
                    sizes.insert(*o, len);
                }
            }
        }
        Ok(Self {
            dir,
            closures,
            sizes,
        })
    }

    /// Bytes of the objects in `to`'s closure and not in `from`'s: about
    /// what the delta carries, before its own compression.
    fn new_bytes(&self, name: &DeltaName) -> u64 {
        let empty = VerifiedSet::default();
        let from = name
            .from
            .and_then(|f| self.closures.get(&f))
            .unwrap_or(&empty);
        self.closures.get(&name.to).map_or(0, |to| {
            to.objects()
                .filter(|o| !from.contains(o))
                .map(|o| self.sizes.get(o).copied().unwrap_or(0))
                .sum()
        })
    }

    /// Compiles `name` with `commitmeta` (the detached metadata served for
    /// its target) embedded, and moves it into `store` under `key`.
    pub fn generate(
        &self,
        store: &mut Store,
        key: &str,
        name: &DeltaName,
        commitmeta: Option<&[u8]>,
        bounds: &Bounds,
    ) -> Result<Arc<StoredDelta>> {
        let need = self.new_bytes(name).saturating_mul(2);
        check_space(store.path(), need)?;
        let meta_rel = ObjectName::new(name.to, ObjectKind::CommitMeta).path();
        let meta_path = self.dir.path().join(&meta_rel);
        match commitmeta {
            Some(m) => write_new(&meta_path, m)?,
            None => remove_file(&meta_path)?,
        }
        let rel = name.dir();
        let tmpdir = self.dir.path().join(COMPILER_TMP);
        std::fs::create_dir_all(&tmpdir)
            .with_context(|| format!("creating {}", tmpdir.display()))?;
        let compiled = child::compile(bounds, self.dir.path(), &tmpdir, name);
        // Whatever a killed or failed compiler left, and its temporary
        // files, go before anything else is compiled here.
        remove_dir(&tmpdir)?;
        let compiled = match compiled {
            Ok(c) => c,
            Err(e) => {
                remove_dir(&self.dir.path().join(&rel))?;
                return Err(e.into());
            }
        };
        tracing::info!(
            delta = name.summary_name(),
            peak_rss_bytes = compiled.peak_rss,
            "the delta compiler ended"
        );
        let rel = name.dir();
        pin_superblock_time(&self.dir.path().join(&rel).join("superblock"))?;
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{TMP_PREFIX}{key}-"))
            .tempdir_in(store.path())
            .context("creating a delta directory")?;
        let dest = tmp.path().join(&rel);
        if let Some(p) = dest.parent() {
            std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
        }
        std::fs::rename(self.dir.path().join(&rel), &dest)
            .with_context(|| format!("moving the compiled {rel}"))?;
        let root = tmp.keep();
        let stored = store.insert(key, name, &root);
        if stored.is_err() {
            let _ = std::fs::remove_dir_all(&root);
        }
        stored
    }
}

/// Replaces the compilation time in a superblock libostree just wrote by
/// its commit's (`reproducible_superblock` says why).
fn pin_superblock_time(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let pinned = oscontent_format::delta::reproducible_superblock(&bytes)
        .context("the compiled superblock")?;
    std::fs::write(path, pinned).with_context(|| format!("rewriting {}", path.display()))
}

/// Links (or copies) object `o` as `g` serves it into the scratch repo
/// at `dest_root`; returns its size.
fn link_object(g: &Generation, o: &ObjectName, dest_root: &Path) -> Result<u64> {
    let rel = o.path();
    let found = g
        .sources
        .iter()
        .find_map(|root| fsutil::open_file(root, &rel).transpose())
        .transpose()
        .with_context(|| format!("opening {rel}"))?
        .with_context(|| format!("{rel} is in no source"))?;
    let (mut file, meta) = found;
    let dest = dest_root.join(&rel);
    if let Some(p) = dest.parent() {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    // The very inode that was opened beneath the source, never a path
    // that could have been swapped for a link since.
    let proc = format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        file.as_fd().as_raw_fd()
    });
    let linked = rustix::fs::linkat(
        rustix::fs::CWD,
        proc.as_str(),
        rustix::fs::CWD,
        &dest,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    );
    if linked.is_err() {
        // Another filesystem (EXDEV), or links refused: copy, within the
        // state volume's reserve.
        check_space(dest_root, meta.len())?;
        let mut out =
            std::fs::File::create(&dest).with_context(|| format!("creating {}", dest.display()))?;
        std::io::copy(&mut file, &mut out).with_context(|| format!("copying {rel}"))?;
    }
    Ok(meta.len())
}

fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    // A link to a source's file must never be written through.
    remove_file(path)?;
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn remove_dir(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Refuses a delta that could leave less than the reserve free.
fn check_space(dir: &Path, need: u64) -> Result<()> {
    let s = rustix::fs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    let free = s.f_bavail.saturating_mul(s.f_frsize);
    let total = s.f_blocks.saturating_mul(s.f_frsize);
    let reserve = RESERVE_BYTES.min(total / 20);
    anyhow::ensure!(
        need.saturating_add(reserve) <= free,
        "not enough space in {}: the delta may need {need} bytes, {free} are free and {reserve} are kept in reserve",
        dir.display()
    );
    Ok(())
}

/// The commits a round needs in its scratch repo.
pub fn commits_of(pairs: &[DeltaName]) -> Vec<Checksum> {
    let mut set: HashSet<Checksum> = HashSet::new();
    for p in pairs {
        set.extend(p.from);
        set.insert(p.to);
    }
    let mut v: Vec<Checksum> = set.into_iter().collect();
    v.sort();
    v
}
