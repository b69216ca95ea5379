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
//! `fdatasync` forces the whole pending journal, ours included. And data
//! written back may still sit in the device's cache, which the neighbour's
//! `fdatasync` flushes too. So the flusher commits (an `fdatasync` of the
//! chunk's last whole file, which commits the creates of other files too
//! and flushes the device cache) every [`LOG_FORCE_OBJECTS`] objects and
//! every [`LOG_FORCE_BYTES`] of data, at most once per [`COMMIT_GAP`]
//! (each commit is itself a flush the neighbour may queue behind), and
//! writers wait while more than [`MAX_UNFORCED`] objects are written but
//! not yet committed: what a neighbour's flush can find of ours is then at
//! most one commit interval, never everything a writer produced since the
//! start, and the final `syncfs` finds at most that.

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
pub const CHUNK_MAX_FILES: usize = 32;
/// Objects flushed between two commits. Each commit is a device cache
/// flush a neighbour's `fdatasync` may queue behind, so the fewer, the
/// lower the neighbour's p99 (and the fewer journal bytes written); each
/// then carries more creates. Measured on the full fixture (RESULTS.md):
/// a commit at the end of every chunk put the neighbour's p99 at 2-3×
/// its baseline; one every 128 objects, with [`LOG_FORCE_BYTES`] bounding
/// the data between two, about 1.5× with the same worst stall.
pub const LOG_FORCE_OBJECTS: u64 = 128;
/// Data written back between two commits, at most once [`COMMIT_GAP`]
/// has passed: what the device may hold in its cache for a neighbour's
/// flush to wait on. Without it, a
/// commit every 128 objects let a 30% update (bigger files, and the parts
/// of a big file, which hold no new object) push the neighbour's worst
/// stall to 4.5× its baseline; with it, the worst stays near 1.1×.
pub const LOG_FORCE_BYTES: u64 = 2 << 20;
/// The shortest time between two commits, whatever falls due. On a fast
/// disk (a neighbour's fdatasync at 0.5 ms p99) 128 objects take a few
/// tens of milliseconds, and a commit at each put 20-30 a second on the
/// device: the neighbour's worst stall reached 4.7-20x its baseline at
/// 30%. Commits at least 100 ms apart kept it at 2.0x, and 250 ms or
/// 1 s apart let more pile up for the neighbour's own flush to meet
/// (2.7x and 5.2x; `cargo xtask bench io` at 088a09f).
pub const COMMIT_GAP: Duration = Duration::from_millis(100);
/// Objects written but not yet committed to the journal (queued, in
/// flight, or flushed since the last commit) before writers wait: the
/// creates of a few [`COMMIT_GAP`]s at the fastest rates measured (about
/// 1,500 objects a second), so writers wait on it only when commits fall
/// far behind.
pub const MAX_UNFORCED: u64 = 4096;
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
    /// Data written back since the last commit.
    unforced_bytes: u64,
    /// When the last commit ended.
    last_commit: Option<Instant>,
    /// [`COMMIT_GAP`], or a test's.
    commit_gap: Duration,
    /// A file flushed whole before, to `fdatasync` when a commit falls due
    /// in a chunk with no whole file (a big file's middle): its data and
    /// metadata are on the device, so that is a device cache flush, never
    /// the write-back of a file with more to come.
    flushed_file: Option<File>,
    in_flight: bool,
    closed: bool,
    /// The first error the flusher hit; every later call reports it.
    error: Option<(io::ErrorKind, String)>,
    aimd: Aimd,
    next_slot: Option<Instant>,
    stats: FlusherStats,
}

