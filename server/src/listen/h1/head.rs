//! Pure parts of the loop: which requests it answers, and their headers
//! as `conditional` reads them.

use crate::http::answer::Fields;
use http::HeaderName;
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
    /// The target's path, without its query.
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
    // A target `http::Uri` might refuse is hyper's to answer (400): only
    // RFC 3986's characters are taken, and only the origin form.
    let uri = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b);
    if !path.starts_with('/') || !path.bytes().all(uri) {
        return Next::Hyper;
    }
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    // The routes (probes, scrapes, staging slots) are the router's, and
    // rarely share a connection with pulls.
    if crate::http::routed(path) {
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

/// A parsed head's headers, as `conditional` reads them.
#[derive(Debug)]
pub(super) struct Parsed<'h, 'b>(pub &'h [httparse::Header<'b>]);

impl Fields for Parsed<'_, '_> {
    fn nth(&self, name: &HeaderName, n: usize) -> Option<&[u8]> {
        let name = name.as_str();
        let mut named = self.0.iter().filter(|h| h.name.eq_ignore_ascii_case(name));
        named.nth(n).map(|h| h.value)
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

    /// What [`next`] made of a head, its headers counted.
    #[derive(Debug, PartialEq, Eq, Clone, Copy)]
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
        let h = Shape::Hyper;
        #[rustfmt::skip]
        let cases: Vec<(&str, &[u8], Shape<'_>)> = vec![
            ("nothing yet", b"", Shape::More),
            ("a GET", get, plain(get.len(), false, "/config", false, 1)),
            ("a HEAD", b"HEAD /summary HTTP/1.1\r\nHost: a\r\n\r\n", plain(35, true, "/summary", false, 1)),
            ("two pipelined: the first", &pipelined, plain(get.len(), false, "/config", false, 1)),
            ("Connection: close", b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n", plain(38, false, "/c", true, 1)),
            ("close among tokens", b"GET /c HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n", plain(50, false, "/c", true, 1)),
            ("Content-Length: 0", b"GET /c HTTP/1.1\r\nContent-Length: 0\r\n\r\n", plain(38, false, "/c", false, 1)),
            ("a head still arriving", b"GET /config HTTP/1.1\r\nHost: a\r\n", Shape::More),
            ("still arriving past the limit", &long.as_bytes()[..MAX + 1], h),
            ("HTTP/1.0", b"GET /config HTTP/1.0\r\n\r\n", h),
            ("POST", b"POST /config HTTP/1.1\r\nHost: a\r\n\r\n", h),
            ("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", h),
            ("absolute form", b"GET http://a/config HTTP/1.1\r\nHost: a\r\n\r\n", h),
            ("a query, left out of the path", b"GET /config?x=1 HTTP/1.1\r\n\r\n", plain(28, false, "/config", false, 0)),
            ("a character Uri may refuse", b"GET /refs/heads/a|b HTTP/1.1\r\n\r\n", h),
            ("a probe", b"GET /healthz HTTP/1.1\r\n\r\n", h),
            ("a probe with a query", b"GET /readyz?v HTTP/1.1\r\n\r\n", h),
            ("the staging slots", b"GET /oscontent/v1/stage/slots HTTP/1.1\r\n\r\n", h),
            ("metrics", b"GET /metrics HTTP/1.1\r\n\r\n", h),
            ("a body", b"GET /c HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", h),
            ("chunked", b"GET /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", h),
            ("Expect", b"GET /c HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", h),
            ("libostree's h2c upgrade, ignored", OSTREE, plain(OSTREE.len(), false, "/summary", false, 6)),
            ("Upgrade: websocket", b"GET /c HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", h),
            ("a hop-by-hop header named", b"GET /c HTTP/1.1\r\nConnection: x-foo\r\n\r\n", h),
            ("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", h),
            ("TLS", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", h),
            ("a space in a name", b"GET /c HTTP/1.1\r\nBad Name: x\r\n\r\n", h),
            ("longer than the limit", long.as_bytes(), h),
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
    fn parsed_headers_are_found_by_any_case_in_order() {
        let raw = b"GET / HTTP/1.1\r\nRange: a\r\nHOST: h\r\nrange: b\r\n\r\n";
        let mut headers = [const { MaybeUninit::uninit() }; crate::listen::MAX_HEADERS];
        let Next::Plain(p) = next(raw, &mut headers, MAX) else {
            panic!("a plain GET");
        };
        let h = Parsed(p.headers);
        let range = http::header::RANGE;
        let all: Vec<&[u8]> = h.lines(&range).collect();
        assert_eq!(all, [&b"a"[..], b"b"]);
        assert_eq!(h.nth(&http::header::HOST, 0), Some(&b"h"[..]));
        assert_eq!(h.nth(&http::header::HOST, 1), None);
        assert_eq!(h.nth(&http::header::ETAG, 0), None);
    }
}
