//! A site server fed by another oscontent server (`serve --upstream URL`)
//! or by a bundle carried across an air gap (`serve --bundle DIR`).
//!
//! Both work the same way. The server keeps its own archive store under
//! its state dir (`mirror/repo`: objects, detached metadata, deltas, and a
//! manifest of what it verified, `mirror/objects.json`). Each refresh reads
//! the source's summary; if it differs from the one being served, the
//! verified walk ([`super::sync`]) brings in only the objects the store
//! lacks, verifying every object and, with trusted keys, the summary and
//! every commit signature, and then a new generation is published whose
//! overlay holds the source's refs, config, and its summary and
//! `summary.sig` byte for byte: nodes verify against the original signer,
//! and no trust is re-rooted at the site. A bundle is also checked file by
//! file against its manifest before anything is read from it.
//!
//! The store only grows during a refresh (objects are immutable), so the
//! generation being served stays whole; with `--keep N`, objects that no
//! kept release reaches are removed after the new generation is built.
//! A failed refresh keeps the previous generation; a refresh killed midway
//! leaves verified objects that the next one uses (see [`super::store`]).

use super::bundle::{self, BundleRemote, Destination, Pruned};
use super::remote::{HttpRemote, RateLimit, Remote};
use super::sync::{self, Metadata, SyncOptions};
use crate::redact::RedactedUrl;
use crate::refresh::rollback::{self, ref_ages, RollbackGuard};
use crate::refresh::{Checked, Publisher};
use crate::served::{Generation, PINNED_SUMMARY};
use crate::state::Generations;
use anyhow::{Context, Result};
use oscontent_format::{Checksum, RefNamespace};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Under the state dir.
pub const MIRROR_DIR: &str = "mirror";
/// The store, served as the generation's source.
const REPO: &str = "repo";
/// The store's manifest.
const OBJECTS_MANIFEST: &str = "objects.json";
/// Generation overlays.
const GENERATIONS: &str = "generations";

/// Where a site server's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiteSource {
    /// Another oscontent server (or any archive remote) over HTTP(S).
    Upstream(RedactedUrl),
    /// A bundle directory (`mirror ... bundle:DIR`).
    Bundle(PathBuf),
}

impl std::fmt::Display for SiteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SiteSource::Upstream(u) => write!(f, "upstream {u}"),
            SiteSource::Bundle(d) => write!(f, "bundle {}", d.display()),
        }
    }
}

/// What one refresh found.
#[derive(Debug)]
pub enum Refresh {
    /// The source still publishes the summary served.
    Unchanged,
    /// This summary moves a ref back in time, and that was refused.
    RolledBack(Checksum),
    /// A new generation (not yet visible).
    New(Box<Generation>, Box<Refreshed>),
}

/// What one refresh did.
#[derive(Debug, Clone)]
pub struct Refreshed {
    pub summary: Checksum,
    pub refs: Vec<(String, Checksum)>,
    pub fetched: u64,
    pub fetched_bytes: u64,
    pub objects: u64,
    pub object_bytes: u64,
    pub verified_commits: usize,
    pub summary_verified: bool,
    pub pruned: Option<Pruned>,
}

/// A site server's mirror of its source.
#[derive(Debug)]
pub struct SiteMirror {
    pub source: SiteSource,
    dir: PathBuf,
    pub opts: SyncOptions,
    pub keep: Option<usize>,
    pub limit: Option<Arc<RateLimit>>,
    generations: Generations,
}

impl SiteMirror {
    /// Opens (creating) `state_dir/mirror`, removing overlays an earlier
    /// process left; the store and its manifest are kept (that is what
    /// makes a restart incremental).
    pub fn open(
        source: SiteSource,
        state_dir: &Path,
        opts: SyncOptions,
        keep: Option<usize>,
        limit: Option<Arc<RateLimit>>,
    ) -> Result<Self> {
        let dir = state_dir.join(MIRROR_DIR);
        let generations = Generations::open(dir.join(GENERATIONS))?;
        if let SiteSource::Bundle(b) = &source {
            let b = b
                .canonicalize()
                .with_context(|| format!("bundle {}", b.display()))?;
            anyhow::ensure!(
                !b.starts_with(state_dir) && !state_dir.starts_with(&b),
                "--state-dir {} overlaps the bundle {}; the server never writes the bundle it serves",
                state_dir.display(),
                b.display()
            );
        }
        Ok(Self {
            source,
            dir,
            opts,
            keep,
            limit,
            generations,
        })
    }

