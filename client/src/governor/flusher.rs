//! The `paced` mode's background flusher.
//!
//! Writer threads hand over each object they wrote ([`Flusher::submit`]);
//! one flusher thread, in the idle I/O class, writes them back in small
//! chunks, one chunk in flight at a time, and sleeps between chunks as the
//! [`Aimd`] controller's rate says. What the neighbour can find queued
//! ahead of its own write is therefore at most one chunk of ours, never a
//! pile of dirty pages released by the kernel's flusher or a batch of
//! whole objects.
//!
//! Writers are held back only when the backlog (written, not yet flushed)
//! passes a few seconds' worth at the current rate, so the CPU-heavy work
//! (download, inflate, checksum) overlaps the paced I/O instead of waiting
//! for it, and dirty data never ages into the kernel's own writeback.
//!
//! Chunks, backlog and rate are measured in cost bytes (length plus a
//! fixed cost per object, [`AimdConfig::cost`]): an update of thousands of
//! small files is paced by its creates, not only by its few megabytes.
//!
//! Creates are paced too, not only data. `sync_file_range` writes data
//! only; a create (inode, xattr, directory entry) sits in the filesystem's
//! journal until something forces it, and on XFS a neighbour's own
//! `fdatasync` forces the whole pending journal, ours included. So the
//! flusher commits the journal (an `fdatasync` of the chunk's last whole
//! file, which commits the creates of other files too) at the end of every
//! chunk that holds a new object ([`LOG_FORCE_OBJECTS`]), and writers wait
//! while more than [`MAX_UNFORCED`] objects are written but not yet
//! committed: what a neighbour's flush can find of ours in the journal is
//! then a chunk or two of creates, never the thousands a writer can
//! produce in a few seconds, and the final `syncfs` finds at most that.

use super::aimd::{Aimd, AimdConfig};
use super::samples::Samples;
use crate::sys;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A chunk also closes after this many files: each small file is its own
/// write request, and many of them in flight at once queue the neighbour
/// as surely as one big one.
pub const CHUNK_MAX_FILES: usize = 64;
/// Objects flushed between two journal commits; 1 commits at the end of
/// every chunk that holds a new object. Each commit is a device cache
/// flush a neighbour's `fdatasync` may queue behind, so fewer commits cost
/// the neighbour less at p99, but each then carries more creates: on the
/// full fixture a commit every 128 objects took its p99 from about 2.0× to
/// 1.7× its baseline and wrote fewer bytes, and let a 30% update's worst
/// stall reach 4.5× (etcd's worst put 3.6×), where every chunk kept it at
/// 1.7× (1.9×). The worst stall is the harm this governor exists to
/// prevent.
pub const LOG_FORCE_OBJECTS: u64 = 1;
/// Objects written but not yet committed to the journal (queued, in
/// flight, or flushed since the last commit) before writers wait.
pub const MAX_UNFORCED: u64 = 2 * CHUNK_MAX_FILES as u64;
/// Chunk ranges are cut at multiples of this (the page size of every
/// architecture a node runs).
const PAGE: u64 = 4096;
/// Descriptors held for the backlog; writers wait beyond it.
pub const MAX_QUEUED_FILES: usize = 512;
/// The backlog writers may build, in seconds of writing at the current
/// rate...
pub const BACKLOG_SECS: f64 = 2.0;
/// ...but at least this much, so that a slow rate does not serialise the
/// writers on every object...
pub const MIN_BACKLOG: u64 = 8 << 20;
/// ...and at most this much: well under the kernel's dirty thresholds on a
/// small node, and flushed long before `dirty_expire` (30 s) would hand it
/// to the kernel's flusher at normal priority.
pub const MAX_BACKLOG: u64 = 64 << 20;
/// The schedule may run this far behind real time before the flusher
/// sleeps, so pacing does not turn every chunk into a tiny sleep.
const PACE_SLACK: Duration = Duration::from_millis(5);

/// What the flusher did, merged into the governor's stats.
#[derive(Debug, Default, Clone)]
pub struct FlusherStats {
    pub flushes: u64,
    pub flushes_over_target: u64,
    pub throttle: Duration,
    /// Time writers spent waiting for backlog room.
    pub backpressure: Duration,
    /// Journal commits (`fdatasync`s ending a chunk).
    pub log_forces: u64,
    /// The most objects ever written but not yet committed.
    pub max_unforced: u64,
    pub samples: Samples,
}

#[derive(Debug)]
struct Item {
    file: File,
    /// The part of the file still to flush.
    offset: u64,
    len: u64,
    /// More of the file follows in a later chunk.
    split: bool,
}

