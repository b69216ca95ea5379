//! Keeps `--image` sources published: the first fetch, then refreshes.
//!
//! A refresh (every `--refresh-interval`, or at SIGHUP) first resolves each
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

use crate::http::AppState;
use crate::publish::{self, Release, StateDir};
use crate::served::Generation;
use crate::signing::{self, SignatureOptions, SignatureWatch};
use crate::source::{self, FetchOptions, ImageRef, StagedImage};
use anyhow::{Context, Result};
use oscontent_format::Checksum;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// First wait after a failed fetch; doubles up to `max_backoff`.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// What the publisher needs, fixed for the server's life.
#[derive(Debug)]
pub struct ImagePublisher {
    pub images: Vec<ImageRef>,
    pub opts: FetchOptions,
    /// Where images are staged (under the state dir).
    pub staging: PathBuf,
    pub state_dir: Arc<StateDir>,
    pub app: AppState,
    pub max_backoff: Duration,
    /// Check the references for new digests this often; `None`: only at
    /// SIGHUP.
    pub refresh_interval: Option<Duration>,
    /// Fired by SIGHUP: check now.
    pub refresh_now: Arc<Notify>,
    /// Signatures to install, make and verify at each publication.
    pub sigs: SignatureOptions,
    /// How often to look for new signatures (when `sigs` is active).
    pub signatures_poll: Duration,
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

/// Outcome of one check, for logs and metrics.
#[derive(Debug)]
enum Checked {
    Published,
    Unchanged,
    /// Staged and verified, but the signatures did not verify.
    Refused(anyhow::Error),
}

/// What ended a wait.
#[derive(Debug, PartialEq, Eq)]
enum Trigger {
    /// The refresh interval or a retry.
    Timer,
    Sighup,
    /// New signatures, or a summary that moved.
    Signatures,
}

impl ImagePublisher {
    /// Runs until the task is aborted (at shutdown): publishes the images
    /// once (retrying with backoff), then refreshes on the interval and at
    /// SIGHUP. Never returns an error: failures are logged, counted and
    /// retried, and the last good generation stays served.
    pub async fn run(self) {
        let mut current: Option<Vec<Current>> = None;
        // Staged and verified, refused for signatures only.
        let mut pending: Option<Vec<Current>> = None;
        let mut watch = SignatureWatch::default();
        let mut backoff = INITIAL_BACKOFF;
        // Set after a failure: retry after `backoff` even without a trigger.
        let mut retry_in: Option<Duration> = None;
        for attempt in 1u64.. {
            let mut force = false;
            if current.is_some() || retry_in.is_some() || pending.is_some() {
                force = self
                    .wait_for_trigger(retry_in, &watch, pending.is_some())
                    .await
                    == Trigger::Signatures;
            }
            let base = pending.as_deref().or(current.as_deref());
            match self.check(base, force || pending.is_some()).await {
                Ok((Checked::Unchanged, _)) => {
                    self.count("unchanged");
                    tracing::debug!("images unchanged");
                    retry_in = None;
                    backoff = INITIAL_BACKOFF;
                }
                Ok((Checked::Published, next)) => {
                    self.count("published");
                    watch.published();
                    current = Some(next);
                    pending = None;
                    retry_in = None;
                    backoff = INITIAL_BACKOFF;
                }
                Ok((Checked::Refused(e), next)) => {
                    self.count("failed");
                    let dir = self.sigs.bundle_dir.clone();
                    watch = tokio::task::spawn_blocking(move || {
                        watch.refused(dir.as_deref());
                        watch
                    })
                    .await
                    .unwrap_or_default();
                    let serving = if current.is_some() {
                        "still serving the previous generation"
                    } else {
                        "not ready until the signatures verify"
                    };
                    tracing::error!("{e:#} ({serving}; watching for new signatures)");
                    pending = Some(next);
                    retry_in = None;
                    backoff = INITIAL_BACKOFF;
                }
                Err(e) => {
                    self.count("failed");
                    let serving = if current.is_some() {
                        "still serving the previous generation"
                    } else {
                        "nothing published yet"
                    };
                    tracing::error!(attempt, retry_in = ?backoff, "{e:#} ({serving})");
                    retry_in = Some(backoff);
                    backoff = (backoff * 2).min(self.max_backoff);
                }
            }
        }
    }

