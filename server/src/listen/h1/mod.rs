//! HTTP/1.1 connections answered by our own loop, so that a file body goes
//! out with `sendfile(2)` (`http::sendfile`) and a head with the body
//! behind it (`MSG_MORE`): through hyper every byte was copied from the
//! page cache into memory and again into the socket, and that copy was
//! most of what a request cost over nginx.
//!
//! Only the requests stock ostree and our client send are answered here:
//! HTTP/1.1 GET or HEAD of a repo path, with no body, `Expect` or
//! `Upgrade`, a head within the limits hyper has (its whole time from the
//! start of the wait, its size, its count of headers). They go through the
//! same router as every other request, so conditionals, ranges, errors,
//! metrics and the access log are the router's; a plain repo request
//! that can be answered at once is answered past the router's types
//! (`http::direct`), with the router's head and record. At the first request that
//! is anything else (or the HTTP/2 preface), the connection and what it
//! has read are handed to hyper for the rest of its life, so every other
//! corner of the protocol keeps hyper's answer.

mod head;
mod prefixed;
mod respond;

pub(super) use prefixed::Prefixed;

use super::idle::ConnIdle;
use super::watch::{Activity, HeaderReadTimeout, Watched};
use crate::http::direct::{self, Direct};
use crate::http::sendfile::CanSendFile;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::{Buf, Bytes, BytesMut};
use head::{next, Next, Plain};
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};
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
    pub app: super::App,
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
// A local of one loop turn, never stored: boxing the request would cost an
// allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    Read,
    Answer {
        asked: Asked,
        close: bool,
        len: usize,
    },
    Hyper,
}

/// A request in hand, and who answers it.
// As `Step`: a local of one loop turn.
#[allow(clippy::large_enum_variant)]
enum Asked {
    Router {
        req: Request<Body>,
        head: bool,
    },
    /// Answered already (`http::direct`): only its writing is left.
    Direct(Direct),
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
        let step = {
            let mut headers = [const { MaybeUninit::uninit() }; super::MAX_HEADERS];
            match next(&buf, &mut headers, super::MAX_HEAD_BYTES) {
                Next::More => Step::Read,
                Next::Hyper => Step::Hyper,
                Next::Plain(p) => {
                    let ask = direct::Ask {
                        head: p.head,
                        path: p.path,
                        headers: p.headers,
                        client: conn.peer.ip(),
                    };
                    let asked = match conn.app.direct(&ask) {
                        Some(d) => Some(Asked::Direct(d)),
                        None => request(&p, &buf, conn.peer)
                            .map(|req| Asked::Router { req, head: p.head }),
                    };
                    match asked {
                        Some(asked) => Step::Answer {
                            asked,
                            close: p.close,
                            len: p.len,
                        },
                        None => Step::Hyper,
                    }
                }
            }
        };
        let (asked, close_asked) = match step {
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
            Step::Answer { asked, close, len } => {
                buf.advance(len);
                deadline = None;
                (asked, close)
            }
        };
        conn.act.requested();
        answered = true;
        let close = match asked {
            Asked::Router { req, head } => {
                let resp = conn.app.answer(req).await;
                let stop = close_asked || *conn.shutdown.borrow();
                respond::respond(&mut io, &conn.act, resp, head, stop, &mut out).await?
            }
            Asked::Direct(d) => {
                let stop = close_asked || *conn.shutdown.borrow();
                respond::respond_direct(&mut io, &conn.act, &d, stop, &mut out).await?
            }
        };
        if close {
            io.shutdown().await.ok();
            return Ok(Ended::Closed);
        }
    }
}

/// The request the router gets; `None` if `http` refuses a part of it
/// (hyper's to answer). The head is copied once and its path and header
/// values are slices of that copy: one allocation, where a copy of each
/// was one apiece.
fn request(plain: &Plain<'_, '_>, buf: &[u8], peer: SocketAddr) -> Option<Request<Body>> {
    let raw = Bytes::copy_from_slice(&buf[..plain.len]);
    // `part` is one of the parser's slices of `buf`'s head.
    let slice = |part: &[u8]| {
        let at = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
        raw.slice(at..at + part.len())
    };
    let mut req = Request::new(Body::empty());
    *req.method_mut() = if plain.head {
        Method::HEAD
    } else {
        Method::GET
    };
    *req.uri_mut() = Uri::from_maybe_shared(slice(plain.path.as_bytes())).ok()?;
    *req.version_mut() = Version::HTTP_11;
    let map = req.headers_mut();
    map.reserve(plain.headers.len());
    for h in plain.headers {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        map.append(name, HeaderValue::from_maybe_shared(slice(h.value)).ok()?);
    }
    req.extensions_mut().insert(ConnectInfo(peer));
    req.extensions_mut().insert(CanSendFile);
    Some(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_its_head_sliced_not_retyped() {
        // A second request pipelined behind: only the first is taken.
        let raw = b"GET /objects/ab/cd.filez?x=1 HTTP/1.1\r\nHost: a:1\r\n\
            User-Agent: libostree/2022.7\r\nIf-None-Match: \"e\", W/\"f\"\r\n\
            X-Empty:\r\nAccept: */*\r\nAccept: text/plain\r\n\r\nGET /next HTTP/1.1\r\n";
        let mut headers = [const { MaybeUninit::uninit() }; crate::listen::MAX_HEADERS];
        let Next::Plain(plain) = next(raw, &mut headers, crate::listen::MAX_HEAD_BYTES) else {
            panic!("a plain GET");
        };
        let peer: SocketAddr = "10.0.0.1:5".parse().unwrap();
        let req = request(&plain, raw, peer).expect("a request");
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri(), "/objects/ab/cd.filez?x=1");
        assert_eq!(req.version(), Version::HTTP_11);
        let h = req.headers();
        let all = |name: &str| {
            h.get_all(name)
                .iter()
                .map(|v| v.as_bytes())
                .collect::<Vec<_>>()
        };
        #[rustfmt::skip]
        let want: [(&str, &[&[u8]]); 5] = [
            ("host", &[b"a:1"]),
            ("user-agent", &[b"libostree/2022.7"]),
            ("if-none-match", &[b"\"e\", W/\"f\""]),
            ("x-empty", &[b""]),
            ("accept", &[b"*/*", b"text/plain"]),
        ];
        for (name, values) in want {
            assert_eq!(all(name), values, "{name}");
        }
        assert_eq!(h.len(), 6);
        let conn = req.extensions().get::<ConnectInfo<SocketAddr>>();
        assert_eq!(conn.map(|c| c.0), Some(peer));
        assert!(req.extensions().get::<CanSendFile>().is_some());

        let mut headers = [const { MaybeUninit::uninit() }; crate::listen::MAX_HEADERS];
        let head = b"HEAD /summary HTTP/1.1\r\nHost: a\r\n\r\n";
        let Next::Plain(plain) = next(head, &mut headers, crate::listen::MAX_HEAD_BYTES) else {
            panic!("a plain HEAD");
        };
        let req = request(&plain, head, peer).expect("a request");
        assert_eq!(
            (req.method(), req.uri().path()),
            (&Method::HEAD, "/summary")
        );
    }
}
