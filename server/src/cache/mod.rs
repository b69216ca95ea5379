//! The in-memory cache of immutable objects (`--cache-size`): what a
//! fleet update asks every node for is answered from memory, with no
//! syscall and no trip to the blocking pool.
//!
//! Keyed by generation and object name, so a new generation never sees
//! an entry of the old one (its entries age out); each entry holds the
//! whole body and its validators with the header values already made.
//! Bounded in bytes: every entry is charged its body plus
//! [`ENTRY_OVERHEAD`], and eviction (CLOCK: an entry read since the hand
//! last passed gets a second chance) runs before an insert would exceed
//! the budget. Small metadata (refs, summary, config, detached metadata)
//! has its own per-generation cache (`served/metadata.rs`), which must
//! notice files replaced on disk; objects never change under their name.
//!
//! Publication fills it before a generation becomes visible ([`warm`]),
//! with what the generation's releases bring new: what every node of a
//! fleet update will ask for first. Requests add only small objects
//! (`http/answer/find.rs`): a pull asks for each object once, so a large one
//! read for it would only push out small ones that many connections are
//! answered from. A connection that sends files itself (`sendfile`) gets
//! an object's first request from its file, as nginx would, and only a
//! second request, recent enough to be remembered ([`ObjectCache::again`]),
//! reads it into the cache: an object asked for once is then never read,
//! copied or allocated for.

pub mod warm;

use crate::prepared::Prepared;
use bytes::Bytes;
use oscontent_format::ObjectName;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What an entry costs besides its body: the key, the header values, the
/// map and queue slots (an upper estimate, so the bound holds).
pub const ENTRY_OVERHEAD: usize = 320;
/// The largest body cached, whatever the budget: bigger objects are
/// streamed from the page cache, and would evict many small ones.
pub const MAX_ENTRY: usize = 1 << 20;
/// Objects whose first request [`ObjectCache::again`] remembers, at most
/// (one `u64` each, 512 KiB): a slot holds the latest of the names that
/// share it, so a name is forgotten once this many others came after it,
/// or sooner by collision, and its next request counts as a first again.
const REMEMBERED: usize = 1 << 16;

/// One cached object.
#[derive(Debug)]
pub struct CachedObject {
    pub bytes: Bytes,
    pub prepared: Prepared,
    /// Read since the clock hand last passed.
    visited: AtomicBool,
}

impl CachedObject {
    pub fn new(bytes: Bytes, prepared: Prepared) -> Arc<Self> {
        Arc::new(Self {
            bytes,
            prepared,
            visited: AtomicBool::new(false),
        })
    }

    fn charge(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }
}

type Key = (u64, ObjectName);

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Key, Arc<CachedObject>, rustc_hash::FxBuildHasher>,
    /// The clock: every key in `map`, once.
    queue: VecDeque<Key>,
    bytes: usize,
}

/// The object cache, shared by every generation.
#[derive(Debug)]
pub struct ObjectCache {
    capacity: usize,
    max_entry: usize,
    inner: Mutex<Inner>,
    /// Fingerprints of the objects asked for once (`again`), by slot.
    asked: Box<[AtomicU64]>,
}

