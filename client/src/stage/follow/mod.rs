//! `oscontent stage --follow`: the node agent. It follows a ref on the
//! remote and stages the image published there, one staging slot at a time
//! per the server's caps, so that a fleet does not stage all at once.
//!
//! A round, and why in this order:
//! 1. The remote's summary, verified against keys ([`options::require_verified`]
//!    refused to start otherwise: the server names the digest here), and the
//!    staging index's one image for the ref's commit.
//! 2. The repo: an image already staged, or already imported, leaves the
//!    agent idle until the next poll ([`decide::round`]).
//! 3. A slot: asked for with the node, pool and digest; a 429 is waited out
//!    (its `Retry-After`, capped, with the agent's own jitter) and asked
//!    again; a server without slots is a failure unless `--without-slots`.
//! 4. The stage, exactly as `oscontent stage --image` runs it, while a
//!    renewer renews the lease every ttl/3 on the agent's own runtime. A
//!    lease the server no longer has stops the stage between two of its
//!    steps (nothing is visible) and the round asks again.
//! 5. The slot released (DELETE), whether the stage succeeded or not.
//!
//! A failed round backs off exponentially, capped ([`decide::failure_backoff`]);
//! SIGTERM or SIGINT ends any wait or stage, releases the slot held, and the
//! agent exits 0. Slots live in the memory of the server replica that gave
//! them: behind several replicas each hands out its own, and a renewal that
//! reaches another replica is a 404, which is "ask again" here.

pub mod decide;
pub mod metrics;
pub mod options;
pub mod slots;
pub mod wire;

use crate::pull::error::{PullError, PullResult, Tag};
use crate::pull::options::Remote;
use crate::pull::report::Reporter;
use crate::pull::store::Store;
use crate::pull::{self, remote};
use crate::stage::image::PinnedImage;
use crate::stage::{self as stage_mod, StageTarget};
use anyhow::{anyhow, Context};
use decide::{AgentState, Next, RenewNext, Renewal, Round};
use metrics::Metrics;
pub use options::FollowOptions;
use serde_json::json;
use slots::SlotClient;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use wire::{Lease, SlotRequest};

/// Reading the summary (step 1) ends within this.
const SUMMARY_TIMEOUT: Duration = Duration::from_secs(300);
/// A round waits for a slot at most this long, then reads the summary
/// again: the ref may have moved meanwhile.
const MAX_SLOT_ROUND: Duration = Duration::from_secs(1800);
/// Releasing a slot ends within this; a release that fails leaves the
/// lease to expire after its TTL.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a round ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundEnd {
    /// Wait for the next poll.
    Done,
    /// Start the next round at once (the slot was lost, or waited for
    /// [`MAX_SLOT_ROUND`]).
    Again,
    /// SIGTERM or SIGINT.
    Stopped,
}

/// What every round shares.
struct Agent<'a> {
    opts: &'a FollowOptions,
    remote: Remote,
    slots: SlotClient,
    /// The slot requests, renewals, signals and `/metrics`: a runtime of
    /// its own, so that they go on while a stage runs on the stage's.
    rt: tokio::runtime::Runtime,
    /// `Some(signal name)` once SIGTERM or SIGINT came.
    stop: watch::Receiver<Option<&'static str>>,
    reporter: Arc<Reporter>,
    metrics: Arc<Metrics>,
    state: Mutex<Option<AgentState>>,
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn follow(opts: &FollowOptions, reporter: Arc<Reporter>) -> PullResult<()> {
    opts.check()?;
    let store = Store::open(&opts.stage.repo).local()?;
    options::require_verified(&opts.stage, &store)?;
    let io = opts.stage.io.checked()?;
    let remote = remote::resolve_source(&stage_mod::pull_options(&opts.stage, &io), &store)?;
    drop(store);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the agent's runtime")
        .usage()?;
    let (tx, stop) = watch::channel(None);
    rt.spawn(async move {
        let why = pull::interrupted().await;
        let _ = tx.send(Some(why));
    });
    let metrics = Arc::new(Metrics::new(&opts.node, &opts.pool));
    if let Some(addr) = opts.metrics_listen {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| anyhow!("--metrics-listen {addr}: {e}"))
            .usage()?;
        let m = metrics.clone();
        rt.spawn(async move {
            if let Err(e) = metrics::serve(listener, m).await {
                tracing::error!("{e:#}");
            }
        });
    }
    let agent = Agent {
        slots: SlotClient::new(&remote.url).usage()?,
        remote,
        opts,
        rt,
        stop,
        reporter,
        metrics,
        state: Mutex::new(None),
    };
    agent.run();
    agent.rt.shutdown_timeout(pull::SHUTDOWN_GRACE);
    Ok(())
}

