//! One misbehaving HTTP proxy on loopback, driven by a rule.
//!
//! A [`Proxy`] stands in front of a genuine peer (our server, a
//! docker-registry, or a repo directory it serves itself as stock ostree
//! lays it out) and forwards every request, headers and body streamed
//! both ways, except where its [`Rule`] says otherwise: answer with other
//! bytes, a status, a redirect, endless garbage, a slow drip, or cut the
//! response mid-body. On top
//! of any rule it can hold every response once a byte budget is spent
//! ([`ProxyBuilder::stall_after`]) and refuse HTTP/2 so that clients fall
//! back to HTTP/1.1 ([`ProxyBuilder::http1_only`]).
//!
//! The suites use it three ways: a compromised worker lying to a node (the
//! hostile suite), transient faults a client must retry past ([`Faults`]),
//! and a transfer that stalls while a server streams an image.
//!
//! Bounded: forwarded bodies stream (nothing is buffered whole), generated
//! bodies stop at their cap or when the client hangs up, a stall lasts at
//! most [`STALL_LIMIT`], and the proxy stops when dropped.

mod body;
mod faults;

pub use faults::{FaultStats, Faults};

use anyhow::{Context, Result};
use axum::body::Body;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest a held response waits to be unthrottled.
pub const STALL_LIMIT: Duration = Duration::from_secs(300);
/// Requests remembered for messages.
const MAX_LOGGED: usize = 10_000;
/// Timeout of one forwarded request, body included.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a connection may take to show its first bytes before the
/// HTTP/1.1-only check gives up on it.
const PREFACE_WAIT: Duration = Duration::from_secs(30);
/// Response bodies shorter than this are never cut (nothing to cut into).
const MIN_CUT: u64 = 64;

/// What the proxy answers for one request.
#[derive(Debug, Clone)]
pub enum Action {
    /// Forward to the proxy's upstream.
    Forward,
    /// Forward to another server (base URL, no trailing slash).
    ForwardTo(String),
    /// Forward, then close the connection half-way through the body (for
    /// bodies of at least 64 bytes with a known length).
    Cut,
    /// 200 with these bytes.
    Bytes(Bytes),
    /// This status, empty body.
    Status(u16),
    /// This status with this `Retry-After`, empty body.
    Later { status: u16, retry_after: String },
    /// 200 with generated garbage: `announce` as Content-Length if given
    /// (else chunked on HTTP/1.1), at most `cap` bytes actually sent.
    Garbage { announce: Option<u64>, cap: u64 },
    /// 302 to this location (absolute, or relative to the request).
    Redirect(String),
    /// 200 announcing `len` bytes, then one byte every `every`.
    Drip { len: u64, every: Duration },
}

/// A rule that rewrites exactly `path` (with its leading `/`).
pub fn only(path: &str, action: Action) -> Rule {
    let path = path.to_owned();
    Arc::new(move |p: &str| (p == path).then(|| action.clone()))
}

/// Where forwarded requests go.
#[derive(Debug, Clone)]
enum Upstream {
    /// A server's base URL, no trailing slash.
    Url(String),
    /// A directory served as static files (a repo as stock ostree lays
    /// it out), for a peer that must not depend on our server.
    Dir(std::path::PathBuf),
}

/// The misbehaviour: `Some(action)` for the paths it rewrites; `None`
/// forwards. Called once per request, in arrival order per connection.
pub type Rule = Arc<dyn Fn(&str) -> Option<Action> + Send + Sync>;

/// What the proxy did, for assertions.
#[derive(Debug, Default)]
struct Counters {
    /// Connections that opened with the HTTP/2 preface and were refused
    /// ([`ProxyBuilder::http1_only`]).
    h2_prefaces: AtomicUsize,
    /// Responses actually cut mid-body.
    cuts: AtomicUsize,
    /// Bytes of generated garbage sent.
    garbage: AtomicU64,
    /// Bytes of [`Action::Drip`] bodies sent.
    dripped: AtomicU64,
    /// "METHOD path -> action", first [`MAX_LOGGED`].
    log: Mutex<Vec<String>>,
}

/// A byte budget over all forwarded response bodies; once spent, bodies
/// hold until it is raised.
#[derive(Debug)]
struct Gate {
    limit: AtomicU64,
    sent: AtomicU64,
    stalled: AtomicBool,
}

