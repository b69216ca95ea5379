//! The `--image` publisher: what one check of the images does (when to
//! check is [`crate::refresh`]'s business).
//!
//! A check (the first fetch; then every `--refresh-interval`, or at SIGHUP) first resolves each
//! image reference to its manifest digest, which reads only manifests. If
//! no digest moved, nothing else happens. Otherwise the moved images are
//! streamed and verified afresh, the unchanged ones are reused as they are
//! staged, and all of them are published together as a new generation,
//! which the HTTP layer switches to in one step. Until then, and if
//! anything fails, the previous generation keeps being served: a failed
//! refresh never costs the verified content already published.
//!
//! A staged image is shared (by `Arc`) between the generations that serve
//! it and this publisher; its directory is removed when the last of them
//! lets go, i.e. after the last in-flight request on an old generation.
//!
//! Each image is judged on its own (`choose.rs`): when one image's new
//! release is refused (it moves a ref back in time past the marks kept in
//! the state dir, its signatures do not verify) or fails to fetch, it
//! keeps its previous release in the next generation (never published:
//! it is left out) and the others move forward; the refusal is logged
//! and counted per image (`oscontent_image_refusals_total`). An image
//! refused as a rollback is not fetched again until its digest moves; one
//! refused for signatures stays staged and is tried again, without
//! fetching, when the signatures change; one that failed is fetched again
//! at the retry.

use crate::ages::RefAge;
use crate::publish::{self, Release};
use crate::refresh::rollback::{self, ref_ages, Rollback, RollbackGuard};
use crate::refresh::{Checked, Publisher, RollbackPolicy};
use crate::served::Generation;
use crate::signing::{self, SignatureOptions};
use crate::source::{self, FetchOptions, ImageRef, StagedImage};
use crate::state::StateDir;
use anyhow::{Context, Result};
use choose::{choose, Tried};
use oscontent_format::Checksum;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod choose;

/// Under the state dir: where images are staged and kept while served.
pub const IMAGES_DIR: &str = "images";

/// What the publisher needs, fixed for the server's life, and where each
/// image stands.
#[derive(Debug)]
pub struct ImagePublisher {
    slots: Vec<Slot>,
    opts: FetchOptions,
    /// Where images are staged (under the state dir).
    staging: PathBuf,
    state_dir: Arc<StateDir>,
    /// Signatures to install, make and verify at each publication.
    sigs: SignatureOptions,
    /// Refs moved back in time: refused or allowed, judged against the
    /// marks every publication records.
    rollback: Arc<RollbackGuard>,
}

/// One `--image` and where it stands.
#[derive(Debug)]
struct Slot {
    image: ImageRef,
    /// What is served now.
    current: Option<Current>,
    /// Staged and verified, refused for signatures only.
    pending: Option<Current>,
    /// A digest refused as a rollback: not fetched again.
    refused: Option<String>,
}

/// Removes a staged image when the last generation serving it is dropped,
/// or when publication fails.
#[derive(Debug)]
struct StagedGuard(Option<StagedImage>);

impl Drop for StagedGuard {
    fn drop(&mut self) {
        if let Some(img) = self.0.take() {
            let root = img.root.clone();
            match img.remove() {
                Ok(()) => {
                    tracing::info!(dir = %root.display(), "removed a staged image no generation serves")
                }
                Err(e) => tracing::warn!(dir = %root.display(), "removing a staged image: {e}"),
            }
        }
    }
}

/// One image as currently published.
#[derive(Debug, Clone)]
struct Current {
    /// The manifest digest it was fetched at.
    digest: String,
    release: Release,
    guard: Arc<StagedGuard>,
}

/// What a check found for each image: its previous release, and a new
/// one to offer if it moved.
#[derive(Debug, Default)]
struct Offers {
    previous: Vec<Option<Current>>,
    new: Vec<Option<Current>>,
}

/// Images that failed to resolve or fetch (kept at their previous
/// release), with why.
type Failed = Vec<(usize, anyhow::Error)>;

impl Offers {
    fn moved(&self) -> Vec<bool> {
        self.new.iter().map(Option::is_some).collect()
    }

    /// The set where image `i` has its new release if `take[i]`.
    fn set(&self, take: &[bool]) -> Vec<Option<Current>> {
        (0..self.new.len())
            .map(|i| match take[i] {
                true => self.new[i].clone(),
                false => self.previous[i].clone(),
            })
            .collect()
    }
}

