//! Pure parts of the loop: which requests it answers, and the heads it
//! writes.

use crate::http::{header_line, log_date};
use http::header;
use http::StatusCode;
use std::mem::MaybeUninit;

/// What a `Connection` header may name and still be answered here: its
/// own options, and what an h2c upgrade (ignored) names.
const H2C_HOP_BY_HOP: [&[u8]; 3] = [b"keep-alive", b"upgrade", b"http2-settings"];

/// What to do with the bytes read so far.
#[derive(Debug)]
pub(super) enum Next<'h, 'b> {
    /// Nothing yet, or a head still arriving: read more.
    More,
    /// A plain request whose head is the first `len` bytes.
    Plain(Plain<'h, 'b>),
    /// Anything else: hyper's.
    Hyper,
}

/// A request answered here.
#[derive(Debug)]
pub(super) struct Plain<'h, 'b> {
    pub len: usize,
    pub head: bool,
    pub path: &'b str,
    /// The client asked to close after this answer.
    pub close: bool,
    pub headers: &'h [httparse::Header<'b>],
}

/// Classifies what has arrived: pure, so that each rule is a table row.
/// `headers` is where the parser puts them, left uninitialised: zeroing
/// room for 64 of them (2 KiB) at every turn of the loop cost more than
/// parsing the few a request has.
pub(super) fn next<'h, 'b>(
    buf: &'b [u8],
    headers: &'h mut [MaybeUninit<httparse::Header<'b>>],
    max_head: usize,
) -> Next<'h, 'b> {
    if buf.is_empty() {
        return Next::More;
    }
    let mut req = httparse::Request::new(&mut []);
    // A head too large, or one httparse refuses, is hyper's to answer (431
    // or 400).
    let len = match req.parse_with_uninit_headers(buf, headers) {
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
    // The routes (probes and scrapes) keep hyper's answers, and rarely
    // share a connection with pulls.
    if !path.starts_with('/') || crate::http::ROUTES.contains(&path) {
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
        headers: req.headers,
    })
}

/// A comma-separated header's tokens, empty ones left out.
pub(super) fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Writes a response head: the status line, the router's headers (a 304's
/// Content-Length aside), `Date`, and `Connection: close` when closing.
/// Pure but for the clock.
pub(super) fn write_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &http::HeaderMap,
    close: bool,
) {
    // The router gives a 304 the 200's length (RFC 9110 §8.6 allows it);
    // hyper and nginx leave it out, and so does this.
    let length_too = status != StatusCode::NOT_MODIFIED;
    let lines = |out: &mut Vec<u8>| {
        for (name, value) in headers {
            if name == header::CONTENT_LENGTH && !length_too {
                continue;
            }
            header_line(out, name, value.as_bytes());
        }
    };
    let date = !headers.contains_key(header::DATE);
    let close = close && !headers.contains_key(header::CONNECTION);
    write_head_with(out, status, lines, date, close);
}

