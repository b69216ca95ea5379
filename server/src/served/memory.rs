//! The memory that streamed bodies hold in userspace: every chunk read
//! from a file for a response lives until the connection has written it,
//! which for a peer that stops reading is never. HTTP/2 makes that many
//! chunks at once (16 streams a connection, 64 connections an address),
//! and hyper polls a body for its next chunk whenever the stream's send
//! buffer has room, whatever the peer's windows say, so flow control
//! bounds nothing a hostile peer does not want bounded.
//!
//! So a chunk is read only with a place in a byte budget ([`BodyMemory`]):
//! a total, an address's share and its network's (`crate::clients`)
//! share, charged before the buffer is allocated and released when the
//! last handle on the chunk's bytes is dropped (the bytes own their
//! permit, `Bytes::from_owner`), wherever hyper or h2 keeps them. Without
//! a place a body still moves, never waits on others and is never
//! refused: it reads a [`LONE_CHUNK`] outside the budget, and only once
//! its previous lone chunk is gone ([`Charge`]). What one address can
//! pin is then its share plus a lone chunk per stream it may open.
//!
//! Objects the cache holds are served from the cache's own bytes and
//! sendfile bodies are sent from the page cache: neither is charged.

use futures_util::task::AtomicWaker;
use std::collections::hash_map::{Entry, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;

/// The budget of chunks held at once, all clients together.
pub const DEFAULT_BODY_MEMORY: usize = 64 << 20;
/// A body's read without a place in the budget. Small: an address whose
/// share is spent pins this much per stream (1,024 streams at the default
/// caps: 4 MiB), and it is still served, slowly.
pub const LONE_CHUNK: usize = 4 * 1024;

/// One client address's share of `total`.
pub fn share_per_ip(total: usize) -> usize {
    (total / 16).max(1)
}

/// One network's (/24, /64) share of `total`.
pub fn share_per_net(total: usize) -> usize {
    (total / 4).max(1)
}

/// Bytes of response chunks held now, in total, by address and by network.
#[derive(Debug)]
pub struct BodyMemory {
    capacity: usize,
    per_ip: usize,
    per_net: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Only the addresses and networks holding bytes now: the maps cannot
    /// grow with every address seen.
    by_ip: HashMap<IpAddr, usize>,
    by_net: HashMap<IpAddr, usize>,
}

/// `bytes` of the budget, given back when dropped.
#[derive(Debug)]
pub struct MemoryPermit {
    budget: Arc<BodyMemory>,
    ip: IpAddr,
    bytes: usize,
}

impl BodyMemory {
    /// A budget of `capacity` bytes.
    pub fn new(capacity: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            capacity,
            per_ip: share_per_ip(capacity),
            per_net: share_per_net(capacity),
            held: Mutex::default(),
        })
    }

    /// Bytes held now.
    pub fn in_use(&self) -> usize {
        self.lock().total
    }

    /// Bytes held now for `ip`, and for its network.
    pub fn held_by(&self, ip: IpAddr) -> (usize, usize) {
        let held = self.lock();
        let get = |m: &HashMap<IpAddr, usize>, k| m.get(&k).copied().unwrap_or(0);
        (
            get(&held.by_ip, ip),
            get(&held.by_net, crate::clients::network(ip)),
        )
    }

    /// `bytes` for `ip` if the total, its share and its network's share
    /// all have them now, without waiting.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr, bytes: usize) -> Option<MemoryPermit> {
        let net = crate::clients::network(ip);
        let mut held = self.lock();
        let Held {
            total,
            by_ip,
            by_net,
        } = &mut *held;
        let has = |m: &HashMap<IpAddr, usize>, k| m.get(&k).copied().unwrap_or(0);
        if *total + bytes > self.capacity
            || has(by_ip, ip) + bytes > self.per_ip
            || has(by_net, net) + bytes > self.per_net
        {
            return None;
        }
        *total += bytes;
        *by_ip.entry(ip).or_default() += bytes;
        *by_net.entry(net).or_default() += bytes;
        Some(MemoryPermit {
            budget: self.clone(),
            ip,
            bytes,
        })
    }

    /// Each update is one step: a panic elsewhere cannot leave the counts
    /// half-made.
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes `n` from `key`'s count, forgetting the key at zero.
fn release(m: &mut HashMap<IpAddr, usize>, key: IpAddr, n: usize) {
    if let Entry::Occupied(mut e) = m.entry(key) {
        if *e.get() <= n {
            e.remove();
        } else {
            *e.get_mut() -= n;
        }
    }
}

impl Drop for MemoryPermit {
    fn drop(&mut self) {
        let net = crate::clients::network(self.ip);
        let mut held = self.budget.lock();
        let Held {
            total,
            by_ip,
            by_net,
        } = &mut *held;
        release(by_ip, self.ip, self.bytes);
        release(by_net, net, self.bytes);
        *total = total.saturating_sub(self.bytes);
    }
}

/// What one body's chunks are charged to: the budget, as `ip`, and the
/// body's one lone chunk.
#[derive(Debug)]
pub struct Charge {
    memory: Arc<BodyMemory>,
    ip: IpAddr,
    lone: Arc<Lone>,
}

/// Whether a body's lone chunk is still held somewhere, and who waits
/// for it to go.
#[derive(Debug, Default)]
struct Lone {
    held: AtomicBool,
    waker: AtomicWaker,
}

/// What a chunk's bytes hold until they are dropped.
#[derive(Debug)]
pub enum Hold {
    Budget(MemoryPermit),
    Lone(LoneGuard),
}

