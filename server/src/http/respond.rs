//! Responses for what a repo path found: preconditions, ranges and the
//! headers every representation carries, over bytes in memory or a file
//! streamed.

use super::AppError;
use crate::conditional::{self, Precondition, RangeOutcome};
use crate::prepared::Prepared;
use axum::body::Body;
use axum::response::Response;
use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;

fn base_headers(h: &mut HeaderMap, v: &Prepared, cache: HeaderValue) {
    h.insert(header::ETAG, v.etag.clone());
    if let Some(lm) = &v.last_modified {
        h.insert(header::LAST_MODIFIED, lm.clone());
    }
    h.insert(header::CACHE_CONTROL, cache);
}

fn status_only(status: StatusCode, v: &Prepared, cache: HeaderValue) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    base_headers(r.headers_mut(), v, cache);
    r
}

/// A 304. Its Content-Length, if any, must be the 200's (RFC 9110 §8.6);
/// left unset, the empty body's 0 would go out with a HEAD's.
fn not_modified(v: &Prepared, cache: HeaderValue, len: u64) -> Response {
    let mut r = status_only(StatusCode::NOT_MODIFIED, v, cache);
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

pub(super) fn respond_bytes(
    h: &HeaderMap,
    bytes: bytes::Bytes,
    v: &Prepared,
    cache: HeaderValue,
    head: bool,
) -> Response {
    let len = bytes.len() as u64;
    match conditional::evaluate(h, &v.validators) {
        Precondition::NotModified => return not_modified(v, cache, len),
        Precondition::Failed => return AppError::from_precondition(),
        Precondition::Proceed => {}
    }
    let (status, body, range) = match conditional::range(h, len, &v.validators) {
        RangeOutcome::Full => (StatusCode::OK, bytes, None),
        RangeOutcome::Partial { start, end } => (
            StatusCode::PARTIAL_CONTENT,
            bytes.slice(start as usize..=end as usize),
            Some((start, end)),
        ),
        RangeOutcome::Unsatisfiable => return unsatisfiable(len),
    };
    let blen = body.len();
    let mut r = Response::new(if head {
        Body::empty()
    } else {
        Body::from(body)
    });
    *r.status_mut() = status;
    finish_headers(r.headers_mut(), v, cache, blen as u64, len, range);
    r
}

impl AppError {
    fn from_precondition() -> Response {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::PRECONDITION_FAILED;
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        r
    }
}

fn unsatisfiable(len: u64) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    r.headers_mut().insert(
        header::CONTENT_RANGE,
        HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
    );
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    r
}

fn finish_headers(
    h: &mut HeaderMap,
    v: &Prepared,
    cache: HeaderValue,
    body_len: u64,
    total: u64,
    range: Option<(u64, u64)>,
) {
    base_headers(h, v, cache);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some((s, e)) = range {
        h.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("bytes {s}-{e}/{total}")).expect("ascii"),
        );
    }
}

/// A file's representation; unless `head`, the body `stream` makes for a
/// range (start, count) of it.
pub(super) fn respond_file(
    h: &HeaderMap,
    len: u64,
    v: &Prepared,
    cache: HeaderValue,
    head: bool,
    stream: impl FnOnce(u64, u64) -> Body,
) -> Response {
    match conditional::evaluate(h, &v.validators) {
        Precondition::NotModified => return not_modified(v, cache, len),
        Precondition::Failed => return AppError::from_precondition(),
        Precondition::Proceed => {}
    }
    let (status, start, count, range) = match conditional::range(h, len, &v.validators) {
        RangeOutcome::Full => (StatusCode::OK, 0, len, None),
        RangeOutcome::Partial { start, end } => (
            StatusCode::PARTIAL_CONTENT,
            start,
            end - start + 1,
            Some((start, end)),
        ),
        RangeOutcome::Unsatisfiable => return unsatisfiable(len),
    };
    let body = if head {
        Body::empty()
    } else {
        stream(start, count)
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    finish_headers(r.headers_mut(), v, cache, count, len, range);
    r
}
