//! Metrics and the access log for every request. Requests and their time
//! to the response head are counted as the head goes out; body bytes, and
//! the log line that carries them, when the body ends or is dropped
//! unfinished, so both say what was sent, not the Content-Length promised:
//! a client that resets its streams or goes away mid-object is not counted
//! as having been served the whole of it. Counting takes no lock
//! (`Metrics`' handles); the log line is serialized from borrowed fields and
//! queued for an idle worker to write, and only when there is a log.

use super::{kind, refused_head, repo_path, routed, AppState, NO_STORE};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Version};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use oscontent_format::ObjectName;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The router's middleware, for its routes (the probes, the scrape, the
/// staging slots); a repo answer keeps its own record (`super::answer`).
pub(super) async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !routed(req.uri().path()) {
        return next.run(req).await;
    }
    let start = Instant::now();
    let kind = kind(req.uri().path(), repo_path(req.uri().path()).as_ref());
    let logged = st.access_log.as_ref().map(|_| Logged {
        method: req.method().clone(),
        path: LoggedPath::Text(req.uri().path().into()),
        version: req.version(),
        client: req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip()),
    });
    let head = req.method() == Method::HEAD;
    let mut resp = match refused_head(req.version(), req.headers()) {
        None => next.run(req).await,
        Some(e) => e.into_response(),
    };
    // What sets no policy of its own is not to be stored (the module doc
    // of `super`).
    if !resp.headers().contains_key(header::CACHE_CONTROL) {
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static(NO_STORE));
    }
    let done = Done::headed(&st, kind, resp.status().as_u16(), start, logged);
    if head {
        done.finish(0);
        return resp;
    }
    resp.map(|inner| Body::new(Counted::new(inner, Some(done))))
}

/// What the log line needs of the request, kept only when there is a log.
pub(super) struct Logged {
    pub method: Method,
    pub path: LoggedPath,
    pub version: Version,
    pub client: Option<IpAddr>,
}

/// The request's path, as the log writes it.
pub(super) enum LoggedPath {
    /// An object's canonical path, which is what was asked for: written
    /// only if the line is.
    Object(ObjectName),
    Text(Box<str>),
}

impl LoggedPath {
    fn with<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            LoggedPath::Text(t) => f(t),
            LoggedPath::Object(o) => {
                let mut buf = [0u8; 1 + ObjectName::PATH_MAX];
                buf[0] = b'/';
                let rest: &mut [u8; ObjectName::PATH_MAX] =
                    (&mut buf[1..]).try_into().expect("the rest is a path");
                let len = 1 + o.path_in(rest).len();
                f(std::str::from_utf8(&buf[..len]).unwrap_or_default())
            }
        }
    }
}

/// What is left to record once the body's bytes are known.
pub(super) struct Done {
    st: AppState,
    kind: &'static str,
    status: u16,
    start: Instant,
    /// Time to the response head.
    elapsed: Duration,
    logged: Option<Logged>,
}

impl Done {
    /// The response's head is out: the request is counted, with its time
    /// since `start`.
    pub(super) fn headed(
        st: &AppState,
        kind: &'static str,
        status: u16,
        start: Instant,
        logged: Option<Logged>,
    ) -> Self {
        let elapsed = start.elapsed();
        st.metrics
            .observe_request(kind, status, elapsed.as_secs_f64());
        Self {
            st: st.clone(),
            kind,
            status,
            start,
            elapsed,
            logged,
        }
    }

    pub(super) fn finish(self, bytes: u64) {
        self.st.metrics.sent(self.kind, bytes);
        let (Some(log), Some(l)) = (&self.st.access_log, self.logged) else {
            return;
        };
        l.path.with(|path| {
            log_date::with_now(|ts| {
                let line = LogLine {
                    bytes,
                    client: l.client,
                    duration_ms: self.elapsed.as_secs_f64() * 1e3,
                    kind: self.kind,
                    method: l.method.as_str(),
                    path,
                    status: self.status,
                    total_ms: self.start.elapsed().as_secs_f64() * 1e3,
                    ts,
                    version: version_name(l.version),
                };
                log.log_with(|out| line.write(out));
            })
        });
    }
}

/// A response body that counts the bytes handed to the connection and
/// records them when it ends, fails, or is dropped unfinished.
pub(super) struct Counted {
    inner: Body,
    sent: u64,
    done: Option<Done>,
}

impl Counted {
    pub(super) fn new(inner: Body, done: Option<Done>) -> Self {
        Self {
            inner,
            sent: 0,
            done,
        }
    }

