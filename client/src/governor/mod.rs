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
//! - `paced` (default): `writeback`, plus the idle I/O class for everything
//!   we submit, plus a feedback loop ([`aimd`]) that measures how long each
//!   batch takes to reach the device and adapts the batch size and a write
//!   rate limit toward `--io-latency-target`.
//!
//! All modes end with one `syncfs` barrier before any ref moves.
//!
//! Why `sync_file_range(WRITE)` per object: `ionice` only applies to I/O
//! the process submits itself, and stock ostree leaves all of its data to
//! background writeback (submitted by kworkers, at normal priority, in
//! large bursts when the dirty limits trip). Submitting writeback from our
//! own thread, right after each object is written, makes the idle class
//! apply and keeps dirty data from piling up.

pub mod aimd;

use crate::sys;
use aimd::{Aimd, AimdConfig};
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
    /// Idle I/O priority, incremental writeback, AIMD pacing toward the
    /// latency target (default).
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
/// Writes may run this far ahead of the paced schedule before sleeping, so
/// that pacing does not turn every small object into a sleep.
const PACE_SLACK: Duration = Duration::from_millis(20);
/// Flush latencies kept for percentiles (older ones beyond are dropped
/// from the percentile, not from count and max).
const MAX_SAMPLES: usize = 1 << 16;

/// What the governor did, for `--json` and the benchmark.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GovernorStats {
    pub io_mode: String,
    /// Objects handed to the governor after being written.
    pub objects: u64,
    /// Bytes of those objects on disk (apparent size).
    pub bytes: u64,
    /// Waited flushes (batches, or fsyncs in per-object-fsync mode).
    pub flushes: u64,
    pub flush_p50_ms: f64,
    pub flush_p99_ms: f64,
    pub flush_max_ms: f64,
    /// Flushes slower than the latency target.
    pub flushes_over_target: u64,
    /// Time writers slept to respect the paced rate.
    pub throttle_ms: f64,
    /// Final rate limit (paced), MiB/s.
    pub final_rate_mib_s: f64,
    /// Final batch size (paced, writeback), KiB.
    pub final_batch_kib: u64,
    /// Whether the idle I/O class was set (paced).
    pub idle_priority: bool,
    /// Duration of the final syncfs.
    pub barrier_ms: f64,
}

#[derive(Debug)]
struct State {
    aimd: Aimd,
    pending: Vec<File>,
    pending_bytes: u64,
    /// When the paced schedule allows the next write.
    next_slot: Option<Instant>,
    samples: Vec<f64>,
    stats: GovernorStats,
}

#[derive(Debug)]
pub struct Governor {
    mode: IoMode,
    state: Mutex<State>,
    /// Held by the thread waiting for a batch, so that writers crossing the
    /// next threshold wait too instead of piling up more dirty data.
    flushing: Mutex<()>,
}

