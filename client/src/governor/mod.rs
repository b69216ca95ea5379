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