impl ObjectCache {
    /// A cache of at most `capacity` bytes (0: off). An entry may take at
    /// most an eighth of it, and never more than [`MAX_ENTRY`].
    pub fn new(capacity: usize) -> Self {
        let remembered = if capacity == 0 { 0 } else { REMEMBERED };
        Self {
            capacity,
            max_entry: (capacity / 8).min(MAX_ENTRY),
            inner: Mutex::new(Inner::default()),
            asked: (0..remembered).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether `name` was asked for recently (and so is worth reading into
    /// the cache); a first request is remembered for the next. Lossy in
    /// both directions by design: a forgotten name is read one request
    /// later, and two names that collide on slot and fingerprint (one in
    /// 2^48 for the same slot) let one in early. No lock: an array of
    /// words, one swap.
    pub fn again(&self, generation: u64, name: &ObjectName) -> bool {
        if self.asked.is_empty() {
            return false;
        }
        let h = rustc_hash::FxBuildHasher.hash_one((generation, name));
        let slot = (h as usize) % self.asked.len();
        // Never 0, the empty slot's value.
        let fingerprint = h | 1;
        self.asked[slot].swap(fingerprint, Ordering::Relaxed) == fingerprint
    }

    /// Whether a body of `len` bytes would be kept: the caller reads such
    /// an object whole rather than streaming it.
    pub fn admits(&self, len: u64) -> bool {
        len as usize + ENTRY_OVERHEAD <= self.capacity && len <= self.max_entry as u64
    }

    pub fn get(&self, generation: u64, name: &ObjectName) -> Option<Arc<CachedObject>> {
        let hit = self.lock().map.get(&(generation, *name)).cloned()?;
        hit.visited.store(true, Ordering::Relaxed);
        Some(hit)
    }

    /// Keeps `obj` if it fits the rules, evicting as needed; whether it was
    /// added (false: refused, or already there).
    pub fn insert(&self, generation: u64, name: ObjectName, obj: Arc<CachedObject>) -> bool {
        if !self.admits(obj.bytes.len() as u64) {
            return false;
        }
        let key = (generation, name);
        let mut inner = self.lock();
        if inner.map.contains_key(&key) {
            return false;
        }
        // Each turn removes an entry or takes one second chance away, so
        // two passes over the clock always make room.
        let mut turns = 2 * inner.queue.len() + 1;
        while inner.bytes + obj.charge() > self.capacity && turns > 0 {
            turns -= 1;
            let Some(k) = inner.queue.pop_front() else {
                break;
            };
            let Some(e) = inner.map.get(&k) else {
                continue;
            };
            if e.visited.swap(false, Ordering::Relaxed) {
                inner.queue.push_back(k);
                continue;
            }
            let charge = e.charge();
            inner.map.remove(&k);
            inner.bytes -= charge;
        }
        if inner.bytes + obj.charge() > self.capacity {
            return false;
        }
        inner.bytes += obj.charge();
        inner.queue.push_back(key);
        inner.map.insert(key, obj);
        true
    }

    /// Bytes charged now (bodies plus overhead) and entries.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.bytes, inner.map.len())
    }

    /// The largest body kept.
    pub fn max_entry(&self) -> usize {
        self.max_entry
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update completes before the guard drops.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oscontent_format::{Checksum, ObjectKind};
    use oscontent_parse::conditional::Validators;

    fn name(i: u8) -> ObjectName {
        ObjectName::new(Checksum::digest(&[i]), ObjectKind::File)
    }

    #[test]
    fn a_second_request_is_remembered_as_one() {
        let cache = ObjectCache::new(1 << 20);
        assert!(!cache.again(1, &name(1)), "a first request");
        assert!(cache.again(1, &name(1)), "the second");
        assert!(cache.again(1, &name(1)), "and after");
        assert!(!cache.again(2, &name(1)), "another generation's is its own");
        assert!(!cache.again(1, &name(2)), "another object's is its own");
        // Bounded: after many times as many other first requests as there
        // are slots, one of them took its slot and it is forgotten.
        for g in 0..16 * REMEMBERED as u64 {
            cache.again(100 + g, &name(3));
        }
        assert!(
            !cache.again(1, &name(1)),
            "forgotten: a first request again"
        );
        assert!(cache.again(1, &name(1)));
        let off = ObjectCache::new(0);
        assert!(
            !off.again(1, &name(1)) && !off.again(1, &name(1)),
            "no cache, no memory"
        );
    }

    fn obj(len: usize) -> Arc<CachedObject> {
        let v = Validators {
            etag: "\"x\"".into(),
            last_modified: None,
            exact_date: false,
        };
        CachedObject::new(Bytes::from(vec![7u8; len]), Prepared::new(v))
    }

    #[test]
    fn stays_within_its_budget_and_keeps_what_is_read() {
        let cap = 8 * (1000 + ENTRY_OVERHEAD);
        let c = ObjectCache::new(cap);
        for i in 0..8 {
            c.insert(1, name(i), obj(1000));
        }
        assert_eq!(c.usage(), (cap, 8));
        // Read 0 and 1: they survive the next inserts; 2.. go first.
        assert!(c.get(1, &name(0)).is_some() && c.get(1, &name(1)).is_some());
        for i in 8..14 {
            c.insert(1, name(i), obj(1000));
            assert!(c.usage().0 <= cap, "over budget after {i}");
        }
        assert!(c.get(1, &name(0)).is_some() && c.get(1, &name(1)).is_some());
        assert!(c.get(1, &name(2)).is_none());
    }

    #[test]
    fn admission_table() {
        let c = ObjectCache::new(64 << 20);
        #[rustfmt::skip]
        let cases: &[(u64, bool)] = &[
            (0, true), (4096, true), (MAX_ENTRY as u64, true), (MAX_ENTRY as u64 + 1, false),
        ];
        for &(len, want) in cases {
            assert_eq!(c.admits(len), want, "{len}");
        }
        let small = ObjectCache::new(8 * 1024);
        assert!(small.admits(1024) && !small.admits(1025));
        let off = ObjectCache::new(0);
        assert!(!off.admits(0));
        off.insert(1, name(0), obj(0));
        assert_eq!(off.usage(), (0, 0));
    }

    #[test]
    fn generations_do_not_share_entries() {
        let c = ObjectCache::new(1 << 20);
        c.insert(1, name(0), obj(10));
        assert!(c.get(1, &name(0)).is_some());
        assert!(c.get(2, &name(0)).is_none());
    }
}
