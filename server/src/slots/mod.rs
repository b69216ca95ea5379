//! Staging slots: how many nodes of a pool stage an update at once.
//! Staging a whole fleet at once is a spike for the network and, on
//! control-plane nodes, for the disks etcd lives on; so a node agent asks
//! for a slot (a lease) before it stages, renews it every ttl/3 while it
//! stages, and gives it back when done. The HTTP side is
//! `http::slots`; this is the table, pure: no I/O, no clock and no random
//! source of its own (every call is given `now`, and the caller's random
//! numbers), so each rule is a table row in `tests.rs`.
//!
//! The rules: at most `per_pool` live leases a pool; control-plane
//! leases also count against `control_plane` across all pools; at most
//! `per_address` live leases a client address; at most `max_pools` pools
//! ever known (each has metric series, which must stay bounded). A node
//! that asks again while it holds a live lease gets the same one back,
//! renewed, so a restarted agent never takes a second slot. A lease not
//! renewed within the TTL expires: a node that died frees its slot after
//! at most one TTL. The table therefore holds at most `max_pools` x
//! `per_pool` leases.
//!
//! Leases live in memory, in the serving process: a slot is worth no
//! more than a TTL, and the agent already treats a lease the server does
//! not know (a renew answered 404) as "ask again". A restarted server
//! forgets its leases, so up to `per_pool` more nodes may stage during
//! the old leases' last TTL; and with several replicas behind a Service
//! each hands out its own slots, so a pool stages at most `per_pool`
//! nodes per replica (README, "Staging slots").

mod refusal;
pub mod request;
#[cfg(test)]
mod tests;

