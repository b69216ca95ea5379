//! How many files are streamed with a descriptor held: each holds one for
//! as long as its client takes to read it, so clients that never read
//! would otherwise hold one for every stream of every connection they may
//! open (HTTP/2: 16 streams a connection, 64 connections an address). A
//! streamed body keeps its file open only with a permit; past a client
//! address's share, or the total, it is streamed all the same, opening the
//! file again for each (smaller) read and holding nothing in between
//! (`body::reopening_body`). No request waits or fails for want of a
//! permit: a budget that refused or delayed requests was one that slow
//! clients (or a few addresses holding their streams open) could fill to
//! fail every other pull.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One client address's share of the total: a few addresses cannot hold
/// it all, and a node's own pull (at most 64 requests at once) stays
/// within its share with the default total.
pub fn share_per_ip(total: usize) -> usize {
    (total / 8).max(1)
}

/// The budget: a semaphore for the total and one per client address that
/// holds a permit.
#[derive(Debug)]
pub struct StreamBudget {
    total: Arc<Semaphore>,
    capacity: usize,
    per_ip: usize,
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

impl StreamBudget {
    /// `capacity` files held open at once.
    pub fn new(capacity: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            total: Arc::new(Semaphore::new(capacity)),
            capacity,
            per_ip: share_per_ip(capacity),
            by_ip: Mutex::default(),
        })
    }

    /// Files held open by streamed bodies now.
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

    /// Drops an address's semaphore once nobody holds a permit of it, so
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

    #[test]
    fn an_address_gets_its_share_and_the_total_is_a_bound() {
        let b = StreamBudget::new(16); // 2 per address
        let a1 = b.try_take(ip(1)).unwrap();
        let _a2 = b.try_take(ip(1)).unwrap();
        assert!(b.try_take(ip(1)).is_none(), "past a's share");
        let mut others: Vec<_> = (2..=8)
            .flat_map(|n| [b.try_take(ip(n)), b.try_take(ip(n))])
            .collect();
        assert!(others.iter().all(Option::is_some));
        assert_eq!(b.in_use(), 16);
        assert!(b.try_take(ip(9)).is_none(), "past the total");
        // A place released is anyone's within their share.
        others.pop();
        let _nine = b.try_take(ip(9)).unwrap();
        drop(a1);
        let _a3 = b.try_take(ip(1)).unwrap();
        assert!(b.try_take(ip(10)).is_none(), "the total, full again");
        others.pop();
        assert!(b.try_take(ip(1)).is_none(), "a's share");
    }

    #[test]
    fn addresses_are_forgotten_once_they_hold_nothing() {
        let b = StreamBudget::new(16);
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