    fn finish(&mut self) {
        if let Some(d) = self.done.take() {
            d.finish(self.sent);
        }
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
                // Recorded with the last frame, not at the poll after it:
                // hyper does not poll a body that says it has ended.
                if this.inner.is_end_stream() {
                    this.finish();
                }
            }
            Poll::Ready(_) => this.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One access log line (fields in the order the log has always had them:
/// alphabetical).
#[cfg_attr(test, derive(serde::Serialize))]
struct LogLine<'a> {
    bytes: u64,
    client: Option<std::net::IpAddr>,
    duration_ms: f64,
    kind: &'static str,
    method: &'a str,
    path: &'a str,
    status: u16,
    /// Time to the body's end (or its drop): `duration_ms` is to the head.
    total_ms: f64,
    ts: &'a str,
    version: &'static str,
}

impl LogLine<'_> {
    /// The line as JSON, written field by field: serde's escaping scan of
    /// every string was 2% of the server's CPU in `bench serve`'s replay,
    /// and of these only the path (and an extension method) can hold what
    /// needs escaping. The same bytes as `serde_json` would write (tested).
    fn write(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        // Writes to a Vec cannot fail.
        out.extend_from_slice(b"{\"bytes\":");
        decimal(out, self.bytes);
        out.extend_from_slice(b",\"client\":");
        match self.client {
            // Numbers without the formatter (Ipv4Addr's Display pads
            // through it): they were half of the line's cost.
            Some(IpAddr::V4(ip)) => {
                out.push(b'"');
                for (i, octet) in ip.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push(b'.');
                    }
                    decimal(out, u64::from(octet));
                }
                out.push(b'"');
            }
            Some(ip) => {
                let _ = write!(out, "\"{ip}\"");
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"duration_ms\":");
        json_number(out, self.duration_ms);
        for (key, value) in [
            (&b",\"kind\":"[..], self.kind),
            (b",\"method\":", self.method),
            (b",\"path\":", self.path),
        ] {
            out.extend_from_slice(key);
            json_str(out, value);
        }
        out.extend_from_slice(b",\"status\":");
        decimal(out, u64::from(self.status));
        out.extend_from_slice(b",\"total_ms\":");
        json_number(out, self.total_ms);
        out.extend_from_slice(b",\"ts\":");
        json_str(out, self.ts);
        out.extend_from_slice(b",\"version\":");
        json_str(out, self.version);
        out.push(b'}');
    }
}

/// `s` as a JSON string: copied as it is when it is printable ASCII with
/// no quote or backslash (nearly always), else escaped by `serde_json`.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(out, s);
    }
}

/// `n` in decimal.
fn decimal(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0u8; 20];
    out.extend_from_slice(oscontent_format::digits::decimal(&mut buf, n).as_bytes());
}

/// `v` as `serde_json` writes it (shortest round-trip; `null` if not
/// finite).
fn json_number(out: &mut Vec<u8>, v: f64) {
    let _ = serde_json::to_writer(out, &v);
}

/// The protocol as the log has always named it (`http::Version`'s Debug).
fn version_name(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_11 => "HTTP/1.1",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/?",
    }
}

/// The log's timestamp and the `Date` of `listen::h1`'s responses (an
/// HTTP date, one-second resolution), formatted once a second per thread
/// rather than once a request, from the coarse clock: a second's text
/// needs no finer time than the last tick's, which is read without the
/// TSC (two of a request's seven clock reads were these).
pub(crate) mod log_date {
    use rustix::time::{clock_gettime, ClockId};
    use std::cell::RefCell;
    use std::time::{Duration, UNIX_EPOCH};

    thread_local! {
        static NOW: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }

    pub fn with_now(f: impl FnOnce(&str)) {
        let secs = u64::try_from(clock_gettime(ClockId::RealtimeCoarse).tv_sec).unwrap_or(0);
        NOW.with_borrow_mut(|(at, text)| {
            if *at != secs {
                *at = secs;
                *text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
            }
            f(text);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_is_what_serde_json_would_write() {
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let v4: IpAddr = "10.0.0.7".parse().unwrap();
        let v4_wide: IpAddr = "255.100.9.0".parse().unwrap();
        let base = LogLine {
            bytes: 1234,
            client: Some(v4),
            duration_ms: 0.123_456_7,
            kind: "object",
            method: "GET",
            path: "/objects/ab/cd.filez",
            status: 200,
            total_ms: 12.5,
            ts: "Sun, 29 Nov 2026 06:00:00 GMT",
            version: "HTTP/1.1",
        };
        let cases = [
            LogLine { ..base },
            LogLine {
                client: None,
                bytes: 0,
                status: 404,
                ..base
            },
            LogLine {
                client: Some(v4_wide),
                ..base
            },
            LogLine {
                client: Some(v6),
                duration_ms: 0.0,
                total_ms: f64::NAN,
                ..base
            },
            LogLine {
                path: "/a\"b\\c\u{1}\u{7f}é/\t",
                method: "PURGE",
                duration_ms: 1e-9,
                total_ms: 1e21,
                ..base
            },
            LogLine {
                path: "",
                bytes: u64::MAX,
                status: u16::MAX,
                ..base
            },
        ];
        for line in cases {
            let mut ours = Vec::new();
            line.write(&mut ours);
            let want = serde_json::to_vec(&line).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }

    #[test]
    fn the_coarse_date_is_now() {
        let mut text = String::new();
        log_date::with_now(|d| text = d.to_owned());
        let at = httpdate::parse_http_date(&text).unwrap();
        let now = std::time::SystemTime::now();
        let lag = now.duration_since(at).unwrap_or_default();
        assert!(lag < Duration::from_secs(3), "{text} is {lag:?} behind");
        assert!(at <= now + Duration::from_secs(1), "{text} is ahead");
    }
}