pub use refusal::{retry_after, Held, Reason, Refusal};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The caps and times of the table (`serve --stage-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotConfig {
    /// Live leases a pool may hold.
    pub per_pool: u32,
    /// Live control-plane leases, all pools together.
    pub control_plane: u32,
    /// How long a lease lives unless renewed.
    pub ttl: Duration,
    /// The base of a refusal's `Retry-After` (whole seconds).
    pub retry_after: Duration,
    /// Pools the table keeps (counted since start).
    pub max_pools: u32,
    /// Live leases one client address may hold.
    pub per_address: u32,
}

impl Default for SlotConfig {
    fn default() -> Self {
        Self {
            per_pool: 8,
            control_plane: 1,
            ttl: Duration::from_secs(60),
            retry_after: Duration::from_secs(30),
            max_pools: 64,
            per_address: 2,
        }
    }
}

/// A lease's name: 128 random bits, written as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId([u8; 16]);

impl LeaseId {
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Exactly 32 lowercase hex digits, as [`std::fmt::Display`] writes them.
    pub fn parse(s: &str) -> Option<Self> {
        let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if s.len() != 32 || !s.bytes().all(lower_hex) {
            return None;
        }
        let mut out = [0u8; 16];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

/// Who asks for a slot (the request's fields, already checked).
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub node: &'a str,
    pub pool: &'a str,
    pub control_plane: bool,
    /// The connection's peer.
    pub address: IpAddr,
}

/// A slot granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub lease: LeaseId,
    pub ttl: Duration,
    /// The pool it counts in: the one asked for, or for a node that
    /// already held a lease, the one that lease was granted in.
    pub pool: String,
    /// The node already held it: renewed, not a new slot.
    pub renewed: bool,
}

/// What a pool has seen since start (its metric series).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub in_use: u32,
    /// The most leases it held at once.
    pub peak: u32,
    /// New leases (a node's lease granted again is not one).
    pub grants: u64,
    /// Refused, by [`Reason::ALL`]'s order.
    pub refusals: [u64; Reason::ALL.len()],
    pub expiries: u64,
    pub releases: u64,
}

/// A lease that expired (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    pub node: String,
    pub pool: String,
}

/// The table as the metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub per_pool: u32,
    /// Every pool known, by name.
    pub pools: Vec<(String, PoolStats)>,
    /// Requests refused for naming a pool past `max_pools` (which get no
    /// series of their own).
    pub unknown_pool_refusals: u64,
}

struct Lease {
    node: String,
    pool: String,
    control_plane: bool,
    address: IpAddr,
    expires: Instant,
}

/// How many fresh names a grant draws before it gives up: 128 random
/// bits do not repeat, so only a broken source gets here.
const MAX_DRAWS: usize = 16;

/// The lease table.
pub struct Slots {
    config: SlotConfig,
    leases: HashMap<LeaseId, Lease>,
    nodes: HashMap<String, LeaseId>,
    /// Live leases by expiry, soonest first: expiry pops from the front.
    by_expiry: BTreeSet<(Instant, LeaseId)>,
    pools: BTreeMap<String, PoolStats>,
    control_plane_in_use: u32,
    addresses: HashMap<IpAddr, u32>,
    unknown_pool_refusals: u64,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("config", &self.config)
            .field("leases", &self.leases.len())
            .field("pools", &self.pools.len())
            .finish_non_exhaustive()
    }
}

impl Slots {
    pub fn new(config: SlotConfig) -> Self {
        Self {
            config,
            leases: HashMap::new(),
            nodes: HashMap::new(),
            by_expiry: BTreeSet::new(),
            pools: BTreeMap::new(),
            control_plane_in_use: 0,
            addresses: HashMap::new(),
            unknown_pool_refusals: 0,
        }
    }

    pub fn config(&self) -> &SlotConfig {
        &self.config
    }

    /// Removes the leases whose TTL ended by `now`; what they were.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired> {
        let mut gone = Vec::new();
        while self.by_expiry.first().is_some_and(|(at, _)| *at <= now) {
            let Some((_, id)) = self.by_expiry.pop_first() else {
                break;
            };
            if let Some(l) = self.remove(id) {
                if let Some(p) = self.pools.get_mut(&l.pool) {
                    p.expiries += 1;
                }
                gone.push(Expired {
                    node: l.node,
                    pool: l.pool,
                });
            }
        }
        gone
    }

    /// A slot for `ask`, or why not. `fresh` draws a new lease's name (the
    /// caller's random source), used only when a new lease is made;
    /// `jitter`, in [0, 1), spreads a refusal's retry time.
    pub fn grant(
        &mut self,
        ask: &Ask<'_>,
        now: Instant,
        mut fresh: impl FnMut() -> [u8; 16],
        jitter: f64,
    ) -> Result<Grant, Refusal> {
        self.expire(now);
        let ttl = self.config.ttl;
        if let Some(&id) = self.nodes.get(ask.node) {
            self.extend(id, now);
            let pool = self.leases.get(&id).map(|l| l.pool.clone());
            return Ok(Grant {
                lease: id,
                ttl,
                pool: pool.unwrap_or_default(),
                renewed: true,
            });
        }
        let base = self.config.retry_after;
        let refuse = |reason, in_use, cap| {
            Refusal::new(reason, Held { in_use, cap }, retry_after(base, jitter))
        };
        let known = u32::try_from(self.pools.len()).unwrap_or(u32::MAX);
        if !self.pools.contains_key(ask.pool) && known >= self.config.max_pools {
            self.unknown_pool_refusals += 1;
            return Err(refuse(Reason::Pools, known, self.config.max_pools));
        }
        let held_here = self.addresses.get(&ask.address).copied().unwrap_or(0);
        let pool_in_use = self.pools.get(ask.pool).map_or(0, |p| p.in_use);
        let refused = if held_here >= self.config.per_address {
            Some(refuse(Reason::Address, held_here, self.config.per_address))
        } else if pool_in_use >= self.config.per_pool {
            Some(refuse(Reason::Full, pool_in_use, self.config.per_pool))
        } else if ask.control_plane && self.control_plane_in_use >= self.config.control_plane {
            let cp = self.control_plane_in_use;
            Some(refuse(Reason::ControlPlane, cp, self.config.control_plane))
        } else {
            None
        };
        let drawn = match refused {
            Some(r) => Err(r),
            // Told to come back, as if full: the source draws anew then.
            None => (0..MAX_DRAWS)
                .map(|_| LeaseId(fresh()))
                .find(|id| !self.leases.contains_key(id))
                .ok_or_else(|| refuse(Reason::Full, pool_in_use, self.config.per_pool)),
        };
        let stats = self.pools.entry(ask.pool.to_owned()).or_default();
        let id = match drawn {
            Ok(id) => id,
            Err(r) => {
                stats.refusals[r.reason().index()] += 1;
                return Err(r);
            }
        };
        stats.in_use += 1;
        stats.peak = stats.peak.max(stats.in_use);
        stats.grants += 1;
        if ask.control_plane {
            self.control_plane_in_use += 1;
        }
        *self.addresses.entry(ask.address).or_default() += 1;
        self.nodes.insert(ask.node.to_owned(), id);
        let expires = now + ttl;
        self.by_expiry.insert((expires, id));
        self.leases.insert(
            id,
            Lease {
                node: ask.node.to_owned(),
                pool: ask.pool.to_owned(),
                control_plane: ask.control_plane,
                address: ask.address,
                expires,
            },
        );
        Ok(Grant {
            lease: id,
            ttl,
            pool: ask.pool.to_owned(),
            renewed: false,
        })
    }

    /// Renews a live lease for another TTL; `None` if it expired or was
    /// never granted (the agent then asks for a slot again).
    pub fn renew(&mut self, id: LeaseId, now: Instant) -> Option<Duration> {
        self.expire(now);
        self.extend(id, now).then_some(self.config.ttl)
    }

    /// Gives a live lease back: whose it was, or `None` if it expired or
    /// was never granted.
    pub fn release(&mut self, id: LeaseId, now: Instant) -> Option<Expired> {
        self.expire(now);
        let l = self.remove(id)?;
        if let Some(p) = self.pools.get_mut(&l.pool) {
            p.releases += 1;
        }
        Some(Expired {
            node: l.node,
            pool: l.pool,
        })
    }

    /// The table as of `now` (expired leases gone), for the metrics.
    pub fn report(&mut self, now: Instant) -> Report {
        self.expire(now);
        Report {
            per_pool: self.config.per_pool,
            pools: self
                .pools
                .iter()
                .map(|(name, s)| (name.clone(), s.clone()))
                .collect(),
            unknown_pool_refusals: self.unknown_pool_refusals,
        }
    }

    /// Moves a live lease's expiry to a TTL from `now`; false if none.
    fn extend(&mut self, id: LeaseId, now: Instant) -> bool {
        let Some(l) = self.leases.get_mut(&id) else {
            return false;
        };
        self.by_expiry.remove(&(l.expires, id));
        l.expires = now + self.config.ttl;
        self.by_expiry.insert((l.expires, id));
        true
    }

    /// Takes a lease out of every index and count.
    fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        let l = self.leases.remove(&id)?;
        self.by_expiry.remove(&(l.expires, id));
        self.nodes.remove(&l.node);
        if let Some(p) = self.pools.get_mut(&l.pool) {
            p.in_use = p.in_use.saturating_sub(1);
        }
        if l.control_plane {
            self.control_plane_in_use = self.control_plane_in_use.saturating_sub(1);
        }
        if let Some(n) = self.addresses.get_mut(&l.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.addresses.remove(&l.address);
            }
        }
        Some(l)
    }
}
