//! A compromised worker, as seen from a node: a loopback HTTP server
//! (HTTP/1.1 and h2c, like the real one) in front of a genuine server,
//! which forwards every request except those its rule rewrites.
//!
//! Bounded: forwarded bodies are read up to [`MAX_FORWARD`], generated
//! bodies stop at their cap or when the client hangs up, and the proxy
//! runs until dropped.

use axum::body::Body;
use axum::extract::State;
use axum::http;
use axum::response::Response;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest upstream body forwarded (fixture objects are a few MiB).
const MAX_FORWARD: usize = 256 << 20;
/// Chunk size of generated bodies.
const CHUNK: usize = 64 << 10;
/// Requests remembered for messages.
const MAX_LOGGED: usize = 10_000;

/// What the proxy answers for one path.
#[derive(Debug, Clone)]
pub enum Action {
    /// Forward to this server (base URL, no trailing slash).
    Forward(String),
    /// 200 with these bytes.
    Bytes(Bytes),
    /// This status, empty body.
    Status(u16),
    /// 200 with generated garbage: `announce` as Content-Length if given
    /// (else chunked on HTTP/1.1), at most `cap` bytes actually sent.
    Garbage { announce: Option<u64>, cap: u64 },
}

/// The attack: `Some(action)` for the paths it rewrites.
pub type Rule = Arc<dyn Fn(&str) -> Option<Action> + Send + Sync>;

struct Inner {
    upstream: String,
    rule: Rule,
    client: reqwest::Client,
    generated: AtomicU64,
    log: Mutex<Vec<String>>,
}

/// A running proxy; stopped when dropped.
pub struct Proxy {
    pub url: String,
    inner: Arc<Inner>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0, forwarding to `upstream` unless `rule` says
    /// otherwise.
    pub fn start(upstream: &str, rule: Rule) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let inner = Arc::new(Inner {
            upstream: upstream.trim_end_matches('/').to_owned(),
            rule,
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            generated: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let state = inner.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new().fallback(handle).with_state(state);
                tokio::select! {
                    r = axum::serve(listener, app) => r.unwrap(),
                    _ = rx => {}
                }
            });
            // Connections still streaming are cut here.
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        Proxy {
            url,
            inner,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Bytes of generated garbage sent so far.
    pub fn garbage_sent(&self) -> u64 {
        self.inner.generated.load(Ordering::Relaxed)
    }

    /// "METHOD path -> action" for every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.inner.log.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn status(code: u16) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap();
    r
}

async fn handle(State(st): State<Arc<Inner>>, method: http::Method, uri: http::Uri) -> Response {
    let path = uri.path().to_owned();
    let action = (st.rule)(&path).unwrap_or_else(|| Action::Forward(st.upstream.clone()));
    {
        let mut log = st.log.lock().unwrap();
        if log.len() < MAX_LOGGED {
            let shown = match &action {
                Action::Forward(u) if *u == st.upstream => "forward".to_owned(),
                Action::Forward(u) => format!("forward to {u}"),
                Action::Bytes(b) => format!("{} bytes", b.len()),
                Action::Status(s) => format!("status {s}"),
                Action::Garbage { announce, cap } => {
                    format!("garbage (announce {announce:?}, cap {cap})")
                }
            };
            log.push(format!("{method} {path} -> {shown}"));
        }
    }
    match action {
        Action::Status(s) => status(s),
        Action::Bytes(b) => Response::new(Body::from(b)),
        Action::Forward(base) => forward(&st, &method, &base, &uri).await,
        Action::Garbage { announce, cap } => {
            let limit = announce.map_or(cap, |a| a.min(cap));
            let st2 = st.clone();
            let chunks = futures_util::stream::unfold(0u64, move |sent| {
                let st = st2.clone();
                async move {
                    if sent >= limit {
                        return None;
                    }
                    let n = (limit - sent).min(CHUNK as u64) as usize;
                    // Not zeros: a compressor or a sparse read must not
                    // make this cheap for the client.
                    let chunk: Vec<u8> = (0..n)
                        .map(|i| ((sent as usize + i) as u8).wrapping_mul(167) ^ 0x5a)
                        .collect();
                    st.generated.fetch_add(n as u64, Ordering::Relaxed);
                    Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), sent + n as u64))
                }
            });
            let mut r = Response::new(Body::from_stream(chunks));
            if let Some(a) = announce {
                r.headers_mut()
                    .insert(http::header::CONTENT_LENGTH, a.to_string().parse().unwrap());
            }
            r
        }
    }
}

async fn forward(st: &Inner, method: &http::Method, base: &str, uri: &http::Uri) -> Response {
    let url = format!(
        "{base}{}",
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let m = if method == http::Method::HEAD {
        reqwest::Method::HEAD
    } else {
        reqwest::Method::GET
    };
    let resp = match st.client.request(m, &url).send().await {
        Ok(r) => r,
        Err(_) => return status(502),
    };
    let code = resp.status().as_u16();
    let len = resp.content_length();
    let body = match resp.bytes().await {
        Ok(b) if b.len() <= MAX_FORWARD => b,
        _ => return status(502),
    };
    let mut r = if method == http::Method::HEAD {
        let mut r = Response::new(Body::empty());
        if let Some(l) = len {
            r.headers_mut()
                .insert(http::header::CONTENT_LENGTH, l.to_string().parse().unwrap());
        }
        r
    } else {
        Response::new(Body::from(body))
    };
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap();
    r
}