struct Shared {
    upstream: Upstream,
    rule: Rule,
    client: reqwest::Client,
    counters: Counters,
    gate: Gate,
    stop: AtomicBool,
}

/// How to start a [`Proxy`].
#[derive(Clone)]
pub struct ProxyBuilder {
    upstream: Upstream,
    rule: Rule,
    http1_only: bool,
    stall_after: u64,
}

impl std::fmt::Debug for ProxyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyBuilder")
            .field("upstream", &self.upstream)
            .field("http1_only", &self.http1_only)
            .field("stall_after", &self.stall_after)
            .finish_non_exhaustive()
    }
}

impl ProxyBuilder {
    /// The misbehaviour (default: forward everything).
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rule = rule;
        self
    }

    /// Refuse connections that open with the HTTP/2 preface, as an
    /// HTTP/1.1-only server would, so a client's prior-knowledge attempt
    /// fails and it falls back.
    pub fn http1_only(mut self) -> Self {
        self.http1_only = true;
        self
    }

    /// Hold every response body once `bytes` of forwarded bodies have gone
    /// out in all, until [`Proxy::unthrottle`].
    pub fn stall_after(mut self, bytes: u64) -> Self {
        self.stall_after = bytes;
        self
    }

    /// Listens on 127.0.0.1:0.
    pub fn start(self) -> Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding the proxy")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: self.upstream,
            rule: self.rule,
            // Transparent: no redirects followed, no decompression, no
            // proxy from the environment; plain HTTP upstream, so no CA
            // roots to load.
            client: reqwest::Client::builder()
                .tls_built_in_root_certs(false)
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(FORWARD_TIMEOUT)
                .build()
                .context("building the proxy's client")?,
            counters: Counters::default(),
            gate: Gate {
                limit: AtomicU64::new(self.stall_after),
                sent: AtomicU64::new(0),
                stalled: AtomicBool::new(false),
            },
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        let http1_only = self.http1_only;
        let thread = std::thread::Builder::new()
            .name("test-proxy".into())
            .spawn(move || run(listener, state, http1_only, rx))
            .context("starting the proxy thread")?;
        Ok(Proxy {
            addr,
            url: format!("http://{addr}"),
            shared,
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

/// A running proxy; stopped when dropped (connections still streaming are
/// cut).
pub struct Proxy {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("url", &self.url)
            .field("upstream", &self.shared.upstream)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy in front of `upstream` (a base URL such as
    /// `http://127.0.0.1:5000`) that forwards everything until told
    /// otherwise.
    pub fn builder(upstream: &str) -> ProxyBuilder {
        Self::builder_for(Upstream::Url(upstream.trim_end_matches('/').to_owned()))
    }

    /// A proxy that serves the files under `root` itself (404 for what is
    /// not there) unless `rule` says otherwise.
    pub fn serve_dir(root: &std::path::Path, rule: Rule) -> Result<Proxy> {
        Self::builder_for(Upstream::Dir(root.to_owned()))
            .rule(rule)
            .start()
    }

    fn builder_for(upstream: Upstream) -> ProxyBuilder {
        ProxyBuilder {
            upstream,
            rule: Arc::new(|_: &str| None),
            http1_only: false,
            stall_after: u64::MAX,
        }
    }

    /// A proxy that forwards to `upstream` unless `rule` says otherwise.
    pub fn start(upstream: &str, rule: Rule) -> Result<Proxy> {
        Self::builder(upstream).rule(rule).start()
    }

    /// `127.0.0.1:PORT`, for image references and `--insecure-registry`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Connections refused for opening with the HTTP/2 preface.
    pub fn h2_prefaces(&self) -> usize {
        self.shared.counters.h2_prefaces.load(Ordering::SeqCst)
    }

    /// Responses cut mid-body.
    pub fn cuts(&self) -> usize {
        self.shared.counters.cuts.load(Ordering::SeqCst)
    }

    /// Bytes of [`Action::Drip`] bodies sent so far.
    pub fn dripped(&self) -> u64 {
        self.shared.counters.dripped.load(Ordering::Relaxed)
    }

    /// Bytes of generated garbage sent so far.
    pub fn garbage_sent(&self) -> u64 {
        self.shared.counters.garbage.load(Ordering::Relaxed)
    }

    /// "METHOD path -> action" for every request so far (the first 10,000).
    pub fn requests(&self) -> Vec<String> {
        self.shared.counters.log.lock().unwrap().clone()
    }

    /// Whether a response is being held by the byte budget.
    pub fn stalled(&self) -> bool {
        self.shared.gate.stalled.load(Ordering::SeqCst)
    }

    /// No budget from now on: held responses resume.
    pub fn unthrottle(&self) {
        self.shared.gate.limit.store(u64::MAX, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The proxy's send buffer per connection (the kernel doubles it).
const SEND_BUFFER: usize = 128 << 10;

/// The proxy's own runtime: accept until stopped, one task per connection.
fn run(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    http1_only: bool,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the proxy's runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("the proxy's listener");
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    // A fixed send buffer (no autotuning): what a lying
                    // body can push ahead of a client that reads none of
                    // it is then bounded by buffers, not by how fast the
                    // client, on a loaded machine, gets to close.
                    let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER);
                    tokio::spawn(connection(stream, shared.clone(), http1_only));
                }
                _ = &mut stop => break,
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
}

async fn connection(stream: tokio::net::TcpStream, shared: Arc<Shared>, http1_only: bool) {
    if http1_only && opens_with_h2_preface(&stream).await {
        shared.counters.h2_prefaces.fetch_add(1, Ordering::SeqCst);
        return;
    }
    let service = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
    });
    let io = TokioIo::new(stream);
    let _ = if http1_only {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await
            .map_err(|e| e.to_string())
    } else {
        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await
            .map_err(|e| e.to_string())
    };
}

/// Whether the client's first bytes are HTTP/2's connection preface
/// (`PRI * HTTP/2.0`), looked at without consuming them.
async fn opens_with_h2_preface(stream: &tokio::net::TcpStream) -> bool {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0";
    let mut buf = [0u8; PREFACE.len()];
    let look = async {
        loop {
            match stream.peek(&mut buf).await {
                // Closed, or enough to tell: a request line differs from
                // the preface within its first bytes.
                Ok(0) => return false,
                Ok(n) if n == buf.len() || !PREFACE.starts_with(&buf[..n]) => {
                    return buf[..n] == *PREFACE
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                Err(_) => return false,
            }
        }
    };
    tokio::time::timeout(PREFACE_WAIT, look)
        .await
        .unwrap_or(false)
}

/// One request: log it, ask the rule, answer.
async fn handle(shared: &Arc<Shared>, req: hyper::Request<Incoming>) -> hyper::Response<Body> {
    let path = req.uri().path().to_owned();
    let action = (shared.rule)(&path).unwrap_or(Action::Forward);
    {
        let mut log = shared.counters.log.lock().unwrap();
        if log.len() < MAX_LOGGED {
            log.push(format!("{} {path} -> {}", req.method(), describe(&action)));
        }
    }
    match action {
        Action::Status(code) => status(code),
        Action::Later {
            status: code,
            retry_after,
        } => {
            let mut r = status(code);
            if let Ok(v) = retry_after.parse() {
                r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
            }
            r
        }
        Action::Bytes(b) => hyper::Response::new(Body::from(b)),
        Action::Garbage { announce, cap } => body::garbage(shared, announce, cap),
        Action::Redirect(to) => {
            let mut r = status(302);
            if let Ok(v) = to.parse() {
                r.headers_mut().insert(hyper::header::LOCATION, v);
            }
            r
        }
        Action::Drip { len, every } => body::drip(shared, len, every),
        Action::Forward | Action::Cut => match &shared.upstream {
            Upstream::Url(base) => {
                body::forward(shared, base, req, matches!(action, Action::Cut)).await
            }
            Upstream::Dir(root) => body::file(root, &req).await,
        },
        Action::ForwardTo(base) => body::forward(shared, &base, req, false).await,
    }
}

fn describe(action: &Action) -> String {
    match action {
        Action::Forward => "forward".to_owned(),
        Action::ForwardTo(u) => format!("forward to {u}"),
        Action::Cut => "forward, cut mid-body".to_owned(),
        Action::Bytes(b) => format!("{} bytes", b.len()),
        Action::Status(s) => format!("status {s}"),
        Action::Later {
            status,
            retry_after,
        } => format!("status {status}, retry after {retry_after}"),
        Action::Garbage { announce, cap } => format!("garbage (announce {announce:?}, cap {cap})"),
        Action::Redirect(to) => format!("redirect to {to}"),
        Action::Drip { len, every } => format!("drip {len} bytes, one per {every:?}"),
    }
}

fn status(code: u16) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Body::empty());
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    r
}
