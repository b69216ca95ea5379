//! The stage's refs in the host repo, through libostree. A [`Lock`] is a
//! libostree transaction held on a repo handle of its own for the whole
//! stage: it takes the repo's shared lock as stock `ostree pull` and the
//! importer do, so `ostree prune` (which takes it exclusive) cannot delete
//! the objects a stage is about to name, and the stage's refs are written
//! by that one transaction's commit, after the durability barrier. Objects
//! themselves are written by `pull`'s store, outside the transaction
//! (see `pull::store`).

use super::image::Manifest;
use super::record::{
    staged_ref, Record, IMAGE_PREFIX, MANIFEST_DIGEST_KEY, MANIFEST_KEY, RECORD_KEY, STAGED_PREFIX,
};
use anyhow::{anyhow, Context, Result};
use ostree::gio;
use ostree::glib::{self, prelude::*};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn no_cancel() -> Option<&'static gio::Cancellable> {
    None
}

/// The repo's shared lock, held by an open transaction.
pub struct Lock {
    repo: ostree::Repo,
    path: PathBuf,
    open: bool,
}

impl Lock {
    /// Opens the repo on a handle of its own and begins the transaction
    /// (waiting, as libostree waits, for an exclusive holder to finish).
    pub fn take(path: &Path) -> Result<Self> {
        let repo = ostree::Repo::new_for_path(path);
        repo.open(no_cancel())
            .with_context(|| format!("opening ostree repo {}", path.display()))?;
        repo.prepare_transaction(no_cancel())
            .with_context(|| format!("locking {} (a libostree transaction)", path.display()))?;
        Ok(Self {
            repo,
            path: path.to_owned(),
            open: true,
        })
    }

    pub fn repo(&self) -> &ostree::Repo {
        &self.repo
    }

    /// Writes the record commit, sets the layer refs and the staged ref,
    /// and commits the transaction with fsync on: all the refs become
    /// visible together, or none does. Returns the record commit.
    pub fn commit_stage(mut self, record: &Record) -> Result<String> {
        let (root, _) = self
            .repo
            .read_commit(&record.commit, no_cancel())
            .with_context(|| format!("reading staged commit {}", record.commit))?;
        let root = root
            .downcast::<ostree::RepoFile>()
            .map_err(|_| anyhow!("the root of {} is not a repo file", record.commit))?;
        let meta = glib::VariantDict::new(None);
        meta.insert(RECORD_KEY, record.to_json());
        let record_commit = self
            .repo
            .write_commit_with_time(
                Some(&record.commit),
                Some(&format!("oscontent stage of {}", record.digest)),
                None,
                Some(&meta.end()),
                &root,
                0,
                no_cancel(),
            )
            .context("writing the staged record commit")?;
        for (r, c) in record.refs() {
            self.repo.transaction_set_ref(None, r, Some(c));
        }
        self.repo.transaction_set_ref(
            None,
            &staged_ref(&record.digest),
            Some(record_commit.as_str()),
        );
        self.commit()?;
        Ok(record_commit.to_string())
    }

    /// Deletes refs in the transaction and commits it.
    pub fn delete_refs(mut self, refs: &[String]) -> Result<()> {
        for r in refs {
            self.repo.transaction_set_ref(None, r, None);
        }
        self.commit()
    }

    fn commit(&mut self) -> Result<()> {
        self.repo.set_disable_fsync(false);
        self.repo
            .commit_transaction(no_cancel())
            .with_context(|| format!("committing the refs in {}", self.path.display()))?;
        self.open = false;
        fsync_refs(&self.path)
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.repo.abort_transaction(no_cancel()) {
                tracing::warn!("aborting the transaction on {}: {e}", self.path.display());
            }
        }
    }
}

