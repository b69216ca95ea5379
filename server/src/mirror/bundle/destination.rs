//! A destination being updated: the lock, the manifest moved aside, the
//! release history, pruning, and the commit that makes it complete.

use super::files::{list_files, refuse_foreign_dir, remove_empty_dirs, sync_dir, write_atomic};
use super::manifest::{
    read_manifest, BundleManifest, ReleaseEntry, FORMAT, KIND, MANIFEST, WORK_DIR,
};
use crate::mirror::store::Store;
use crate::mirror::sync::{Metadata, Snapshot};
use anyhow::{Context, Result};
use oscontent_format::{Checksum, Commit, ObjectKind, ObjectName, RepoPath};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where the manifest waits while an update runs.
const PREVIOUS: &str = "previous.json";
/// Serializes mirrors into one destination.
const LOCK: &str = "lock";

/// A destination being updated: the bundle itself, or a site server's
/// store. Holds the lock; knows what the last complete run left.
#[derive(Debug)]
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

    /// After an update that failed: puts the last complete manifest back,
    /// if the update replaced none of the files it lists (it failed while
    /// adding objects, before the summary, refs or signatures were
    /// written). The bundle is then complete as it was, plus files no
    /// manifest lists, which the next run trusts once verified. Returns
    /// whether it did; otherwise the bundle stays incomplete until a run
    /// succeeds.
    pub fn abandon_update(&self) -> Result<bool> {
        let parked = self.work.join(PREVIOUS);
        let Some(prev) = &self.previous else {
            return Ok(false);
        };
        if self.manifest_path.exists() || !parked.is_file() {
            return Ok(false);
        }
        let untouched = prev
            .files
            .iter()
            .all(|(rel, was)| self.store.verified_entry(rel).is_none_or(|now| now == *was));
        if !untouched {
            return Ok(false);
        }
        std::fs::rename(&parked, &self.manifest_path)
            .with_context(|| format!("restoring {}", self.manifest_path.display()))?;
        sync_dir(self.manifest_path.parent().unwrap_or(&self.root))?;
        Ok(true)
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
        let keep_objects = crate::mirror::sync::reachable(&self.store, &commits)?;
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
        let bytes = manifest
            .to_bytes()
            .with_context(|| format!("completing {}", self.manifest_path.display()))?;
        self.store.sync()?;
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
