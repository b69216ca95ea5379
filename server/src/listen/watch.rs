//! Whether a connection is still doing something: an I/O wrapper that
//! notes when response payload moves, and the watchdog that closes a
//! connection which sent nothing after it was accepted, or on which no
//! response moved for the idle timeout.
//!
//! A request arriving counts, and of what the server writes only response
//! payload: of HTTP/2, the payload of HEADERS, CONTINUATION and DATA
//! frames. A client can make the server read frames (SETTINGS, PINGs,
//! WINDOW_UPDATEs) and write control frames (their acks) at will, and a
//! connection kept alive that way by a client that stopped reading pinned
//! its streams' buffers and files for good. A client that keeps asking is
//! still served; what its unread streams can hold is bounded apart
//! (`served::streams`, the HTTP/2 send buffer).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Writes carrying less response payload than this do not count as
/// activity: a DATA frame of a byte or two is how a peer that drips its
/// flow-control window would otherwise look alive forever.
pub const MIN_ACTIVITY: usize = 18;

/// Why an HTTP/1.1 connection (`h1`) ended without an answer: the next
/// request's head did not arrive in time (what hyper's own header-read
/// timeout is on the connections it serves).
#[derive(Debug, thiserror::Error)]
#[error("no request head within {0:?}")]
pub struct HeaderReadTimeout(pub Duration);

/// Why the watchdog closed a connection (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Nothing received within the first-byte timeout.
    FirstByte,
    /// No response payload moved within the idle timeout.
    Idle,
    /// HTTP/2: the peer did not answer the keepalive PING in time.
    Keepalive,
    /// HTTP/1.1: a request head did not arrive whole in time (slowloris,
    /// or a keep-alive connection with no next request).
    HeaderRead,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Expiry::FirstByte => "first_byte",
            Expiry::Idle => "idle",
            Expiry::Keepalive => "keepalive",
            Expiry::HeaderRead => "header_read",
        }
    }

    pub const ALL: [Expiry; 4] = [
        Expiry::FirstByte,
        Expiry::Idle,
        Expiry::Keepalive,
        Expiry::HeaderRead,
    ];

    /// What hyper's own timers ended a connection for, if that is what
    /// `e` says (its keepalive on HTTP/2, its head read on HTTP/1.1).
    pub fn of_connection_error(
        e: &(dyn std::error::Error + Send + Sync + 'static),
        act: &Activity,
    ) -> Option<Expiry> {
        if e.is::<HeaderReadTimeout>() {
            return Some(Expiry::HeaderRead);
        }
        let timed_out = e.downcast_ref::<hyper::Error>()?.is_timeout();
        match (timed_out, act.http2.load(Ordering::Relaxed)) {
            (false, _) => None,
            (true, true) => Some(Expiry::Keepalive),
            (true, false) => Some(Expiry::HeaderRead),
        }
    }
}

/// What the wrapper saw, shared with the watchdog.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last write that counted.
    last_ms: AtomicU64,
    got_bytes: AtomicBool,
    /// The server answers in HTTP/2 frames.
    http2: AtomicBool,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            got_bytes: AtomicBool::new(false),
            http2: AtomicBool::new(false),
        })
    }

    /// `n` bytes read from the peer: it spoke, which is all reads say.
    fn got(&self, n: usize) {
        if n > 0 && !self.got_bytes.load(Ordering::Relaxed) {
            self.got_bytes.store(true, Ordering::Relaxed);
        }
    }

    /// A request arrived: its answer gets the whole idle timeout to start
    /// moving, however long the connection was quiet before (a wait for
    /// a streamed file's place, a cold disk). Refused streams never get
    /// here, and each request that does is answered with a head, which
    /// counts anyway.
    pub fn requested(&self) {
        self.moved(MIN_ACTIVITY);
    }

    /// A write that carried `payload` bytes of responses.
    pub fn moved(&self, payload: usize) {
        if payload >= MIN_ACTIVITY {
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

/// What the server writes on a connection, told apart by its first byte:
/// hyper's HTTP/1 answers begin `HTTP/`, its HTTP/2 connections with a
/// SETTINGS frame (whose length's high byte is 0).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Outbound {
    #[default]
    Unknown,
    /// Everything written is response.
    Http1,
    Http2(Frames),
}

/// Where a stream of HTTP/2 frames is: inside a 9-byte frame header, or
/// `left` bytes into a frame's payload.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Frames {
    header: [u8; 9],
    have: usize,
    left: usize,
    counts: bool,
}

impl Frames {
    /// Of `buf`, the next bytes written, how many are the payload of a
    /// HEADERS (1), CONTINUATION (9) or DATA (0) frame.
    fn payload(&mut self, mut buf: &[u8]) -> usize {
        let mut n = 0;
        while !buf.is_empty() {
            if self.left > 0 {
                let take = self.left.min(buf.len());
                if self.counts {
                    n += take;
                }
                self.left -= take;
                buf = &buf[take..];
                continue;
            }
            let take = (9 - self.have).min(buf.len());
            self.header[self.have..self.have + take].copy_from_slice(&buf[..take]);
            self.have += take;
            buf = &buf[take..];
            if self.have == 9 {
                let h = &self.header;
                self.left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                self.counts = matches!(h[3], 0 | 1 | 9);
                self.have = 0;
            }
        }
        n
    }
}

