//! Whether the listener has been refusing normal clients, and for how
//! long: a pod whose every connection is in use (and none idle to close)
//! is alive, so `/healthz` stays 200, but it is not ready for more, and
//! `/readyz` says so once that has lasted `--unready-after-refusing`, so
//! that the Service sends new clients to other pods. A refusal for a
//! client's own cap (per address, per network) is not the pod's state and
//! does not count, or one abuser could take the pod out of its Service.
//!
//! A leaf: the listener records, the HTTP surface reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Refusals this close together are one run, whatever the threshold.
const MIN_GAP: Duration = Duration::from_secs(1);

/// A run of refusals: when it started and when the latest was.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Streak {
    since: Option<Instant>,
    last: Option<Instant>,
}

impl Streak {
    /// A refusal at `now`: the run goes on if the previous one was within
    /// `threshold` (or [`MIN_GAP`]), else a new one starts.
    fn refused(self, now: Instant, threshold: Duration) -> Streak {
        let gap = threshold.max(MIN_GAP);
        let since = match (self.since, self.last) {
            (Some(since), Some(last)) if now.saturating_duration_since(last) <= gap => since,
            _ => now,
        };
        Streak {
            since: Some(since),
            last: Some(now),
        }
    }

    /// How long the run has lasted at `now`, if it is one that makes the
    /// pod unready: at least `threshold` long, its latest refusal within
    /// `threshold` or [`MIN_GAP`] (refusals that stopped, nobody asking,
    /// end it too).
    fn refusing(self, now: Instant, threshold: Duration) -> Option<Duration> {
        let (since, last) = (self.since?, self.last?);
        let lasted = now.saturating_duration_since(since);
        let recent = now.saturating_duration_since(last) <= threshold.max(MIN_GAP);
        (recent && lasted >= threshold).then_some(lasted)
    }
}

/// The listener's record of refusals, shared with `/readyz`.
#[derive(Debug)]
pub struct Saturation {
    threshold: Duration,
    streak: Mutex<Streak>,
    /// A run is on: `room` takes the lock only then, not at every accept.
    on: AtomicBool,
}

impl Saturation {
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold,
            streak: Mutex::default(),
            on: AtomicBool::new(false),
        }
    }

    /// A normal client was refused (or sent to the probe reserve) because
    /// every connection was in use.
    pub fn refused(&self) {
        let mut s = self.streak.lock().unwrap_or_else(PoisonError::into_inner);
        *s = s.refused(Instant::now(), self.threshold);
        self.on.store(true, Ordering::Relaxed);
    }

    /// A connection was admitted into room that was free: the run is over.
    pub fn room(&self) {
        if self.on.swap(false, Ordering::Relaxed) {
            *self.streak.lock().unwrap_or_else(PoisonError::into_inner) = Streak::default();
        }
    }

    /// How long the server has been refusing normal clients, once that is
    /// past the threshold.
    pub fn refusing(&self) -> Option<Duration> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        let s = *self.streak.lock().unwrap_or_else(PoisonError::into_inner);
        s.refusing(Instant::now(), self.threshold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streak_table() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let th = s(10);
        #[rustfmt::skip]
        let cases: &[(&str, &[u64], u64, Option<u64>)] = &[
            // (what, refusals at these seconds, asked at, refusing for)
            ("none", &[], 20, None),
            ("one, just now", &[0], 0, None),
            ("a run shorter than the threshold", &[0, 3, 6, 9], 9, None),
            ("a run as long as the threshold", &[0, 3, 6, 9, 10], 10, Some(10)),
            ("a long run, asked between refusals", &[0, 5, 10, 15], 18, Some(18)),
            ("refusals stopped: over after the threshold", &[0, 5, 10, 15], 26, None),
            ("a gap past the threshold starts a new run", &[0, 5, 20, 25], 25, None),
            ("...which lasts in its turn", &[0, 5, 20, 25, 30], 30, Some(10)),
        ];
        for &(what, at, asked, want) in cases {
            let streak = at
                .iter()
                .fold(Streak::default(), |st, &t| st.refused(t0 + s(t), th));
            assert_eq!(streak.refusing(t0 + s(asked), th), want.map(s), "{what}");
        }
    }

    #[test]
    fn room_ends_a_run() {
        let sat = Saturation::new(Duration::ZERO);
        sat.refused();
        assert!(sat.refusing().is_some(), "a zero threshold: at once");
        sat.room();
        assert_eq!(sat.refusing(), None);
        sat.room();
        assert_eq!(sat.refusing(), None);
    }
}
