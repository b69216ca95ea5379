//! The I/O governor: decides *when* the bytes we write reach the disk, so
//! that a pull does not stall a latency-sensitive neighbour (etcd) on the
//! same filesystem.
//!
//! - `stock-like`: nothing until one `syncfs` at the end (what stock
//!   `ostree pull` does: the anchor of the benchmark).
//! - `per-object-fsync`: `fsync` each object as it lands (stock
//!   `--per-object-fsync`).
//! - `writeback`: start writeback of each object as soon as it is written
//!   (`sync_file_range(WRITE)`), and wait for it in fixed 4 MiB batches.
//! - `paced` (default): a background [`flusher`] in the idle I/O class
//!   writes back what the writers hand it in small chunks, one chunk in
//!   flight at a time, at a rate the feedback loop ([`aimd`]) steers by the
//!   tail of the chunks' own latency toward `--io-latency-target`: slow
//!   start from a low rate, objects counted by their creates as well as
//!   their bytes, the journal committed every 128 objects and every 2 MiB
//!   of data but at most every 100 ms (writers wait while more than 4,096
//!   objects are uncommitted), and at most `--io-max-rate`.
//!
//! All modes end with one `syncfs` barrier before any ref moves.
//!
//! Why submit writeback ourselves: `ionice` only applies to I/O the process
//! submits itself, and stock ostree leaves all of its data to background
//! writeback (submitted by kworkers, at normal priority, in large bursts
//! when the dirty limits trip). Why one small chunk at a time: the
//! neighbour's fdatasync waits for whatever is queued on the device ahead
//! of it, so what we have in flight is what its latency grows by.
//!
//! # How the governor paces
//!
//! The problem: stock ostree leaves every byte to background writeback and
//! ends with one big `syncfs`; the flush storm stalls etcd's `fdatasync`s.
//! `ionice` does not help because kworkers, not the puller, submit that I/O.
//!
//! `--io-mode paced` (default), `governor/flusher.rs`:
//! - **One flusher thread, one small chunk in flight.** A writer thread hands
//!   each object to the flusher as soon as it is linked, and goes on
//!   downloading and inflating. The flusher writes the backlog back in chunks
//!   (`sync_file_range` START on every range of the chunk, then WAIT on each):
//!   whole small objects grouped, up to 32 files (`CHUNK_MAX_FILES`), or a
//!   page-aligned range of a big one. What the neighbour's `fdatasync` can
//!   find queued ahead of it on the device is then at most one chunk of ours
//!   (64 KiB to 256 KiB of cost, a fraction of a millisecond on an SSD), never
//!   a burst of kworker writeback nor a batch of whole objects started at
//!   once. The first version of this mode
//!   started writeback of every object immediately and waited in batches that
//!   grew to 16 MiB; with the neighbour measured in the same run, that
//!   inflated its p99 several times over, which is why the in-flight amount,
//!   not the batch between waits, is what is bounded now.
//! - **Idle I/O class and nice 10.** The flusher thread submits all of this
//!   mode's writeback, in the idle class (`ioprio_set`; honoured by bfq, the
//!   lowest priority for mq-deadline, no effect with `none`). The pull's
//!   threads run at nice 10 (`PACED_NICE`): on a small node the neighbour's
//!   `fdatasync` only completes for it once it gets a CPU back, and inflating
//!   and hashing objects on every core added run-queue delay that no I/O
//!   policy removes. The flusher itself keeps nice 0 (it is started before
//!   the pull is reniced): its `fdatasync` may be what submits the journal
//!   write a neighbour's `fdatasync` waits for, and a starved flusher would
//!   hold the neighbour for as long; it uses almost no CPU.
//! - **Feedback** (`aimd.rs`, pure, table-tested): each chunk's
//!   flush latency is measured, and the decision looks at the *tail*, the
//!   slowest of the last 8 flushes, against `--io-latency-target` (default
//!   10 ms). *Slow start*: the rate begins at 8 MiB/s and grows ×1.25 per
//!   chunk while the tail stays within target, so a small update, written in
//!   a couple of seconds, is never written at full speed before the first
//!   feedback (with a 64 MiB/s start, a 60 MiB burst of small files finished
//!   before a single slow flush was seen). The first slow tail ends slow
//!   start; after it the rate grows by 4 MiB/s and the chunk by 64 KiB per
//!   fast flush. Over target, both halve, the rate from the lower of its limit
//!   and what the device just delivered (so one slow flush bites at once),
//!   once per round trip (the tail is reset, the next two flushes are not
//!   acted on). *Creates count*: rates, chunks and backlog are in cost bytes,
//!   an object's length plus 16 KiB (inode, directory entry, journal), so
//!   2,000 small files are paced like the 30+ MiB of metadata writes they
//!   are. Floors 1 MiB/s and 64 KiB; ceilings 256 KiB and 1 GiB/s, or
//!   `--io-max-rate`. After
//!   each chunk the flusher waits for the rate's share and at least as long
//!   as the flush took: we hold the device at most half the time, and back
//!   off in proportion when it slows down (a stalled device makes our flush
//!   slow, and the neighbour needs the time right after a stall most).
//! - **Bounded backlog.** Writers wait only when what they handed over and
//!   is not yet flushed exceeds 2 s at the current rate (clamped to 8–64 MiB)
//!   or 512 files (descriptors). Dirty data therefore never reaches the
//!   kernel's dirty thresholds nor ages to `dirty_expire` (30 s), either of
//!   which would hand it to kworkers at normal priority. Time waited is
//!   `backpressure_ms`.
//! - **Static deltas too**: libostree writes a delta's objects itself, with
//!   our fsync off; right after it returns, the superblock's object list is
//!   handed to the flusher, so they reach the disk paced while still dirty.
//! - **Creates paced and committed as they go.** `sync_file_range` writes
//!   data only; a create (inode, xattr, directory entry) waits in the journal,
//!   and on XFS a neighbour's own `fdatasync` forces the whole pending
//!   journal, ours included; data written back may also wait in the device's
//!   cache, which that `fdatasync` flushes. So the flusher commits (an
//!   `fdatasync` of the chunk's last whole file: the journal up to it and a
//!   device cache flush, inside the paced, measured chunk) every 128 objects
//!   (`LOG_FORCE_OBJECTS`) and every 2 MiB of data (`LOG_FORCE_BYTES`; in
//!   the middle of a big file, the last file flushed whole is synced
//!   instead), but never within 100 ms of the last commit (`COMMIT_GAP`),
//!   and writers wait while more than 4,096 objects (`MAX_UNFORCED`, plus
//!   one per writer) are written but not yet committed. The interval is a
//!   trade measured in `bench io` (RESULTS.md): each commit is a device
//!   cache flush that the neighbour may queue behind, so commits too often
//!   (every chunk; or every 128 objects on a fast disk, 20-30 a second)
//!   raise its p99 and worst stall, and commits too rare leave more for the
//!   neighbour's own flush to meet (every 128 objects alone let a 30%
//!   update's worst stall reach 4.5× on a slow disk; 1 s apart, 5× on a
//!   fast one). By objects and by bytes, at most ten a second, sits
//!   between.
//!   `done.governor` reports `log_forces` and `max_unforced`.
//! - **One barrier**: `syncfs` at the end, before the ref moves; by then the
//!   data and the journal of all but the last chunk are on the device, so it
//!   is cheap.
//!
//! Other modes, for the benchmark: `stock-like` (nothing, then `syncfs`),
//! `per-object-fsync` (`fsync` after each object), `writeback` (the writer
//! starts `SYNC_FILE_RANGE_WRITE` on each object and waits in fixed 4 MiB
//! batches; no idle class, no pacing). Stats (`done.governor` in `--json`):
//! objects and bytes handed to the governor, flushes, flush p50/p99/max,
//! flushes over target, throttle and backpressure time, final rate and chunk,
//! barrier time, whether the idle class and nice were set.
//!
//! Measured figures (neighbour latency ratios, time and bytes against stock
//! `ostree pull`, with their runs, dates and git revisions) are in
//! [`xtask/src/bench/RESULTS.md`](xtask/src/bench/RESULTS.md).

