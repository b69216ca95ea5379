//! How many files are streamed at once: each holds a descriptor and a
//! chunk in flight for as long as its client takes to read it, so a client
//! that never reads would otherwise pin both for every stream of every
//! connection it may open (HTTP/2: 16 streams a connection, 64 connections
//! an address). A permit is taken before a streamed body's file is kept
//! open; past a client address's share, or the total, the request waits
//! (holding no descriptor) for one to be released, and is told to come
//! back if none is within its wait ([`WAIT`], or less: a connection on
//! which nothing moves for the idle timeout is closed, and the wait should
//! end in an answer, not in that).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a request waits for a permit before it is answered 503, at
/// most.
pub const WAIT: Duration = Duration::from_secs(10);

/// One client address's share of the total: a few attackers cannot hold
/// it all, and a node's own pull (at most 64 requests at once) never waits
/// on its share with the default total.
pub fn share_per_ip(total: usize) -> usize {
    (total / 8).max(1)
}

/// The budget: a fair (FIFO) semaphore for the total and one per client
/// address that holds or waits for a permit.
#[derive(Debug)]
pub struct StreamBudget {
    total: Arc<Semaphore>,
    capacity: usize,
    per_ip: usize,
    wait: Duration,
    by_ip: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// One streamed file's place; released when the body is done or dropped.
#[derive(Debug)]
pub struct StreamPermit {
    budget: Arc<StreamBudget>,
    ip: IpAddr,
    // Dropped before `Drop::drop` returns, in field order: the address's
    // permit first, then the total's.
    ip_permit: Option<OwnedSemaphorePermit>,
    _total: OwnedSemaphorePermit,
}

/// No permit came within the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{held} files are being streamed ({capacity} at most, {per_ip} per client address)")]
pub struct Exhausted {
    pub held: usize,
    pub capacity: usize,
    pub per_ip: usize,
}

impl StreamBudget {
    /// `capacity` files at once; a request waits for its place up to half
    /// the connections' `idle_timeout`, and never more than [`WAIT`].
    pub fn new(capacity: usize, idle_timeout: Duration) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            total: Arc::new(Semaphore::new(capacity)),
            capacity,
            per_ip: share_per_ip(capacity),
            wait: WAIT.min(idle_timeout / 2),
            by_ip: Mutex::default(),
        })
    }

    /// Files streamed now.
    pub fn in_use(&self) -> usize {
        self.capacity - self.total.available_permits()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn ip_semaphore(&self, ip: IpAddr) -> Arc<Semaphore> {
        let mut m = self.by_ip.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry(ip)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_ip)))
            .clone()
    }

    /// A permit if one is free now, without waiting.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<StreamPermit> {
        let ip_permit = self.ip_semaphore(ip).try_acquire_owned();
        let Ok(ip_permit) = ip_permit else {
            self.forget_if_unused(ip);
            return None;
        };
        let Ok(total) = self.total.clone().try_acquire_owned() else {
            drop(ip_permit);
            self.forget_if_unused(ip);
            return None;
        };
        Some(self.permit(ip, ip_permit, total))
    }

    /// A permit, waiting in line for one (the address's share first, then
    /// the total) for at most the wait.
    pub async fn take(self: &Arc<Self>, ip: IpAddr) -> Result<StreamPermit, Exhausted> {
        let sem = self.ip_semaphore(ip);
        let both = async {
            let ip_permit = sem.clone().acquire_owned().await.ok()?;
            let total = self.total.clone().acquire_owned().await.ok()?;
            Some((ip_permit, total))
        };
        match tokio::time::timeout(self.wait, both).await {
            Ok(Some((ip_permit, total))) => Ok(self.permit(ip, ip_permit, total)),
            _ => {
                drop(sem);
                self.forget_if_unused(ip);
                Err(Exhausted {
                    held: self.in_use(),
                    capacity: self.capacity,
                    per_ip: self.per_ip,
                })
            }
        }
    }

    fn permit(
        self: &Arc<Self>,
        ip: IpAddr,
        ip_permit: OwnedSemaphorePermit,
        total: OwnedSemaphorePermit,
    ) -> StreamPermit {
        StreamPermit {
            budget: self.clone(),
            ip,
            ip_permit: Some(ip_permit),
            _total: total,
        }
    }

    /// Drops an address's semaphore once nobody holds or waits for it, so
    /// the map holds only the addresses streaming now (it cannot grow with
    /// every address seen). Anyone else holding the `Arc` got it from the
    /// map under this lock, so the count cannot rise behind our back.
    fn forget_if_unused(&self, ip: IpAddr) {
        let mut m = self.by_ip.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = m.get(&ip) {
            if Arc::strong_count(s) == 1 && s.available_permits() == self.per_ip {
                m.remove(&ip);
            }
        }
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        drop(self.ip_permit.take());
        self.budget.forget_if_unused(self.ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        [10, 0, 0, n].into()
    }

    #[test]
    fn shares_table() {
        // (total, per address)
        let cases = [(1, 1), (7, 1), (8, 1), (32, 4), (1024, 128)];
        for (total, want) in cases {
            assert_eq!(share_per_ip(total), want, "{total}");
        }
    }

    #[tokio::test]
    async fn an_address_gets_its_share_and_the_total_is_a_bound() {
        let b = StreamBudget::new(16, WAIT * 2); // 2 per address
        let a1 = b.try_take(ip(1)).unwrap();
        let _a2 = b.try_take(ip(1)).unwrap();
        assert!(b.try_take(ip(1)).is_none(), "past a's share");
        let mut others: Vec<_> = (2..=8)
            .flat_map(|n| [b.try_take(ip(n)), b.try_take(ip(n))])
            .collect();
        assert!(others.iter().all(Option::is_some));
        assert_eq!(b.in_use(), 16);
        assert!(b.try_take(ip(9)).is_none(), "past the total");
        // A waiter gets the first permit released, its address's share
        // allowing.
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.take(ip(9)).await })
        };
        tokio::task::yield_now().await;
        others.pop();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(got.is_ok());
        drop(a1);
        assert_eq!(b.in_use(), 15);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_at_most_wait_then_hears_why() {
        let b = StreamBudget::new(1, WAIT * 2);
        let _held = b.try_take(ip(1)).unwrap();
        let err = b.take(ip(2)).await.unwrap_err();
        assert_eq!(
            err,
            Exhausted {
                held: 1,
                capacity: 1,
                per_ip: 1
            }
        );
        assert!(err.to_string().contains("1 files are being streamed"));
    }

    #[test]
    fn addresses_are_forgotten_once_they_hold_nothing() {
        let b = StreamBudget::new(16, WAIT * 2);
        let p: Vec<_> = (1..=5).filter_map(|n| b.try_take(ip(n))).collect();
        assert_eq!(b.by_ip.lock().unwrap().len(), 5);
        drop(p);
        assert!(b.by_ip.lock().unwrap().is_empty());
        assert_eq!(b.in_use(), 0);
        // A refusal leaves nothing behind either.
        let held: Vec<_> = (0..16).filter_map(|i| b.try_take(ip(10 + i / 2))).collect();
        assert_eq!(held.len(), 16);
        assert!(b.try_take(ip(99)).is_none());
        assert!(!b.by_ip.lock().unwrap().contains_key(&ip(99)));
    }
}
