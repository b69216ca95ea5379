//! Responses for what a repo path found: preconditions, ranges and the
//! headers every representation carries, over bytes in memory or a file
//! streamed.

use super::AppError;
use crate::prepared::Prepared;
use axum::body::Body;
use axum::response::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use oscontent_parse::conditional::{self, Precondition, RangeOutcome};

const OCTET_STREAM: &str = "application/octet-stream";

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

/// The headers [`finish_headers`] gives a whole 200, written as HTTP/1.1
/// lines in the same order (`super::direct`).
pub(super) fn write_headers(out: &mut Vec<u8>, v: &Prepared, cache: &HeaderValue, len: u64) {
    let mut line = |name: &HeaderName, value: &[u8]| header_line(out, name, value);
    line(&header::ETAG, v.etag.as_bytes());
    if let Some(lm) = &v.last_modified {
        line(&header::LAST_MODIFIED, lm.as_bytes());
    }
    line(&header::CACHE_CONTROL, cache.as_bytes());
    line(&header::CONTENT_TYPE, OCTET_STREAM.as_bytes());
    let mut digits = [0u8; 20];
    line(
        &header::CONTENT_LENGTH,
        oscontent_format::digits::decimal(&mut digits, len).as_bytes(),
    );
    line(&header::ACCEPT_RANGES, b"bytes");
}

/// One header as an HTTP/1.1 head line.
pub(crate) fn header_line(out: &mut Vec<u8>, name: &HeaderName, value: &[u8]) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
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
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(OCTET_STREAM));
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

#[cfg(test)]
mod tests {
    use super::*;
    use oscontent_parse::conditional::Validators;
    use std::time::{Duration, UNIX_EPOCH};

    /// The lines a 200 gets past the router are the router's headers for
    /// it, in its order.
    #[test]
    fn the_lines_past_the_router_are_its_headers() {
        let modified = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let immutable = HeaderValue::from_static(super::super::IMMUTABLE);
        let short = HeaderValue::from_static("public, max-age=30");
        let cases = [
            (Some(modified), 3_300, &immutable),
            (None, 0, &immutable),
            (Some(modified), u64::MAX, &immutable),
            (Some(modified), 490, &short),
        ];
        for (last_modified, len, cache) in cases {
            let v = Prepared::new(Validators {
                etag: "\"abc.filez-ce4\"".into(),
                last_modified,
                exact_date: false,
            });
            let mut routed = HeaderMap::new();
            finish_headers(&mut routed, &v, cache.clone(), len, len, None);
            let mut want = Vec::new();
            for (name, value) in &routed {
                header_line(&mut want, name, value.as_bytes());
            }
            let mut got = Vec::new();
            write_headers(&mut got, &v, cache, len);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap(),
                "{last_modified:?} {len} {cache:?}"
            );
        }
    }
}