    fn repo(&self) -> PathBuf {
        self.dir.join(REPO)
    }

    /// The source's summary digest now, and a remote to sync from, unless
    /// it is `current` (then `None`: nothing to do). Blocking.
    fn check(&self, current: Option<&Checksum>) -> Result<Option<(Box<dyn Remote>, Metadata)>> {
        let remote: Box<dyn Remote> = match &self.source {
            SiteSource::Upstream(url) => Box::new(HttpRemote::new(url, self.limit.clone())?),
            SiteSource::Bundle(dir) => {
                // Cheap check first: the whole bundle is verified only when
                // it names another summary.
                if let Some(m) = bundle::read_manifest(&dir.join(bundle::MANIFEST))? {
                    if current.is_some_and(|c| c.to_hex() == m.summary_sha256) {
                        return Ok(None);
                    }
                }
                Box::new(BundleRemote::open(dir, self.limit.clone())?)
            }
        };
        let meta = sync::read_metadata(remote.as_ref(), &self.opts)?;
        if current == Some(&meta.summary_digest()) {
            return Ok(None);
        }
        Ok(Some((remote, meta)))
    }

    /// One refresh (blocking): `Ok(None)` if the source still publishes the
    /// summary `current` serves, or if `rollback` refuses what it moved;
    /// else the new generation, not yet visible. The rollback check runs
    /// once the new commits are verified and before anything is pruned:
    /// a refused summary costs the served generation nothing.
    pub fn refresh(
        &self,
        current: Option<&Checksum>,
        rollback: Option<&RollbackGuard>,
    ) -> Result<Refresh> {
        let Some((remote, meta)) = self.check(current)? else {
            return Ok(Refresh::Unchanged);
        };
        sync::verify_commits(remote.as_ref(), &meta, &self.opts)?;
        let dest = Destination::begin(&self.repo(), &self.dir.join(OBJECTS_MANIFEST))?;
        dest.start_update()?;
        let snap = sync::sync_with(remote.as_ref(), &dest.store, &self.opts, meta)
            .with_context(|| format!("mirroring {}", self.source))?;
        dest.write_commitmeta(&snap)?;
        let generation = self.build_generation(&snap.meta)?;
        // Judged against the newest release ever published from this
        // state dir, so a restart does not forget it; recorded before the
        // generation is returned.
        let judged = match rollback {
            Some(guard) => {
                let ages = ref_ages(&generation)?;
                guard.admit(&ages)?;
                let found = guard.found(&ages);
                if !rollback::judge(guard.policy(), &found, guard.metrics()) {
                    return Ok(Refresh::RolledBack(snap.meta.summary_digest()));
                }
                Some((guard, ages))
            }
            None => None,
        };
        let mut history = dest.history(&snap);
        let pruned = match self.keep {
            Some(k) => Some(dest.prune(&mut history, &snap, k)?),
            None => None,
        };
        dest.commit(&self.source.to_string(), &snap.meta, history)?;
        if let Some((guard, ages)) = judged {
            guard.record(&ages)?;
        }
        let refreshed = Refreshed {
            summary: snap.meta.summary_digest(),
            refs: generation.derived_refs.clone(),
            fetched: snap.fetched,
            fetched_bytes: snap.fetched_bytes,
            objects: snap.objects,
            object_bytes: snap.object_bytes,
            verified_commits: snap.verified_commits.len(),
            summary_verified: snap.meta.verified_summary.is_some(),
            pruned,
        };
        Ok(Refresh::New(Box::new(generation), Box::new(refreshed)))
    }

    /// A generation serving the store with `meta`'s refs, config, summary
    /// and signature in a fresh overlay.
    fn build_generation(&self, meta: &Metadata) -> Result<Generation> {
        let mut building = self.generations.begin(vec![self.repo()])?;
        write_overlay(building.path(), meta)?;
        // The same checks as any publication: the summary it will serve is
        // the one mirrored, and every ref's commit loads.
        let generation = building.generation();
        let served = generation.resolve(&oscontent_format::RepoPath::Summary)?;
        anyhow::ensure!(
            matches!(served, crate::served::Resolved::File { .. }),
            "internal: the mirrored summary is not what the generation serves"
        );
        let mut refs = Vec::new();
        for r in generation.refs()? {
            generation.commit(&r.commit)?;
            let name = match r.namespace {
                RefNamespace::Heads => r.name,
                RefNamespace::Mirrors => format!("(mirror) {}", r.name),
            };
            refs.push((name, r.commit));
        }
        anyhow::ensure!(!refs.is_empty(), "nothing to publish: no refs");
        let generation = building.generation_mut();
        generation.derived_refs = refs;
        // The store only holds files renamed into place after they verified.
        generation.gate = crate::verify::ObjectGate::VerifiedStore;
        Ok(building.commit())
    }
}

