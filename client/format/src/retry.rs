//! The retry policy for requests to a remote, shared by the node client and
//! the mirror: which failures are worth another attempt, how many attempts,
//! capped exponential backoff with jitter, and a server's `Retry-After`.
//! Pure (the random number and the clock come from the caller), so it is
//! table-tested.
//!
//! A `Retry-After` is waited for as long as it asks plus up to half again,
//! so that a fleet told "1" does not come back within the same second.

use std::time::{Duration, SystemTime};

/// How a request to a remote is retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// First backoff delay.
    pub base_delay: Duration,
    /// Backoff never waits longer than this between attempts.
    pub max_delay: Duration,
    /// Fraction of each delay that is randomised.
    pub jitter: f64,
    /// A `Retry-After` shorter than this (0, or a date already past) is no
    /// request to wait: the answer counts as a plain failure, so that such
    /// a server cannot hold a request in a fast loop.
    pub min_retry_after: Duration,
    /// The longest `Retry-After` waited for. A server asking for more is
    /// taken at its word that it will not serve soon: the request fails now
    /// and says why, rather than a node sleeping for an hour unseen.
    pub max_retry_after: Duration,
    /// How long one request may spend in all waiting on `Retry-After`s.
    /// An overloaded server that says when to come back is not failing, so
    /// those answers do not use up `max_attempts`; this bounds them instead.
    pub max_throttled: Duration,
}

/// What one request's failed attempts have used of a [`RetryPolicy`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Retries {
    /// Failed attempts counted against `max_attempts`.
    pub failed: u32,
    /// Time spent waiting on `Retry-After`s.
    pub throttled: Duration,
}

/// Why a failed attempt is not followed by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GiveUp {
    #[error("no attempts left")]
    Attempts,
    #[error("the server asked to retry after {} s, more than the {} s waited at most", .asked.as_secs(), .max.as_secs())]
    RetryAfterTooLong { asked: Duration, max: Duration },
    #[error("the server kept asking to retry later, for {} s in all", .0.as_secs())]
    Throttled(Duration),
}

