//! The `--image` publisher: what one check of the images does (when to
//! check is [`crate::serve::refresher`]'s business).
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
//! With signatures (`signing.rs`), a publication refused because something
//! does not verify keeps the verified, staged images as pending: they are
//! published, without fetching again, once new signatures (a changed
//! `--signatures` bundle) verify.

use crate::publish::{self, Release};
use crate::serve::refresher::{Checked, Publisher};
use crate::served::Generation;
use crate::signing::{self, SignatureOptions};
use crate::source::{self, FetchOptions, ImageRef, StagedImage};
use crate::state::StateDir;
use anyhow::{Context, Result};
use oscontent_format::Checksum;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Under the state dir: where images are staged and kept while served.
pub const IMAGES_DIR: &str = "images";

/// What the publisher needs, fixed for the server's life, and the images
/// it published.
#[derive(Debug)]
pub struct ImagePublisher {
    images: Vec<ImageRef>,
    opts: FetchOptions,
    /// Where images are staged (under the state dir).
    staging: PathBuf,
    state_dir: Arc<StateDir>,
    /// Signatures to install, make and verify at each publication.
    sigs: SignatureOptions,
    /// What is served now.
    current: Option<Vec<Current>>,
    /// Staged and verified, refused for signatures only.
    pending: Option<Vec<Current>>,
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

impl ImagePublisher {
    pub fn new(
        images: Vec<ImageRef>,
        opts: FetchOptions,
        staging: PathBuf,
        state_dir: Arc<StateDir>,
        sigs: SignatureOptions,
    ) -> Self {
        Self {
            images,
            opts,
            staging,
            state_dir,
            sigs,
            current: None,
            pending: None,
        }
    }

    /// A new generation if any image's digest differs from what is
    /// published (or nothing is yet, or `force`); images waiting for
    /// signatures are published again without fetching them. On error,
    /// whatever this call staged is removed; on a signature refusal it is
    /// kept, to be published when signatures change.
    async fn check_images(&mut self, force: bool) -> Result<Checked> {
        let base = self.pending.as_deref().or(self.current.as_deref());
        let force = force || self.pending.is_some();
        let Some(next) = self.stage_moved(base, force).await? else {
            return Ok(Checked::Unchanged);
        };
        match self.publish(&next).await {
            Ok(generation) => {
                self.current = Some(next);
                self.pending = None;
                Ok(Checked::New(Box::new(generation)))
            }
            Err(e) if signing::is_signature_error(&e) => {
                self.pending = Some(next);
                Ok(Checked::Refused(e))
            }
            Err(e) => Err(e),
        }
    }

    /// Every image as it should be published: reused from `base` where its
    /// digest did not move, fetched afresh otherwise; `None` if nothing
    /// moved (and not `force`).
    async fn stage_moved(
        &self,
        base: Option<&[Current]>,
        force: bool,
    ) -> Result<Option<Vec<Current>>> {
        let mut next = Vec::with_capacity(self.images.len());
        let mut changed = base.is_none() || force;
        for (i, image) in self.images.iter().enumerate() {
            if let Some(cur) = base.map(|c| &c[i]) {
                let digest = source::resolve_digest(image, &self.opts)
                    .await
                    .with_context(|| format!("checking {image} for a new digest"))?;
                if digest == cur.digest {
                    next.push(cur.clone());
                    continue;
                }
                tracing::info!(%image, from = cur.digest, to = digest, "image moved; fetching it");
            }
            next.push(self.fetch(image).await?);
            changed = true;
        }
        Ok(changed.then_some(next))
    }

    /// Publishes the staged images as one generation (not yet visible).
    async fn publish(&self, next: &[Current]) -> Result<Generation> {
        let releases: Vec<Release> = next.iter().map(|c| c.release.clone()).collect();
        let sd = self.state_dir.clone();
        let sigs = self.sigs.clone();
        let mut generation = tokio::task::spawn_blocking(move || {
            publish::publish_releases_signed(&releases, &sd, &sigs)
        })
        .await
        .context("publish task")??;
        // The generation shares the staged images; they outlive it only if
        // a later generation still serves them.
        generation.keepalive.extend(
            next.iter()
                .map(|c| Box::new(c.guard.clone()) as Box<dyn std::any::Any + Send + Sync>),
        );
        announce(&generation);
        Ok(generation)
    }

    async fn fetch(&self, image: &ImageRef) -> Result<Current> {
        fetch_one(image, &self.opts, &self.staging).await
    }
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
    // Owned from here: an early return below removes it.
    let guard = Arc::new(StagedGuard(Some(staged)));
    let commit: Checksum = commit
        .parse()
        .with_context(|| format!("image {image}: its commit label"))?;
    Ok(Current {
        digest,
        release: Release {
            image: image.to_string(),
            repo: root.join(publish::OSCONTAINER_REPO),
            commit,
            version,
            preverified: format == source::ImageFormat::Native,
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