impl Agent<'_> {
    /// Rounds until stopped; each ends in a bounded wait.
    fn run(&self) {
        self.reporter.event(
            "agent-start",
            json!({
                "node": self.opts.node, "pool": self.opts.pool, "ref": self.opts.ref_name,
                "control_plane": self.opts.control_plane,
                "poll_interval_secs": self.opts.poll_interval.as_secs_f64(),
                "without_slots": self.opts.without_slots,
            }),
            Some(format!(
                "following {} for node {} (pool {})",
                self.opts.ref_name, self.opts.node, self.opts.pool
            )),
        );
        let mut failures = 0u32;
        while self.stopped().is_none() {
            let wait = match self.round() {
                Ok(RoundEnd::Stopped) => break,
                Ok(RoundEnd::Again) => Duration::ZERO,
                Ok(RoundEnd::Done) => {
                    failures = 0;
                    decide::next_poll(self.opts.poll_interval, rand::random())
                }
                Err(_) if self.stopped().is_some() => break,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.failed(&e, failures)
                }
            };
            if !self.sleep(wait) {
                break;
            }
        }
        let why = self.stopped().unwrap_or("stopped");
        self.reporter.event(
            "agent-stopped",
            json!({"signal": why}),
            Some(format!("{why}: the agent stopped")),
        );
    }

    fn failed(&self, e: &PullError, failures: u32) -> Duration {
        self.metrics.failure();
        self.set_state(AgentState::Error);
        let wait = decide::failure_backoff(failures, rand::random());
        self.reporter.event(
            "round-failed",
            json!({
                "kind": e.kind(), "message": format!("{e:#}"), "failures": failures,
                "retry_in_secs": wait.as_secs_f64(),
            }),
            Some(format!(
                "error: {e:#} ({failures} in a row; trying again in {:.0}s)",
                wait.as_secs_f64()
            )),
        );
        wait
    }

    /// Steps 1 to 5.
    fn round(&self) -> PullResult<RoundEnd> {
        let pinned = self.image()?;
        let (staged, imported) = stage_mod::holds(&self.opts.stage.repo, &pinned.digest)?;
        if let Round::Idle(why) = decide::round(staged, imported) {
            self.metrics.succeeded();
            self.set_state_with(
                AgentState::Idle,
                json!({"digest": pinned.digest, "why": why}),
            );
            return Ok(RoundEnd::Done);
        }
        let lease = match self.slot(&pinned)? {
            Slot::Held(lease, ttl) => Some((lease, ttl)),
            Slot::Without => None,
            Slot::End(end) => return Ok(end),
        };
        self.set_state_with(AgentState::Staging, json!({"digest": pinned.digest}));
        let (lost_tx, lost) = watch::channel(false);
        let renewer = lease.clone().map(|(l, ttl)| {
            self.rt.spawn(renew(
                self.slots.clone(),
                l,
                ttl,
                lost_tx,
                self.reporter.clone(),
            ))
        });
        let started = Instant::now();
        let r = self.stage(&pinned, lost.clone());
        if let Some(h) = renewer {
            h.abort();
        }
        if let Some((l, _)) = &lease {
            self.release(l);
        }
        match r {
            Ok(done) => {
                self.metrics.staged(&done, started.elapsed());
                self.set_state_with(
                    AgentState::Idle,
                    json!({"digest": done.digest, "why": "staged"}),
                );
                Ok(RoundEnd::Done)
            }
            Err(_) if self.stopped().is_some() => Ok(RoundEnd::Stopped),
            Err(_) if *lost.borrow() => Ok(RoundEnd::Again),
            Err(e) => Err(e),
        }
    }

    /// Step 1.
    fn image(&self) -> PullResult<PinnedImage> {
        let work = pull::within(
            SUMMARY_TIMEOUT,
            "reading the summary",
            &self.reporter,
            async {
                stage_mod::image_at_ref(
                    &self.remote,
                    &self.opts.ref_name,
                    self.opts.stage.http1_only,
                    &self.reporter,
                )
                .await
            },
        );
        self.until_stopped(work)?
    }

    /// Step 4: the stage, stopped by a signal or by the slot lost.
    fn stage(
        &self,
        pinned: &PinnedImage,
        mut lost: watch::Receiver<bool>,
    ) -> PullResult<stage_mod::StageDone> {
        let mut stop = self.stop.clone();
        let opts = stage_mod::StageOptions {
            target: StageTarget::Image(pinned.clone()),
            ..self.opts.stage.clone()
        };
        stage_mod::stage_until(&opts, self.reporter.clone(), async move {
            tokio::select! {
                _ = stop.wait_for(Option::is_some) => PullError::Interrupted(anyhow!(
                    "the stage was stopped; no ref was written, and the next stage resumes"
                )),
                _ = slot_lost(&mut lost) => PullError::Network(anyhow!(
                    "the staging slot was lost; no ref was written"
                )),
            }
        })
    }

    /// Step 5. A release that fails is reported; the lease then expires.
    fn release(&self, lease: &Lease) {
        let r = self.rt.block_on(async {
            tokio::time::timeout(RELEASE_TIMEOUT, self.slots.release(lease)).await
        });
        let (released, message) = match r {
            Ok(Ok(true)) => (true, None),
            Ok(Ok(false)) => (false, Some("the server no longer had it".to_owned())),
            Ok(Err(e)) => (false, Some(format!("{e:#}"))),
            Err(_) => (
                false,
                Some(format!("no answer within {}s", RELEASE_TIMEOUT.as_secs())),
            ),
        };
        self.reporter.event(
            "slot-released",
            json!({"released": released, "message": message}),
            message
                .as_ref()
                .map(|m| format!("the slot was not released: {m}")),
        );
    }

    /// Runs `work` on the agent's runtime unless a signal comes first.
    fn until_stopped<T>(&self, work: impl std::future::Future<Output = T>) -> PullResult<T> {
        let mut stop = self.stop.clone();
        self.rt.block_on(async {
            tokio::select! {
                t = work => Ok(t),
                _ = stop.wait_for(Option::is_some) => Err(PullError::Interrupted(anyhow!("stopped"))),
            }
        })
    }

    /// Waits `d`; `false` if a signal ended the wait.
    fn sleep(&self, d: Duration) -> bool {
        // Made inside the runtime: a timer needs its context when created.
        self.until_stopped(async { tokio::time::sleep(d).await })
            .is_ok()
    }

    fn stopped(&self) -> Option<&'static str> {
        *self.stop.borrow()
    }

    fn set_state(&self, s: AgentState) {
        self.set_state_with(s, json!({}));
    }

    /// The state, reported as an event when it changes.
    fn set_state_with(&self, s: AgentState, mut fields: serde_json::Value) {
        self.metrics.set_state(s);
        let mut cur = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *cur == Some(s) {
            return;
        }
        *cur = Some(s);
        fields["state"] = s.as_str().into();
        let human = format!("state: {} {}", s.as_str(), fields);
        self.reporter.event("agent-state", fields, Some(human));
    }
}

