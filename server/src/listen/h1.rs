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
//! metrics and the access log are the router's. At the first request that
//! is anything else (or the HTTP/2 preface), the connection and what it
//! has read are handed to hyper for the rest of its life, so every other
//! corner of the protocol keeps hyper's answer.

use super::watch::{Activity, Watched};
use crate::http::log_date;
use crate::http::sendfile::{CanSendFile, SendFile};
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower::ServiceExt;

/// Paths not answered here: probes and scrapes keep hyper's answers (and
/// rarely share a connection with pulls).
const NOT_HERE: [&str; 3] = ["/healthz", "/readyz", "/metrics"];
/// What a `Connection` header may name and still be answered here: its
/// own options, and what an h2c upgrade (ignored) names.
const H2C_HOP_BY_HOP: [&[u8]; 3] = [b"keep-alive", b"upgrade", b"http2-settings"];
/// What one read asks for (a few request heads).
const READ: usize = 4096;
/// Body bytes written behind the head in one write; a larger first frame
/// goes in the same vectored write instead of being copied.
const INLINE_BODY: usize = 16 * 1024;

/// Why the connection ended without an answer: the next request's head
/// did not arrive in time (what hyper's own header-read timeout is).
#[derive(Debug, thiserror::Error)]
#[error("no request head within {0:?}")]
pub struct HeaderReadTimeout(pub Duration);

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a connection is served with.
pub(super) struct Conn {
    pub router: Router,
    pub peer: SocketAddr,
    pub act: Arc<Activity>,
    /// Bounds the wait for each request's head, as hyper's does.
    pub header_read_timeout: Duration,
    pub max_head: usize,
    /// Signalled once: finish the request in hand, then close.
    pub shutdown: watch::Receiver<bool>,
}

/// What to do with the bytes read so far.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next<'b> {
    /// Nothing yet, or a head still arriving: read more.
    More,
    /// A plain request whose head is the first `len` bytes.
    Plain(Plain<'b>),
    /// Anything else: hyper's.
    Hyper,
}

/// A request answered here.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plain<'b> {
    pub len: usize,
    pub head: bool,
    pub path: &'b str,
    /// The client asked to close after this answer.
    pub close: bool,
}

/// Classifies what has arrived: pure, so that each rule is a table row.
pub(super) fn next<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
    max_head: usize,
) -> Next<'b> {
    if buf.is_empty() {
        return Next::More;
    }
    let mut req = httparse::Request::new(headers);
    // A head too large, or one httparse refuses, is hyper's to answer (431
    // or 400).
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= max_head => len,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Next::More,
        _ => return Next::Hyper,
    };
    let (Some(method), Some(path), Some(1)) = (req.method, req.path, req.version) else {
        return Next::Hyper;
    };
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Next::Hyper,
    };
    if !path.starts_with('/') || NOT_HERE.contains(&path) {
        return Next::Hyper;
    }
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            if h.value != b"0" {
                return Next::Hyper;
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
        {
            return Next::Hyper;
        } else if name.eq_ignore_ascii_case("upgrade") {
            // libostree's curl asks for h2c on every request; hyper, like
            // nginx, answers in HTTP/1.1 (RFC 9110 §7.8 lets a server
            // ignore an upgrade), and so does this. Any other is hyper's.
            if !tokens(h.value).all(|t| t.eq_ignore_ascii_case(b"h2c")) {
                return Next::Hyper;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in tokens(h.value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !H2C_HOP_BY_HOP.iter().any(|t| token.eq_ignore_ascii_case(t)) {
                    // Other headers named hop-by-hop: hyper knows them.
                    return Next::Hyper;
                }
            }
        }
    }
    Next::Plain(Plain {
        len,
        head,
        path,
        close,
    })
}