    fn count(&self, result: &str) {
        self.app
            .metrics
            .source_checks
            .with_label_values(&[result])
            .inc();
    }

    /// Waits for SIGHUP, the refresh interval, a pending retry or new
    /// signatures, whichever comes first.
    async fn wait_for_trigger(
        &self,
        retry_in: Option<Duration>,
        watch: &SignatureWatch,
        pending: bool,
    ) -> Trigger {
        let wait = match (retry_in, self.refresh_interval) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = wait.map(|d| tokio::time::Instant::now() + d);
        let poll = self.sigs.is_active().then_some(self.signatures_poll);
        // Bounded by the server's life: the task is aborted at shutdown.
        loop {
            let step = match (deadline, poll) {
                (Some(d), Some(p)) => Some(d.min(tokio::time::Instant::now() + p)),
                (Some(d), None) => Some(d),
                (None, Some(p)) => Some(tokio::time::Instant::now() + p),
                (None, None) => None,
            };
            match step {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.refresh_now.notified() => {
                            tracing::info!("SIGHUP: checking the images now");
                            return Trigger::Sighup;
                        }
                    }
                }
                None => {
                    self.refresh_now.notified().await;
                    tracing::info!("SIGHUP: checking the images now");
                    return Trigger::Sighup;
                }
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return Trigger::Timer;
            }
            if poll.is_some() && self.signatures_changed(watch, pending).await {
                tracing::info!("new signatures (or a changed summary); publishing again");
                return Trigger::Signatures;
            }
        }
    }

    async fn signatures_changed(&self, watch: &SignatureWatch, pending: bool) -> bool {
        let current = self.app.current.load_full();
        if current.is_none() && !pending {
            // Nothing staged to publish: that is the fetch retry's job.
            return false;
        }
        let dir = self.sigs.bundle_dir.clone();
        let refused = watch.clone();
        tokio::task::spawn_blocking(move || {
            refused.should_republish(dir.as_deref(), current.as_deref())
        })
        .await
        .unwrap_or(false)
    }

    /// Publishes a new generation if any image's digest differs from
    /// `current` (or nothing is published yet, or `force`). On error,
    /// whatever this call staged is removed; on a signature refusal it is
    /// returned, to be published when signatures change.
    async fn check(
        &self,
        current: Option<&[Current]>,
        force: bool,
    ) -> Result<(Checked, Vec<Current>)> {
        let mut next = Vec::with_capacity(self.images.len());
        let mut changed = current.is_none() || force;
        for (i, image) in self.images.iter().enumerate() {
            if let Some(cur) = current.map(|c| &c[i]) {
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
        if !changed {
            return Ok((Checked::Unchanged, next));
        }
        let releases: Vec<Release> = next.iter().map(|c| c.release.clone()).collect();
        let sd = self.state_dir.clone();
        let sigs = self.sigs.clone();
        let published = tokio::task::spawn_blocking(move || {
            publish::publish_releases_signed(&releases, &sd, &sigs)
        })
        .await
        .context("publish task")?;
        let mut generation: Generation = match published {
            Ok(g) => g,
            Err(e) if signing::is_signature_error(&e) => return Ok((Checked::Refused(e), next)),
            Err(e) => return Err(e),
        };
        // The generation shares the staged images; they outlive it only if
        // a later generation still serves them.
        generation.keepalive.extend(
            next.iter()
                .map(|c| Box::new(c.guard.clone()) as Box<dyn std::any::Any + Send + Sync>),
        );
        announce(&generation);
        self.app.publish(generation);
        Ok((Checked::Published, next))
    }

    async fn fetch(&self, image: &ImageRef) -> Result<Current> {
        fetch_one(image, &self.opts, &self.staging).await
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
    // Owned from here: an early return below removes it.
    let guard = Arc::new(StagedGuard(Some(staged)));
    let commit: Checksum = commit
        .parse()
        .with_context(|| format!("image {image}: label {}", source::COMMIT_LABEL))?;
    Ok(Current {
        digest,
        release: Release {
            image: image.to_string(),
            repo: root.join(publish::OSCONTAINER_REPO),
            commit,
            version,
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
