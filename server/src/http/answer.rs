//! One answer per repo request, made once whoever writes it: its status,
//! its header fields (still as the values they were prepared as, written
//! out by the writer), its body (empty, bytes, a file's range, or a
//! stream), and its record for the metrics and the access log.
//! Preconditions and ranges are `conditional`'s, over the request's
//! headers however its connection holds them (`conditional::Fields`).
//!
//! Two writers: our HTTP/1.1 loop (`listen::h1`) writes the head itself
//! and a file with `sendfile(2)`; hyper (HTTP/2, and whatever the loop
//! hands it) and the router (its fallback: the in-process tests) get the
//! same answer as an ordinary response ([`Answer::into_response`]), the
//! file streamed. The record is made as the answer is (the request is
//! counted with its time to the head) and finished once, with the bytes
//! the writer sent, when the answer or its body is dropped.
//!
//! The lookups (`find.rs`): an immutable object from the object cache or
//! its file, everything else (refs, summaries, config, deltas) resolved in
//! the generation; found on the request's thread when the kernel has what
//! they read, else in one trip to the blocking pool. A file to be sent is
//! held open with a place in the streamed-file budget when one is free for
//! its client, else opened again for each read.

mod find;

use super::observe::{Done, Logged, LoggedPath};
use super::{kind, refused_head, repo_path, AppError, AppState, NO_STORE};
use crate::conditional::{self, Precondition, RangeOutcome};
use crate::prepared::Prepared;
use crate::served::memory::{BodyMemory, Charge};
use crate::served::streams::StreamPermit;
use axum::body::Body;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Version};
use oscontent_format::RepoPath;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

pub use crate::conditional::Fields;

const OCTET_STREAM: &str = "application/octet-stream";

/// A repo request, as its connection read it.
#[derive(Debug)]
pub struct Ask<'a, H: ?Sized> {
    pub method: &'a Method,
    /// The path, without the query.
    pub path: &'a str,
    pub version: Version,
    pub headers: &'a H,
    /// `None` when there is no connection (in-process tests).
    pub client: Option<IpAddr>,
    /// The writer sends a file body with `sendfile(2)`: an object large
    /// enough (`find::SENDFILE_FROM`) is then sent from its file even when
    /// the object cache holds it, and a small one is read whole only when
    /// asked for again.
    pub sendfile: bool,
}

