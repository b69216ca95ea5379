//! Retry policy: which failures are worth another attempt, and capped
//! exponential backoff with jitter. Pure, so it is table-tested.

use std::time::Duration;

/// Attempts per request, the first included. A server that fails five
/// times in a row over ~8 s of backoff is down, not flaky.
pub const MAX_ATTEMPTS: u32 = 5;
/// First backoff delay.
pub const BASE_DELAY: Duration = Duration::from_millis(250);
/// Backoff never waits longer than this between attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(4);
/// Fraction of each delay that is randomised, so that many nodes retrying
/// the same server do not do so in lockstep.
pub const JITTER: f64 = 0.5;

/// Whether an HTTP status is transient: server errors, overload, and
/// request timeouts. Every other status is final.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 425 | 429 | 500 | 502 | 503 | 504)
}

/// The delay before attempt `attempt + 1` (`attempt` counts from 1), given
/// a uniform random number `r` in [0, 1): `BASE_DELAY * 2^(attempt-1)`,
/// capped at `MAX_DELAY`, of which the last `JITTER` fraction is random.
pub fn backoff(attempt: u32, r: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(16);
    let full = (BASE_DELAY.as_secs_f64() * f64::from(1u32 << exp)).min(MAX_DELAY.as_secs_f64());
    let r = r.clamp(0.0, 1.0);
    Duration::from_secs_f64(full * (1.0 - JITTER) + full * JITTER * r)
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
            assert_eq!(ms(backoff(attempt, r)), want, "attempt {attempt} r {r}");
        }
    }

    #[test]
    fn statuses() {
        for s in [500, 502, 503, 504, 429, 408] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [200, 304, 400, 403, 404, 410, 501] {
            assert!(!retryable_status(s), "{s}");
        }
    }
}
