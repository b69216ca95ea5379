//! Metrics and the access log for every request. Requests and their time
//! to the response head are counted as the head goes out; body bytes, and
//! the log line that carries them, when the body ends or is dropped
//! unfinished, so both say what was sent, not the Content-Length promised:
//! a client that resets its streams or goes away mid-object is not counted
//! as having been served the whole of it. Counting takes no lock
//! (`Metrics`' handles); the log line is serialized from borrowed fields and
//! queued for an idle worker to write, and only when there is a log.

use super::sendfile::SendFile;
use super::{kind, refused_head, repo_path, AppState};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Uri, Version};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use oscontent_format::RepoPath;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub(super) async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    observed(st, req, |req, _| next.run(req)).await
}

/// [`observe`] around `inner`, whatever calls it: the router's middleware,
/// or the shortcut past the router (`super::shortcut`). `inner` is given
/// the repo path the request names, as parsed for the metrics' label.
pub(super) async fn observed<F: std::future::Future<Output = Response>>(
    st: AppState,
    req: Request,
    inner: impl FnOnce(Request, Option<RepoPath>) -> F,
) -> Response {
    let start = Instant::now();
    let parsed = repo_path(req.uri().path());
    let kind = kind(req.uri().path(), parsed.as_ref());
    let head = req.method() == Method::HEAD;
    let logged = st.access_log.as_ref().map(|_| Logged {
        method: req.method().clone(),
        // A reference count on the request's bytes, not a copy.
        uri: req.uri().clone(),
        version: req.version(),
        client: req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip()),
    });
    let mut resp = match refused_head(req.version(), req.headers()) {
        None => inner(req, parsed).await,
        Some(e) => e.into_response(),
    };
    // What sets no policy of its own (errors, probes, metrics) is not to
    // be stored: a shared cache keeps a 404 for minutes by default (Varnish
    // 120 s), and a `.commitmeta`, `summary.sig` or object that appears
    // later, or a replica that has not published yet, would stay missing.
    // (Looked up first: `entry` makes room for an insert either way, and
    // a full map of a representation's six headers would grow for none.)
    if !resp.headers().contains_key(header::CACHE_CONTROL) {
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    let elapsed = start.elapsed();
    let status = resp.status().as_u16();
    st.metrics
        .observe_request(kind, status, elapsed.as_secs_f64());
    let done = Done {
        st,
        kind,
        status,
        start,
        elapsed,
        logged,
    };
    // A HEAD's body is never sent, and a 304 has none (though it carries
    // the 200's Content-Length, RFC 9110 §8.6).
    if head || status == 304 {
        done.finish(0);
        return resp;
    }
    let sendfile = resp.extensions().get::<SendFile>().cloned();
    resp.map(|inner| {
        Body::new(Counted {
            inner,
            sent: 0,
            sendfile,
            done: Some(done),
        })
    })
}

/// What the log line needs of the request, kept only when there is a log.
struct Logged {
    method: Method,
    uri: Uri,
    version: Version,
    client: Option<IpAddr>,
}

/// What is left to record once the body's bytes are known.
struct Done {
    st: AppState,
    kind: &'static str,
    status: u16,
    start: Instant,
    /// Time to the response head.
    elapsed: Duration,
    logged: Option<Logged>,
}

impl Done {
    fn finish(self, bytes: u64) {
        self.st.metrics.sent(self.kind, bytes);
        let (Some(log), Some(l)) = (&self.st.access_log, self.logged) else {
            return;
        };
        log_date::with_now(|ts| {
            log.log(&LogLine {
                bytes,
                client: l.client,
                duration_ms: self.elapsed.as_secs_f64() * 1e3,
                kind: self.kind,
                method: l.method.as_str(),
                path: l.uri.path(),
                status: self.status,
                total_ms: self.start.elapsed().as_secs_f64() * 1e3,
                ts,
                version: version_name(l.version),
            });
        });
    }
}

/// A response body that counts the bytes handed to the connection and
/// records them when it ends, fails, or is dropped unfinished.
struct Counted {
    inner: Body,
    sent: u64,
    /// A body the connection sends itself, and counts: it drops this body
    /// once it has.
    sendfile: Option<SendFile>,
    done: Option<Done>,
}

impl Counted {
    fn finish(&mut self) {
        if let Some(d) = self.done.take() {
            d.finish(self.sent + self.sendfile.as_ref().map_or(0, SendFile::sent));
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
#[derive(serde::Serialize)]
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
/// rather than once a request.
pub(crate) mod log_date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static NOW: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }

    pub fn with_now(f: impl FnOnce(&str)) {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        NOW.with_borrow_mut(|(at, text)| {
            if *at != secs {
                *at = secs;
                *text = httpdate::fmt_http_date(now);
            }
            f(text);
        });
    }
}
