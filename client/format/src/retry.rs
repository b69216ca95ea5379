//! The retry policy for requests to a remote, shared by the node client and
//! the mirror: which failures are worth another attempt, how many attempts,
//! and capped exponential backoff with jitter. Pure (the random number comes
//! from the caller), so it is table-tested.

use std::time::Duration;

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
    };

    /// Whether an HTTP status is transient: server errors, overload, and
    /// request timeouts. Every other status is final.
    pub fn retryable_status(status: u16) -> bool {
        matches!(status, 408 | 425 | 429 | 500 | 502 | 503 | 504)
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
    fn attempts() {
        let p = RetryPolicy::default();
        // (failed attempt, another allowed)
        for (attempt, want) in [(1, true), (4, true), (5, false), (6, false)] {
            assert_eq!(p.may_retry(attempt), want, "{attempt}");
        }
    }
}
