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

use crate::http::AppState;
use crate::publish::{self, Release, StateDir};
use crate::served::Generation;
use crate::source::{self, FetchOptions, ImageRef, StagedImage};
use anyhow::{Context, Result};
use oscontent::format::Checksum;
use std::path::PathBuf;
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
    /// Signatures to install and verify at each publication.
    pub sigs: crate::signing::SignatureOptions,
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
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    Published,
    Unchanged,
}

impl ImagePublisher {
    /// Runs until the task is aborted (at shutdown): publishes the images
    /// once (retrying with backoff), then refreshes on the interval and at
    /// SIGHUP. Never returns an error: failures are logged, counted and
    /// retried, and the last good generation stays served.
    pub async fn run(self) {
        let mut current: Option<Vec<Current>> = None;
        let mut backoff = INITIAL_BACKOFF;
        // Set after a failure: retry after `backoff` even without a trigger.
        let mut retry_in: Option<Duration> = None;
        for attempt in 1u64.. {
            if current.is_some() || retry_in.is_some() {
                self.wait_for_trigger(retry_in).await;
            }
            match self.check(current.as_deref()).await {
                Ok((Checked::Unchanged, _)) => {
                    self.count("unchanged");
                    tracing::debug!("images unchanged");
                    retry_in = None;
                    backoff = INITIAL_BACKOFF;
                }
                Ok((Checked::Published, next)) => {
                    self.count("published");
                    current = Some(next);
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

    /// Waits for SIGHUP, the refresh interval, or a pending retry, whichever
    /// comes first.
    async fn wait_for_trigger(&self, retry_in: Option<Duration>) {
        let wait = match (retry_in, self.refresh_interval) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match wait {
            Some(d) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = self.refresh_now.notified() => tracing::info!("SIGHUP: checking the images now"),
                }
            }
            None => {
                self.refresh_now.notified().await;
                tracing::info!("SIGHUP: checking the images now");
            }
        }
    }

    /// Publishes a new generation if any image's digest differs from
    /// `current` (or nothing is published yet). On error, whatever this
    /// call staged is removed.
    async fn check(&self, current: Option<&[Current]>) -> Result<(Checked, Vec<Current>)> {
        let mut next = Vec::with_capacity(self.images.len());
        let mut changed = current.is_none();
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
        let (sd, sigs) = (self.state_dir.clone(), self.sigs.clone());
        let mut generation: Generation = tokio::task::spawn_blocking(move || {
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
        self.app.publish(generation);
        Ok((Checked::Published, next))
    }

    async fn fetch(&self, image: &ImageRef) -> Result<Current> {
        let staged = source::fetch(image, &self.opts, &self.staging)
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
}

/// Logs what a new generation publishes.
pub fn announce(generation: &Generation) {
    for (name, commit) in &generation.derived_refs {
        tracing::info!(r#ref = name, %commit, generation = generation.id, "published");
    }
}
