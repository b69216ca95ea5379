//! HTTP validators, preconditions and byte ranges (RFC 9110 §8.8, §13, §14),
//! as pure functions of headers and the representation's validators.

use http::header::{
    HeaderMap, HeaderName, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE,
    IF_UNMODIFIED_SINCE, RANGE,
};
use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

/// What the preconditions say to do (for GET and HEAD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    Proceed,
    NotModified,
    Failed,
}

/// A selected representation's validators.
#[derive(Debug, Clone)]
pub struct Validators {
    /// Strong entity-tag including quotes, e.g. `"abc"`.
    pub etag: String,
    pub last_modified: Option<SystemTime>,
    /// `If-Modified-Since` must name `last_modified` exactly (nginx's
    /// `if_modified_since exact`) rather than any time at or after it. For
    /// what can change under its name: its date is a replica's own
    /// publication time, so two replicas (or a rollback) can put an older
    /// date on other bytes, and "not after" would call those unmodified.
    /// Immutable objects keep the RFC's "at or after": any 304 for them is
    /// right.
    pub exact_date: bool,
}

/// 9999-12-31T23:59:59Z, the last instant an HTTP date can name.
pub const MAX_HTTP_DATE_SECS: u64 = 253_402_300_799;

/// `t` within what an HTTP date can say (1970 to 9999): a file's mtime is
/// whatever an image or a repo's writer set, and `httpdate` panics outside
/// that range, which would drop the response.
pub fn clamp_http_date(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + std::time::Duration::from_secs(secs(t).min(MAX_HTTP_DATE_SECS))
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A request's header fields, however its connection holds them: an
/// `http::HeaderMap`, or the slices a head parser left in its buffer.
pub trait Fields {
    /// The value of the `n`th field line named `name` (from 0).
    fn nth(&self, name: &HeaderName, n: usize) -> Option<&[u8]>;

    /// The value of every field line named `name`, in order.
    fn lines<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        (0..).map_while(move |n| self.nth(name, n))
    }
}

impl Fields for HeaderMap {
    fn nth(&self, name: &HeaderName, n: usize) -> Option<&[u8]> {
        self.get_all(name).iter().nth(n).map(|v| v.as_bytes())
    }
}

/// A field value as text, as `HeaderValue::to_str` takes it: visible
/// ASCII, spaces and tabs.
fn text(v: &[u8]) -> Option<&str> {
    v.iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        .then(|| std::str::from_utf8(v).ok())
        .flatten()
}

fn header_str<'a, H: Fields + ?Sized>(h: &'a H, name: &HeaderName) -> Option<&'a str> {
    h.nth(name, 0).and_then(text)
}

/// A list-valued field: its field lines joined with commas, as RFC 9110
/// §5.3 combines them (`If-Match: "a"` and `If-Match: "b"` are
/// `If-Match: "a", "b"`). A line that is not text is left out.
fn header_list<'a, H: Fields + ?Sized>(h: &'a H, name: &'a HeaderName) -> Option<Cow<'a, str>> {
    let mut lines = h.lines(name).filter_map(text);
    let first = lines.next()?;
    match lines.next() {
        None => Some(Cow::Borrowed(first)),
        Some(second) => {
            let mut all = format!("{first}, {second}");
            for l in lines {
                all.push_str(", ");
                all.push_str(l);
            }
            Some(Cow::Owned(all))
        }
    }
}

fn date<H: Fields + ?Sized>(h: &H, name: &HeaderName) -> Option<u64> {
    header_str(h, name)
        .and_then(|s| httpdate::parse_http_date(s).ok())
        .map(secs)
}

/// Splits an entity-tag list. `None` for `*`.
fn tags(list: &str) -> Option<Vec<(bool, &str)>> {
    if list.trim() == "*" {
        return None;
    }
    Some(
        list.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| match t.strip_prefix("W/") {
                Some(rest) => (true, rest),
                None => (false, t),
            })
            .collect(),
    )
}

/// If-None-Match uses weak comparison.
fn none_match_hits(list: &str, etag: &str) -> bool {
    let ours = etag.strip_prefix("W/").unwrap_or(etag);
    match tags(list) {
        None => true,
        Some(ts) => ts.iter().any(|(_, t)| *t == ours),
    }
}

/// If-Match and If-Range use strong comparison.
fn strong_hit(list: &str, etag: &str) -> bool {
    match tags(list) {
        None => true,
        Some(ts) => !etag.starts_with("W/") && ts.iter().any(|(weak, t)| !weak && *t == etag),
    }
}

