//! The access log, off the request path: a request serializes its line
//! into a thread-local buffer and appends it to a shared batch under a
//! short lock; a writer thread of its own takes the whole batch, writes
//! and flushes it once. The writer is woken only when it sleeps with
//! nothing to do, and after each batch it lingers a moment so a busy
//! server's lines gather into one write instead of one wake and one write
//! per request (measured: the per-line channel wake cost a context switch
//! per request). An idle server's line is written at once. A stalled
//! stdout (a blocked pipe, a slow log collector) costs log lines, counted
//! in `/metrics`, never requests.

use prometheus::IntCounter;
use std::cell::RefCell;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Lines waiting for the writer before new ones are dropped: a few seconds
/// of a busy server.
pub const QUEUE: usize = 16 * 1024;
/// Bytes waiting for the writer before new lines are dropped (a path may
/// be long; lines are usually ~250 bytes).
const QUEUE_BYTES: usize = 8 << 20;
/// How long [`AccessLog::sync`] waits for the writer: short, as shutdown
/// waits this long for a stalled stdout within the pod's grace period.
const SYNC_TIMEOUT: Duration = Duration::from_secs(2);
/// After a batch, the writer waits this long before taking the next: a
/// line of a busy server is at most this much (plus the write) late.
pub const LINGER: Duration = Duration::from_millis(5);

/// The batch the requests fill and the writer empties.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: usize,
    /// Lines appended since the start, and of those, written and flushed.
    appended: u64,
    written: u64,
    /// The writer waits for `more` (so an append must wake it).
    parked: bool,
    closed: bool,
}

struct Shared {
    batch: Mutex<Batch>,
    /// Signals the writer: lines to write, or closed.
    more: Condvar,
    /// Signals [`AccessLog::sync`]: `written` moved.
    flushed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Batch> {
        // A panic while holding the lock leaves a batch that is still
        // consistent bytes (appends are one extend), so go on.
        self.batch.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The requests' side; the writer thread ends when this is dropped, after
/// writing what was queued.
pub struct AccessLog {
    shared: Arc<Shared>,
    dropped: IntCounter,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

thread_local! {
    /// Where a request thread serializes its line, reused.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl AccessLog {
    /// Starts the writer thread on `out`; `dropped` counts lines lost to a
    /// full queue.
    pub fn start(out: Box<dyn Write + Send>, dropped: IntCounter) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            batch: Mutex::new(Batch::default()),
            more: Condvar::new(),
            flushed: Condvar::new(),
        });
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(&theirs, out))?;
        Ok(Self { shared, dropped })
    }

    /// Queues one line, `entry` as JSON; never blocks on the writer.
    pub fn log(&self, entry: &impl serde::Serialize) {
        SCRATCH.with_borrow_mut(|line| {
            line.clear();
            if let Err(e) = serde_json::to_writer(&mut *line, entry) {
                tracing::warn!("access log line: {e}");
                self.dropped.inc();
                return;
            }
            line.push(b'\n');
            self.append(line);
        });
    }

    /// Queues one line given as text (no newline).
    #[cfg(test)]
    fn log_text(&self, text: &str) {
        let mut line = Vec::with_capacity(text.len() + 1);
        line.extend_from_slice(text.as_bytes());
        line.push(b'\n');
        self.append(&line);
    }

    fn append(&self, line: &[u8]) {
        let mut b = self.shared.lock();
        if b.closed || b.lines >= QUEUE || b.bytes.len() + line.len() > QUEUE_BYTES {
            drop(b);
            self.dropped.inc();
            return;
        }
        b.bytes.extend_from_slice(line);
        b.lines += 1;
        b.appended += 1;
        let wake = std::mem::replace(&mut b.parked, false);
        drop(b);
        if wake {
            self.shared.more.notify_one();
        }
    }

    /// Waits until everything queued so far is written and flushed (tests,
    /// and the last lines at shutdown). Bounded: a stalled writer is not
    /// waited for past [`SYNC_TIMEOUT`].
    pub fn sync(&self) -> bool {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        let mut b = self.shared.lock();
        let target = b.appended;
        while b.written < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            b = self
                .shared
                .flushed
                .wait_timeout(b, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.more.notify_one();
    }
}

/// The writer: takes the whole batch, writes and flushes it, lingers, and
/// sleeps when there is nothing to take.
fn write_lines(shared: &Shared, mut out: Box<dyn Write + Send>) {
    let mut failed = false;
    let mut spare = Vec::new();
    loop {
        let mut b = shared.lock();
        while b.lines == 0 && !b.closed {
            b.parked = true;
            b = shared.more.wait(b).unwrap_or_else(PoisonError::into_inner);
        }
        if b.lines == 0 && b.closed {
            return;
        }
        std::mem::swap(&mut b.bytes, &mut spare);
        b.lines = 0;
        let upto = b.appended;
        let closed = b.closed;
        drop(b);
        if let Err(e) = out.write_all(&spare).and_then(|()| out.flush()) {
            warn_once(&mut failed, &e);
        }
        spare.clear();
        shared.lock().written = upto;
        shared.flushed.notify_all();
        if !closed {
            std::thread::sleep(LINGER);
        }
    }
}

/// One warning per run of failures, not one per line.
fn warn_once(failed: &mut bool, e: &std::io::Error) {
    if !std::mem::replace(failed, true) {
        tracing::warn!("access log write failed (further failures not logged): {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, Mutex};

    /// A writer that blocks until released, like a stdout nobody reads.
    #[derive(Clone, Default)]
    struct Stalled {
        open: Arc<(Mutex<bool>, Condvar)>,
        entered: Arc<std::sync::atomic::AtomicBool>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.entered
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let (lock, cv) = &*self.open;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_writer_costs_lines_not_callers() {
        let w = Stalled::default();
        let dropped = IntCounter::new("d", "d").unwrap();
        let log = AccessLog::start(Box::new(w.clone()), dropped.clone()).unwrap();
        let extra = 100;
        // The writer takes the first line and blocks writing it...
        log.log_text("line 0");
        for _ in 0..1000 {
            if w.entered.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(w.entered.load(std::sync::atomic::Ordering::SeqCst));
        // ...so the queue takes QUEUE more, and the rest are dropped
        // without blocking the caller.
        for i in 1..=QUEUE + extra {
            log.log_text(&format!("line {i}"));
        }
        assert_eq!(dropped.get(), extra as u64);
        // Waiting for a stalled writer gives up instead of hanging.
        assert!(!log.sync());
        *w.open.0.lock().unwrap() = true;
        w.open.1.notify_all();
        assert!(log.sync());
        let text = String::from_utf8(w.written.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), QUEUE + 1);
        assert_eq!(text.lines().next(), Some("line 0"));
    }
}