/// Why a set was refused.
#[derive(Debug)]
enum Refusal {
    Rollback(Vec<Rollback>),
    Signatures(anyhow::Error),
    /// Publication failed (an object that does not verify, no space):
    /// the images are tried one by one, so that one bad image does not
    /// block the others.
    Failed(anyhow::Error),
}

/// A set accepted: its generation, the refs' ages it publishes, and the
/// rollbacks `--allow-rollback` lets through.
struct Accepted {
    generation: Generation,
    ages: Vec<RefAge>,
    allowed: Vec<Rollback>,
}

impl ImagePublisher {
    pub fn new(
        images: Vec<ImageRef>,
        opts: FetchOptions,
        staging: PathBuf,
        state_dir: Arc<StateDir>,
        sigs: SignatureOptions,
        rollback: Arc<RollbackGuard>,
    ) -> Self {
        let slots = images
            .into_iter()
            .map(|image| Slot {
                image,
                current: None,
                pending: None,
                refused: None,
            })
            .collect();
        Self {
            slots,
            opts,
            staging,
            state_dir,
            sigs,
            rollback,
        }
    }

    /// A new generation if any image's digest differs from what is
    /// published (or nothing is yet, or `force`); images waiting for
    /// signatures are tried again without fetching them. On error,
    /// whatever this call staged is removed; on a signature refusal it is
    /// kept, to be published when signatures change.
    async fn check_images(&mut self, force: bool) -> Result<Checked> {
        let (offers, mut failed) = self.stage_moved(force).await?;
        let moved = offers.moved();
        // Forced (new signatures), what is served is published again.
        let republish = force && self.slots.iter().any(|s| s.current.is_some());
        if !(moved.iter().any(|m| *m) || republish) {
            return self.nothing_moved(failed);
        }
        let offers = Arc::new(offers);
        let (o, sd, sigs, guard) = (
            offers.clone(),
            self.state_dir.clone(),
            self.sigs.clone(),
            self.rollback.clone(),
        );
        let chosen = tokio::task::spawn_blocking(move || {
            let chosen = choose(&moved, |take: &[bool]| {
                attempt(&o.set(take), &sd, &sigs, &guard)
            })?;
            // Recorded before it is returned (and so published): a restart
            // judges against it even if it comes right after.
            if let Some((_, a)) = &chosen.published {
                guard.record(&a.ages)?;
            }
            anyhow::Ok(chosen)
        })
        .await
        .context("publish task")??;
        let mut waiting = Vec::new();
        for (i, why) in chosen.refused {
            match why {
                // As for a fetch failure: images never published are
                // published together or not at all (the first one waits).
                Refusal::Failed(e) if self.slots[i].current.is_none() => return Err(e),
                why => waiting.extend(self.refuse(i, why, &offers, &mut failed)),
            }
        }
        match chosen.unattributed {
            Some(Refusal::Signatures(e)) => waiting.push(e),
            Some(Refusal::Failed(e)) => return Err(e),
            Some(Refusal::Rollback(found)) => {
                let m = self.rollback.metrics();
                rollback::judge(RollbackPolicy::Refuse, &found, m);
            }
            None => {}
        }
        let Some((take, accepted)) = chosen.published else {
            return self.nothing_published(waiting, failed);
        };
        for e in waiting {
            tracing::error!("{e:#} (watching for new signatures)");
        }
        rollback::judge(
            RollbackPolicy::Allow,
            &accepted.allowed,
            self.rollback.metrics(),
        );
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if take[i] {
                slot.current = offers.new[i].clone();
                slot.pending = None;
                slot.refused = None;
            }
        }
        let mut generation = accepted.generation;
        keep_staged(&mut generation, &offers.set(&take));
        announce(&generation);
        Ok(self.with_failures(generation, failed))
    }

    /// Every image's previous release and, where its digest moved (or
    /// nothing is published yet), the new one, fetched and verified.
    /// An image that cannot be resolved or fetched keeps its previous
    /// release; if it has none, the whole check fails.
    async fn stage_moved(&self, force: bool) -> Result<(Offers, Failed)> {
        let mut o = Offers::default();
        let mut failed = Failed::new();
        for (i, slot) in self.slots.iter().enumerate() {
            o.previous.push(slot.current.clone());
            let offer = match (force, &slot.pending) {
                (true, Some(p)) => Ok(Some(p.clone())),
                _ => self.offer(slot).await,
            };
            match offer {
                Ok(new) => o.new.push(new),
                Err(e) if slot.current.is_some() => {
                    o.new.push(None);
                    failed.push((i, e));
                }
                Err(e) => return Err(e),
            }
        }
        Ok((o, failed))
    }

    /// The image's new release, if its digest moved.
    async fn offer(&self, slot: &Slot) -> Result<Option<Current>> {
        let image = &slot.image;
        let digest = source::resolve_digest(image, &self.opts)
            .await
            .with_context(|| format!("checking {image} for a new digest"))?;
        let known = [&slot.current, &slot.pending]
            .into_iter()
            .flatten()
            .map(|c| &c.digest)
            .chain(&slot.refused);
        if known.into_iter().any(|d| *d == digest) {
            return Ok(None);
        }
        if let Some(cur) = &slot.current {
            tracing::info!(%image, from = cur.digest, to = digest, "image moved; fetching it");
        }
        Ok(Some(fetch_one(image, &self.opts, &self.staging).await?))
    }

    /// Logs and counts a refused image, and remembers why: a rollback's
    /// digest is not fetched again, a signature refusal stays staged. A
    /// signature refusal is returned.
    fn refuse(
        &mut self,
        i: usize,
        why: Refusal,
        offers: &Offers,
        failed: &mut Failed,
    ) -> Option<anyhow::Error> {
        let slot = &mut self.slots[i];
        let new = offers.new[i].as_ref()?;
        let serving = match &slot.current {
            Some(c) => format!(
                "still serving the previous generation: {} stays at its previous release {}",
                slot.image, c.release.commit
            ),
            None => format!(
                "{} is not served (none of its releases is published)",
                slot.image
            ),
        };
        let metrics = self.rollback.metrics();
        match why {
            Refusal::Rollback(found) => {
                metrics
                    .image_refusals
                    .with_label_values(&[&slot.image.to_string(), "rollback"])
                    .inc();
                rollback::judge_serving(RollbackPolicy::Refuse, &found, metrics, &serving);
                slot.refused = Some(new.digest.clone());
                None
            }
            Refusal::Signatures(e) => {
                metrics
                    .image_refusals
                    .with_label_values(&[&slot.image.to_string(), "signatures"])
                    .inc();
                slot.pending = Some(new.clone());
                Some(e.context(format!(
                    "image {} refused for its signatures ({serving})",
                    slot.image
                )))
            }
            // Fetched again at the retry; counted with the fetch failures.
            Refusal::Failed(e) => {
                failed.push((i, e));
                None
            }
        }
    }

    /// Nothing new to publish: unchanged, or what failed.
    fn nothing_moved(&self, failed: Failed) -> Result<Checked> {
        if let Some((_, e)) = failed.into_iter().next() {
            return Err(e);
        }
        if self.slots.iter().all(|s| s.current.is_none()) {
            anyhow::bail!(
                "nothing to publish: every image was refused (see above), and none moved since"
            );
        }
        Ok(Checked::Unchanged)
    }

    /// No set with a new release was accepted.
    fn nothing_published(
        &self,
        mut waiting: Vec<anyhow::Error>,
        failed: Failed,
    ) -> Result<Checked> {
        // A failure is retried with backoff; the retry is not forced, so
        // images waiting for signatures stay waiting.
        if let Some((_, e)) = self.count_failed(failed).into_iter().next() {
            for other in waiting {
                tracing::error!("{other:#} (watching for new signatures)");
            }
            return Err(e);
        }
        if let Some(e) = waiting.pop() {
            for other in waiting {
                tracing::error!("{other:#} (watching for new signatures)");
            }
            return Ok(Checked::Refused(e));
        }
        if self.slots.iter().all(|s| s.current.is_none()) {
            anyhow::bail!("nothing to publish: every image was refused (see above)");
        }
        // Refusals are logged and counted; what is served stays.
        Ok(Checked::Unchanged)
    }

    /// The generation, with what failed to fetch logged and counted.
    fn with_failures(&self, generation: Generation, failed: Failed) -> Checked {
        let mut errors = Vec::new();
        for (i, e) in self.count_failed(failed) {
            let image = &self.slots[i].image;
            errors.push(format!("{e:#} ({image} stays at its previous release)"));
        }
        match errors.is_empty() {
            true => Checked::New(Box::new(generation)),
            false => Checked::Partial(Box::new(generation), anyhow::anyhow!(errors.join("; "))),
        }
    }

    /// Counts each image that failed while the others were published.
    fn count_failed(&self, failed: Failed) -> Failed {
        for (i, _) in &failed {
            let image = self.slots[*i].image.to_string();
            let m = self.rollback.metrics();
            m.image_refusals
                .with_label_values(&[&image, "failed"])
                .inc();
        }
        failed
    }
}

