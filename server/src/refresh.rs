//! Keeps a source published: one loop for every kind of source.
//!
//! A [`Publisher`] knows only how to check its source once and build a new
//! generation when it moved. The [`Refresher`] decides when to check (the
//! refresh interval, SIGHUP, a retry after a failure with capped
//! exponential backoff, new signatures), publishes what a check built into
//! the [`Sink`], counts every outcome, and logs what is served meanwhile. A
//! failed check never costs the generation already published.
//! `oscontent_source_checks_total{result="published"|"unchanged"|"failed"}`
//! counts the checks.
//!
//! Whether a new generation may move a ref back in time is the
//! publisher's decision ([`rollback::RollbackGuard`]: the image publisher
//! judges each image against marks kept in the state dir, a site mirror
//! its summary before it prunes): what a check returns is published.
//!
//! With signatures, a check refused only because something does not verify
//! is not retried on a timer: the source is checked again (forced, so a
//! publisher republishes what it staged) once the signatures change.

use crate::served::Generation;
use crate::signing::{SignatureOptions, SignatureWatch};
use crate::sink::{Outcome, Sink};
use anyhow::Result;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub mod follow;
pub mod marks;
pub mod rollback;

use follow::Follow;

pub use rollback::{RollbackGuard, RollbackPolicy};

/// First wait after a failed check; doubles up to the configured maximum.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// What one check found.
#[derive(Debug)]
pub enum Checked {
    /// A new generation, verified and not yet visible.
    New(Box<Generation>),
    /// A new generation without some of what moved, which failed (kept at
    /// its previous release): published, and the check retried.
    Partial(Box<Generation>, anyhow::Error),
    Unchanged,
    /// Built, but the signatures did not verify: wait for new ones.
    Refused(anyhow::Error),
}

/// One kind of source: how to check it once.
pub trait Publisher: Send {
    /// Checks the source and builds a new generation if it moved, or
    /// anyway with `force` (the signatures changed). On error, whatever the
    /// check staged is removed.
    fn check(&mut self, force: bool) -> impl Future<Output = Result<Checked>> + Send;
    /// What is checked, for logs: "the images", "the source".
    fn what(&self) -> &str;
    /// Whether a failed check shows that `current`, the generation being
    /// served, can no longer be trusted: it reads files the check found
    /// corrupt, or others that changed as well. A publisher that serves
    /// its own verified copy never has to say so.
    fn discredits(
        &self,
        _e: &anyhow::Error,
        _current: Arc<Generation>,
    ) -> impl Future<Output = bool> + Send {
        async { false }
    }
}

/// When to check, besides SIGHUP.
#[derive(Debug, Clone, Copy, Default)]
pub struct Schedule {
    /// `--refresh-interval`; `None`: only at SIGHUP.
    pub interval: Option<Duration>,
    /// Longest wait between retries after a failure; `None`: a failure
    /// waits for the next trigger instead of being retried.
    pub max_backoff: Option<Duration>,
}

/// Where new signatures come from, and how often to look.
#[derive(Debug, Clone)]
struct SignaturePoll {
    bundle_dir: Option<PathBuf>,
    every: Duration,
    /// A served summary that moved triggers a publication: never with
    /// `--sign-key`, which would sign what a repo's writer changed.
    follow_summary: bool,
}

/// What ended a wait.
#[derive(Debug, PartialEq, Eq)]
enum Trigger {
    /// The refresh interval or a retry.
    Timer,
    Sighup,
    /// New signatures, or a summary that moved.
    Signatures,
    /// A followed `--repo` changed.
    Repo,
}

/// The refresh loop around one [`Publisher`].
#[derive(Debug)]
pub struct Refresher<P> {
    publisher: P,
    sink: Arc<Sink>,
    schedule: Schedule,
    /// Fired by SIGHUP: check now.
    hup: Arc<Notify>,
    signatures: Option<SignaturePoll>,
    watch: SignatureWatch,
    /// A `--repo` followed without SIGHUP (never with `--sign-key`).
    follow: Option<Follow>,
    /// The last check was refused for signatures only.
    pending: bool,
    /// The served generation was withdrawn ([`Publisher::discredits`]):
    /// wait for a trigger rather than check again at once.
    withdrawn: bool,
    backoff: Duration,
    /// Set after a failure: check again after this even without a trigger.
    retry_in: Option<Duration>,
}