/// A comma-separated header's tokens, empty ones left out.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// The request the router gets; `None` if `http` refuses a part of it
/// (hyper's to answer).
fn request(
    plain: &Plain<'_>,
    headers: &[httparse::Header<'_>],
    peer: SocketAddr,
) -> Option<Request<Body>> {
    let mut req = Request::new(Body::empty());
    *req.method_mut() = if plain.head {
        Method::HEAD
    } else {
        Method::GET
    };
    *req.uri_mut() = Uri::try_from(plain.path).ok()?;
    *req.version_mut() = Version::HTTP_11;
    let map = req.headers_mut();
    for h in headers.iter().take_while(|h| !h.name.is_empty()) {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        map.append(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    req.extensions_mut().insert(ConnectInfo(peer));
    req.extensions_mut().insert(CanSendFile);
    Some(req)
}

/// Writes a response head: the status line, the router's headers, `Date`,
/// and `Connection: close` when closing. Pure but for the clock.
pub(super) fn write_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &http::HeaderMap,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        log_date::with_now(|d| out.extend_from_slice(d.as_bytes()));
        out.extend_from_slice(b"\r\n");
    }
    if close && !headers.contains_key(header::CONNECTION) {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// How a connection served here ended.
pub(super) enum Ended {
    /// Closed (by either side), or a request it could not answer.
    Closed,
    /// Hyper's from here: the socket and what was read of it.
    Hyper(Prefixed<Watched<TcpStream>>),
}

/// What the bytes in hand call for.
// A local of one loop turn, never stored: boxing the request would cost an
// allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    Read,
    Answer {
        req: Request<Body>,
        head: bool,
        close: bool,
        len: usize,
    },
    Hyper,
}

/// Answers plain requests until the connection closes, shutdown is asked,
/// or a request is not plain.
pub(super) async fn serve(mut io: Watched<TcpStream>, mut conn: Conn) -> Result<Ended, BoxError> {
    let mut buf = BytesMut::with_capacity(READ);
    let mut out = Vec::with_capacity(1024);
    // When the head being waited for must have arrived by: set when the
    // wait starts (after the last answer), as hyper's header-read timer is,
    // so it bounds a keep-alive wait and a head sent a byte at a time alike.
    let mut deadline = None;
    loop {
        let step = {
            let mut headers = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
            match next(&buf, &mut headers, conn.max_head) {
                Next::More => Step::Read,
                Next::Hyper => Step::Hyper,
                Next::Plain(p) => match request(&p, &headers, conn.peer) {
                    Some(req) => Step::Answer {
                        req,
                        head: p.head,
                        close: p.close,
                        len: p.len,
                    },
                    None => Step::Hyper,
                },
            }
        };
        let (req, head, close_asked) = match step {
            Step::Hyper => return Ok(Ended::Hyper(Prefixed::new(buf.freeze(), io))),
            Step::Read => {
                let by = *deadline
                    .get_or_insert_with(|| tokio::time::Instant::now() + conn.header_read_timeout);
                if buf.capacity() - buf.len() < READ / 4 {
                    buf.reserve(READ);
                }
                let read = tokio::select! {
                    r = tokio::time::timeout_at(by, io.read_buf(&mut buf)) => r,
                    // Between requests only: a head half read is finished.
                    _ = conn.shutdown.wait_for(|stop| *stop), if buf.is_empty() => {
                        return Ok(Ended::Closed)
                    }
                };
                match read {
                    Err(_) => return Err(Box::new(HeaderReadTimeout(conn.header_read_timeout))),
                    Ok(Ok(0)) => return Ok(Ended::Closed),
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => return Err(Box::new(e)),
                }
            }
            Step::Answer {
                req,
                head,
                close,
                len,
            } => {
                buf.advance(len);
                deadline = None;
                (req, head, close)
            }
        };
        conn.act.requested();
        let resp = conn
            .router
            .clone()
            .oneshot(req)
            .await
            .unwrap_or_else(|e| match e {});
        let stop = close_asked || *conn.shutdown.borrow();
        if respond(&mut io, &conn.act, resp, head, stop, &mut out).await? {
            io.shutdown().await.ok();
            return Ok(Ended::Closed);
        }
    }
}

/// Writes one response; true if the connection is to close after it.
async fn respond(
    io: &mut Watched<TcpStream>,
    act: &Activity,
    resp: Response<Body>,
    head: bool,
    stop: bool,
    out: &mut Vec<u8>,
) -> io::Result<bool> {
    let (mut parts, body) = resp.into_parts();
    let close = stop
        || parts
            .headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|v| tokens(v.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close")));
    let bodiless = head
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    out.clear();
    if let Some(send) = parts.extensions.remove::<SendFile>().filter(|_| !bodiless) {
        write_head(out, parts.status, &parts.headers, close);
        send_file(io, act, out, &send).await?;
        // The body (empty) records what was sent when dropped.
        drop(body);
        return Ok(close);
    }
    if bodiless {
        write_head(out, parts.status, &parts.headers, close);
        io.write_all(out).await?;
        drop(body);
        return Ok(close);
    }
    // The router's repo answers all carry a length; anything else is read
    // whole first to get one.
    let (first, rest) = if parts.headers.contains_key(header::CONTENT_LENGTH) {
        (Bytes::new(), Some(body))
    } else {
        let whole = body.collect().await.map_err(io::Error::other)?.to_bytes();
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
        (whole, None)
    };
    write_head(out, parts.status, &parts.headers, close);
    let Some(mut body) = rest else {
        write_with_head(io, out, first).await?;
        return Ok(close);
    };
    let mut head_sent = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if head_sent {
            io.write_all(&data).await?;
        } else {
            write_with_head(io, out, data).await?;
            head_sent = true;
        }
    }
    if !head_sent {
        io.write_all(out).await?;
    }
    Ok(close)
}

/// The head and the first of the body in one write: copied behind the
/// head when small, else side by side.
async fn write_with_head(
    io: &mut Watched<TcpStream>,
    out: &mut Vec<u8>,
    data: Bytes,
) -> io::Result<()> {
    if data.len() <= INLINE_BODY {
        out.extend_from_slice(&data);
        return io.write_all(out).await;
    }
    let mut both = Buf::chain(&out[..], data);
    io.write_all_buf(&mut both).await
}

/// The head, held back (`MSG_MORE`) so that it leaves with the file's
/// first bytes, then the file's range from the page cache.
async fn send_file(
    io: &mut Watched<TcpStream>,
    act: &Activity,
    out: &[u8],
    send: &SendFile,
) -> io::Result<()> {
    let sock = io.get_ref();
    let mut done = 0;
    while done < out.len() {
        let n = sock
            .async_io(Interest::WRITABLE, || {
                rustix::net::send(sock.as_fd(), &out[done..], rustix::net::SendFlags::MORE)
                    .map_err(io::Error::from)
            })
            .await?;
        done += n;
    }
    act.moved(out.len());
    let (start, count) = send.range();
    let (mut offset, end) = (start, start + count);
    while offset < end {
        let want = usize::try_from(end - offset).unwrap_or(usize::MAX);
        let n = sock
            .async_io(Interest::WRITABLE, || {
                let mut at = offset;
                rustix::fs::sendfile(sock.as_fd(), send.file().as_fd(), Some(&mut at), want)
                    .map_err(io::Error::from)
            })
            .await?;
        if n == 0 {
            // The file is shorter than it was: the length promised cannot
            // be kept, so the connection ends (the client sees it short).
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank",
            ));
        }
        offset += n as u64;
        send.note_sent(n as u64);
        act.moved(n);
    }
    Ok(())
}