/// One answer, for either writer.
pub struct Answer {
    pub status: StatusCode,
    fields: Head,
    body: Payload,
    /// What the writer sent of the body.
    sent: u64,
    record: Option<Done>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// The header fields, as prepared.
enum Head {
    /// A 200, 206 or 304 of a representation of `len` bytes; `range` is
    /// the part a 206 sends, inclusive.
    Repr {
        etag: HeaderValue,
        last_modified: Option<HeaderValue>,
        cache: HeaderValue,
        len: u64,
        range: Option<(u64, u64)>,
    },
    /// An error: empty, not to be stored, and one field more for some.
    Error(Option<(HeaderName, HeaderValue)>),
}

/// A header value, as [`Answer::fields`] hands it to a writer.
#[derive(Debug)]
pub enum Value<'a> {
    Header(&'a HeaderValue),
    Text(&'static str),
    Number(u64),
    /// A 206's `Content-Range`: `bytes {start}-{end}/{len}`.
    Range(u64, u64, u64),
}

/// What follows the head.
#[derive(Debug)]
pub enum Payload {
    Empty,
    Bytes(Bytes),
    File(FileRange),
    /// A file opened again for each read (no place was free to hold it).
    Stream(Body),
}

/// `count` bytes of `file` from `start`, the file held open with its
/// place in the streamed-file budget until this is dropped.
#[derive(Debug)]
pub struct FileRange {
    pub file: File,
    pub start: u64,
    pub count: u64,
    permit: StreamPermit,
    /// Whom the chunks are charged to if it is streamed rather than sent.
    memory: (Arc<BodyMemory>, IpAddr),
}

impl FileRange {
    fn into_body(self) -> Body {
        let charge = Charge::new(self.memory.0, self.memory.1);
        let permit = Some(self.permit);
        crate::served::body::file_body(self.file, self.start, self.count, permit, charge)
    }
}

/// Answers `ask`: the one function every repo request goes through.
pub async fn answer<H: Fields + ?Sized>(st: &AppState, ask: &Ask<'_, H>) -> Answer {
    let start = Instant::now();
    let parsed = repo_path(ask.path);
    let (status, fields, body) = match found(st, ask, parsed.as_ref()).await {
        Ok(found) => found,
        Err(e) => e.answer(),
    };
    let logged = st.access_log.as_ref().map(|_| Logged {
        method: ask.method.clone(),
        path: match &parsed {
            // Its canonical path is what was asked for: written only if
            // the line is.
            Some(RepoPath::Object(o)) => LoggedPath::Object(*o),
            _ => LoggedPath::Text(ask.path.into()),
        },
        version: ask.version,
        client: ask.client,
    });
    let kind = kind(ask.path, parsed.as_ref());
    let record = Done::headed(st, kind, status.as_u16(), start, logged);
    let mut answer = Answer {
        status,
        fields,
        body,
        sent: 0,
        record: Some(record),
    };
    // Nothing to send: the record is complete now.
    if matches!(answer.body, Payload::Empty) {
        answer.finish();
    }
    answer
}

type Found = (StatusCode, Head, Payload);

async fn found<H: Fields + ?Sized>(
    st: &AppState,
    ask: &Ask<'_, H>,
    parsed: Option<&RepoPath>,
) -> Result<Found, AppError> {
    if let Some(e) = refused_head(ask.version, ask.headers) {
        return Err(e);
    }
    let Some(rp) = parsed else {
        return Err(AppError::NotFound);
    };
    if ask.method != Method::GET && ask.method != Method::HEAD {
        return Err(AppError::MethodNotAllowed);
    }
    let Some(generation) = st.sink.current() else {
        return Err(AppError::Unavailable);
    };
    match rp {
        RepoPath::Object(name) if find::policy(rp) == find::CachePolicy::Immutable => {
            find::object(st, &generation, ask, *name).await
        }
        _ => find::other(st, &generation, ask, rp).await,
    }
}

/// A status, its fields, and the part of the representation to send.
type Represented = (StatusCode, Head, Option<(u64, u64)>);

/// The preconditions and the range asked for, against a representation
/// of `len` bytes: its status and fields, and the part of it to send
/// (start, count), `None` when nothing is.
fn represent<H: Fields + ?Sized>(
    ask: &Ask<'_, H>,
    v: &Prepared,
    cache: HeaderValue,
    len: u64,
) -> Result<Represented, AppError> {
    let head = |range| Head::Repr {
        etag: v.etag.clone(),
        last_modified: v.last_modified.clone(),
        cache,
        len,
        range,
    };
    match conditional::evaluate(ask.headers, &v.validators) {
        Precondition::NotModified => return Ok((StatusCode::NOT_MODIFIED, head(None), None)),
        Precondition::Failed => return Err(AppError::PreconditionFailed),
        Precondition::Proceed => {}
    }
    let (status, range) = match conditional::range(ask.headers, len, &v.validators) {
        RangeOutcome::Full => (StatusCode::OK, None),
        RangeOutcome::Partial { start, end } => (StatusCode::PARTIAL_CONTENT, Some((start, end))),
        RangeOutcome::Unsatisfiable => return Err(AppError::RangeNotSatisfiable(len)),
    };
    let part = range.map_or((0, len), |(s, e)| (s, e - s + 1));
    let send = (ask.method != Method::HEAD).then_some(part);
    Ok((status, head(range), send))
}

/// Bytes in memory, or the part of them asked for.
fn in_memory<H: Fields + ?Sized>(
    ask: &Ask<'_, H>,
    bytes: &Bytes,
    v: &Prepared,
    cache: HeaderValue,
) -> Result<Found, AppError> {
    let (status, head, send) = represent(ask, v, cache, bytes.len() as u64)?;
    let body = match send {
        // Within the representation (`conditional::range`).
        Some((start, count)) => {
            Payload::Bytes(bytes.slice(start as usize..(start + count) as usize))
        }
        None => Payload::Empty,
    };
    Ok((status, head, body))
}

impl AppError {
    /// An error's answer: a status and an empty body, never internals.
    fn answer(self) -> Found {
        let (status, extra) = match self {
            AppError::BadRequest => (StatusCode::BAD_REQUEST, None),
            AppError::ExpectationFailed => (StatusCode::EXPECTATION_FAILED, None),
            AppError::NotFound => (StatusCode::NOT_FOUND, None),
            AppError::PreconditionFailed => (StatusCode::PRECONDITION_FAILED, None),
            AppError::RangeNotSatisfiable(len) => {
                let range = HeaderValue::from_str(&format!("bytes */{len}"));
                let range = range.unwrap_or(HeaderValue::from_static("bytes */0"));
                let extra = (header::CONTENT_RANGE, range);
                (StatusCode::RANGE_NOT_SATISFIABLE, Some(extra))
            }
            AppError::MethodNotAllowed => {
                let allow = (header::ALLOW, HeaderValue::from_static("GET, HEAD"));
                (StatusCode::METHOD_NOT_ALLOWED, Some(allow))
            }
            AppError::Unavailable => {
                let retry = (header::RETRY_AFTER, HeaderValue::from_static("5"));
                (StatusCode::SERVICE_UNAVAILABLE, Some(retry))
            }
            AppError::Internal(e) => {
                tracing::error!("internal error: {e:#}");
                (StatusCode::INTERNAL_SERVER_ERROR, None)
            }
        };
        (status, Head::Error(extra), Payload::Empty)
    }
}

impl Answer {
    /// An error's answer, unrecorded (the router's middleware records its
    /// routes' answers).
    pub(super) fn of_error(e: AppError) -> Self {
        let (status, fields, body) = e.answer();
        Self {
            status,
            fields,
            body,
            sent: 0,
            record: None,
        }
    }

    /// Hands each header field to `f`, in their order. A 304 carries the
    /// 200's Content-Length (RFC 9110 §8.6 allows it); a writer may leave
    /// it out.
    pub fn fields(&self, mut f: impl FnMut(&HeaderName, Value<'_>)) {
        match &self.fields {
            Head::Repr {
                etag,
                last_modified,
                cache,
                len,
                range,
            } => {
                f(&header::ETAG, Value::Header(etag));
                if let Some(lm) = last_modified {
                    f(&header::LAST_MODIFIED, Value::Header(lm));
                }
                f(&header::CACHE_CONTROL, Value::Header(cache));
                if self.status == StatusCode::NOT_MODIFIED {
                    f(&header::CONTENT_LENGTH, Value::Number(*len));
                    return;
                }
                let count = range.map_or(*len, |(s, e)| e - s + 1);
                f(&header::CONTENT_TYPE, Value::Text(OCTET_STREAM));
                f(&header::CONTENT_LENGTH, Value::Number(count));
                f(&header::ACCEPT_RANGES, Value::Text("bytes"));
                if let Some((s, e)) = range {
                    f(&header::CONTENT_RANGE, Value::Range(*s, *e, *len));
                }
            }
            Head::Error(extra) => {
                f(&header::CONTENT_LENGTH, Value::Number(0));
                if let Some((name, value)) = extra {
                    f(name, Value::Header(value));
                }
                f(&header::CACHE_CONTROL, Value::Text(NO_STORE));
            }
        }
    }

    /// The body, for the writer to send (and count, [`Self::sent`]).
    pub fn take_body(&mut self) -> Payload {
        std::mem::replace(&mut self.body, Payload::Empty)
    }

    /// Adds `n` bytes of the body handed to the connection.
    pub fn sent(&mut self, n: u64) {
        self.sent += n;
    }

    fn finish(&mut self) {
        if let Some(done) = self.record.take() {
            done.finish(self.sent);
        }
    }

    /// The answer as a response, for hyper and the router: its body
    /// records what was sent when it ends or is dropped.
    pub fn into_response(mut self) -> Response<Body> {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = self.status;
        let h = r.headers_mut();
        self.fields(|name, value| {
            let value = match value {
                Value::Header(v) => v.clone(),
                Value::Text(t) => HeaderValue::from_static(t),
                Value::Number(n) => HeaderValue::from(n),
                Value::Range(s, e, len) => HeaderValue::from_str(&format!("bytes {s}-{e}/{len}"))
                    .unwrap_or(HeaderValue::from_static("bytes */0")),
            };
            h.insert(name.clone(), value);
        });
        let inner = match self.take_body() {
            Payload::Empty => return r,
            Payload::Bytes(b) => Body::from(b),
            Payload::File(f) => f.into_body(),
            Payload::Stream(b) => b,
        };
        let done = self.record.take();
        *r.body_mut() = Body::new(super::observe::Counted::new(inner, done));
        r
    }
}

/// Recorded once, with what the writer sent, whichever writer it was.
impl Drop for Answer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The repo handler: the router's fallback.
pub(super) async fn repo(
    axum::extract::State(st): axum::extract::State<AppState>,
    req: axum::extract::Request,
) -> Response<Body> {
    answer_request(&st, &req.into_parts().0).await
}

/// A request hyper read (its head), answered.
pub async fn answer_request(st: &AppState, req: &http::request::Parts) -> Response<Body> {
    let client = req
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let ask = Ask {
        method: &req.method,
        path: req.uri.path(),
        version: req.version,
        headers: &req.headers,
        client,
        sendfile: false,
    };
    answer(st, &ask).await.into_response()
}

/// Whom a client's streamed chunks are charged to: an in-process test
/// has no address.
fn charged(st: &AppState, client: Option<IpAddr>) -> (Arc<BodyMemory>, IpAddr) {
    let ip = client.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    (st.memory.clone(), ip)
}
