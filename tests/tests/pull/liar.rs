//! A server that lies about one thing: a loopback HTTP server (HTTP/1.1
//! and h2c) that serves an archive repo directory as stock ostree lays it
//! out, except for the paths its rule rewrites.
//!
//! Bounded: files are read whole (fixture repos are small), a drip stops
//! at its length or when the client hangs up, and the server runs until
//! dropped.

use axum::body::Body;
use axum::extract::State;
use axum::http;
use axum::response::Response;
use bytes::Bytes;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the liar answers instead of the file.
#[derive(Debug, Clone)]
pub enum Lie {
    /// This status, empty body.
    Status(u16),
    /// 200 with these bytes.
    Bytes(Bytes),
    /// 302 to this location (absolute, or relative to the request).
    Redirect(String),
    /// 200 announcing `len` bytes, then one byte every `every`.
    Drip { len: u64, every: Duration },
}

/// `Some(lie)` for the paths (with their leading `/`) it rewrites.
pub type Rule = Arc<dyn Fn(&str) -> Option<Lie> + Send + Sync>;

struct Inner {
    root: PathBuf,
    rule: Rule,
    dripped: AtomicU64,
}

/// A running liar; stopped when dropped.
pub struct Liar {
    pub url: String,
    inner: Arc<Inner>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Liar {
    /// Serves `root` on 127.0.0.1:0, unless `rule` says otherwise.
    pub fn start(root: &Path, rule: Rule) -> Liar {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the liar");
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let inner = Arc::new(Inner {
            root: root.to_path_buf(),
            rule,
            dripped: AtomicU64::new(0),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let state = inner.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
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
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        Liar {
            url,
            inner,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// A liar that serves `root` and rewrites exactly one path.
    pub fn one(root: &Path, path: &str, lie: Lie) -> Liar {
        let path = path.to_owned();
        Liar::start(
            root,
            Arc::new(move |p: &str| (p == path).then(|| lie.clone())),
        )
    }

    /// Bytes dripped so far.
    pub fn dripped(&self) -> u64 {
        self.inner.dripped.load(Ordering::Relaxed)
    }
}

impl Drop for Liar {
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

fn ok(body: Body, len: u64) -> Response {
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(http::header::CONTENT_LENGTH, len.into());
    r
}

async fn handle(State(st): State<Arc<Inner>>, uri: http::Uri) -> Response {
    let path = uri.path().to_owned();
    match (st.rule)(&path) {
        Some(Lie::Status(code)) => status(code),
        Some(Lie::Bytes(b)) => {
            let len = b.len() as u64;
            ok(Body::from(b), len)
        }
        Some(Lie::Redirect(to)) => {
            let mut r = status(302);
            r.headers_mut()
                .insert(http::header::LOCATION, to.parse().unwrap());
            r
        }
        Some(Lie::Drip { len, every }) => {
            let state = st.clone();
            let stream = futures_util::stream::unfold(0u64, move |sent| {
                let state = state.clone();
                async move {
                    if sent >= len {
                        return None;
                    }
                    tokio::time::sleep(every).await;
                    state.dripped.fetch_add(1, Ordering::Relaxed);
                    Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), sent + 1))
                }
            });
            ok(Body::from_stream(stream), len)
        }
        None => serve_file(&st.root, &path).await,
    }
}

/// The file under `root` that a clean request path names; 404 otherwise.
async fn serve_file(root: &Path, path: &str) -> Response {
    let rel = Path::new(path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return status(404);
    }
    match tokio::fs::read(root.join(rel)).await {
        Ok(b) => {
            let len = b.len() as u64;
            ok(Body::from(b), len)
        }
        Err(_) => status(404),
    }
}
