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

use std::collections::hash_map::{Entry, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One client address's share of the total: a few addresses cannot hold
/// it all, and a node's own pull (at most 64 requests at once) stays
/// within its share with the default total.
pub fn share_per_ip(total: usize) -> usize {
    (total / 8).max(1)
}

/// The budget: counts of the places held, in total and by client
/// address, under one lock. Nothing ever waits for a place, so counts do
/// what semaphores did, for one lock a take and one a release (the
/// semaphores took four, and made and freed an address's semaphore for
/// every file of a client streaming one at a time).
#[derive(Debug)]
pub struct StreamBudget {
    capacity: usize,
    per_ip: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Only the addresses holding a place now: it cannot grow with every
    /// address seen.
    by_ip: HashMap<IpAddr, usize>,
}

/// One streamed file's place; released when the body is done or dropped.
#[derive(Debug)]
pub struct StreamPermit {
    budget: Arc<StreamBudget>,
    ip: IpAddr,
}

impl StreamBudget {
    /// `capacity` files held open at once.
    pub fn new(capacity: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            capacity,
            per_ip: share_per_ip(capacity),
            held: Mutex::default(),
        })
    }

    /// Files held open by streamed bodies now.
    pub fn in_use(&self) -> usize {
        self.lock().total
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A permit if one is free now, without waiting.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<StreamPermit> {
        let mut held = self.lock();
        let Held { total, by_ip } = &mut *held;
        if *total >= self.capacity {
            return None;
        }
        match by_ip.entry(ip) {
            Entry::Occupied(e) if *e.get() >= self.per_ip => return None,
            Entry::Occupied(mut e) => *e.get_mut() += 1,
            Entry::Vacant(e) => {
                e.insert(1);
            }
        }
        *total += 1;
        Some(StreamPermit {
            budget: self.clone(),
            ip,
        })
    }

    /// Each update is one step: a panic elsewhere cannot leave the counts
    /// half-made.
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        let Held { total, by_ip } = &mut *held;
        if let Entry::Occupied(mut e) = by_ip.entry(self.ip) {
            if *e.get() <= 1 {
                e.remove();
            } else {
                *e.get_mut() -= 1;
            }
        }
        *total = total.saturating_sub(1);
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
        assert_eq!(b.lock().by_ip.len(), 5);
        drop(p);
        assert!(b.lock().by_ip.is_empty());
        assert_eq!(b.in_use(), 0);
        // A refusal leaves nothing behind either.
        let held: Vec<_> = (0..16).filter_map(|i| b.try_take(ip(10 + i / 2))).collect();
        assert_eq!(held.len(), 16);
        assert!(b.try_take(ip(99)).is_none());
        assert!(!b.lock().by_ip.contains_key(&ip(99)));
    }
}