impl Item {
    /// The first part of a file also carries the cost of its create.
    fn cost(&self, config: &AimdConfig) -> u64 {
        config.cost(self.len, u64::from(self.offset == 0))
    }
}

#[derive(Debug)]
struct State {
    queue: VecDeque<Item>,
    /// Cost queued plus the chunk in flight.
    backlog: u64,
    /// Objects submitted whose create is not yet committed.
    unforced: u64,
    /// Of those, the ones already flushed (the next commit covers them).
    flushed_unforced: u64,
    in_flight: bool,
    closed: bool,
    /// The first error the flusher hit; every later call reports it.
    error: Option<(io::ErrorKind, String)>,
    aimd: Aimd,
    next_slot: Option<Instant>,
    stats: FlusherStats,
}

impl State {
    fn backlog_limit(&self) -> u64 {
        ((self.aimd.rate * BACKLOG_SECS) as u64).clamp(MIN_BACKLOG, MAX_BACKLOG)
    }

    fn check(&self) -> io::Result<()> {
        match &self.error {
            Some((kind, msg)) => Err(io::Error::new(*kind, msg.clone())),
            None => Ok(()),
        }
    }

    /// Takes the next chunk off the queue: whole small files, or a
    /// chunk-sized range of a big one (the rest stays at the front).
    fn take_chunk(&mut self) -> Vec<Item> {
        let limit = self.aimd.batch;
        let mut chunk = Vec::new();
        let mut cost = 0;
        while let Some(front) = self.queue.front_mut() {
            if cost >= limit || chunk.len() >= CHUNK_MAX_FILES {
                break;
            }
            let room = limit - cost;
            if front.cost(&self.aimd.config) > room {
                let create = front.cost(&self.aimd.config) - front.len;
                // Page-aligned, so no page is written back twice.
                let take = room.saturating_sub(create) & !(PAGE - 1);
                if take == 0 {
                    break;
                }
                let part = Item {
                    file: match front.file.try_clone() {
                        Ok(f) => f,
                        // Out of descriptors: flush the whole file instead.
                        Err(_) => break,
                    },
                    offset: front.offset,
                    len: take,
                    split: true,
                };
                front.offset += take;
                front.len -= take;
                chunk.push(part);
                break;
            }
            let item = self.queue.pop_front().expect("front exists");
            cost += item.cost(&self.aimd.config);
            chunk.push(item);
        }
        if chunk.is_empty() {
            // Descriptor exhaustion above: flush the front file whole.
            if let Some(item) = self.queue.pop_front() {
                chunk.push(item);
            }
        }
        chunk
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The flusher waits here for work.
    work: Condvar,
    /// Writers wait here for backlog room, and `drain` for an empty queue.
    room: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("flusher state")
    }
}