impl State {
    /// Nothing queued or uncommitted yet.
    fn new(config: AimdConfig, commit_gap: Duration) -> Self {
        Self {
            queue: VecDeque::new(),
            backlog: 0,
            unforced: 0,
            flushed_unforced: 0,
            unforced_bytes: 0,
            last_commit: None,
            commit_gap,
            flushed_file: None,
            in_flight: false,
            closed: false,
            error: None,
            aimd: Aimd::new(config),
            next_slot: None,
            stats: FlusherStats::default(),
        }
    }

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
        Self::start_with_gap(config, COMMIT_GAP)
    }

    fn start_with_gap(config: AimdConfig, commit_gap: Duration) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(config, commit_gap)),
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

    /// Gives up on what is queued, for a pull that has failed: writers
    /// waiting for backlog room return at once with an error (a slow
    /// `--io-max-rate` must not hold a failed pull for the seconds its
    /// backlog would take), and so does every later submit. What was queued
    /// stays written but unflushed, which the commit's partial marker
    /// already accounts for.
    pub fn abandon(&self, why: &str) {
        let mut st = self.shared.lock();
        st.error
            .get_or_insert((io::ErrorKind::Interrupted, why.to_owned()));
        st.queue.clear();
        st.backlog = 0;
        st.unforced = 0;
        drop(st);
        self.shared.room.notify_all();
        self.shared.work.notify_all();
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
            st.unforced_bytes += chunk.iter().map(|i| i.len).sum::<u64>();
            let force = commit_due(
                objects,
                st.flushed_unforced,
                st.unforced_bytes,
                st.last_commit.map(|t| t.elapsed()),
                st.commit_gap,
            );
            let cost: u64 = chunk.iter().map(|i| i.cost(&st.aimd.config)).sum();
            let fallback = force
                .then(|| st.flushed_file.as_ref().and_then(|f| f.try_clone().ok()))
                .flatten();
            (chunk, cost, force, fallback)
        };
        let (chunk, bytes, force_log, fallback) = chunk;
        let t = Instant::now();
        let r = flush_chunk(&chunk, force_log, fallback.as_ref());
        // Only real commits are counted.
        let forced = matches!(r, Ok(Commit::Chunk | Commit::Fallback));
        let latency = t.elapsed();
        let whole = chunk.iter().rev().find(|i| !i.split);
        let flushed_file = whole.and_then(|i| i.file.try_clone().ok());
        drop(chunk);
        let sleep = {
            let mut st = shared.lock();
            st.in_flight = false;
            st.backlog = st.backlog.saturating_sub(bytes);
            if r.is_ok() && flushed_file.is_some() {
                st.flushed_file = flushed_file;
            }
            if forced {
                st.stats.log_forces += 1;
                st.last_commit = Some(Instant::now());
            }
            if forced {
                st.unforced_bytes = 0;
            }
            // A commit of this chunk's file covers every create flushed
            // before it. The fallback's may not: its inode was committed
            // before, and an `fdatasync` forces the journal only as far as
            // that inode needs; the next chunk with a whole file commits
            // them. With no file at all to `fdatasync` (a first chunk
            // holding only part of a big file) they are released all the
            // same, so that writers can never wait on a commit that does
            // not come.
            if force_log && matches!(r, Ok(Commit::Chunk | Commit::Nothing)) {
                st.unforced = st.unforced.saturating_sub(st.flushed_unforced);
                st.flushed_unforced = 0;
                st.unforced_bytes = 0;
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

/// Whether a chunk ends in a commit: `gap` has passed since the last one
/// (`since_last`, None before the first), and it holds a new object and
/// [`LOG_FORCE_OBJECTS`] have been flushed since the last commit (a chunk
/// with no new object, the rest of a big file, has no create to commit),
/// or [`LOG_FORCE_BYTES`] of data have.
fn commit_due(
    objects_in_chunk: u64,
    flushed_unforced: u64,
    unforced_bytes: u64,
    since_last: Option<Duration>,
    gap: Duration,
) -> bool {
    since_last.is_none_or(|t| t >= gap)
        && ((objects_in_chunk > 0 && flushed_unforced >= LOG_FORCE_OBJECTS)
            || unforced_bytes >= LOG_FORCE_BYTES)
}

/// Starts writeback of every range of the chunk, then waits for all of
/// them: one chunk in flight, its requests submitted together so the
/// device can merge them. With `force_log`, commits the journal (creates
/// included) and flushes the device cache by `fdatasync`ing the chunk's
/// last whole file, else `fallback` (a file flushed whole before): never a
/// file with more data to come, whose `fdatasync` would write it all back
/// at once.
fn flush_chunk(chunk: &[Item], force_log: bool, fallback: Option<&File>) -> io::Result<Commit> {
    // A zero length means "to the end of the file" to sync_file_range;
    // an empty object has no data to write back at all.
    let data = || chunk.iter().filter(|i| i.len > 0);
    for i in data() {
        sys::sync_file_range(i.file.as_fd(), i.offset, i.len, sys::SYNC_START)?;
    }
    for i in data() {
        sys::sync_file_range(i.file.as_fd(), i.offset, i.len, sys::SYNC_WAIT)?;
    }
    if !force_log {
        return Ok(Commit::Nothing);
    }
    let (file, how) = match (chunk.iter().rev().find(|i| !i.split), fallback) {
        (Some(last), _) => (&last.file, Commit::Chunk),
        (None, Some(f)) => (f, Commit::Fallback),
        (None, None) => return Ok(Commit::Nothing),
    };
    rustix::fs::fdatasync(file.as_fd())?;
    Ok(how)
}

/// What ended a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// No commit: none was due, or there was no file to `fdatasync`.
    Nothing,
    /// An `fdatasync` of the chunk's last whole file.
    Chunk,
    /// An `fdatasync` of a file flushed before.
    Fallback,
}

#[cfg(test)]
mod tests;
