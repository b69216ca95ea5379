//! The HTTP listener: the accept loop axum's own `serve` does not give us.
//! Every connection gets hyper's timer (so its header-read timeout works),
//! a first-byte and an idle watchdog, HTTP/2 keepalive pings and small
//! HTTP/2 buffers, and a place under the total, per-client and
//! per-network caps; when the total is full, the connection idle the
//! longest is closed to make room (`idle.rs`), and with none idle a small
//! reserve of connections answers only the probes, while `/readyz` learns
//! how long that lasts (`http/saturation.rs`). The access log's writer
//! (`http/access_log.rs`) and the repo answer (`http/answer.rs`) sit in
//! `http`, below this module: `listen` imports `http`, never the other way.

mod h1;
pub mod idle;
pub mod limits;
pub mod watch;
mod workers;

use crate::http::saturation::Saturation;
use crate::http::AppState;
use crate::metrics::Metrics;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use idle::ConnIdle;
use limits::{Admission, Limits, Tracker};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;
use watch::{Activity, Expiry, Watched};

/// The longest HTTP/1.1 request head (request line and headers) read;
/// ostree's and our client's are a few hundred bytes.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The most HTTP/1.1 request headers.
const MAX_HEADERS: usize = 64;
/// The largest HTTP/2 header list a client may send.
const MAX_H2_HEADER_LIST: u32 = 16 * 1024;
/// After a failed accept (EMFILE and the like), how long to wait before
/// the next, so the loop does not spin while descriptors are short.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// A probe-reserve connection must bring its whole request within this,
/// and serves one request: a kubelet probe sends at once, and an abuser
/// that lands in the reserve holds its place only this long.
const RESERVE_TIMEOUT: Duration = Duration::from_secs(1);

/// What a worker runs before its runtime parks (`AppState::idle`).
pub type Idle = Arc<dyn Fn() + Send + Sync>;

/// What requests are answered with: the router (its routes), the state
/// repo answers are made from (`http::answer`), and what a worker does
/// when idle.
#[derive(Clone)]
pub struct App {
    router: Router,
    state: AppState,
    idle: Idle,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

impl App {
    pub fn new(router: Router, state: AppState, idle: Idle) -> Self {
        Self {
            router,
            state,
            idle,
        }
    }

    /// A request hyper read. A repo path's answer is the one the router's
    /// fallback gives, asked for without the router's dispatch (its route
    /// lookup, boxed middleware and extractors: 2-4% of an HTTP/2 pull's
    /// CPU).
    async fn answer(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        if crate::http::routed(req.uri().path()) {
            let Ok(r) = self.router.clone().oneshot(req.map(Body::new)).await;
            return r;
        }
        let (head, _) = req.into_parts();
        crate::http::answer::answer_request(&self.state, &head).await
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves,
/// then stops accepting and lets open connections finish their requests.
/// `workers` threads accept from the listener, each serving the
/// connections it accepted on a single-threaded runtime of its own
/// (`workers.rs`); the caps hold across them all. `saturation` hears
/// of the clients refused for want of room (`/readyz` reads it).
pub async fn serve(
    listener: TcpListener,
    workers: NonZeroUsize,
    app: App,
    (limits, saturation): (Limits, Arc<Saturation>),
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = Arc::new(limits);
    let shared = Arc::new(Shared {
        tracker: Tracker::new(limits.clone(), saturation),
        builders: Builders {
            fresh: connection_builder(&limits),
            after_h1: connection_builder(&limits).http1_only(),
            reserve: reserve_builder(&limits),
        },
        limits,
        app,
        metrics,
    });
    workers::run(listener, workers, shared, shutdown).await
}

/// What every worker's accept loop serves with.
struct Shared {
    limits: Arc<Limits>,
    /// One count of open connections for all workers.
    tracker: Tracker,
    builders: Builders,
    app: App,
    metrics: Arc<Metrics>,
}

// long-fn: one select over accept, the caps and shutdown, so the order of its decisions reads in one place
/// Accepts and serves connections on `listener` until `shutdown` says
/// so, then waits for the connections it accepted to finish.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Shared {
        limits,
        tracker,
        app,
        metrics,
        ..
    } = &*shared;
    // Every connection holds a receiver: closed once all have ended.
    let (stop, _) = tokio::sync::watch::channel(false);
    // One wait for the whole loop: a new one at every accept registered
    // with the channel and unregistered again, under its lock.
    let mut stopping = std::pin::pin!(async {
        let _ = shutdown.wait_for(|stop| *stop).await;
    });
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = &mut stopping => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                metrics
                    .connections
                    .refused
                    .with_label_values(&["accept_error"])
                    .inc();
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let slot = match tracker.admit(peer.ip()) {
            Ok(s) => s,
            Err(why) => {
                metrics
                    .connections
                    .refused
                    .with_label_values(&[why.label()])
                    .inc();
                refuse(stream);
                continue;
            }
        };
        metrics.connections.accepted.inc();
        if slot.made_room {
            metrics.connections.idle_closed.inc();
        }
        if let Some(why) = slot.over {
            metrics
                .connections
                .reserved
                .with_label_values(&[why.label()])
                .inc();
        }
        // Without TCP_NODELAY, Nagle plus the client's delayed ACK adds
        // ~40 ms to every small response on a keep-alive connection.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let act = Activity::new();
        let io = Watched::new(stream, act.clone());
        let probe_only = slot.admission == Admission::ProbeOnly;
        let conn_idle = slot.idle.clone();
        let svc = Svc {
            app: app.clone(),
            probe_only,
            peer,
            act: act.clone(),
            idle: conn_idle.clone(),
        };
        let (first_byte, idle, h1) = if probe_only {
            (RESERVE_TIMEOUT, RESERVE_TIMEOUT, None)
        } else {
            let h1 = h1::Conn {
                state: app.state.clone(),
                peer,
                act: act.clone(),
                idle: conn_idle.clone(),
                header_read_timeout: limits.header_read_timeout,
                shutdown: stop.subscribe(),
            };
            (limits.first_byte_timeout, limits.idle_timeout, Some(h1))
        };
        let shared = shared.clone();
        let stopping = stop.subscribe();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _open = OpenGauge::new(&metrics, probe_only);
            // The connection first: what the peer sent is read (and
            // answered) before the watchdog judges it idle.
            tokio::select! {
                biased;
                r = drive(io, h1, &shared.builders, svc, stopping, &conn_idle) => if let Err(e) = r {
                    tracing::debug!(%peer, "connection: {e}");
                    if let Some(why) = Expiry::of_connection_error(&*e, &act) {
                        metrics.connections.expired.with_label_values(&[why.label()]).inc();
                    }
                },
                why = watch::watchdog(act.clone(), first_byte, idle) => {
                    // Dropping the connection closes the socket.
                    tracing::debug!(%peer, reason = why.label(), "closing an inactive connection");
                    metrics.connections.expired.with_label_values(&[why.label()]).inc();
                }
            }
        });
    }
    drop(listener);
    // Idle connections close; busy ones finish their request (HTTP/1.1)
    // or their streams (HTTP/2, after a GOAWAY).
    let _ = stop.send(true);
    stop.closed().await;
}

