//! Whether a connection is still doing something: an I/O wrapper that
//! notes when payload moves, and the watchdog that closes a connection
//! which sent nothing after it was accepted, or on which nothing moved for
//! the idle timeout.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Reads and writes smaller than this do not count as activity: a lone
/// HTTP/2 PING or its ACK (17 bytes), a SETTINGS ACK or a WINDOW_UPDATE,
/// or a DATA frame of a byte or two, which is how a peer that stopped
/// reading (or drips) would otherwise look alive forever.
pub const MIN_ACTIVITY: usize = 18;

/// Why the watchdog closed a connection (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Nothing received within the first-byte timeout.
    FirstByte,
    /// No payload moved within the idle timeout.
    Idle,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Expiry::FirstByte => "first_byte",
            Expiry::Idle => "idle",
        }
    }
}

/// What the wrapper saw, shared with the watchdog.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last read or write that counted.
    last_ms: AtomicU64,
    got_bytes: AtomicBool,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            got_bytes: AtomicBool::new(false),
        })
    }

    fn note(&self, n: usize, read: bool) {
        if read && n > 0 {
            self.got_bytes.store(true, Ordering::Relaxed);
        }
        if n >= MIN_ACTIVITY {
            let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.last_ms.store(ms, Ordering::Relaxed);
        }
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// The deadline a connection must act by, or the reason it is over.
/// Pure: `now`, what was seen and the timeouts in, a verdict out.
fn verdict(
    now: Instant,
    start: Instant,
    got_bytes: bool,
    last: Instant,
    first_byte: Duration,
    idle: Duration,
) -> Result<Instant, Expiry> {
    let (deadline, expiry) = if got_bytes {
        (last + idle, Expiry::Idle)
    } else {
        (start + first_byte, Expiry::FirstByte)
    };
    if now >= deadline {
        Err(expiry)
    } else {
        Ok(deadline)
    }
}

/// How late a timer may fire before the watchdog suspects that the
/// process itself was stalled (a starved machine), not the peer.
pub const LATE: Duration = Duration::from_millis(250);
/// How long a connection then gets to read what its peer sent meanwhile.
pub const GRACE: Duration = Duration::from_secs(1);

/// Resolves when the connection has expired, with the reason. Each turn
/// sleeps until the next deadline, so the loop wakes at most once per
/// timeout of activity.
///
/// A timer that fires more than [`LATE`] after its deadline means this
/// process could not run for a while: the peer's bytes that arrived
/// meanwhile sit unread in the socket, and the runtime may wake this
/// timer before it notices them. The peer must not be blamed for our
/// stall: the connection gets [`GRACE`] to read them (which counts as
/// activity) before it is judged again, once.
pub async fn watchdog(act: Arc<Activity>, first_byte: Duration, idle: Duration) -> Expiry {
    let mut slept_until: Option<Instant> = None;
    loop {
        let got = act.got_bytes.load(Ordering::Relaxed);
        let now = Instant::now();
        match verdict(now, act.start, got, act.last(), first_byte, idle) {
            Ok(deadline) => {
                slept_until = Some(deadline);
                tokio::time::sleep_until(deadline).await
            }
            Err(e) => match slept_until.take() {
                Some(d) if now.saturating_duration_since(d) > LATE => {
                    tokio::time::sleep(GRACE).await
                }
                _ => return e,
            },
        }
    }
}

/// A stream that reports what moves through it to an [`Activity`].
#[derive(Debug)]
pub struct Watched<T> {
    inner: T,
    act: Arc<Activity>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, act: Arc<Activity>) -> Self {
        Self { inner, act }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.act.note(buf.filled().len() - before, true);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.act.note(n, false);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.act.note(n, false);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_table() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        #[rustfmt::skip]
        let cases = [
            // (now, got bytes, last activity), timeouts first byte 2 s, idle 5 s
            ("silent, in time", t0 + s(1), false, t0, Ok(t0 + s(2))),
            ("silent, too long", t0 + s(2), false, t0, Err(Expiry::FirstByte)),
            ("spoke, idle since 3 s", t0 + s(6), true, t0 + s(3), Ok(t0 + s(8))),
            ("spoke, idle 5 s", t0 + s(8), true, t0 + s(3), Err(Expiry::Idle)),
            // Bytes below the activity floor mark the first byte but not
            // activity: the idle clock runs from the start.
            ("only a drip", t0 + s(5), true, t0, Err(Expiry::Idle)),
        ];
        for (what, now, got, last, want) in cases {
            assert_eq!(verdict(now, t0, got, last, s(2), s(5)), want, "{what}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_fires_after_the_timeouts_and_activity_postpones_it() {
        let act = Activity::new();
        let t0 = Instant::now();
        let e = watchdog(act.clone(), Duration::from_secs(2), Duration::from_secs(5)).await;
        assert_eq!(
            (e, t0.elapsed()),
            (Expiry::FirstByte, Duration::from_secs(2))
        );

        let act = Activity::new();
        act.note(1, true);
        tokio::time::advance(Duration::from_secs(3)).await;
        act.note(MIN_ACTIVITY, false);
        let e = watchdog(act, Duration::from_secs(2), Duration::from_secs(5)).await;
        assert_eq!((e, t0.elapsed()), (Expiry::Idle, Duration::from_secs(10)));
    }

    /// A process stalled past a deadline (the clock jumps, as it does for
    /// a stopped or starved process): the connection's bytes that arrive
    /// within the grace count, and only a second expiry closes it.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_missed_by_our_own_stall_gets_a_grace() {
        let idle = Duration::from_secs(4);
        // Woken at 9 s instead of 4 s: judged again after the grace, at
        // 10 s; bytes read at 9.5 s move the deadline to 13.5 s.
        for (what, note_in_grace, want_ms) in [
            ("the peer spoke during the stall", true, 13_500),
            ("the peer was silent", false, 10_000),
        ] {
            let act = Activity::new();
            act.note(MIN_ACTIVITY, true);
            let t0 = Instant::now();
            let dog = tokio::spawn(watchdog(act.clone(), idle, idle));
            tokio::task::yield_now().await;
            // Stalled 5 s past the deadline: nothing ran meanwhile.
            tokio::time::advance(Duration::from_secs(9)).await;
            if note_in_grace {
                // What the connection reads once it runs again.
                tokio::time::advance(Duration::from_millis(500)).await;
                act.note(MIN_ACTIVITY, true);
                tokio::time::advance(Duration::from_millis(500)).await;
            }
            let e = dog.await.expect("watchdog task");
            assert_eq!(e, Expiry::Idle, "{what}");
            assert_eq!(t0.elapsed().as_millis(), want_ms, "{what}");
        }
    }
}