/// Evaluates preconditions in RFC 9110 §13.2.2 order for a GET/HEAD of an
/// existing representation. If-None-Match takes precedence over
/// If-Modified-Since: when it is present, the date is not consulted.
pub fn evaluate<H: Fields + ?Sized>(h: &H, v: &Validators) -> Precondition {
    let lm = v.last_modified.map(secs);
    if let Some(list) = header_list(h, &IF_MATCH) {
        if !strong_hit(&list, &v.etag) {
            return Precondition::Failed;
        }
    } else if let (Some(since), Some(lm)) = (date(h, &IF_UNMODIFIED_SINCE), lm) {
        if lm > since {
            return Precondition::Failed;
        }
    }
    if let Some(list) = header_list(h, &IF_NONE_MATCH) {
        return if none_match_hits(&list, &v.etag) {
            Precondition::NotModified
        } else {
            Precondition::Proceed
        };
    }
    if let (Some(since), Some(lm)) = (date(h, &IF_MODIFIED_SINCE), lm) {
        if lm == since || (!v.exact_date && lm < since) {
            return Precondition::NotModified;
        }
    }
    Precondition::Proceed
}

/// The outcome of a Range header against a representation of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOutcome {
    Full,
    /// Inclusive byte range.
    Partial {
        start: u64,
        end: u64,
    },
    Unsatisfiable,
}