/// What step 3 came to.
enum Slot {
    Held(Lease, Duration),
    /// No slot, and `--without-slots` says to stage anyway.
    Without,
    End(RoundEnd),
}

impl Agent<'_> {
    /// Step 3: asks until granted, stopped, or [`MAX_SLOT_ROUND`] passed;
    /// every refusal waits at least [`decide::MIN_SLOT_WAIT`].
    fn slot(&self, pinned: &PinnedImage) -> PullResult<Slot> {
        let req = SlotRequest {
            node: &self.opts.node,
            pool: &self.opts.pool,
            control_plane: self.opts.control_plane,
            digest: &pinned.digest,
        };
        let deadline = Instant::now() + MAX_SLOT_ROUND;
        while Instant::now() < deadline {
            self.set_state_with(AgentState::WaitingForSlot, json!({"digest": pinned.digest}));
            let answer = self.until_stopped(self.slots.ask(&req))?.net()?;
            let refused = match &answer {
                wire::SlotAnswer::Refused {
                    reason,
                    in_use,
                    slots,
                    retry_after,
                } => Some(json!({
                    "reason": reason, "in_use": in_use, "slots": slots,
                    "retry_after_secs": retry_after.map(|d| d.as_secs()),
                })),
                _ => None,
            };
            match decide::after_answer(answer, self.opts.without_slots, rand::random()) {
                Next::Stage { lease, ttl } => {
                    self.reporter.event(
                        "slot-granted",
                        json!({"ttl_secs": ttl.as_secs(), "pool": self.opts.pool}),
                        Some(format!("slot granted in pool {}", self.opts.pool)),
                    );
                    return Ok(Slot::Held(lease, ttl));
                }
                Next::StageWithoutSlot => {
                    self.reporter.event(
                        "no-slots",
                        json!({"staging": "without a slot (--without-slots)"}),
                        Some(
                            "the server hands out no slots: staging without one (--without-slots)"
                                .to_owned(),
                        ),
                    );
                    return Ok(Slot::Without);
                }
                Next::WaitForSlot(d) => {
                    self.metrics.slot_wait();
                    let mut f = refused.unwrap_or_else(|| json!({}));
                    f["wait_secs"] = d.as_secs_f64().into();
                    self.reporter.event("slot-refused", f, None);
                    if !self.sleep(d) {
                        return Ok(Slot::End(RoundEnd::Stopped));
                    }
                }
                Next::Fail(why) => return Err(PullError::Network(anyhow!(why))),
            }
        }
        Ok(Slot::End(RoundEnd::Again))
    }
}

