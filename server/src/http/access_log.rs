//! The access log, with no thread of its own: a request serializes its
//! line into a thread-local buffer and appends it to a shared batch under
//! a short lock; a worker writes the batch out when it has nothing else to
//! do (just before its runtime parks, [`AccessLog::flush`]), and the
//! request that fills it to [`FLUSH_AT`] writes it at once. That is one
//! `write` per idle moment, as nginx makes one per request. A writer thread
//! cost a wake-up, a linger and a sleep per batch: 8-10% of the server's
//! CPU in a delta pull (`cargo xtask bench serve` at 074b223). A timer
//! that wrote a batch 20 ms after its first line, one `write` a pull
//! instead of one a request, cost 7-20% more: its own wake-up is dearer
//! than the appends it saves (`cargo xtask bench serve`).
//!
//! The output must not block (`nonblocking_stdout` makes stdout so): a
//! full pipe keeps the lines queued, to be written at a later idle moment,
//! and past the queue's bounds costs lines, counted in `/metrics`, never
//! requests.

use prometheus::IntCounter;
use std::cell::RefCell;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Lines queued before new ones are dropped: a few seconds of a busy
/// server.
pub const QUEUE: usize = 16 * 1024;
/// Bytes queued before new lines are dropped (a path may be long; lines
/// are usually ~250 bytes).
const QUEUE_BYTES: usize = 8 << 20;
/// A batch this large is written by the request that filled it: a worker
/// that never runs out of work still writes every few hundred lines.
pub const FLUSH_AT: usize = 64 * 1024;
/// How long [`AccessLog::sync`] waits for a full output: short, as
/// shutdown waits this long for a stalled stdout within the pod's grace
/// period.
const SYNC_TIMEOUT: Duration = Duration::from_secs(2);
/// Between [`AccessLog::sync`]'s tries at a full output.
const SYNC_RETRY: Duration = Duration::from_millis(1);

/// The lines the requests fill.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: usize,
}

/// The output, and what of a batch it has not taken yet.
struct Writer {
    out: Box<dyn Write + Send>,
    /// A batch taken from [`Batch`], written up to `done`.
    taken: Vec<u8>,
    taken_lines: usize,
    done: usize,
    /// A failure was logged (one warning per run of failures).
    failed: bool,
}

struct Shared {
    batch: Mutex<Batch>,
    writer: Mutex<Writer>,
    /// Lines and bytes appended and not yet written (the batch and the
    /// writer's `taken`): the bound, and a flush with nothing queued is
    /// one load.
    queued_lines: AtomicUsize,
    queued_bytes: AtomicUsize,
}