/// Parses a single `bytes=` range. Multiple ranges, other units and
/// malformed headers are served in full, as the RFC allows; an If-Range
/// that does not match (strongly, or by exact date) also means full.
pub fn range<H: Fields + ?Sized>(h: &H, len: u64, v: &Validators) -> RangeOutcome {
    let Some(spec) = header_str(h, &RANGE) else {
        return RangeOutcome::Full;
    };
    if let Some(cond) = header_str(h, &IF_RANGE) {
        let ok = if cond.starts_with('"') || cond.starts_with("W/") {
            strong_hit(cond, &v.etag)
        } else {
            let d = httpdate::parse_http_date(cond).ok().map(secs);
            d.is_some() && d == v.last_modified.map(secs)
        };
        if !ok {
            return RangeOutcome::Full;
        }
    }
    let Some(set) = spec.trim().strip_prefix("bytes=") else {
        return RangeOutcome::Full;
    };
    if set.contains(',') {
        return RangeOutcome::Full;
    }
    let Some((a, b)) = set.trim().split_once('-') else {
        return RangeOutcome::Full;
    };
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (a.trim(), b.trim()) {
        ("", suffix) => match num(suffix) {
            Some(0) => RangeOutcome::Unsatisfiable,
            Some(n) if len == 0 => {
                let _ = n;
                RangeOutcome::Unsatisfiable
            }
            Some(n) => RangeOutcome::Partial {
                start: len.saturating_sub(n),
                end: len - 1,
            },
            None => RangeOutcome::Full,
        },
        (first, last) => {
            let Some(start) = num(first) else {
                return RangeOutcome::Full;
            };
            let end = if last.is_empty() {
                len.saturating_sub(1)
            } else {
                match num(last) {
                    Some(e) if e >= start => e.min(len.saturating_sub(1)),
                    _ => return RangeOutcome::Full,
                }
            };
            if start >= len {
                RangeOutcome::Unsatisfiable
            } else {
                RangeOutcome::Partial { start, end }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T0: u64 = 1_700_000_000;

    fn v() -> Validators {
        Validators {
            etag: "\"abc\"".into(),
            last_modified: Some(UNIX_EPOCH + Duration::from_secs(T0)),
            exact_date: false,
        }
    }

    fn hdrs(pairs: &[(&str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, val) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                val.parse().unwrap(),
            );
        }
        h
    }

    fn at(offset: i64) -> String {
        httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs((T0 as i64 + offset) as u64))
    }

    #[test]
    fn http_dates_clamped_into_range() {
        let cases: &[(SystemTime, &str)] = &[
            (
                UNIX_EPOCH - Duration::from_secs(1),
                "Thu, 01 Jan 1970 00:00:00 GMT",
            ),
            (UNIX_EPOCH, "Thu, 01 Jan 1970 00:00:00 GMT"),
            (
                UNIX_EPOCH + Duration::from_secs(T0),
                "Tue, 14 Nov 2023 22:13:20 GMT",
            ),
            (
                UNIX_EPOCH + Duration::from_secs(MAX_HTTP_DATE_SECS),
                "Fri, 31 Dec 9999 23:59:59 GMT",
            ),
            (
                UNIX_EPOCH + Duration::from_secs(MAX_HTTP_DATE_SECS + 1),
                "Fri, 31 Dec 9999 23:59:59 GMT",
            ),
            (
                UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX) << 16),
                "Fri, 31 Dec 9999 23:59:59 GMT",
            ),
        ];
        for (t, want) in cases {
            assert_eq!(httpdate::fmt_http_date(clamp_http_date(*t)), *want, "{t:?}");
        }
    }

    #[test]
    fn preconditions() {
        use Precondition::*;
        let cases: Vec<(Vec<(&str, String)>, Precondition)> = vec![
            (vec![], Proceed),
            (vec![("if-none-match", "\"abc\"".into())], NotModified),
            (vec![("if-none-match", "W/\"abc\"".into())], NotModified),
            (
                vec![("if-none-match", "\"x\", \"abc\"".into())],
                NotModified,
            ),
            (vec![("if-none-match", "*".into())], NotModified),
            (vec![("if-none-match", "\"x\"".into())], Proceed),
            (vec![("if-modified-since", at(0))], NotModified),
            (vec![("if-modified-since", at(10))], NotModified),
            (vec![("if-modified-since", at(-1))], Proceed),
            (vec![("if-modified-since", "garbage".into())], Proceed),
            // If-None-Match wins over If-Modified-Since, both ways.
            (
                vec![
                    ("if-none-match", "\"x\"".into()),
                    ("if-modified-since", at(10)),
                ],
                Proceed,
            ),
            (
                vec![
                    ("if-none-match", "\"abc\"".into()),
                    ("if-modified-since", at(-10)),
                ],
                NotModified,
            ),
            (vec![("if-match", "\"abc\"".into())], Proceed),
            (vec![("if-match", "W/\"abc\"".into())], Failed),
            (vec![("if-match", "\"x\"".into())], Failed),
            (vec![("if-match", "*".into())], Proceed),
            (vec![("if-unmodified-since", at(-1))], Failed),
            (vec![("if-unmodified-since", at(0))], Proceed),
            // Several field lines are one list (RFC 9110 §5.3).
            (
                vec![("if-match", "\"x\"".into()), ("if-match", "\"abc\"".into())],
                Proceed,
            ),
            (
                vec![("if-match", "\"x\"".into()), ("if-match", "\"y\"".into())],
                Failed,
            ),
            (
                vec![
                    ("if-none-match", "\"x\"".into()),
                    ("if-none-match", "\"y\", \"abc\"".into()),
                ],
                NotModified,
            ),
        ];
        for (h, want) in cases {
            assert_eq!(evaluate(&hdrs(&h), &v()), want, "{h:?}");
        }
    }

    #[test]
    fn an_exact_date_is_not_modified_only_at_that_date() {
        use Precondition::*;
        let exact = Validators {
            exact_date: true,
            ..v()
        };
        // (If-Modified-Since offset from Last-Modified, at or after, exact)
        let cases = [
            (0, NotModified, NotModified),
            (10, NotModified, Proceed),
            (-1, Proceed, Proceed),
        ];
        for (offset, later, same) in cases {
            let h = hdrs(&[("if-modified-since", at(offset))]);
            assert_eq!(
                (evaluate(&h, &v()), evaluate(&h, &exact)),
                (later, same),
                "{offset}"
            );
        }
        // If-None-Match still decides alone.
        let h = hdrs(&[
            ("if-none-match", "\"abc\"".into()),
            ("if-modified-since", at(10)),
        ]);
        assert_eq!(evaluate(&h, &exact), NotModified);
    }

    #[test]
    fn ranges() {
        use RangeOutcome::*;
        type Case = (Vec<(&'static str, String)>, u64, RangeOutcome);
        let cases: Vec<Case> = vec![
            (vec![], 100, Full),
            (
                vec![("range", "bytes=0-9".into())],
                100,
                Partial { start: 0, end: 9 },
            ),
            (
                vec![("range", "bytes=90-".into())],
                100,
                Partial { start: 90, end: 99 },
            ),
            (
                vec![("range", "bytes=90-1000".into())],
                100,
                Partial { start: 90, end: 99 },
            ),
            (
                vec![("range", "bytes=-10".into())],
                100,
                Partial { start: 90, end: 99 },
            ),
            (
                vec![("range", "bytes=-1000".into())],
                100,
                Partial { start: 0, end: 99 },
            ),
            (vec![("range", "bytes=100-".into())], 100, Unsatisfiable),
            (vec![("range", "bytes=-0".into())], 100, Unsatisfiable),
            (vec![("range", "bytes=5-1".into())], 100, Full),
            (vec![("range", "bytes=0-1,5-6".into())], 100, Full),
            (vec![("range", "items=0-1".into())], 100, Full),
            (vec![("range", "bytes=a-b".into())], 100, Full),
            (
                vec![
                    ("range", "bytes=0-9".into()),
                    ("if-range", "\"abc\"".into()),
                ],
                100,
                Partial { start: 0, end: 9 },
            ),
            (
                vec![
                    ("range", "bytes=0-9".into()),
                    ("if-range", "\"old\"".into()),
                ],
                100,
                Full,
            ),
            (
                vec![("range", "bytes=0-9".into()), ("if-range", at(0))],
                100,
                Partial { start: 0, end: 9 },
            ),
            (
                vec![("range", "bytes=0-9".into()), ("if-range", at(-5))],
                100,
                Full,
            ),
        ];
        for (h, len, want) in cases {
            assert_eq!(range(&hdrs(&h), len, &v()), want, "{h:?}");
        }
    }
}