/// A body's lone chunk, outstanding; its body may read the next one once
/// this is dropped.
#[derive(Debug)]
pub struct LoneGuard(Arc<Lone>);

impl Drop for LoneGuard {
    fn drop(&mut self) {
        self.0.held.store(false, Ordering::Release);
        self.0.waker.wake();
    }
}

impl Charge {
    pub fn new(memory: Arc<BodyMemory>, ip: IpAddr) -> Self {
        Self {
            memory,
            ip,
            lone: Arc::default(),
        }
    }

    /// How much of `want` the next chunk may read, and what it holds: a
    /// place in the budget for all of `want` if there is one now, else a
    /// [`LONE_CHUNK`] once the body's previous lone chunk is gone.
    pub async fn reserve(&self, want: usize) -> (usize, Hold) {
        if let Some(p) = self.memory.try_take(self.ip, want) {
            return (want, Hold::Budget(p));
        }
        let lone = &self.lone;
        std::future::poll_fn(|cx| {
            let take = || {
                lone.held
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            };
            if take() {
                return Poll::Ready(());
            }
            lone.waker.register(cx.waker());
            // Released between the first look and the registration.
            if take() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        (want.min(LONE_CHUNK), Hold::Lone(LoneGuard(lone.clone())))
    }
}

/// A chunk's buffer and what it holds, as `Bytes`' owner: the hold goes
/// when the last handle on the bytes does.
pub struct Chunk {
    pub buf: Vec<u8>,
    pub hold: Hold,
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunk")
            .field("len", &self.buf.len())
            .field("hold", &self.hold)
            .finish()
    }
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn shares_of_an_address_and_its_network_bound_it() {
        // 64 KiB: an address 4 KiB, a /24 16 KiB.
        let m = BodyMemory::new(64 * 1024);
        let k = 1024;
        #[rustfmt::skip]
        let steps: &[(&str, usize, bool)] = &[
            ("10.0.0.1", 4 * k, true),
            ("10.0.0.1", 1, false),      // its share is spent
            ("10.0.0.2", 4 * k, true),
            ("10.0.0.3", 4 * k, true),
            ("10.0.0.4", 4 * k, true),
            ("10.0.0.5", 1, false),      // the /24's share is spent
            ("10.0.1.1", 4 * k, true),   // another /24 has its own
            ("2001:db8::1", 4 * k, true),
            ("2001:db8::2", 4 * k, true),
            ("2001:db8::3", 4 * k, true),
            ("2001:db8::4", 4 * k, true),
            ("2001:db8::5", 1, false),   // the /64's
        ];
        let mut held = Vec::new();
        for (i, &(addr, bytes, ok)) in steps.iter().enumerate() {
            let p = m.try_take(ip(addr), bytes);
            assert_eq!(p.is_some(), ok, "step {i}: {addr} {bytes}");
            held.extend(p);
        }
        assert_eq!(m.in_use(), 9 * 4 * k);
        assert_eq!(m.held_by(ip("10.0.0.1")), (4 * k, 16 * k));
        drop(held);
        assert_eq!(m.in_use(), 0);
        let h = m.lock();
        assert!(h.by_ip.is_empty() && h.by_net.is_empty(), "forgotten");
    }

    #[test]
    fn the_total_is_a_bound_across_networks() {
        let m = BodyMemory::new(16 * 1024);
        let held: Vec<_> = (0..8)
            .filter_map(|n| m.try_take(ip(&format!("10.0.{n}.1")), 1024))
            .collect();
        assert_eq!(held.len(), 8);
        assert!(m.try_take(ip("10.0.99.1"), 1024).is_some());
        let more: Vec<_> = (10..20)
            .filter_map(|n| m.try_take(ip(&format!("10.0.{n}.1")), 1024))
            .collect();
        assert_eq!(m.in_use(), 16 * 1024, "{} more", more.len());
        assert!(m.try_take(ip("10.0.99.2"), 1).is_none(), "full");
    }

    /// The budget is held as long as any handle on the chunk's bytes, a
    /// slice of them included, and given back with the last.
    #[tokio::test]
    async fn chunks_hold_their_place_until_their_last_handle_goes() {
        let m = BodyMemory::new(64 * 1024);
        let c = Charge::new(m.clone(), ip("10.0.0.1"));
        let (n, hold) = c.reserve(2048).await;
        assert_eq!((n, m.in_use()), (2048, 2048));
        let bytes = Bytes::from_owner(Chunk {
            buf: vec![1; n],
            hold,
        });
        let tail = bytes.slice(1000..);
        drop(bytes);
        assert_eq!(m.in_use(), 2048, "a slice still holds it");
        drop(tail);
        assert_eq!(m.in_use(), 0);
    }

    /// Past its share a body reads lone chunks, one at a time: the next
    /// waits for the previous to be dropped, and nothing is charged.
    #[tokio::test]
    async fn past_its_share_a_body_holds_one_lone_chunk_at_a_time() {
        let m = BodyMemory::new(16 * 16);
        let who = ip("10.0.0.1");
        let _spent = m.try_take(who, 16).unwrap();
        let c = Arc::new(Charge::new(m.clone(), who));
        let (n, first) = c.reserve(64 * 1024).await;
        assert!(matches!(first, Hold::Lone(_)));
        assert_eq!((n, m.in_use()), (LONE_CHUNK, 16));
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.reserve(64 * 1024).await.0 })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "waits for the first lone chunk");
        drop(first);
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken when it went")
            .unwrap();
        assert_eq!(n, LONE_CHUNK);
    }
}