/// A panic while holding either lock leaves consistent bytes (appends are
/// one extend, writes advance `done` after they happen), so go on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The requests' side and the writing, which whoever is idle does.
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
    /// Lines go to `out`, which must not block: a full output says
    /// `WouldBlock`. `dropped` counts lines lost to a full queue or a
    /// failed write.
    pub fn new(out: Box<dyn Write + Send>, dropped: IntCounter) -> Self {
        let writer = Writer {
            out,
            taken: Vec::new(),
            taken_lines: 0,
            done: 0,
            failed: false,
        };
        let shared = Arc::new(Shared {
            batch: Mutex::new(Batch::default()),
            writer: Mutex::new(writer),
            queued_lines: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
        });
        Self { shared, dropped }
    }

    /// Queues one line, which `write` puts into a reused buffer (without
    /// its newline); never blocks on the output.
    pub fn log_with(&self, write: impl FnOnce(&mut Vec<u8>)) {
        SCRATCH.with_borrow_mut(|line| {
            line.clear();
            write(line);
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
        let s = &*self.shared;
        if s.queued_lines.load(Ordering::Relaxed) >= QUEUE
            || s.queued_bytes.load(Ordering::Relaxed) + line.len() > QUEUE_BYTES
        {
            self.dropped.inc();
            return;
        }
        let full = {
            let mut b = lock(&s.batch);
            b.bytes.extend_from_slice(line);
            b.lines += 1;
            // Counted before the batch can be taken, so a write never
            // subtracts what was not added.
            s.queued_lines.fetch_add(1, Ordering::Relaxed);
            s.queued_bytes.fetch_add(line.len(), Ordering::Relaxed);
            b.bytes.len() >= FLUSH_AT
        };
        if full {
            self.flush();
        }
    }

    /// Writes what is queued, as far as the output takes it without
    /// waiting; nothing if another thread is writing. What a worker calls
    /// before it parks.
    pub fn flush(&self) {
        if self.shared.queued_lines.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Ok(mut w) = self.shared.writer.try_lock() {
            self.write_out(&mut w);
        }
    }

    /// Waits until everything queued so far is written (tests, and the
    /// last lines at shutdown). Bounded: a full output is not waited for
    /// past [`SYNC_TIMEOUT`].
    pub fn sync(&self) -> bool {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            self.write_out(&mut lock(&self.shared.writer));
            if self.shared.queued_lines.load(Ordering::Relaxed) == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(SYNC_RETRY);
        }
    }

    /// Writes batches until none is left or the output is full.
    fn write_out(&self, w: &mut Writer) {
        let s = &*self.shared;
        loop {
            if w.done == w.taken.len() {
                let mut b = lock(&s.batch);
                if b.lines == 0 {
                    return;
                }
                // The batch's buffer and the writer's spare trade places.
                w.taken.clear();
                std::mem::swap(&mut b.bytes, &mut w.taken);
                w.taken_lines = std::mem::take(&mut b.lines);
                w.done = 0;
            }
            match w.out.write(&w.taken[w.done..]) {
                Ok(0) => self.lose(w, &std::io::Error::from(ErrorKind::WriteZero)),
                Ok(n) => {
                    w.done += n;
                    if w.done == w.taken.len() {
                        s.queued_lines.fetch_sub(w.taken_lines, Ordering::Relaxed);
                        s.queued_bytes.fetch_sub(w.taken.len(), Ordering::Relaxed);
                        w.failed = false;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => self.lose(w, &e),
            }
        }
    }

    /// The taken batch could not be written: its lines are counted lost.
    fn lose(&self, w: &mut Writer, e: &std::io::Error) {
        if !std::mem::replace(&mut w.failed, true) {
            tracing::warn!("access log write failed (further failures not logged): {e}");
        }
        let s = &*self.shared;
        s.queued_lines.fetch_sub(w.taken_lines, Ordering::Relaxed);
        s.queued_bytes.fetch_sub(w.taken.len(), Ordering::Relaxed);
        self.dropped.inc_by(w.taken_lines as u64);
        w.done = w.taken.len();
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Standard output as the access log's output, made not to block
/// ([`nonblocking`]).
pub fn nonblocking_stdout() -> std::io::Result<Box<dyn Write + Send>> {
    use std::os::fd::AsFd;
    nonblocking(std::io::stdout().as_fd())
}

/// `fd` as an output that never blocks: a regular file is written as it
/// is; a pipe or terminal through a non-blocking open file description of
/// its own (so `fd`'s own, shared with whoever started us, keeps its
/// flags); a socket with `MSG_DONTWAIT`.
fn nonblocking(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Box<dyn Write + Send>> {
    use rustix::fs::FileType;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let fd = fd.try_clone_to_owned()?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
    Ok(match kind {
        FileType::RegularFile => Box::new(std::fs::File::from(fd)),
        FileType::Socket => Box::new(SocketOut(fd)),
        _ => {
            let reopened = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            match reopened {
                Ok(f) => Box::new(f),
                Err(e) => {
                    tracing::warn!(
                        "the access log's output ({kind:?}) could not be made non-blocking \
                         ({e}): a stalled reader may stall requests"
                    );
                    Box::new(std::fs::File::from(fd))
                }
            }
        }
    })
}

/// A socket written without waiting.
struct SocketOut(std::os::fd::OwnedFd);

impl Write for SocketOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use rustix::net::SendFlags;
        Ok(rustix::net::send(
            &self.0,
            buf,
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        )?)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// An output that takes `room` more bytes and then says `WouldBlock`,
    /// like a pipe nobody reads.
    #[derive(Clone, Default)]
    struct Full {
        room: Arc<Mutex<usize>>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut room = self.room.lock().unwrap();
            let n = buf.len().min(*room);
            if n == 0 {
                return Err(ErrorKind::WouldBlock.into());
            }
            *room -= n;
            self.written.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn text(w: &Full) -> String {
        String::from_utf8(w.written.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_wait_for_an_idle_moment_then_go_out_whole() {
        let w = Full::default();
        *w.room.lock().unwrap() = usize::MAX;
        let log = AccessLog::new(Box::new(w.clone()), IntCounter::new("d", "d").unwrap());
        log.log_text("a");
        log.log_text("b");
        assert_eq!(
            text(&w),
            "",
            "nothing is written by a request below FLUSH_AT"
        );
        log.flush();
        assert_eq!(text(&w), "a\nb\n");
        // A request that fills the batch writes it.
        let line = "x".repeat(1000);
        for _ in 0..FLUSH_AT / 1001 + 1 {
            log.log_text(&line);
        }
        assert_eq!(text(&w).lines().count(), 2 + FLUSH_AT / 1001 + 1);
    }

    #[test]
    fn a_full_output_costs_lines_not_callers() {
        let w = Full::default();
        // Room for half a line: the rest waits, and is written first.
        *w.room.lock().unwrap() = 3;
        let dropped = IntCounter::new("d", "d").unwrap();
        let log = AccessLog::new(Box::new(w.clone()), dropped.clone());
        log.log_text("line 0");
        log.flush();
        assert_eq!(text(&w), "lin");
        let extra = 100;
        for i in 1..QUEUE + extra {
            log.log_text(&format!("line {i}"));
        }
        log.flush();
        assert_eq!(dropped.get(), extra as u64);
        // Waiting for a full output gives up instead of hanging.
        assert!(!log.sync());
        *w.room.lock().unwrap() = usize::MAX;
        assert!(log.sync());
        let all = text(&w);
        assert_eq!(all.lines().count(), QUEUE);
        assert_eq!(all.lines().next(), Some("line 0"));
        assert_eq!(
            all.lines().last(),
            Some(format!("line {}", QUEUE - 1).as_str())
        );
    }

    #[test]
    fn a_failed_write_counts_its_lines_lost_and_the_log_goes_on() {
        struct Broken(Full, bool);
        impl Write for Broken {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if std::mem::replace(&mut self.1, false) {
                    return Err(ErrorKind::BrokenPipe.into());
                }
                self.0.write(buf)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let w = Full::default();
        *w.room.lock().unwrap() = usize::MAX;
        let dropped = IntCounter::new("d", "d").unwrap();
        let log = AccessLog::new(Box::new(Broken(w.clone(), true)), dropped.clone());
        log.log_text("lost 1");
        log.log_text("lost 2");
        assert!(log.sync());
        assert_eq!(dropped.get(), 2);
        log.log_text("kept");
        assert!(log.sync());
        assert_eq!(text(&w), "kept\n");
    }

    /// A pipe nobody reads fills, and the output says so instead of
    /// blocking; the pipe's own descriptor keeps its flags.
    #[test]
    fn a_pipe_is_written_without_blocking_and_keeps_its_flags() {
        use rustix::fs::OFlags;
        let (rx, tx) = std::io::pipe().unwrap();
        let (done, filled) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut out = nonblocking(std::os::fd::AsFd::as_fd(&tx)).unwrap();
            let chunk = [b'x'; 4096];
            let mut total = 0;
            let full = loop {
                match out.write(&chunk) {
                    Ok(n) => total += n,
                    Err(e) => break e,
                }
                if total > 64 << 20 {
                    break ErrorKind::Other.into();
                }
            };
            let _ = done.send((full.kind(), total));
            tx
        });
        // A blocking write would wait here for a reader; closing ours
        // then ends it (EPIPE), and the test fails rather than hangs.
        let got = filled.recv_timeout(Duration::from_secs(10));
        drop(rx);
        let (kind, total) = got.expect("a write to a full pipe blocked");
        assert_eq!(kind, ErrorKind::WouldBlock);
        assert!(total > 0);
        let tx = writer.join().unwrap();
        let flags = rustix::fs::fcntl_getfl(&tx).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
    }
}