#[derive(Debug)]
pub struct Flusher {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Flusher {
    /// Starts the flusher thread. It inherits the caller's I/O class and
    /// nice value, which is what makes them apply to the writeback it
    /// submits: [`super::Governor::new`] sets both before calling this.
    pub fn start(config: AimdConfig) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                backlog: 0,
                unforced: 0,
                flushed_unforced: 0,
                in_flight: false,
                closed: false,
                error: None,
                aimd: Aimd::new(config),
                next_slot: None,
                stats: FlusherStats::default(),
            }),
            work: Condvar::new(),
            room: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("oscontent-flusher".into())
            .spawn(move || run(&s))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a written object for writeback (an empty one too: its
    /// create costs the device all the same); waits while the backlog is
    /// over its limit.
    pub fn submit(&self, file: File, len: u64) -> io::Result<()> {
        let mut st = self.shared.lock();
        st.check()?;
        let item = Item {
            file,
            offset: 0,
            len,
            split: false,
        };
        st.backlog += item.cost(&st.aimd.config);
        st.unforced += 1;
        st.stats.max_unforced = st.stats.max_unforced.max(st.unforced);
        st.queue.push_back(item);
        self.shared.work.notify_one();
        let t = Instant::now();
        let mut waited = false;
        while st.error.is_none()
            && (st.backlog > st.backlog_limit()
                || st.queue.len() > MAX_QUEUED_FILES
                || st.unforced > MAX_UNFORCED)
        {
            waited = true;
            st = self.shared.room.wait(st).expect("flusher state");
        }
        if waited {
            st.stats.backpressure += t.elapsed();
        }
        st.check()
    }

    /// Waits until everything submitted is on the device.
    pub fn drain(&self) -> io::Result<()> {
        let mut st = self.shared.lock();
        while st.error.is_none() && (!st.queue.is_empty() || st.in_flight) {
            st = self.shared.room.wait(st).expect("flusher state");
        }
        st.check()
    }

    pub fn stats(&self) -> (FlusherStats, Aimd) {
        let st = self.shared.lock();
        (st.stats.clone(), st.aimd.clone())
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
        if let Some(t) = self.thread.lock().expect("flusher thread").take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared) {
    loop {
        let chunk = {
            let mut st = shared.lock();
            while st.queue.is_empty() && !st.closed {
                st = shared.work.wait(st).expect("flusher state");
            }
            if st.queue.is_empty() {
                return;
            }
            st.in_flight = true;
            let chunk = st.take_chunk();
            let objects = chunk.iter().filter(|i| i.offset == 0).count() as u64;
            st.flushed_unforced += objects;
            // A chunk with no new object (the rest of a big file) has no
            // create to commit.
            let force = objects > 0 && st.flushed_unforced >= LOG_FORCE_OBJECTS;
            let cost: u64 = chunk.iter().map(|i| i.cost(&st.aimd.config)).sum();
            (chunk, cost, force)
        };
        let (chunk, bytes, force_log) = chunk;
        let t = Instant::now();
        let r = flush_chunk(&chunk, force_log);
        // A chunk that holds only the first part of a big file has no whole
        // file to `fdatasync`, so the journal was not committed; its create
        // is released all the same (the next commit, at the latest when
        // that file's last part is flushed beside the next object, carries
        // it), so that writers can never wait on a commit that does not
        // come. Only real commits are counted.
        let forced = matches!(r, Ok(true));
        let latency = t.elapsed();
        drop(chunk);
        let sleep = {
            let mut st = shared.lock();
            st.in_flight = false;
            st.backlog = st.backlog.saturating_sub(bytes);
            if forced {
                st.stats.log_forces += 1;
            }
            if force_log && r.is_ok() {
                st.unforced = st.unforced.saturating_sub(st.flushed_unforced);
                st.flushed_unforced = 0;
            }
            match r {
                Err(e) => {
                    st.error.get_or_insert((e.kind(), e.to_string()));
                    st.queue.clear();
                    st.backlog = 0;
                    st.unforced = 0;
                    None
                }
                Ok(_) => {
                    st.stats.flushes += 1;
                    st.stats.samples.push(latency);
                    if latency > st.aimd.config.target {
                        st.stats.flushes_over_target += 1;
                    }
                    st.aimd.on_flush(latency, bytes);
                    let now = Instant::now();
                    let slot = st.next_slot.map_or(now, |s| s.max(now));
                    let next = slot + st.aimd.pace(bytes, latency);
                    st.next_slot = Some(next);
                    next.checked_duration_since(now + PACE_SLACK)
                }
            }
        };
        shared.room.notify_all();
        if let Some(d) = sleep {
            std::thread::sleep(d);
            shared.lock().stats.throttle += d;
        }
    }
}

/// Starts writeback of every range of the chunk, then waits for all of
/// them: one chunk in flight, its requests submitted together so the
/// device can merge them. With `force_log`, commits the journal (creates
/// included) by `fdatasync`ing the chunk's last whole file: never a file
/// with more data to come, whose `fdatasync` would write it all back at
/// once. Returns whether the journal was committed.
fn flush_chunk(chunk: &[Item], force_log: bool) -> io::Result<bool> {
    // A zero length means "to the end of the file" to sync_file_range;
    // an empty object has no data to write back at all.
    let data = || chunk.iter().filter(|i| i.len > 0);
    for i in data() {
        sys::sync_file_range(i.file.as_fd(), i.offset, i.len, sys::SYNC_START)?;
    }
    for i in data() {
        sys::sync_file_range(i.file.as_fd(), i.offset, i.len, sys::SYNC_WAIT)?;
    }
    if let (true, Some(last)) = (force_log, chunk.iter().rev().find(|i| !i.split)) {
        rustix::fs::fdatasync(last.file.as_fd())?;
        return Ok(true);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(dir: &std::path::Path, name: &str, len: usize) -> File {
        let p = dir.join(name);
        std::fs::write(&p, vec![1u8; len]).unwrap();
        File::open(&p).unwrap()
    }

    fn state(batch: u64, object_cost: u64, items: &[u64], dir: &std::path::Path) -> State {
        let mut cfg = AimdConfig::new(Duration::from_millis(10));
        cfg.initial_batch = batch;
        cfg.object_cost = object_cost;
        let mut st = State {
            queue: VecDeque::new(),
            backlog: 0,
            unforced: 0,
            flushed_unforced: 0,
            in_flight: false,
            closed: false,
            error: None,
            aimd: Aimd::new(cfg),
            next_slot: None,
            stats: FlusherStats::default(),
        };
        for (n, &len) in items.iter().enumerate() {
            st.queue.push_back(Item {
                file: file_of(dir, &n.to_string(), len as usize),
                offset: 0,
                len,
                split: false,
            });
        }
        st
    }

    #[test]
    fn chunks_split_big_files_and_group_small_ones() {
        let dir = tempfile::tempdir().unwrap();
        const K: u64 = 1024;
        // (chunk cost, cost per object, queued file sizes, expected chunks
        // as (offset, len) lists)
        type Case = (u64, u64, &'static [u64], &'static [&'static [(u64, u64)]]);
        let cases: &[Case] = &[
            (
                256 * K,
                0,
                &[100 * K, 100 * K, 100 * K],
                &[
                    &[(0, 100 * K), (0, 100 * K), (0, 56 * K)],
                    &[(56 * K, 44 * K)],
                ],
            ),
            (
                256 * K,
                0,
                &[600 * K],
                &[&[(0, 256 * K)], &[(256 * K, 256 * K)], &[(512 * K, 88 * K)]],
            ),
            (
                256 * K,
                0,
                &[10 * K, 600 * K],
                &[
                    &[(0, 10 * K), (0, 244 * K)],
                    &[(244 * K, 256 * K)],
                    &[(500 * K, 100 * K)],
                ],
            ),
            (
                256 * K,
                0,
                &[1; 2 * CHUNK_MAX_FILES + 8],
                &[
                    &[(0, 1); CHUNK_MAX_FILES],
                    &[(0, 1); CHUNK_MAX_FILES],
                    &[(0, 1); 8],
                ],
            ),
            // A create costs 16 KiB: the third file's first part carries
            // its create and 8 KiB of data, the rest costs its bytes only.
            (
                256 * K,
                16 * K,
                &[100 * K, 100 * K, 100 * K],
                &[
                    &[(0, 100 * K), (0, 100 * K), (0, 8 * K)],
                    &[(8 * K, 92 * K)],
                ],
            ),
            // Empty files are paced by their creates alone.
            (
                64 * K,
                16 * K,
                &[0; 10],
                &[&[(0, 0); 4], &[(0, 0); 4], &[(0, 0); 2]],
            ),
        ];
        for (batch, object_cost, items, want) in cases {
            let mut st = state(*batch, *object_cost, items, dir.path());
            let mut got = Vec::new();
            while !st.queue.is_empty() {
                let c = st.take_chunk();
                got.push(c.iter().map(|i| (i.offset, i.len)).collect::<Vec<_>>());
            }
            let want: Vec<Vec<_>> = want.iter().map(|c| c.to_vec()).collect();
            assert_eq!(got, want, "chunk {batch}, items {items:?}");
        }
    }

    #[test]
    fn flushes_everything_submitted() {
        let dir = tempfile::tempdir().unwrap();
        let f = Flusher::start(AimdConfig::new(Duration::from_millis(10))).unwrap();
        for i in 0..20 {
            f.submit(file_of(dir.path(), &i.to_string(), 300 << 10), 300 << 10)
                .unwrap();
        }
        for i in 0..200 {
            f.submit(file_of(dir.path(), &format!("e{i}"), 0), 0)
                .unwrap();
        }
        f.drain().unwrap();
        let (s, _) = f.stats();
        // 6000 KiB and 220 creates in chunks of at most the 1 MiB ceiling
        // and CHUNK_MAX_FILES files.
        let most = CHUNK_MAX_FILES as u64;
        assert!(
            s.flushes >= 6000 / 1024 + 200 / most,
            "{} flushes",
            s.flushes
        );
        // The journal was committed at most once per LOG_FORCE_OBJECTS
        // objects and at least once per full chunk of them (the rest is
        // the barrier's), and the one writer never ran more than the bound
        // (plus its own object) ahead of the commits.
        let per_commit = LOG_FORCE_OBJECTS.max(most);
        assert!(
            s.log_forces >= 220 / per_commit,
            "{} log forces",
            s.log_forces
        );
        assert!(s.log_forces <= 220 / LOG_FORCE_OBJECTS);
        assert!(s.log_forces <= s.flushes);
        assert!(
            s.max_unforced <= MAX_UNFORCED + 1,
            "{} objects uncommitted at once",
            s.max_unforced
        );
        assert_eq!(f.shared.lock().backlog, 0);
        assert_eq!(s.samples.len() as u64, s.flushes);
    }
}