/// Resolves once the renewer says the slot is lost; never without a
/// renewer (a stage without a slot, whose sender is gone at once).
async fn slot_lost(lost: &mut watch::Receiver<bool>) {
    if lost.wait_for(|l| *l).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The renewer: renews every ttl/3 until aborted (the stage ended), or
/// says the slot is lost ([`decide::after_renewal`]).
async fn renew(
    client: SlotClient,
    lease: Lease,
    mut ttl: Duration,
    lost: watch::Sender<bool>,
    reporter: Arc<Reporter>,
) {
    let mut last_ok = Instant::now();
    let mut wait = decide::renew_every(ttl);
    loop {
        tokio::time::sleep(wait).await;
        let attempt = match client.renew(&lease).await {
            Ok(Some(t)) => Renewal::Renewed(t),
            Ok(None) => Renewal::Gone,
            Err(e) => {
                tracing::warn!("{e:#}");
                Renewal::Failed
            }
        };
        if let Renewal::Renewed(_) = attempt {
            last_ok = Instant::now();
        }
        match decide::after_renewal(attempt, last_ok.elapsed(), ttl) {
            RenewNext::After(w, t) => (wait, ttl) = (w, t),
            RenewNext::Lost => {
                reporter.event(
                    "slot-lost",
                    json!({"gone": attempt == Renewal::Gone}),
                    Some("the staging slot is gone: the stage stops and asks again".to_owned()),
                );
                let _ = lost.send(true);
                return;
            }
        }
    }
}