impl Governor {
    /// Creates the governor. In `paced` mode this puts the calling thread in
    /// the idle I/O class: call it before spawning any thread, so that they
    /// all inherit it.
    pub fn new(mode: IoMode, target: Duration) -> Self {
        let mut stats = GovernorStats {
            io_mode: mode.as_str().to_owned(),
            ..Default::default()
        };
        if mode == IoMode::Paced {
            match sys::set_idle_io_priority() {
                Ok(()) => stats.idle_priority = true,
                Err(e) => tracing::warn!("cannot set the idle I/O priority: {e}"),
            }
        }
        let aimd = Aimd::new(AimdConfig::new(target));
        Self {
            mode,
            state: Mutex::new(State {
                aimd,
                pending: Vec::new(),
                pending_bytes: 0,
                next_slot: None,
                samples: Vec::new(),
                stats,
            }),
            flushing: Mutex::new(()),
        }
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Called by a writer thread right after an object file was written
    /// (and linked into place). `file` is that object, opened read-only;
    /// `None` for objects that have no data of their own (symlinks in bare
    /// repos).
    pub fn after_write(&self, file: Option<File>) -> io::Result<()> {
        let Some(file) = file else {
            return Ok(());
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        {
            let mut st = self.state.lock().expect("governor state");
            st.stats.objects += 1;
            st.stats.bytes += len;
        }
        match self.mode {
            IoMode::StockLike => Ok(()),
            IoMode::PerObjectFsync => {
                let t = Instant::now();
                rustix::fs::fsync(file.as_fd())?;
                self.record_flush(t.elapsed());
                Ok(())
            }
            IoMode::Writeback | IoMode::Paced => {
                sys::sync_file_range(file.as_fd(), sys::SYNC_START)?;
                let batch = {
                    let mut st = self.state.lock().expect("governor state");
                    st.pending.push(file);
                    st.pending_bytes += len;
                    let limit = if self.mode == IoMode::Paced {
                        st.aimd.batch
                    } else {
                        FIXED_BATCH
                    };
                    (st.pending_bytes >= limit || st.pending.len() >= MAX_PENDING_FILES)
                        .then(|| Self::take_batch(&mut st))
                };
                if let Some(batch) = batch {
                    self.flush_batch(batch)?;
                }
                if self.mode == IoMode::Paced {
                    self.pace(len);
                }
                Ok(())
            }
        }
    }

    fn take_batch(st: &mut State) -> Vec<File> {
        st.pending_bytes = 0;
        std::mem::take(&mut st.pending)
    }

    /// Waits until a batch of files is on the device, measuring how long
    /// that takes, and feeds the controller.
    fn flush_batch(&self, batch: Vec<File>) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let _serialised = self.flushing.lock().expect("governor flush lock");
        let t = Instant::now();
        for f in &batch {
            sys::sync_file_range(f.as_fd(), sys::SYNC_WAIT)?;
        }
        self.record_flush(t.elapsed());
        Ok(())
    }

    fn record_flush(&self, latency: Duration) {
        let mut st = self.state.lock().expect("governor state");
        let ms = latency.as_secs_f64() * 1e3;
        st.stats.flushes += 1;
        st.stats.flush_max_ms = st.stats.flush_max_ms.max(ms);
        if st.samples.len() < MAX_SAMPLES {
            st.samples.push(ms);
        }
        if self.mode == IoMode::Paced {
            if st.aimd.on_flush(latency) {
                st.stats.flushes_over_target += 1;
            }
        } else if latency > st.aimd.config.target {
            st.stats.flushes_over_target += 1;
        }
    }

    /// Sleeps as long as the paced schedule says writing `bytes` takes.
    fn pace(&self, bytes: u64) {
        let sleep = {
            let mut st = self.state.lock().expect("governor state");
            let now = Instant::now();
            let slot = st.next_slot.map_or(now, |s| s.max(now));
            let next = slot + st.aimd.pace(bytes);
            st.next_slot = Some(next);
            next.checked_duration_since(now + PACE_SLACK)
        };
        if let Some(d) = sleep {
            std::thread::sleep(d);
            let mut st = self.state.lock().expect("governor state");
            st.stats.throttle_ms += d.as_secs_f64() * 1e3;
        }
    }

    /// Waits for whatever is still pending (end of the pull, before the
    /// barrier).
    pub fn drain(&self) -> io::Result<()> {
        let batch = {
            let mut st = self.state.lock().expect("governor state");
            Self::take_batch(&mut st)
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
        self.state.lock().expect("governor state").stats.barrier_ms = d.as_secs_f64() * 1e3;
        Ok(d)
    }

    pub fn stats(&self) -> GovernorStats {
        let st = self.state.lock().expect("governor state");
        let mut s = st.stats.clone();
        let mut v = st.samples.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        s.flush_p50_ms = percentile(&v, 0.50);
        s.flush_p99_ms = percentile(&v, 0.99);
        if matches!(self.mode, IoMode::Paced | IoMode::Writeback) {
            s.final_batch_kib = if self.mode == IoMode::Paced {
                st.aimd.batch >> 10
            } else {
                FIXED_BATCH >> 10
            };
        }
        if self.mode == IoMode::Paced {
            s.final_rate_mib_s = st.aimd.rate / (1024.0 * 1024.0);
        }
        s
    }
}

/// Nearest-rank percentile of sorted samples (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let cases: &[(&[f64], f64, f64)] = &[
            (&[], 0.5, 0.0),
            (&[3.0], 0.5, 3.0),
            (&[1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
            (&[1.0, 2.0, 3.0, 4.0], 0.99, 4.0),
            (&[1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
        ];
        for (v, q, want) in cases {
            assert_eq!(percentile(v, *q), *want, "{v:?} q={q}");
        }
    }

    #[test]
    fn writeback_mode_flushes_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let g = Governor::new(IoMode::Writeback, Duration::from_millis(10));
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
