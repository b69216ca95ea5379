//! Whether a connection is idle, for the cap's sake: when every place is
//! taken, the connection idle the longest is closed to make room for a new
//! one (as nginx reuses its keep-alive connections), rather than refusing
//! everyone. Idle means waiting for a request with nothing of one read: an
//! HTTP/1.1 connection between requests (or before its first), a
//! connection handed to hyper with no request in flight after its first.
//! A connection mid-request, or streaming an answer, is never closed for
//! room. Marking costs the connection an atomic store per request; only
//! the search for the oldest (`limits::Tracker`, when the cap is full)
//! looks at them all.

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// One connection's idleness, shared with the tracker.
#[derive(Debug)]
pub struct ConnIdle {
    epoch: Instant,
    /// Milliseconds after `epoch`, plus one, since it went idle; 0 while
    /// busy.
    since: AtomicU64,
    /// Requests hyper is answering on it.
    in_flight: AtomicUsize,
    /// Chosen to make room: its place is already given away.
    evicted: AtomicBool,
    notify: tokio::sync::Notify,
}

impl ConnIdle {
    /// A connection accepted now, not idle yet; `epoch` is the tracker's.
    pub fn new(epoch: Instant) -> Arc<Self> {
        Arc::new(Self {
            epoch,
            since: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            evicted: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// It waits for a request, with nothing of one read.
    pub fn idle(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.since.store(ms + 1, Ordering::Relaxed);
    }

    /// Something of a request arrived. False if it was chosen to make room
    /// meanwhile: its place is gone, and it is to close.
    pub fn busy(&self) -> bool {
        self.since.store(0, Ordering::Relaxed);
        !self.evicted.load(Ordering::Acquire)
    }

    /// Since when it has been idle (the tracker's milliseconds), if it is.
    pub(super) fn idle_since(&self) -> Option<u64> {
        match self.since.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(ms),
        }
    }

    pub(super) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Chosen to make room: it closes at its next look.
    pub(super) fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        // Stores a permit when nobody waits yet.
        self.notify.notify_one();
    }

    /// Resolves once it was chosen to make room.
    pub async fn evicted(&self) {
        if self.is_evicted() {
            return;
        }
        self.notify.notified().await;
    }

    /// A request hyper answers: busy until the guard (and the body it is
    /// moved into, [`tracked`]) is dropped.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.since.store(0, Ordering::Relaxed);
        InFlight(self.clone())
    }
}

/// A request in flight on a connection hyper serves.
#[derive(Debug)]
pub struct InFlight(Arc<ConnIdle>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle();
        }
    }
}

/// `body`, holding `guard` until it is done or dropped.
pub fn tracked(body: Body, guard: InFlight) -> Body {
    Body::new(Tracked {
        body,
        _guard: guard,
    })
}

struct Tracked {
    body: Body,
    _guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_in_flight_keep_it_busy_and_the_last_one_ends_it() {
        let c = ConnIdle::new(Instant::now());
        assert_eq!(c.idle_since(), None, "a new connection is not idle");
        c.idle();
        assert!(c.idle_since().is_some());
        let (a, b) = (c.request(), c.request());
        assert_eq!(c.idle_since(), None);
        drop(a);
        assert_eq!(c.idle_since(), None, "one still in flight");
        let body = tracked(Body::from("x"), b);
        assert_eq!(c.idle_since(), None, "its body is still being sent");
        drop(body);
        assert!(c.idle_since().is_some(), "idle once the last body went");
        assert!(c.busy(), "not chosen");
        c.evict();
        assert!(!c.busy(), "chosen: to close");
        tokio::time::timeout(std::time::Duration::from_secs(1), c.evicted())
            .await
            .expect("told");
    }
}
