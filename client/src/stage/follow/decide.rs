//! The agent's decisions, pure: what a round does given what the repo holds,
//! what a slot answer leads to, and how long each wait is. The random
//! number (uniform in [0, 1)) comes from the caller, so every case is a
//! row of a table.

use super::wire::{Lease, SlotAnswer};
use oscontent_format::RetryPolicy;
use std::time::Duration;

/// The agent's state, as `oscontent_agent_state{state}` exports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    Idle,
    WaitingForSlot,
    Staging,
    Error,
}

impl AgentState {
    pub const ALL: [AgentState; 4] = [
        AgentState::Idle,
        AgentState::WaitingForSlot,
        AgentState::Staging,
        AgentState::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Idle => "idle",
            AgentState::WaitingForSlot => "waiting_for_slot",
            AgentState::Staging => "staging",
            AgentState::Error => "error",
        }
    }
}

/// What a round does with the image the ref names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Nothing to do: the image is already staged, or already imported.
    Idle(&'static str),
    /// Ask for a slot and stage it.
    Stage,
}

/// Imported first: once the importer has the image, its stage is dropped
/// (`stage::tidy`) and staging it again would only be undone.
pub fn round(staged: bool, imported: bool) -> Round {
    match (staged, imported) {
        (_, true) => Round::Idle("imported"),
        (true, false) => Round::Idle("staged"),
        (false, false) => Round::Stage,
    }
}

/// What follows a slot answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Stage {
        lease: Lease,
        ttl: Duration,
    },
    /// The server hands out no slots and `--without-slots` says to stage
    /// anyway.
    StageWithoutSlot,
    /// Ask again after this long.
    WaitForSlot(Duration),
    /// A failure: backed off as any other.
    Fail(String),
}

/// The longest a 429 is waited for before the agent asks again, whatever
/// the server's `Retry-After` says: a slot freed meanwhile is then taken
/// within this.
pub const MAX_SLOT_WAIT: Duration = Duration::from_secs(300);
/// The shortest wait between two slot requests.
pub const MIN_SLOT_WAIT: Duration = Duration::from_secs(1);
/// The agent's own jitter on a 429's wait: up to this fraction longer,
/// beside the server's, so that agents a server answered in the same
/// second do not come back in the same second either.
pub const SLOT_WAIT_JITTER: f64 = 0.25;

pub fn after_answer(answer: SlotAnswer, without_slots: bool, r: f64) -> Next {
    match answer {
        SlotAnswer::Granted { lease, ttl } => Next::Stage { lease, ttl },
        SlotAnswer::Refused { retry_after, .. } => Next::WaitForSlot(slot_wait(retry_after, r)),
        SlotAnswer::NoSlots if without_slots => Next::StageWithoutSlot,
        SlotAnswer::NoSlots => Next::Fail(
            "the server hands out no staging slots (404 on its slot route: an older server, \
             or one run with --stage-slots 0); pass --without-slots to stage without one"
                .to_owned(),
        ),
    }
}

/// A 429's wait: the server's `Retry-After` (1 s when it sent none) within
/// [`MIN_SLOT_WAIT`, `MAX_SLOT_WAIT`], then up to [`SLOT_WAIT_JITTER`]
/// longer.
pub fn slot_wait(retry_after: Option<Duration>, r: f64) -> Duration {
    let base = retry_after
        .unwrap_or(MIN_SLOT_WAIT)
        .clamp(MIN_SLOT_WAIT, MAX_SLOT_WAIT);
    base + base.mul_f64(SLOT_WAIT_JITTER * r.clamp(0.0, 1.0))
}

/// How often a lease is renewed: a third of its TTL (so two renewals may
/// fail before it expires), at least every second.
pub fn renew_every(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_secs(1))
}

/// What one renewal attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Renewed(Duration),
    /// 404: the server no longer has the lease.
    Gone,
    /// Anything else (no connection, a 5xx): try again.
    Failed,
}

/// What the renewer does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewNext {
    /// Renew again after this long, with the TTL now in force.
    After(Duration, Duration),
    /// The slot is gone (or must be taken as gone): stop staging.
    Lost,
}

/// After a renewal attempt, `since_ok` after the last one that succeeded
/// (or the grant): a failed attempt is retried sooner, but once a whole TTL
/// has passed unrenewed the server has expired the lease, and the stage
/// must not go on as if it held a slot.
pub fn after_renewal(r: Renewal, since_ok: Duration, ttl: Duration) -> RenewNext {
    match r {
        Renewal::Renewed(t) => RenewNext::After(renew_every(t), t),
        Renewal::Gone => RenewNext::Lost,
        Renewal::Failed if since_ok >= ttl => RenewNext::Lost,
        Renewal::Failed => {
            let left = ttl - since_ok;
            RenewNext::After((renew_every(ttl) / 2).min(left), ttl)
        }
    }
}

/// Failed rounds back off from 5 s, doubling, to at most 5 minutes, half of
/// each delay random (the shared policy's backoff).
pub const FAILURE_BACKOFF: RetryPolicy = RetryPolicy {
    base_delay: Duration::from_secs(5),
    max_delay: Duration::from_secs(300),
    jitter: 0.5,
    ..RetryPolicy::DEFAULT
};

/// The wait after the `failures`-th failed round in a row (counting from 1).
pub fn failure_backoff(failures: u32, r: f64) -> Duration {
    FAILURE_BACKOFF.backoff(failures.max(1), r)
}

/// The wait between two rounds: the poll interval, up to a tenth shorter,
/// so that a fleet started at once does not read the summary in lockstep.
pub fn next_poll(interval: Duration, r: f64) -> Duration {
    interval - interval.mul_f64(0.1 * r.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests;