/// A head whose header lines `lines` writes, then `Date` if `date`, and
/// `Connection: close` if `close`. Pure but for the clock.
pub(super) fn write_head_with(
    out: &mut Vec<u8>,
    status: StatusCode,
    lines: impl FnOnce(&mut Vec<u8>),
    date: bool,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    lines(out);
    if date {
        out.extend_from_slice(b"date: ");
        log_date::with_now(|d| out.extend_from_slice(d.as_bytes()));
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const MAX: usize = 16 * 1024;
    /// What libostree 2022.7 (curl) sends, captured.
    const OSTREE: &[u8] = b"GET /summary HTTP/1.1\r\nHost: 127.0.0.1:18091\r\n\
        User-Agent: libostree/2022.7\r\nAccept: */*\r\n\
        Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
        HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";

    /// What [`next`] made of a head, its headers counted.
    #[derive(Debug, PartialEq, Eq)]
    enum Shape<'b> {
        More,
        Hyper,
        Plain {
            len: usize,
            head: bool,
            path: &'b str,
            close: bool,
            headers: usize,
        },
    }

    fn classify(raw: &[u8]) -> Shape<'_> {
        let mut headers = [const { MaybeUninit::uninit() }; crate::listen::MAX_HEADERS];
        match next(raw, &mut headers, MAX) {
            Next::More => Shape::More,
            Next::Hyper => Shape::Hyper,
            Next::Plain(p) => Shape::Plain {
                len: p.len,
                head: p.head,
                path: p.path,
                close: p.close,
                headers: p.headers.len(),
            },
        }
    }

    fn plain(len: usize, head: bool, path: &str, close: bool, headers: usize) -> Shape<'_> {
        Shape::Plain {
            len,
            head,
            path,
            close,
            headers,
        }
    }

    // long-fn: a table of request heads, one row a case
    #[test]
    fn only_plain_requests_whose_head_is_whole_are_answered_here() {
        let get = b"GET /config HTTP/1.1\r\nHost: a\r\n\r\n";
        let long = format!(
            "GET /config HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
            "y".repeat(MAX)
        );
        let pipelined = [&get[..], &get[..]].concat();
        let cases: Vec<(&str, &[u8], Shape<'_>)> = vec![
            ("nothing yet", b"", Shape::More),
            ("a GET", get, plain(get.len(), false, "/config", false, 1)),
            (
                "a HEAD",
                b"HEAD /summary HTTP/1.1\r\nHost: a\r\n\r\n",
                plain(35, true, "/summary", false, 1),
            ),
            (
                "two pipelined: the first",
                &pipelined,
                plain(get.len(), false, "/config", false, 1),
            ),
            (
                "Connection: close",
                b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n",
                plain(38, false, "/c", true, 1),
            ),
            (
                "close among tokens",
                b"GET /c HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n",
                plain(50, false, "/c", true, 1),
            ),
            (
                "Content-Length: 0",
                b"GET /c HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                plain(38, false, "/c", false, 1),
            ),
            (
                "a head still arriving",
                b"GET /config HTTP/1.1\r\nHost: a\r\n",
                Shape::More,
            ),
            (
                "still arriving past the limit",
                &long.as_bytes()[..MAX + 1],
                Shape::Hyper,
            ),
            ("HTTP/1.0", b"GET /config HTTP/1.0\r\n\r\n", Shape::Hyper),
            (
                "POST",
                b"POST /config HTTP/1.1\r\nHost: a\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "OPTIONS *",
                b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "absolute form",
                b"GET http://a/config HTTP/1.1\r\nHost: a\r\n\r\n",
                Shape::Hyper,
            ),
            ("a probe", b"GET /healthz HTTP/1.1\r\n\r\n", Shape::Hyper),
            ("metrics", b"GET /metrics HTTP/1.1\r\n\r\n", Shape::Hyper),
            (
                "a body",
                b"GET /c HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                Shape::Hyper,
            ),
            (
                "chunked",
                b"GET /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "Expect",
                b"GET /c HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "libostree's h2c upgrade, ignored",
                OSTREE,
                plain(OSTREE.len(), false, "/summary", false, 6),
            ),
            (
                "Upgrade: websocket",
                b"GET /c HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "a hop-by-hop header named",
                b"GET /c HTTP/1.1\r\nConnection: x-foo\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "the HTTP/2 preface",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                Shape::Hyper,
            ),
            (
                "TLS",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                Shape::Hyper,
            ),
            (
                "a space in a name",
                b"GET /c HTTP/1.1\r\nBad Name: x\r\n\r\n",
                Shape::Hyper,
            ),
            ("longer than the limit", long.as_bytes(), Shape::Hyper),
        ];
        for (what, raw, want) in cases {
            assert_eq!(classify(raw), want, "{what}");
        }
        let many: String = (0..crate::listen::MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect();
        let many = format!("GET /c HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            classify(many.as_bytes()),
            Shape::Hyper,
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
            assert!(text.contains("\r\netag: \"x\"\r\n"), "{text}");
            let length = status != StatusCode::NOT_MODIFIED;
            assert_eq!(text.contains("\r\ncontent-length: 5\r\n"), length, "{text}");
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
