//! The access log, off the request path: requests hand their line to a
//! bounded channel and a writer thread of its own writes and flushes. A
//! stalled stdout (a blocked pipe, a slow log collector) then costs log
//! lines, counted in `/metrics`, never requests.

use prometheus::IntCounter;
use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// Lines waiting for the writer before new ones are dropped: a few seconds
/// of a busy server, a few MiB at most.
pub const QUEUE: usize = 16 * 1024;
/// How long [`AccessLog::sync`] waits for the writer: short, as shutdown
/// waits this long for a stalled stdout within the pod's grace period.
const SYNC_TIMEOUT: Duration = Duration::from_secs(2);

enum Msg {
    Line(String),
    /// Answered once every line sent before it is written and flushed.
    Sync(mpsc::Sender<()>),
}

/// The sending side; the writer thread ends when this is dropped, after
/// writing what was queued.
#[derive(Debug)]
pub struct AccessLog {
    tx: SyncSender<Msg>,
    dropped: IntCounter,
}

impl AccessLog {
    /// Starts the writer thread on `out`; `dropped` counts lines lost to a
    /// full queue.
    pub fn start(out: Box<dyn Write + Send>, dropped: IntCounter) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx, out))?;
        Ok(Self { tx, dropped })
    }

    /// Queues one line; never blocks.
    pub fn log(&self, line: String) {
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.dropped.inc(),
            // The writer died (it logged why); counting is all that is left.
            Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }

    /// Waits until everything queued so far is written (tests, and the
    /// last lines at shutdown). Bounded: a stalled writer is not waited
    /// for past [`SYNC_TIMEOUT`].
    pub fn sync(&self) -> bool {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        let (done, wait) = mpsc::channel();
        let mut msg = Msg::Sync(done);
        // Not `send`: with the queue full and the writer stalled, that
        // would block for as long as the stall.
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return false,
            }
        }
        wait.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

/// The writer: writes lines as they come and flushes whenever the queue
/// runs empty, so a burst costs one flush, not one per line.
fn write_lines(rx: Receiver<Msg>, mut out: Box<dyn Write + Send>) {
    let mut failed = false;
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(l) => {
                    if let Err(e) = writeln!(out, "{l}") {
                        warn_once(&mut failed, &e);
                    }
                }
                Msg::Sync(done) => {
                    if let Err(e) = out.flush() {
                        warn_once(&mut failed, &e);
                    }
                    let _ = done.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = out.flush() {
            warn_once(&mut failed, &e);
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
        log.log("line 0".into());
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
            log.log(format!("line {i}"));
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