/// libostree fsyncs each ref file it writes; the directories that hold
/// them are fsynced here so that the renames survive a power cut too.
fn fsync_refs(repo: &Path) -> Result<()> {
    let heads = repo.join("refs/heads");
    for d in ["oscontent/staged", "ostree/container/blob"]
        .iter()
        .map(|d| heads.join(d))
        .chain(std::iter::once(heads.clone()))
    {
        match std::fs::File::open(&d) {
            Ok(f) => f
                .sync_all()
                .with_context(|| format!("fsync {}", d.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("opening {}", d.display())),
        }
    }
    Ok(())
}

/// A stage recorded in the repo.
#[derive(Debug, Clone)]
pub struct Staged {
    pub ref_name: String,
    pub record: Record,
    /// The record's layer refs that point where it says.
    pub present: Vec<String>,
    /// Whether the importer has imported this digest since.
    pub imported: bool,
}

/// Every local ref (`refs/heads`), name to commit.
fn local_refs(repo: &ostree::Repo) -> Result<BTreeMap<String, String>> {
    let all = repo
        .list_refs_ext(
            None,
            ostree::RepoListRefsExtFlags::EXCLUDE_REMOTES
                | ostree::RepoListRefsExtFlags::EXCLUDE_MIRRORS,
            no_cancel(),
        )
        .context("listing refs")?;
    Ok(all.into_iter().collect())
}

fn commit_metadata(repo: &ostree::Repo, c: &str) -> Result<glib::VariantDict> {
    let (v, _) = repo
        .load_commit(c)
        .with_context(|| format!("loading commit {c}"))?;
    Ok(glib::VariantDict::new(Some(&v.child_value(0))))
}

/// The importer's images: the manifest digests it has image refs for,
/// and the layer refs their manifests name (ostree-ext keeps the manifest
/// on its merge commit as `ostree.manifest`).
fn importer_images(
    repo: &ostree::Repo,
    refs: &BTreeMap<String, String>,
    layer_ref: &dyn Fn(&str) -> String,
) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let (mut digests, mut layers) = (BTreeSet::new(), BTreeSet::new());
    for (r, c) in refs.range(IMAGE_PREFIX.to_owned()..) {
        if !r.starts_with(IMAGE_PREFIX) {
            break;
        }
        let meta = commit_metadata(repo, c).with_context(|| format!("image ref {r}"))?;
        if let Ok(Some(d)) = meta.lookup::<String>(MANIFEST_DIGEST_KEY) {
            digests.insert(d);
        }
        let manifest: Option<String> = meta.lookup(MANIFEST_KEY).ok().flatten();
        let manifest = manifest
            .ok_or_else(|| anyhow!("image ref {r}: its commit {c} has no {MANIFEST_KEY}"))?;
        let manifest = Manifest::parse(manifest.as_bytes())
            .with_context(|| format!("the manifest of image ref {r}"))?;
        layers.extend(manifest.layers.iter().map(|l| layer_ref(&l.digest)));
    }
    Ok((digests, layers))
}

/// What the repo holds of stages and of the importer's images.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// Every stage recorded, by digest.
    pub staged: Vec<Staged>,
    /// Layer refs the importer's images name: never dropped here.
    pub image_layers: BTreeSet<String>,
    /// The manifest digests the importer has image refs for.
    pub imported: BTreeSet<String>,
}

/// Every stage recorded in the repo, by digest, and what the importer's
/// images name.
pub fn inventory(repo: &ostree::Repo, layer_ref: &dyn Fn(&str) -> String) -> Result<Inventory> {
    let refs = local_refs(repo)?;
    let (imported, image_layers) = importer_images(repo, &refs, layer_ref)?;
    let mut staged = Vec::new();
    for (r, c) in refs.range(STAGED_PREFIX.to_owned()..) {
        if !r.starts_with(STAGED_PREFIX) {
            break;
        }
        let meta = commit_metadata(repo, c).with_context(|| format!("staged ref {r}"))?;
        let json: String = meta
            .lookup(RECORD_KEY)
            .ok()
            .flatten()
            .ok_or_else(|| anyhow!("{r}: its commit {c} has no {RECORD_KEY} record"))?;
        let record = Record::parse(&json).with_context(|| format!("the record of {r}"))?;
        let present = record
            .refs()
            .filter(|(lr, lc)| refs.get(*lr).map(String::as_str) == Some(*lc))
            .map(|(lr, _)| lr.to_owned())
            .collect();
        staged.push(Staged {
            ref_name: r.clone(),
            imported: imported.contains(&record.digest),
            record,
            present,
        });
    }
    Ok(Inventory {
        staged,
        image_layers,
        imported,
    })
}

impl Inventory {
    /// What dropping the stages `victims` (staged ref names) deletes: their
    /// staged refs, and the layer refs they wrote that still point where
    /// they wrote them, unless another stage or one of the importer's
    /// images names them (the importer reads them by the same names; its
    /// own GC decides when those go).
    pub fn drop_set(&self, victims: &BTreeSet<String>) -> Vec<String> {
        let named_elsewhere: BTreeSet<&str> = self
            .staged
            .iter()
            .filter(|s| !victims.contains(&s.ref_name))
            .flat_map(|s| s.record.refs().map(|(r, _)| r))
            .chain(self.image_layers.iter().map(String::as_str))
            .collect();
        let mut out = Vec::new();
        for s in self.staged.iter().filter(|s| victims.contains(&s.ref_name)) {
            out.push(s.ref_name.clone());
            out.extend(
                s.present
                    .iter()
                    .filter(|r| !named_elsewhere.contains(r.as_str()))
                    .cloned(),
            );
        }
        out.sort();
        out.dedup();
        out
    }
}