/// One connection: plain HTTP/1.1 requests answered by `h1` (given), the
/// rest of the connection, or all of it, by hyper; until it closes, or
/// gracefully once `stopping` says so or it was chosen to make room
/// (`idle`: then it has no request in flight).
async fn drive(
    io: Watched<TcpStream>,
    h1: Option<h1::Conn>,
    builders: &Builders,
    svc: Svc,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    idle: &ConnIdle,
) -> Result<(), h1::BoxError> {
    let (io, builder) = match h1 {
        Some(conn) => match h1::serve(io, conn).await? {
            h1::Ended::Closed => return Ok(()),
            h1::Ended::Hyper { io, answered } if answered => (io, &builders.after_h1),
            h1::Ended::Hyper { io, .. } => (io, &builders.fresh),
        },
        None => (
            h1::Prefixed::new(bytes::Bytes::new(), io),
            &builders.reserve,
        ),
    };
    // Boxed: most connections never get here, and every connection's task
    // is as large as its largest state, moved whole when it is spawned.
    let mut conn = Box::pin(builder.serve_connection(TokioIo::new(io), svc));
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = stopping.wait_for(|stop| *stop) => {}
        () = idle.evicted() => {}
    }
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// hyper's service: each request, through [`respond`].
#[derive(Clone)]
struct Svc {
    app: App,
    probe_only: bool,
    peer: SocketAddr,
    act: Arc<Activity>,
    idle: Arc<ConnIdle>,
}

impl hyper::service::Service<Request<hyper::body::Incoming>> for Svc {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, req: Request<hyper::body::Incoming>) -> Self::Future {
        self.act.requested();
        // Busy until the answer's body is done (or dropped).
        let guard = self.idle.request();
        let answer = respond(self.app.clone(), self.probe_only, self.peer, req);
        Box::pin(async move {
            let r = answer.await?;
            Ok(r.map(|body| idle::tracked(body, guard)))
        })
    }
}

/// hyper's settings for a connection: new (HTTP/1.1 or HTTP/2, by its
/// first bytes), handed over after HTTP/1.1 requests (HTTP/1.1 only: the
/// HTTP/2 preface is prior knowledge at a connection's start and nowhere
/// else, RFC 9113 §3.4), and in the probe reserve.
struct Builders {
    fresh: auto::Builder<TokioExecutor>,
    after_h1: auto::Builder<TokioExecutor>,
    reserve: auto::Builder<TokioExecutor>,
}

/// hyper's per-connection settings from `limits`.
fn connection_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES.max(8192))
        .max_headers(MAX_HEADERS)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_keepalive)
        .keep_alive_timeout(limits.h2_keepalive)
        .max_concurrent_streams(limits.h2_max_streams)
        .max_send_buf_size(limits.h2_send_buffer)
        .max_header_list_size(MAX_H2_HEADER_LIST);
    b
}

/// For the probe reserve: one request a connection, its head within
/// [`RESERVE_TIMEOUT`].
fn reserve_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut b = connection_builder(limits);
    b.http1()
        .header_read_timeout(RESERVE_TIMEOUT)
        .keep_alive(false);
    b
}

/// One request. On a probe-reserve connection only the probes and
/// `/metrics` (which shows the abuse) are served; anything else is told to
/// come back, and the connection is closed.
async fn respond(
    app: App,
    probe_only: bool,
    peer: SocketAddr,
    mut req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    if probe_only && !crate::http::ROUTES.contains(&req.uri().path()) {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let h = r.headers_mut();
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        return Ok(r);
    }
    // The access log names the client, as axum's `ConnectInfo` would.
    req.extensions_mut().insert(ConnectInfo(peer));
    Ok(app.answer(req).await)
}

/// Closes a refused connection at once, with a reset: nothing of it stays
/// in TIME_WAIT on our side, and the client learns immediately.
fn refuse(stream: TcpStream) {
    if let Err(e) = stream.set_zero_linger() {
        tracing::debug!("SO_LINGER: {e}");
    }
}

/// The open-connections gauge, decremented when the connection ends.
struct OpenGauge(prometheus::IntGauge);

impl OpenGauge {
    fn new(m: &Metrics, probe_only: bool) -> Self {
        let g = m.connections.open_now(probe_only).clone();
        g.inc();
        Self(g)
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}