impl RetryPolicy {
    /// A server that fails five times in a row over ~8 s of backoff is down,
    /// not flaky. Half of each delay is random so that many nodes retrying
    /// the same server do not do so in lockstep.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_millis(250),
        max_delay: Duration::from_secs(4),
        jitter: 0.5,
        min_retry_after: Duration::from_secs(1),
        max_retry_after: Duration::from_secs(60),
        max_throttled: Duration::from_secs(300),
    };

    /// Whether an HTTP status is transient: server errors, overload, and
    /// request timeouts. Every other status is final.
    pub fn retryable_status(status: u16) -> bool {
        matches!(status, 408 | 425 | 429 | 500 | 502 | 503 | 504)
    }

    /// After a retryable failure: how long to wait before the next attempt,
    /// or why there is none. `retry_after` is the server's `Retry-After`
    /// (see [`parse_retry_after`]); `r` is uniform in [0, 1).
    ///
    /// With a `Retry-After`, the wait is never shorter than the server
    /// asked, and up to `jitter` of it longer, so that a fleet told "1" by
    /// the same overloaded server does not come back in the same second.
    pub fn after_failure(
        &self,
        used: &mut Retries,
        retry_after: Option<Duration>,
        r: f64,
    ) -> Result<Duration, GiveUp> {
        let Some(asked) = retry_after.filter(|a| *a >= self.min_retry_after) else {
            used.failed += 1;
            if !self.may_retry(used.failed) {
                return Err(GiveUp::Attempts);
            }
            return Ok(self.backoff(used.failed, r));
        };
        if asked > self.max_retry_after {
            return Err(GiveUp::RetryAfterTooLong {
                asked,
                max: self.max_retry_after,
            });
        }
        let floor = asked.max(self.backoff(used.failed + 1, 0.0));
        let delay = floor + floor.mul_f64(self.jitter * r.clamp(0.0, 1.0));
        if used.throttled + delay > self.max_throttled {
            return Err(GiveUp::Throttled(used.throttled));
        }
        used.throttled += delay;
        Ok(delay)
    }

    /// Whether a failed attempt `attempt` (counting from 1) may be followed
    /// by another.
    pub fn may_retry(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }

    /// The delay before attempt `attempt + 1` (`attempt` counts from 1), given
    /// a uniform random number `r` in [0, 1): `base_delay * 2^(attempt-1)`,
    /// capped at `max_delay`, of which the last `jitter` fraction is random.
    pub fn backoff(&self, attempt: u32, r: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(16);
        let full = (self.base_delay.as_secs_f64() * f64::from(1u32 << exp))
            .min(self.max_delay.as_secs_f64());
        let r = r.clamp(0.0, 1.0);
        Duration::from_secs_f64(full * (1.0 - self.jitter) + full * self.jitter * r)
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3): delay-seconds, or an
/// HTTP-date, as the wait from `now` (zero if it has passed). `None` for
/// anything else, which a recipient ignores.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let v = std::str::from_utf8(value).ok()?.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        return Some(Duration::from_secs(v.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The `Retry-After` of a response with `status`, as a wait: only 503 and
/// 429 say "come back later" with it (RFC 9110 §10.2.3, RFC 6585 §4); on
/// another status it is ignored. A date is taken against the response's
/// own `Date` when it has one, so that a server whose clock is off by an
/// hour does not turn "in 5 seconds" into "in an hour" (or into "now").
pub fn response_retry_after(
    status: u16,
    retry_after: Option<&[u8]>,
    date: Option<&[u8]>,
    local_now: SystemTime,
) -> Option<Duration> {
    if !matches!(status, 429 | 503) {
        return None;
    }
    let now = date
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| httpdate::parse_http_date(d.trim()).ok())
        .unwrap_or(local_now);
    parse_retry_after(retry_after?, now)
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        let ms = |d: Duration| d.as_millis();
        // (attempt, r, expected ms)
        let cases = [
            (1, 0.0, 125),
            (1, 1.0, 250),
            (2, 0.0, 250),
            (3, 1.0, 1000),
            (5, 1.0, 4000),
            (6, 1.0, 4000),
            (60, 0.0, 2000),
            (0, 1.0, 250),
        ];
        for (attempt, r, want) in cases {
            let got = RetryPolicy::DEFAULT.backoff(attempt, r);
            assert_eq!(ms(got), want, "attempt {attempt} r {r}");
        }
    }

    #[test]
    fn statuses() {
        for s in [500, 502, 503, 504, 429, 408] {
            assert!(RetryPolicy::retryable_status(s), "{s}");
        }
        for s in [200, 304, 400, 403, 404, 410, 501] {
            assert!(!RetryPolicy::retryable_status(s), "{s}");
        }
    }

    #[test]
    fn retry_after_values() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        // (header value, expected wait in seconds)
        let cases: &[(&[u8], Option<u64>)] = &[
            (b"120", Some(120)),
            (b" 0 ", Some(0)),
            (b"99999999999999999999999", Some(u64::MAX)),
            // Sun, 06 Nov 1994 08:49:37 GMT is 784111777.
            (b"Sun, 06 Nov 1994 08:50:07 GMT", Some(30)),
            (b"Sunday, 06-Nov-94 08:50:07 GMT", Some(30)),
            (b"Sun Nov  6 08:50:07 1994", Some(30)),
            (b"Sun, 06 Nov 1994 08:00:00 GMT", Some(0)),
            (b"-1", None),
            (b"1.5", None),
            (b"soon", None),
            (b"", None),
            (b"\xff", None),
        ];
        for (value, want) in cases {
            let got = parse_retry_after(value, now).map(|d| d.as_secs());
            assert_eq!(got, *want, "{:?}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn only_503_and_429_ask_to_wait_and_by_the_servers_clock() {
        let local = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let server_ahead = b"Sun, 06 Nov 1994 09:49:37 GMT"; // local + 1 h
        let in_5s_by_server = b"Sun, 06 Nov 1994 09:49:42 GMT";
        // (status, Retry-After, Date, wait in seconds)
        type Case<'a> = (u16, Option<&'a [u8]>, Option<&'a [u8]>, Option<u64>);
        let cases: &[Case] = &[
            (503, Some(b"7"), None, Some(7)),
            (429, Some(b"7"), None, Some(7)),
            (500, Some(b"7"), None, None),
            (502, Some(b"7"), None, None),
            (504, Some(b"7"), None, None),
            (503, None, None, None),
            // Taken against the server's Date, not the local clock...
            (503, Some(in_5s_by_server), Some(server_ahead), Some(5)),
            // ...which stands in when Date is missing or unreadable.
            (503, Some(in_5s_by_server), None, Some(3605)),
            (503, Some(in_5s_by_server), Some(b"soon"), Some(3605)),
            // Delay-seconds do not depend on any clock.
            (503, Some(b"5"), Some(server_ahead), Some(5)),
        ];
        for (status, after, date, want) in cases {
            let got = response_retry_after(*status, *after, *date, local).map(|d| d.as_secs());
            assert_eq!(got, *want, "{status} {after:?} {date:?}");
        }
    }

    #[test]
    fn after_failure_plans() {
        let p = RetryPolicy::DEFAULT;
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (the failures' Retry-After, r, what each failure leads to)
        type Case = (Vec<Option<Duration>>, f64, Vec<Result<Duration, GiveUp>>);
        let cases: Vec<Case> = vec![
            // Backoff alone: five attempts, the fifth failure is final.
            (
                vec![None, None, None, None, None],
                0.0,
                vec![
                    Ok(ms(125)),
                    Ok(ms(250)),
                    Ok(ms(500)),
                    Ok(ms(1000)),
                    Err(GiveUp::Attempts),
                ],
            ),
            // Never sooner than asked, and up to half as much again.
            (vec![Some(s(2))], 0.0, vec![Ok(s(2))]),
            (vec![Some(s(2))], 1.0, vec![Ok(s(3))]),
            // "0" (or a date past) is a plain failure: it backs off, and
            // uses up attempts.
            (vec![Some(s(0))], 0.0, vec![Ok(ms(125))]),
            (
                vec![Some(s(0)), Some(s(0)), Some(s(0)), Some(s(0)), Some(s(0))],
                0.0,
                vec![
                    Ok(ms(125)),
                    Ok(ms(250)),
                    Ok(ms(500)),
                    Ok(ms(1000)),
                    Err(GiveUp::Attempts),
                ],
            ),
            // Throttled answers do not use up attempts...
            (
                vec![
                    Some(s(1)),
                    Some(s(1)),
                    Some(s(1)),
                    Some(s(1)),
                    Some(s(1)),
                    None,
                ],
                0.0,
                vec![
                    Ok(s(1)),
                    Ok(s(1)),
                    Ok(s(1)),
                    Ok(s(1)),
                    Ok(s(1)),
                    Ok(ms(125)),
                ],
            ),
            // ...but their wait is bounded.
            (
                vec![
                    Some(s(60)),
                    Some(s(60)),
                    Some(s(60)),
                    Some(s(60)),
                    Some(s(60)),
                    Some(s(60)),
                ],
                0.0,
                vec![
                    Ok(s(60)),
                    Ok(s(60)),
                    Ok(s(60)),
                    Ok(s(60)),
                    Ok(s(60)),
                    Err(GiveUp::Throttled(s(300))),
                ],
            ),
            // Longer than we wait: final at once.
            (
                vec![Some(s(3600))],
                0.0,
                vec![Err(GiveUp::RetryAfterTooLong {
                    asked: s(3600),
                    max: s(60),
                })],
            ),
        ];
        for (asked, r, want) in cases {
            let mut used = Retries::default();
            let got: Vec<_> = asked
                .iter()
                .map(|a| p.after_failure(&mut used, *a, r))
                .collect();
            assert_eq!(got, want, "{asked:?} r {r}");
        }
    }

    #[test]
    fn attempts() {
        let p = RetryPolicy::default();
        // (failed attempt, another allowed)
        for (attempt, want) in [(1, true), (4, true), (5, false), (6, false)] {
            assert_eq!(p.may_retry(attempt), want, "{attempt}");
        }
    }
}