/// The remote's own files, verbatim, into a generation overlay: each path
/// checked against the archive grammar, then written beneath the
/// overlay's directory fd.
fn write_overlay(dir: &Path, meta: &Metadata) -> Result<()> {
    let write = |rel: &str, bytes: &[u8]| -> Result<()> {
        super::store::layout_path(dir, rel)?;
        crate::fsutil::write_atomic(dir, rel, bytes)
            .with_context(|| format!("writing {rel} into {}", dir.display()))
    };
    write("config", &meta.config)?;
    for r in &meta.refs {
        write(&r.path(), format!("{}\n", r.commit).as_bytes())?;
    }
    write(PINNED_SUMMARY, &meta.summary)?;
    if let Some(sig) = &meta.summary_sig {
        write("summary.sig", sig)?;
    }
    Ok(())
}

/// A site server's publisher: each check is one refresh of the mirror
/// (the refresher retries the first with capped exponential backoff while
/// `/readyz` says 503, then checks at every `--refresh-interval` and
/// SIGHUP). A failure keeps the generation being served.
#[derive(Debug)]
pub struct SitePublisher {
    mirror: Arc<SiteMirror>,
    /// The summary served now, or the last one refused as a rollback
    /// (checked again only once the source moves).
    current: Option<Checksum>,
    rollback: Option<Arc<RollbackGuard>>,
    /// Something was published: "unchanged" is an answer, not a wait.
    published: bool,
}

impl SitePublisher {
    pub fn new(mirror: SiteMirror) -> Self {
        Self {
            mirror: Arc::new(mirror),
            current: None,
            rollback: None,
            published: false,
        }
    }

    /// Refuses (or, allowed, logs) a summary that moves a ref back in
    /// time past its mark, before anything is pruned for it.
    pub fn checking_rollback(mut self, guard: Arc<RollbackGuard>) -> Self {
        self.rollback = Some(guard);
        self
    }
}

impl Publisher for SitePublisher {
    /// One refresh on the blocking pool.
    async fn check(&mut self, _force: bool) -> Result<Checked> {
        let (m, cur, rb) = (self.mirror.clone(), self.current, self.rollback.clone());
        let r = tokio::task::spawn_blocking(move || m.refresh(cur.as_ref(), rb.as_deref()))
            .await
            .context("refresh task")??;
        let (generation, refreshed) = match r {
            // Not mirrored again until the source moves; the refusal is
            // logged and counted.
            Refresh::RolledBack(summary) => {
                self.current = Some(summary);
                return self.unchanged();
            }
            Refresh::Unchanged => return self.unchanged(),
            Refresh::New(g, r) => (g, r),
        };
        self.published = true;
        announce(&generation, &refreshed, &self.mirror.source);
        self.current = Some(refreshed.summary);
        Ok(Checked::New(generation))
    }

    fn what(&self) -> &str {
        "the source"
    }
}

impl SitePublisher {
    /// Nothing new. With nothing published yet (the first summary, after a
    /// restart, moved a ref back past its mark) that is an error, so that
    /// the refresher retries with backoff rather than at once.
    fn unchanged(&self) -> Result<Checked> {
        anyhow::ensure!(
            self.published,
            "nothing to publish: {} moves a ref back in time (see above); \
             waiting for it to move forward",
            self.mirror.source
        );
        Ok(Checked::Unchanged)
    }
}

/// Logs what a refresh did.
pub fn announce(generation: &Generation, r: &Refreshed, source: &SiteSource) {
    for (name, commit) in &generation.derived_refs {
        tracing::info!(r#ref = name, %commit, generation = generation.id, "published");
    }
    tracing::info!(
        %source,
        summary_sha256 = %r.summary,
        summary_verified = r.summary_verified,
        commits_verified = r.verified_commits,
        objects = r.objects,
        object_bytes = r.object_bytes,
        fetched = r.fetched,
        fetched_bytes = r.fetched_bytes,
        "mirrored and verified"
    );
    if let Some(p) = &r.pruned {
        tracing::info!(
            releases = p.releases.len(),
            objects = p.objects,
            deltas = p.deltas,
            bytes = p.bytes,
            "pruned"
        );
    }
}