impl Outbound {
    /// Of `written`, how many bytes are response payload.
    fn payload(&mut self, written: &[u8]) -> usize {
        if *self == Outbound::Unknown {
            match written.first() {
                None => return 0,
                Some(b'H') => *self = Outbound::Http1,
                Some(_) => *self = Outbound::Http2(Frames::default()),
            }
        }
        match self {
            Outbound::Http2(f) => f.payload(written),
            _ => written.len(),
        }
    }
}

/// A stream that reports what moves through it to an [`Activity`].
#[derive(Debug)]
pub struct Watched<T> {
    inner: T,
    act: Arc<Activity>,
    outbound: Outbound,
}

impl<T> Watched<T> {
    pub fn new(inner: T, act: Arc<Activity>) -> Self {
        Self {
            inner,
            act,
            outbound: Outbound::Unknown,
        }
    }
}

impl<T> Watched<T> {
    /// The connection's own socket, for writes made around the wrapper
    /// (`h1`'s sendfile), which report their activity themselves.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn note_protocol(&self) {
        if matches!(self.outbound, Outbound::Http2(_)) && !self.act.http2.load(Ordering::Relaxed) {
            self.act.http2.store(true, Ordering::Relaxed);
        }
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
            self.act.got(buf.filled().len() - before);
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
            let me = &mut *self;
            let payload = me.outbound.payload(&buf[..n]);
            me.act.moved(payload);
            me.note_protocol();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = r {
            let me = &mut *self;
            let mut payload = 0;
            for b in bufs {
                let take = n.min(b.len());
                payload += me.outbound.payload(&b[..take]);
                n -= take;
                if n == 0 {
                    break;
                }
            }
            me.act.moved(payload);
            me.note_protocol();
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
        act.got(1);
        tokio::time::advance(Duration::from_secs(3)).await;
        act.moved(MIN_ACTIVITY);
        let e = watchdog(act, Duration::from_secs(2), Duration::from_secs(5)).await;
        assert_eq!((e, t0.elapsed()), (Expiry::Idle, Duration::from_secs(10)));
    }

    /// A process stalled past a deadline (the clock jumps, as it does for
    /// a stopped or starved process): an answer the connection writes
    /// within the grace counts, and only a second expiry closes it.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_missed_by_our_own_stall_gets_a_grace() {
        let idle = Duration::from_secs(4);
        // Woken at 9 s instead of 4 s: judged again after the grace, at
        // 10 s; an answer written at 9.5 s moves the deadline to 13.5 s.
        for (what, note_in_grace, want_ms) in [
            ("the peer asked during the stall", true, 13_500),
            ("the peer was silent", false, 10_000),
        ] {
            let act = Activity::new();
            act.got(1);
            act.moved(MIN_ACTIVITY);
            let t0 = Instant::now();
            let dog = tokio::spawn(watchdog(act.clone(), idle, idle));
            tokio::task::yield_now().await;
            // Stalled 5 s past the deadline: nothing ran meanwhile.
            tokio::time::advance(Duration::from_secs(9)).await;
            if note_in_grace {
                // What the connection answers once it runs again.
                tokio::time::advance(Duration::from_millis(500)).await;
                act.moved(MIN_ACTIVITY);
                tokio::time::advance(Duration::from_millis(500)).await;
            }
            let e = dog.await.expect("watchdog task");
            assert_eq!(e, Expiry::Idle, "{what}");
            assert_eq!(t0.elapsed().as_millis(), want_ms, "{what}");
        }
    }

    fn frame(kind: u8, payload: usize) -> Vec<u8> {
        let len = u32::try_from(payload).unwrap().to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 1];
        f.resize(9 + payload, 0xaa);
        f
    }

    #[test]
    fn only_response_payload_counts() {
        const DATA: u8 = 0;
        const HEADERS: u8 = 1;
        const SETTINGS: u8 = 4;
        const PING: u8 = 6;
        const WINDOW_UPDATE: u8 = 8;
        const CONTINUATION: u8 = 9;
        let settings = frame(SETTINGS, 18);
        let control: Vec<u8> =
            [frame(PING, 8), frame(SETTINGS, 0), frame(WINDOW_UPDATE, 4)].concat();
        let answer: Vec<u8> =
            [frame(HEADERS, 40), frame(CONTINUATION, 5), frame(DATA, 100)].concat();
        #[rustfmt::skip]
        let cases = [
            // (what, successive writes, payload each write carried)
            ("h1: every byte", vec![b"HTTP/1.1 200 OK\r\n".to_vec(), b"abc".to_vec()], vec![17, 3]),
            ("h2: server SETTINGS, then control frames", vec![settings.clone(), control.clone()], vec![0, 0]),
            ("h2: an answer", vec![settings.clone(), answer.clone()], vec![0, 145]),
            // Frames cut anywhere by short writes, the header included.
            ("h2: split inside a header", vec![settings.clone(), answer[..4].to_vec(), answer[4..60].to_vec(), answer[60..].to_vec()], vec![0, 0, 42, 103]),
            ("h2: control then one DATA byte", vec![settings.clone(), [control.clone(), frame(DATA, 1)].concat()], vec![0, 1]),
            ("nothing written", vec![vec![]], vec![0]),
        ];
        for (what, writes, want) in cases {
            let (writes, want): (Vec<Vec<u8>>, Vec<usize>) = (writes, want);
            let mut o = Outbound::default();
            let got: Vec<usize> = writes.iter().map(|w| o.payload(w)).collect();
            assert_eq!(got, want, "{what}");
        }
    }
}