/// Publishes one set of images (blocking): accepted, refused (signatures,
/// or a ref moved back past its mark without `--allow-rollback`), or an
/// error.
fn attempt(
    set: &[Option<Current>],
    state_dir: &StateDir,
    sigs: &SignatureOptions,
    guard: &RollbackGuard,
) -> Result<Tried<Accepted, Refusal>> {
    let releases: Vec<Release> = set.iter().flatten().map(|c| c.release.clone()).collect();
    let generation = match publish::publish_releases_signed(&releases, state_dir, sigs) {
        Ok(g) => g,
        Err(e) if signing::is_signature_error(&e) => {
            return Ok(Tried::Refused(Refusal::Signatures(e)))
        }
        Err(e) => return Ok(Tried::Refused(Refusal::Failed(e))),
    };
    let ages = ref_ages(&generation).context("reading the new generation's commits")?;
    // Never published, never the mark; the others are tried without it.
    if let Err(e) = guard.admit(&ages) {
        return Ok(Tried::Refused(Refusal::Failed(e)));
    }
    let found = guard.found(&ages);
    if !found.is_empty() && guard.policy() == RollbackPolicy::Refuse {
        return Ok(Tried::Refused(Refusal::Rollback(found)));
    }
    Ok(Tried::Published(Accepted {
        generation,
        ages,
        allowed: found,
    }))
}