impl<P: Publisher> Refresher<P> {
    pub fn new(publisher: P, sink: Arc<Sink>, hup: Arc<Notify>, schedule: Schedule) -> Self {
        Self {
            publisher,
            sink,
            schedule,
            hup,
            signatures: None,
            watch: SignatureWatch::default(),
            follow: None,
            pending: false,
            withdrawn: false,
            backoff: INITIAL_BACKOFF,
            retry_in: None,
        }
    }

    /// Also checks when the signatures change (when `sigs` has any), looking
    /// every `every`.
    pub fn watching(mut self, sigs: &SignatureOptions, every: Duration) -> Self {
        self.signatures = sigs.is_active().then(|| SignaturePoll {
            bundle_dir: sigs.bundle_dir.clone(),
            every,
            follow_summary: sigs.sign_key.is_none(),
        });
        self
    }

    /// Also checks when the followed repo changes.
    pub fn following(mut self, follow: Follow) -> Self {
        self.follow = Some(follow);
        self
    }

    /// The first check, before the server listens: an error is the
    /// caller's (the server does not start), except a signature refusal,
    /// which waits for new signatures. Not counted.
    pub async fn publish_first(&mut self) -> Result<()> {
        if let Some(f) = &mut self.follow {
            f.mark().await;
        }
        match self.publisher.check(false).await? {
            Checked::New(generation) => self.publish(*generation).await,
            Checked::Partial(generation, e) => {
                self.publish(*generation).await;
                self.failed(&e, 1);
            }
            Checked::Unchanged => {}
            Checked::Refused(e) => self.refused(e).await,
        }
        Ok(())
    }

    /// Runs until the task is aborted (at shutdown): checks at once unless
    /// something is published or waiting for signatures, then at every
    /// trigger. Failures are logged, counted and retried; the last good
    /// generation stays served.
    pub async fn run(mut self) {
        for attempt in 1u64.. {
            let mut force = false;
            if self.sink.has_generation()
                || self.retry_in.is_some()
                || self.pending
                || self.withdrawn
            {
                force = self.wait().await == Trigger::Signatures;
            }
            self.check(force, attempt).await;
        }
    }

    /// One check, published, counted and logged.
    async fn check(&mut self, force: bool, attempt: u64) {
        if let Some(f) = &mut self.follow {
            f.mark().await;
        }
        match self.publisher.check(force).await {
            Ok(Checked::New(generation)) => {
                self.sink.count(Outcome::Published);
                self.publish(*generation).await;
                self.succeeded();
            }
            Ok(Checked::Partial(generation, e)) => {
                self.sink.count(Outcome::Published);
                self.publish(*generation).await;
                // What failed is fetched again at the retry.
                self.failed(&e, attempt);
            }
            Ok(Checked::Unchanged) => {
                self.sink.count(Outcome::Unchanged);
                tracing::debug!("{} unchanged", self.publisher.what());
                self.succeeded();
            }
            Ok(Checked::Refused(e)) => {
                self.sink.count(Outcome::Failed);
                self.refused(e).await;
                // Retrying would be refused again: new signatures trigger.
                self.succeeded();
            }
            Err(e) => {
                self.sink.count(Outcome::Failed);
                let discredited = match self.sink.current() {
                    Some(current) => self.publisher.discredits(&e, current).await,
                    None => false,
                };
                if discredited {
                    self.sink.withdraw();
                    self.withdrawn = true;
                    tracing::error!(
                        "{e:#} (the generation served reads the same files: withdrawn, not \
                         ready until {} verifies again)",
                        self.publisher.what()
                    );
                    if let Some(max) = self.schedule.max_backoff {
                        self.retry_in = Some(self.backoff);
                        self.backoff = (self.backoff * 2).min(max);
                    }
                    return;
                }
                self.failed(&e, attempt);
            }
        }
    }