/// A connection handed over with what was already read of it.
pub(super) struct Prefixed<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Prefixed<T> {
    pub fn new(prefix: Bytes, inner: T) -> Self {
        Self { prefix, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 16 * 1024;
    /// What libostree 2022.7 (curl) sends, captured.
    const OSTREE: &[u8] = b"GET /summary HTTP/1.1\r\nHost: 127.0.0.1:18091\r\n\
        User-Agent: libostree/2022.7\r\nAccept: */*\r\n\
        Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
        HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";

    fn classify(raw: &[u8]) -> Next<'_> {
        let mut headers = [httparse::EMPTY_HEADER; super::super::MAX_HEADERS];
        next(raw, &mut headers, MAX)
    }

    fn plain(len: usize, head: bool, path: &str, close: bool) -> Next<'_> {
        Next::Plain(Plain {
            len,
            head,
            path,
            close,
        })
    }

    #[test]
    fn only_plain_requests_whose_head_is_whole_are_answered_here() {
        let get = b"GET /config HTTP/1.1\r\nHost: a\r\n\r\n";
        let long = format!(
            "GET /config HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
            "y".repeat(MAX)
        );
        let pipelined = [&get[..], &get[..]].concat();
        let cases: Vec<(&str, &[u8], Next<'_>)> = vec![
            ("nothing yet", b"", Next::More),
            ("a GET", get, plain(get.len(), false, "/config", false)),
            (
                "a HEAD",
                b"HEAD /summary HTTP/1.1\r\nHost: a\r\n\r\n",
                plain(35, true, "/summary", false),
            ),
            (
                "two pipelined: the first",
                &pipelined,
                plain(get.len(), false, "/config", false),
            ),
            (
                "Connection: close",
                b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n",
                plain(38, false, "/c", true),
            ),
            (
                "close among tokens",
                b"GET /c HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n",
                plain(50, false, "/c", true),
            ),
            (
                "Content-Length: 0",
                b"GET /c HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                plain(38, false, "/c", false),
            ),
            (
                "a head still arriving",
                b"GET /config HTTP/1.1\r\nHost: a\r\n",
                Next::More,
            ),
            (
                "still arriving past the limit",
                &long.as_bytes()[..MAX + 1],
                Next::Hyper,
            ),
            ("HTTP/1.0", b"GET /config HTTP/1.0\r\n\r\n", Next::Hyper),
            (
                "POST",
                b"POST /config HTTP/1.1\r\nHost: a\r\n\r\n",
                Next::Hyper,
            ),
            (
                "OPTIONS *",
                b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
                Next::Hyper,
            ),
            (
                "absolute form",
                b"GET http://a/config HTTP/1.1\r\nHost: a\r\n\r\n",
                Next::Hyper,
            ),
            ("a probe", b"GET /healthz HTTP/1.1\r\n\r\n", Next::Hyper),
            ("metrics", b"GET /metrics HTTP/1.1\r\n\r\n", Next::Hyper),
            (
                "a body",
                b"GET /c HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                Next::Hyper,
            ),
            (
                "chunked",
                b"GET /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                Next::Hyper,
            ),
            (
                "Expect",
                b"GET /c HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
                Next::Hyper,
            ),
            (
                "libostree's h2c upgrade, ignored",
                OSTREE,
                plain(OSTREE.len(), false, "/summary", false),
            ),
            (
                "Upgrade: websocket",
                b"GET /c HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                Next::Hyper,
            ),
            (
                "a hop-by-hop header named",
                b"GET /c HTTP/1.1\r\nConnection: x-foo\r\n\r\n",
                Next::Hyper,
            ),
            (
                "the HTTP/2 preface",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                Next::Hyper,
            ),
            (
                "TLS",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                Next::Hyper,
            ),
            (
                "a space in a name",
                b"GET /c HTTP/1.1\r\nBad Name: x\r\n\r\n",
                Next::Hyper,
            ),
            ("longer than the limit", long.as_bytes(), Next::Hyper),
        ];
        for (what, raw, want) in cases {
            assert_eq!(classify(raw), want, "{what}");
        }
        let many: String = (0..super::super::MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect();
        let many = format!("GET /c HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            classify(many.as_bytes()),
            Next::Hyper,
            "more headers than the limit"
        );
    }

    #[test]
    fn a_head_carries_the_routers_headers_a_date_and_close_when_closing() {
        let mut h = http::HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert(header::ETAG, HeaderValue::from_static("\"x\""));
        let cases = [
            (StatusCode::OK, false, "HTTP/1.1 200 OK\r\n", false),
            (
                StatusCode::NOT_MODIFIED,
                true,
                "HTTP/1.1 304 Not Modified\r\n",
                true,
            ),
            (
                StatusCode::NOT_FOUND,
                false,
                "HTTP/1.1 404 Not Found\r\n",
                false,
            ),
        ];
        for (status, close, line, closes) in cases {
            let mut out = Vec::new();
            write_head(&mut out, status, &h, close);
            let text = String::from_utf8(out).unwrap();
            assert!(text.starts_with(line), "{text}");
            assert!(
                text.contains("\r\ncontent-length: 5\r\n") && text.contains("\r\netag: \"x\"\r\n"),
                "{text}"
            );
            assert!(
                text.contains("\r\ndate: ") && text.ends_with("\r\n\r\n"),
                "{text}"
            );
            assert_eq!(text.contains("connection: close"), closes, "{text}");
            let mut parsed = [httparse::EMPTY_HEADER; 8];
            let mut r = httparse::Response::new(&mut parsed);
            assert!(r.parse(text.as_bytes()).unwrap().is_complete(), "{text}");
            assert_eq!(r.code, Some(status.as_u16()));
        }
    }
}