/// The generation shares the staged images; they outlive it only if a
/// later generation still serves them.
fn keep_staged(generation: &mut Generation, set: &[Option<Current>]) {
    generation.keepalive.extend(
        set.iter()
            .flatten()
            .map(|c| Box::new(c.guard.clone()) as Box<dyn std::any::Any + Send + Sync>),
    );
}

impl Publisher for ImagePublisher {
    async fn check(&mut self, force: bool) -> Result<Checked> {
        self.check_images(force).await
    }

    fn what(&self) -> &str {
        "the images"
    }
}

/// Fetches and stages every image once, as `serve` would (for `sign`): the
/// releases, and what keeps them staged (removed when dropped).
pub async fn stage_once(
    images: &[ImageRef],
    opts: &FetchOptions,
    staging: &Path,
) -> Result<(Vec<Release>, Vec<Box<dyn std::any::Any + Send + Sync>>)> {
    let mut releases = Vec::new();
    let mut guards: Vec<Box<dyn std::any::Any + Send + Sync>> = Vec::new();
    for image in images {
        let c = fetch_one(image, opts, staging).await?;
        releases.push(c.release);
        guards.push(Box::new(c.guard));
    }
    Ok((releases, guards))
}

async fn fetch_one(image: &ImageRef, opts: &FetchOptions, staging: &Path) -> Result<Current> {
    let staged = source::fetch(image, opts, staging)
        .await
        .with_context(|| format!("fetching {image}"))?;
    tracing::info!(
        %image,
        manifest = staged.manifest_digest,
        commit = staged.commit,
        compressed_bytes = staged.compressed_bytes,
        written_bytes = staged.written_bytes,
        "image verified and staged"
    );
    let digest = staged.manifest_digest.clone();
    let root = staged.root.clone();
    let commit = staged.commit.clone();
    let version = staged.version.clone();
    let format = staged.format;
    let staging = staged.staging.clone();
    // Owned from here: an early return below removes it.
    let guard = Arc::new(StagedGuard(Some(staged)));
    let commit: Checksum = commit
        .parse()
        .with_context(|| format!("image {image}: its commit label"))?;
    Ok(Current {
        digest,
        release: Release {
            image: image.to_string(),
            repo: root.join(crate::request::OSCONTAINER_REPO),
            commit,
            version,
            preverified: format == source::ImageFormat::Native,
            staging,
        },
        guard,
    })
}

/// Logs what a new generation publishes, and what its signatures are.
pub fn announce(generation: &Generation) {
    for (name, commit) in &generation.derived_refs {
        tracing::info!(r#ref = name, %commit, generation = generation.id, "published");
    }
    let s = &generation.signatures;
    for (name, commit, v) in &s.verified_refs {
        tracing::info!(r#ref = name, %commit, key = %v.cert_fingerprint, "commit signature verified");
    }
    if let Some(v) = &s.verified_summary {
        tracing::info!(key = %v.cert_fingerprint, "summary signature verified");
    }
    if let Some(d) = &s.summary_digest {
        tracing::info!(summary_sha256 = %d, signed = s.summary_signed, "summary");
    }
}
