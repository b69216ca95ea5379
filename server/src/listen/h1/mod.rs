//! HTTP/1.1 connections answered by our own loop, so that a file body goes
//! out with `sendfile(2)` and a head with the body behind it (`MSG_MORE`):
//! through hyper every byte was copied from the page cache into memory
//! and again into the socket, and that copy was most of what a request
//! cost over nginx (0.66x its requests per CPU-second, 1.0x with this).
//!
//! Why it exists: hyper writes every body from memory (`http_body::Body`
//! yields `Buf` frames), so neither it nor axum can hand a file to
//! `sendfile(2)`; hyperium/hyper#3026 ("non-`Buf` body chunks") is the
//! open request for bodies that are not bytes (hyperium/hyper#140, the
//! sendfile request, was closed for it, and tower-http#381 waits on it).
//! Once hyper can write such a body, an `Answer`'s file goes to hyper as
//! one, and this loop can go, leaving hyper every connection.
//!
//! Only the requests stock ostree and our client send are answered here:
//! HTTP/1.1 GET or HEAD of a repo path, with no body, `Expect` or
//! `Upgrade`, a head within the limits hyper has (its whole time from the
//! start of the wait, its size, its count of headers). Their answer is
//! `http::answer`'s, the one hyper and the router give too; this loop only
//! writes it. At the first request that is anything else (a route, or the
//! HTTP/2 preface), the connection and what it has read are handed to
//! hyper for the rest of its life, so every other corner of the protocol
//! keeps hyper's answer.

mod head;
mod prefixed;
mod respond;

pub(super) use prefixed::Prefixed;

use super::idle::ConnIdle;
use super::watch::{Activity, HeaderReadTimeout, Watched};
use crate::http::answer::{self, Answer, Ask};
use crate::http::AppState;
use bytes::{Buf, BytesMut};
use head::{next, Next};
use http::{Method, Version};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// What one read asks for (a few request heads).
const READ: usize = 4096;

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a connection is served with.
pub(super) struct Conn {
    pub state: AppState,
    pub peer: SocketAddr,
    pub act: Arc<Activity>,
    /// Idle between requests: closed to make room when the cap is full.
    pub idle: Arc<ConnIdle>,
    /// Bounds the wait for each request's head, as hyper's does.
    pub header_read_timeout: Duration,
    /// Signalled once: finish the request in hand, then close.
    pub shutdown: watch::Receiver<bool>,
}

/// How a connection served here ended.
pub(super) enum Ended {
    /// Closed (by either side), or a request it could not answer.
    Closed,
    /// Hyper's from here: the socket and what was read of it, and whether
    /// requests were answered on it before (then the HTTP/2 preface is no
    /// longer a way to switch protocols, only a bad request).
    Hyper {
        io: Prefixed<Watched<TcpStream>>,
        answered: bool,
    },
}

/// What the bytes in hand call for.
// A local of one loop turn, never stored: boxing the answer would cost an
// allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    Read,
    Answer {
        answer: Answer,
        close: bool,
        len: usize,
    },
    Hyper,
}

/// What the bytes in hand call for, a request among them answered.
async fn step(conn: &Conn, buf: &[u8]) -> Step {
    let mut headers = [const { MaybeUninit::uninit() }; super::MAX_HEADERS];
    let p = match next(buf, &mut headers, super::MAX_HEAD_BYTES) {
        Next::More => return Step::Read,
        Next::Hyper => return Step::Hyper,
        Next::Plain(p) => p,
    };
    conn.act.requested();
    let method = if p.head { Method::HEAD } else { Method::GET };
    let ask = Ask {
        method: &method,
        path: p.path,
        version: Version::HTTP_11,
        headers: &head::Parsed(p.headers),
        client: Some(conn.peer.ip()),
        sendfile: true,
    };
    Step::Answer {
        answer: answer::answer(&conn.state, &ask).await,
        close: p.close,
        len: p.len,
    }
}

// long-fn: the connection's one loop (read, parse, answer, deadlines), whose order is the protocol
/// Answers plain requests until the connection closes, shutdown is asked,
/// or a request is not plain.
pub(super) async fn serve(mut io: Watched<TcpStream>, conn: Conn) -> Result<Ended, BoxError> {
    let mut buf = BytesMut::with_capacity(READ);
    let mut out = Vec::with_capacity(1024);
    // When the head being waited for must have arrived by: set when the
    // wait starts (after the last answer), as hyper's header-read timer is,
    // so it bounds a keep-alive wait and a head sent a byte at a time alike.
    let mut deadline = None;
    // One timer and one wait for shutdown for the connection's life, not
    // one of each per read: moving a registered timer's deadline later
    // takes no lock, where registering one takes the timer wheel's and,
    // when it is the earliest, wakes the driver through its eventfd.
    let mut head_timer = std::pin::pin!(tokio::time::sleep(conn.header_read_timeout));
    let mut stopping = std::pin::pin!({
        let mut rx = conn.shutdown.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    });
    let mut answered = false;
    // Between requests, with nothing of the next read: closed if the cap
    // needs its place (`ConnIdle`), as nginx closes keep-alive ones.
    let mut evicted = std::pin::pin!(conn.idle.evicted());
    let mut idle = false;
    loop {
        let step = step(&conn, &buf).await;
        let (mut answer, close_asked) = match step {
            Step::Hyper => {
                let io = Prefixed::new(buf.freeze(), io);
                return Ok(Ended::Hyper { io, answered });
            }
            Step::Read => {
                if deadline.is_none() {
                    let by = tokio::time::Instant::now() + conn.header_read_timeout;
                    head_timer.as_mut().reset(by);
                    deadline = Some(by);
                }
                if buf.capacity() - buf.len() < READ / 4 {
                    buf.reserve(READ);
                }
                if buf.is_empty() && !idle {
                    conn.idle.idle();
                    idle = true;
                }
                // What arrived is read before the timer is looked at.
                let read = tokio::select! {
                    biased;
                    r = io.read_buf(&mut buf) => r,
                    () = &mut head_timer => {
                        return Err(Box::new(HeaderReadTimeout(conn.header_read_timeout)))
                    }
                    // Between requests only: a head half read is finished.
                    () = &mut stopping, if buf.is_empty() => return Ok(Ended::Closed),
                    () = &mut evicted, if buf.is_empty() => return Ok(Ended::Closed),
                };
                match read {
                    Ok(0) => return Ok(Ended::Closed),
                    Ok(_) => {
                        // Its place given away as the request came: it
                        // closes, as a keep-alive connection nginx closed
                        // would (the client asks again on a new one).
                        if std::mem::take(&mut idle) && !conn.idle.busy() {
                            return Ok(Ended::Closed);
                        }
                        continue;
                    }
                    Err(e) => return Err(Box::new(e)),
                }
            }
            Step::Answer { answer, close, len } => {
                buf.advance(len);
                deadline = None;
                (answer, close)
            }
        };
        answered = true;
        let close = close_asked || *conn.shutdown.borrow();
        respond::respond(&mut io, &conn.act, &mut answer, close, &mut out).await?;
        // Recorded with what was sent.
        drop(answer);
        if close {
            io.shutdown().await.ok();
            return Ok(Ended::Closed);
        }
    }
}