pub mod aimd;
pub mod flusher;
pub mod samples;

use crate::sys;
use aimd::{Aimd, AimdConfig};
use flusher::Flusher;
use samples::Samples;
use serde::Serialize;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `--io-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    /// No pacing; one syncfs at the end (stock `ostree pull`).
    StockLike,
    /// fsync every object as it is written (stock `--per-object-fsync`).
    PerObjectFsync,
    /// Incremental writeback in fixed batches, normal priority, no pacing.
    Writeback,
    /// Idle I/O priority, writeback in small chunks one at a time, AIMD
    /// pacing toward the latency target (default).
    Paced,
}

impl IoMode {
    pub fn as_str(self) -> &'static str {
        match self {
            IoMode::StockLike => "stock-like",
            IoMode::PerObjectFsync => "per-object-fsync",
            IoMode::Writeback => "writeback",
            IoMode::Paced => "paced",
        }
    }
}

/// Batch size of `writeback` mode.
const FIXED_BATCH: u64 = 4 << 20;
/// A waited flush also happens after this many files, whatever their size,
/// which bounds the descriptors held open.
const MAX_PENDING_FILES: usize = 512;
/// The `paced` mode's CPU nice value: below the neighbour's (0) in the
/// scheduler's eyes, without starving the pull on a busy node as
/// `SCHED_IDLE` could.
pub const PACED_NICE: i32 = 10;

/// What the governor did, for `--json` and the benchmark.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GovernorStats {
    pub io_mode: String,
    /// Objects handed to the governor after being written.
    pub objects: u64,
    /// Bytes of those objects on disk (apparent size).
    pub bytes: u64,
    /// Waited flushes (chunks, batches, or fsyncs in per-object-fsync mode).
    pub flushes: u64,
    pub flush_p50_ms: f64,
    pub flush_p99_ms: f64,
    pub flush_max_ms: f64,
    /// Flushes slower than the latency target.
    pub flushes_over_target: u64,
    /// Time the flusher slept to respect the paced rate.
    pub throttle_ms: f64,
    /// Time writers waited for the paced flusher to catch up.
    pub backpressure_ms: f64,
    /// Final rate limit (paced), MiB/s.
    pub final_rate_mib_s: f64,
    /// Final chunk (paced) or batch (writeback) size, KiB.
    pub final_batch_kib: u64,
    /// Whether the idle I/O class was set (paced).
    pub idle_priority: bool,
    /// The CPU nice value set for the pull's threads (paced).
    pub nice: i32,
    /// Duration of the final syncfs.
    pub barrier_ms: f64,
    /// Journal commits the paced flusher made.
    pub log_forces: u64,
    /// The most objects written but not yet committed at once (paced).
    pub max_unforced: u64,
}

/// The inline modes' state (`writeback` batches, `per-object-fsync`).
#[derive(Debug, Default)]
struct Inline {
    pending: Vec<File>,
    pending_bytes: u64,
    samples: Samples,
    flushes: u64,
    over_target: u64,
}

#[derive(Debug)]
pub struct Governor {
    mode: IoMode,
    target: Duration,
    /// `paced` only.
    flusher: Option<Flusher>,
    inline: Mutex<Inline>,
    /// Held by the thread waiting for a `writeback` batch, so that writers
    /// crossing the next threshold wait too instead of piling up more dirty
    /// data.
    flushing: Mutex<()>,
    counts: Mutex<GovernorStats>,
}

impl Governor {
    /// Creates the governor. In `paced` mode this puts the calling thread
    /// in the idle I/O class, starts the flusher (which inherits that), and
    /// then lowers the calling thread to nice [`PACED_NICE`]: call it
    /// before spawning any thread, so that they all inherit both.
    pub fn new(mode: IoMode, target: Duration, max_rate: Option<u64>) -> io::Result<Self> {
        let mut stats = GovernorStats {
            io_mode: mode.as_str().to_owned(),
            ..Default::default()
        };
        let mut flusher = None;
        if mode == IoMode::Paced {
            match sys::set_idle_io_priority() {
                Ok(()) => stats.idle_priority = true,
                Err(e) => tracing::warn!("cannot set the idle I/O priority: {e}"),
            }
            let config = AimdConfig::new(target).with_max_rate(max_rate.map(|r| r as f64));
            // The flusher starts before the pull is reniced, so it keeps
            // the normal CPU priority (and the idle I/O class): its
            // `fdatasync` may be what submits the journal write that the
            // neighbour's own `fdatasync` waits for, and a flusher starved
            // of CPU on a busy node would hold the neighbour for as long.
            // It uses almost no CPU.
            flusher = Some(Flusher::start(config)?);
            // The neighbour's fdatasync only completes for it once it gets a
            // CPU back; inflating and hashing objects on every core would
            // add run-queue delay to its latency that no I/O policy removes.
            match rustix::process::setpriority_process(None, PACED_NICE) {
                Ok(()) => stats.nice = PACED_NICE,
                Err(e) => tracing::warn!("cannot lower the CPU priority: {e}"),
            }
        }
        Ok(Self {
            mode,
            target,
            flusher,
            inline: Mutex::new(Inline::default()),
            flushing: Mutex::new(()),
            counts: Mutex::new(stats),
        })
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Called by a writer thread right after an object file was written
    /// (and linked into place). `file` is that object, opened read-only;
    /// `None` for objects that have no data of their own (symlinks in bare
    /// repos). In `paced` mode this may wait for the flusher to catch up.
    pub fn after_write(&self, file: Option<File>) -> io::Result<()> {
        let Some(file) = file else {
            return Ok(());
        };
        let len = file.metadata()?.len();
        {
            let mut c = self.counts.lock().expect("governor counts");
            c.objects += 1;
            c.bytes += len;
        }
        match self.mode {
            IoMode::StockLike => Ok(()),
            IoMode::PerObjectFsync => {
                let t = Instant::now();
                rustix::fs::fsync(file.as_fd())?;
                self.record_inline(t.elapsed());
                Ok(())
            }
            IoMode::Paced => self
                .flusher
                .as_ref()
                .expect("paced mode has a flusher")
                .submit(file, len),
            IoMode::Writeback => {
                sys::sync_file_range(file.as_fd(), 0, 0, sys::SYNC_START)?;
                let batch = {
                    let mut st = self.inline.lock().expect("governor state");
                    st.pending.push(file);
                    st.pending_bytes += len;
                    (st.pending_bytes >= FIXED_BATCH || st.pending.len() >= MAX_PENDING_FILES).then(
                        || {
                            st.pending_bytes = 0;
                            std::mem::take(&mut st.pending)
                        },
                    )
                };
                match batch {
                    Some(batch) => self.flush_batch(batch),
                    None => Ok(()),
                }
            }
        }
    }

    /// Waits until a `writeback` batch is on the device, measuring how long
    /// that takes.
    fn flush_batch(&self, batch: Vec<File>) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let _serialised = self.flushing.lock().expect("governor flush lock");
        let t = Instant::now();
        for f in &batch {
            sys::sync_file_range(f.as_fd(), 0, 0, sys::SYNC_WAIT)?;
        }
        self.record_inline(t.elapsed());
        Ok(())
    }

    fn record_inline(&self, latency: Duration) {
        let mut st = self.inline.lock().expect("governor state");
        st.flushes += 1;
        st.samples.push(latency);
        if latency > self.target {
            st.over_target += 1;
        }
    }

    /// Stops pacing a pull that has failed (see [`Flusher::abandon`]).
    pub fn abandon(&self, why: &str) {
        if let Some(f) = &self.flusher {
            f.abandon(why);
        }
    }

    /// Waits for whatever is still pending (end of the pull, before the
    /// barrier).
    pub fn drain(&self) -> io::Result<()> {
        if let Some(f) = &self.flusher {
            return f.drain();
        }
        let batch = {
            let mut st = self.inline.lock().expect("governor state");
            st.pending_bytes = 0;
            std::mem::take(&mut st.pending)
        };
        self.flush_batch(batch)
    }

    /// The durability barrier: every object we wrote (data and metadata,
    /// and the device cache) is stable once this returns.
    pub fn barrier(&self, fs: impl AsFd) -> io::Result<Duration> {
        self.drain()?;
        let t = Instant::now();
        rustix::fs::syncfs(fs)?;
        let d = t.elapsed();
        self.counts.lock().expect("governor counts").barrier_ms = d.as_secs_f64() * 1e3;
        Ok(d)
    }

    pub fn stats(&self) -> GovernorStats {
        let mut s = self.counts.lock().expect("governor counts").clone();
        let samples = match &self.flusher {
            Some(f) => {
                let (fs, aimd): (flusher::FlusherStats, Aimd) = f.stats();
                s.flushes = fs.flushes;
                s.flushes_over_target = fs.flushes_over_target;
                s.throttle_ms = fs.throttle.as_secs_f64() * 1e3;
                s.backpressure_ms = fs.backpressure.as_secs_f64() * 1e3;
                s.log_forces = fs.log_forces;
                s.max_unforced = fs.max_unforced;
                s.final_rate_mib_s = aimd.rate / (1024.0 * 1024.0);
                s.final_batch_kib = aimd.batch >> 10;
                fs.samples
            }
            None => {
                let st = self.inline.lock().expect("governor state");
                s.flushes = st.flushes;
                s.flushes_over_target = st.over_target;
                if self.mode == IoMode::Writeback {
                    s.final_batch_kib = FIXED_BATCH >> 10;
                }
                st.samples.clone()
            }
        };
        (s.flush_p50_ms, s.flush_p99_ms, s.flush_max_ms) = samples.summary();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writeback_mode_flushes_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let g = Governor::new(IoMode::Writeback, Duration::from_millis(10), None).unwrap();
        for i in 0..10 {
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
            g.after_write(Some(File::open(&p).unwrap())).unwrap();
        }
        g.barrier(File::open(dir.path()).unwrap()).unwrap();
        let s = g.stats();
        assert_eq!(s.objects, 10);
        assert_eq!(s.bytes, 10 << 20);
        // 4 MiB batches: two full ones, and the rest drained by the barrier.
        assert_eq!(s.flushes, 3);
        assert!(s.flush_max_ms >= s.flush_p50_ms);
    }
}