    /// Publishes into the sink, which warms the object cache first.
    async fn publish(&mut self, generation: Generation) {
        self.watch.published();
        self.pending = false;
        self.withdrawn = false;
        self.sink.publish(generation).await;
    }

    /// The check ran to an answer: back to the first backoff, no retry.
    fn succeeded(&mut self) {
        self.retry_in = None;
        self.backoff = INITIAL_BACKOFF;
    }

    /// Remembers the bundle that was refused, so that only a changed one
    /// triggers the next check.
    async fn refused(&mut self, e: anyhow::Error) {
        let dir = self.signatures.as_ref().and_then(|s| s.bundle_dir.clone());
        let mut watch = std::mem::take(&mut self.watch);
        self.watch = tokio::task::spawn_blocking(move || {
            watch.refused(dir.as_deref());
            watch
        })
        .await
        .unwrap_or_default();
        self.pending = true;
        let serving = if self.sink.has_generation() {
            "still serving the previous generation"
        } else {
            "not ready until the signatures verify"
        };
        tracing::error!("{e:#} ({serving}; watching for new signatures)");
    }

    /// Schedules the retry, if failures are retried.
    fn failed(&mut self, e: &anyhow::Error, attempt: u64) {
        let serving = if self.sink.has_generation() {
            "still serving the previous generation"
        } else {
            "nothing published yet"
        };
        match self.schedule.max_backoff {
            Some(max) => {
                tracing::error!(attempt, retry_in = ?self.backoff, "{e:#} ({serving})");
                self.retry_in = Some(self.backoff);
                self.backoff = (self.backoff * 2).min(max);
            }
            None => tracing::error!(attempt, "{e:#} ({serving})"),
        }
    }

    /// Waits for SIGHUP, the refresh interval, a pending retry or new
    /// signatures, whichever comes first.
    async fn wait(&self) -> Trigger {
        let wait = match (self.retry_in, self.schedule.interval) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = wait.map(|d| Instant::now() + d);
        let poll = match (self.signatures.as_ref().map(|s| s.every), &self.follow) {
            (Some(p), Some(f)) => Some(p.min(f.every)),
            (p, f) => p.or(f.as_ref().map(|f| f.every)),
        };
        // Bounded by the server's life: the task is aborted at shutdown.
        loop {
            let step = match (deadline, poll) {
                (Some(d), Some(p)) => Some(d.min(Instant::now() + p)),
                (Some(d), None) => Some(d),
                (None, Some(p)) => Some(Instant::now() + p),
                (None, None) => None,
            };
            let woken = async {
                match &self.follow {
                    Some(f) => f.woken().await,
                    None => std::future::pending().await,
                }
            };
            let sighup = async {
                match step {
                    Some(at) => tokio::select! {
                        _ = tokio::time::sleep_until(at) => false,
                        _ = self.hup.notified() => true,
                        () = woken => false,
                    },
                    None => tokio::select! {
                        _ = self.hup.notified() => true,
                        () = woken => false,
                    },
                }
            };
            if sighup.await {
                tracing::info!("SIGHUP: checking {} now", self.publisher.what());
                return Trigger::Sighup;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Trigger::Timer;
            }
            if self.signatures.is_some() && self.signatures_changed().await {
                tracing::info!("new signatures (or a changed summary); publishing again");
                return Trigger::Signatures;
            }
            if let Some(f) = &self.follow {
                if f.changed().await {
                    tracing::info!(
                        "the repo changed (refs, summary or signatures); publishing again"
                    );
                    return Trigger::Repo;
                }
            }
        }
    }

    async fn signatures_changed(&self) -> bool {
        let current = self.sink.current();
        if current.is_none() && !self.pending {
            // Nothing built to publish: that is the retry's job.
            return false;
        }
        let dir = self.signatures.as_ref().and_then(|s| s.bundle_dir.clone());
        let follow = self.signatures.as_ref().is_some_and(|s| s.follow_summary);
        let watch = self.watch.clone();
        tokio::task::spawn_blocking(move || {
            watch.should_republish(dir.as_deref(), current.as_deref(), follow)
        })
        .await
        .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
