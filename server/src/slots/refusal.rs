//! Why a staging slot was not granted, and when to ask again.

use std::time::Duration;

/// Which cap refused a slot: the label of
/// `oscontent_stage_slot_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The pool has every slot in use.
    Full,
    /// The control-plane slots (across all pools) are in use.
    ControlPlane,
    /// A pool past `--stage-max-pools`.
    Pools,
    /// The client address holds `--stage-leases-per-address` leases.
    Address,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::Full,
        Reason::ControlPlane,
        Reason::Pools,
        Reason::Address,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Full => "full",
            Reason::ControlPlane => "control_plane",
            Reason::Pools => "pools",
            Reason::Address => "address",
        }
    }

    /// Its place in [`Reason::ALL`] (and in a pool's refusal counts).
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// How full the cap that refused is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub in_use: u32,
    pub cap: u32,
}

/// A slot not granted. Every variant says when to ask again: the
/// configured base with jitter ([`retry_after`]), so that the nodes a
/// full pool turned away do not come back in the same second.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("pool: all {} staging slots of the pool are in use", .held.cap)]
    Full { held: Held, retry_after: Duration },
    #[error(
        "control_plane: {} of {} control-plane staging slots (all pools together) are in use",
        .held.in_use,
        .held.cap
    )]
    ControlPlane { held: Held, retry_after: Duration },
    #[error(
        "pool: {} pools are known, the most this server keeps (--stage-max-pools)",
        .held.cap
    )]
    Pools { held: Held, retry_after: Duration },
    #[error(
        "this client address holds {} staging leases, the most one address may (--stage-leases-per-address)",
        .held.in_use
    )]
    Address { held: Held, retry_after: Duration },
}

impl Refusal {
    pub(super) fn new(reason: Reason, held: Held, retry_after: Duration) -> Self {
        match reason {
            Reason::Full => Refusal::Full { held, retry_after },
            Reason::ControlPlane => Refusal::ControlPlane { held, retry_after },
            Reason::Pools => Refusal::Pools { held, retry_after },
            Reason::Address => Refusal::Address { held, retry_after },
        }
    }

    pub fn reason(&self) -> Reason {
        match self {
            Refusal::Full { .. } => Reason::Full,
            Refusal::ControlPlane { .. } => Reason::ControlPlane,
            Refusal::Pools { .. } => Reason::Pools,
            Refusal::Address { .. } => Reason::Address,
        }
    }

    /// The in-use count and cap of what refused (the pool, the
    /// control-plane slots, the pool table or the address).
    pub fn held(&self) -> Held {
        match self {
            Refusal::Full { held, .. }
            | Refusal::ControlPlane { held, .. }
            | Refusal::Pools { held, .. }
            | Refusal::Address { held, .. } => *held,
        }
    }

    /// When to ask again: whole seconds, at least one.
    pub fn retry_after(&self) -> Duration {
        match self {
            Refusal::Full { retry_after, .. }
            | Refusal::ControlPlane { retry_after, .. }
            | Refusal::Pools { retry_after, .. }
            | Refusal::Address { retry_after, .. } => *retry_after,
        }
    }
}

/// `base` (whole seconds) spread uniformly over the whole seconds in
/// [0.5, 1.5) x `base`, at least 1, by `jitter` in [0, 1) (the caller's
/// random number; out of range is clamped, NaN is the middle). Whole
/// seconds because that is what `Retry-After` carries; the range is the
/// integers in it, so a rounded value never falls outside.
pub fn retry_after(base: Duration, jitter: f64) -> Duration {
    let b = base.as_secs();
    // ceil(b / 2) ..= ceil(3b / 2) - 1, written without floats.
    let lo = b.div_ceil(2);
    let hi = b.saturating_mul(3).div_ceil(2);
    let u = if jitter.is_nan() {
        0.5
    } else {
        jitter.clamp(0.0, 1.0)
    };
    let span = hi.saturating_sub(lo);
    // `as` saturates; `min` keeps u = 1.0 inside the span.
    let step = ((u * span as f64) as u64).min(span.saturating_sub(1));
    Duration::from_secs((lo + step).max(1))
}
