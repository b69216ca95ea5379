//! The HTTP surface: exactly ostree's archive layout, plus `/healthz`,
//! `/readyz` and `/metrics`. Everything else is 404. Error responses on repo
//! paths have empty bodies: ostree's fetcher can take an error body for
//! object content when it falls through a mirrorlist.

use crate::conditional::{self, Precondition, RangeOutcome, Validators};
use crate::fsutil;
use crate::listen::access_log::AccessLog;
use crate::metrics::Metrics;
use crate::serve::sink::Sink;
use crate::served::metadata::{self, digest_etag, MetadataError};
use crate::served::{Generation, Layer, Resolved};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use oscontent_format::{ObjectName, RepoPath};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Objects are content-addressed: their bytes never change.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// Streamed file chunk size.
const CHUNK: usize = 64 * 1024;

/// HTTP settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// max-age for summary, summary.sig, refs, config, commitmeta, deltas.
    pub metadata_max_age: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            metadata_max_age: Duration::from_secs(30),
        }
    }
}

/// Shared state behind every request.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    /// What the publishers published; read at each request.
    pub sink: Arc<Sink>,
    pub metrics: Arc<Metrics>,
    pub config: HttpConfig,
    access_log: Option<AccessLog>,
    draining: AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("sink", &self.sink)
            .field("config", &self.config)
            .field("access_log", &self.access_log.is_some())
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// Serves what is published into `sink`, with its metrics; access log
    /// lines go to `access_log` from a writer thread of their own.
    pub fn new(
        config: HttpConfig,
        sink: Arc<Sink>,
        access_log: Option<Box<dyn Write + Send>>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let metrics = sink.metrics().clone();
        let access_log = access_log
            .map(|w| AccessLog::start(w, metrics.access_log_dropped.clone()))
            .transpose()
            .context("starting the access log writer")?;
        Ok(Self(Arc::new(Inner {
            metrics,
            sink,
            config,
            access_log,
            draining: AtomicBool::new(false),
        })))
    }

    /// Waits (bounded) until the access log lines of the requests answered
    /// so far are written; false if the writer is stuck or gone.
    pub fn sync_access_log(&self) -> bool {
        self.access_log.as_ref().is_none_or(AccessLog::sync)
    }

    /// From now on `/readyz` fails, so load balancers stop sending traffic
    /// while in-flight requests complete.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.metrics.ready.set(0);
    }

    pub fn is_ready(&self) -> bool {
        self.sink.has_generation() && !self.draining.load(Ordering::SeqCst)
    }
}

/// The router. Health endpoints answer with text; repo paths as ostree
/// expects.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(repo)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

async fn readyz(State(st): State<AppState>) -> Response {
    if st.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else if st.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no verified content published yet\n",
        )
            .into_response()
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    let (text, ctype) = st.metrics.render();
    ([(header::CONTENT_TYPE, ctype)], text).into_response()
}

/// Path kind, the metrics label. Bounded set, so label cardinality is too.
pub fn classify(path: &str) -> &'static str {
    match path {
        "/healthz" | "/readyz" => return "health",
        "/metrics" => return "metrics",
        _ => {}
    }
    match path.strip_prefix('/').and_then(RepoPath::parse) {
        Some(RepoPath::Config) => "config",
        Some(RepoPath::Summary) => "summary",
        Some(RepoPath::SummarySig) => "summary_sig",
        Some(RepoPath::Ref { .. }) => "ref",
        Some(RepoPath::Object(o)) => o.kind.extension(),
        Some(RepoPath::Delta { .. }) => "delta",
        Some(RepoPath::DeltaIndex { .. }) => "delta_index",
        None => "other",
    }
}

/// Metrics and the access log for every request.
async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let kind = classify(req.uri().path());
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let version = req.version();
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string());
    let resp = next.run(req).await;
    let elapsed = start.elapsed();
    let status = resp.status().as_u16();
    let bytes = if method == Method::HEAD {
        0
    } else {
        resp.headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    st.metrics
        .requests
        .with_label_values(&[kind, &status.to_string()])
        .inc();
    st.metrics
        .response_bytes
        .with_label_values(&[kind])
        .inc_by(bytes);
    st.metrics
        .latency
        .with_label_values(&[kind])
        .observe(elapsed.as_secs_f64());
    if let Some(log) = &st.access_log {
        let line = serde_json::json!({
            "ts": httpdate::fmt_http_date(SystemTime::now()),
            "client": client,
            "method": method.as_str(),
            "path": path,
            "status": status,
            "bytes": bytes,
            "kind": kind,
            "version": format!("{version:?}"),
            "duration_ms": elapsed.as_secs_f64() * 1e3,
        });
        log.log(line.to_string());
    }
    resp
}

/// Errors on repo paths: a status and an empty body, never internals.
#[derive(Debug)]
pub enum AppError {
    NotFound,
    MethodNotAllowed,
    Unavailable,
    Internal(anyhow::Error),
}

impl From<anyhow::Error> for AppError {
    fn from(e: anyhow::Error) -> Self {
        AppError::Internal(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, extra) = match self {
            AppError::NotFound => (StatusCode::NOT_FOUND, None),
            AppError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                Some((header::ALLOW, "GET, HEAD")),
            ),
            AppError::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                Some((header::RETRY_AFTER, "5")),
            ),
            AppError::Internal(e) => {
                tracing::error!("internal error: {e:#}");
                (StatusCode::INTERNAL_SERVER_ERROR, None)
            }
        };
        let mut r = Response::new(Body::empty());
        *r.status_mut() = status;
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        if let Some((k, v)) = extra {
            r.headers_mut().insert(k, HeaderValue::from_static(v));
        }
        r
    }
}

/// How a representation may be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CachePolicy {
    Immutable,
    ShortLived,
}

fn policy(p: &RepoPath) -> CachePolicy {
    match p {
        RepoPath::Object(o) if o.kind.is_immutable() => CachePolicy::Immutable,
        _ => CachePolicy::ShortLived,
    }
}

/// Serves one repo path. GET and HEAD only.
async fn repo(
    State(st): State<AppState>,
    method: Method,
    headers: HeaderMap,
    uri: http::Uri,
) -> Response {
    match serve_repo(&st, &method, &headers, uri.path()).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve_repo(
    st: &AppState,
    method: &Method,
    headers: &HeaderMap,
    path: &str,
) -> Result<Response, AppError> {
    let Some(rp) = path.strip_prefix('/').and_then(RepoPath::parse) else {
        return Err(AppError::NotFound);
    };
    if method != Method::GET && method != Method::HEAD {
        return Err(AppError::MethodNotAllowed);
    }
    let Some(generation) = st.sink.current() else {
        return Err(AppError::Unavailable);
    };
    let rp2 = rp.clone();
    let g2 = generation.clone();
    let resolved = tokio::task::spawn_blocking(move || g2.resolve(&rp2))
        .await
        .map_err(|e| anyhow::anyhow!("resolver task: {e}"))??;
    let cache = match policy(&rp) {
        CachePolicy::Immutable => HeaderValue::from_static(IMMUTABLE),
        CachePolicy::ShortLived => HeaderValue::from_str(&format!(
            "public, max-age={}",
            st.config.metadata_max_age.as_secs()
        ))
        .expect("ascii"),
    };
    let head = method == Method::HEAD;
    match resolved {
        Resolved::Missing => Err(AppError::NotFound),
        Resolved::Generated(g) => {
            let v = Validators {
                etag: digest_etag(&g.bytes),
                last_modified: Some(g.produced),
            };
            Ok(respond_bytes(headers, g.bytes, &v, cache, head))
        }
        Resolved::File { layer, root, rel } => match metadata::cap(&rp) {
            Some(cap) => {
                let f = read_metadata(st, &generation, root, rel, cap, path).await?;
                Ok(respond_bytes(headers, f.0, &f.1, cache, head))
            }
            None => serve_file(headers, &rp, layer, root, rel, cache, head, path).await,
        },
    }
}

/// A metadata file, read whole (bounded by `cap`) and cached per
/// generation, with its validators.
async fn read_metadata(
    st: &AppState,
    generation: &Arc<Generation>,
    root: PathBuf,
    rel: String,
    cap: u64,
    path: &str,
) -> Result<(bytes::Bytes, Validators), AppError> {
    let g = generation.clone();
    let read = tokio::task::spawn_blocking(move || g.read_metadata(&root, &rel, cap))
        .await
        .map_err(|e| anyhow::anyhow!("read task: {e}"))?;
    let read = match read {
        Ok(r) => r,
        Err(e @ MetadataError::TooLarge { .. }) => {
            st.metrics
                .oversized_metadata
                .with_label_values(&[classify(path)])
                .inc();
            return Err(anyhow::Error::from(e).into());
        }
        Err(e) => return Err(anyhow::Error::from(e).into()),
    };
    // Gone between resolve and read (a tool replacing it): 404, and the
    // client retries.
    let Some(f) = read else {
        return Err(AppError::NotFound);
    };
    let v = Validators {
        etag: f.etag,
        last_modified: f.modified,
    };
    Ok((f.bytes, v))
}

/// Any other file (objects, deltas), streamed from an open handle.
#[allow(clippy::too_many_arguments)] // one request's parts, passed through once
async fn serve_file(
    headers: &HeaderMap,
    rp: &RepoPath,
    layer: Layer,
    root: PathBuf,
    rel: String,
    cache: HeaderValue,
    head: bool,
    path: &str,
) -> Result<Response, AppError> {
    let opened = tokio::task::spawn_blocking(move || fsutil::open_file(&root, &rel))
        .await
        .map_err(|e| anyhow::anyhow!("open task: {e}"))?
        .map_err(|e| anyhow::anyhow!("opening {path}: {e}"))?;
    let Some((file, meta)) = opened else {
        return Err(AppError::NotFound);
    };
    let etag = match rp {
        // Content-addressed: the name is the identity; length and inode
        // guard against a re-compressed copy.
        RepoPath::Object(ObjectName { checksum, kind }) => {
            format!(
                "\"{}.{}-{:x}\"",
                checksum.to_hex(),
                kind.extension(),
                meta.len()
            )
        }
        _ => format!(
            "\"{:x}-{:x}-{:x}.{:x}-{}\"",
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            u8::from(layer == Layer::Overlay)
        ),
    };
    let v = Validators {
        etag,
        last_modified: meta.modified().ok(),
    };
    respond_file(headers, file, meta.len(), &v, cache, head).await
}

fn base_headers(h: &mut HeaderMap, v: &Validators, cache: HeaderValue) {
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&v.etag).expect("ascii etag"),
    );
    if let Some(lm) = v.last_modified {
        h.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_str(&httpdate::fmt_http_date(
                crate::conditional::clamp_http_date(lm),
            ))
            .expect("ascii"),
        );
    }
    h.insert(header::CACHE_CONTROL, cache);
}

fn status_only(status: StatusCode, v: &Validators, cache: HeaderValue) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    base_headers(r.headers_mut(), v, cache);
    r
}

fn respond_bytes(
    h: &HeaderMap,
    bytes: bytes::Bytes,
    v: &Validators,
    cache: HeaderValue,
    head: bool,
) -> Response {
    match conditional::evaluate(h, v) {
        Precondition::NotModified => return status_only(StatusCode::NOT_MODIFIED, v, cache),
        Precondition::Failed => return AppError::from_precondition(),
        Precondition::Proceed => {}
    }
    let len = bytes.len() as u64;
    let (status, body, range) = match conditional::range(h, len, v) {
        RangeOutcome::Full => (StatusCode::OK, bytes, None),
        RangeOutcome::Partial { start, end } => (
            StatusCode::PARTIAL_CONTENT,
            bytes.slice(start as usize..=end as usize),
            Some((start, end)),
        ),
        RangeOutcome::Unsatisfiable => return unsatisfiable(len),
    };
    let blen = body.len();
    let mut r = Response::new(if head {
        Body::empty()
    } else {
        Body::from(body)
    });
    *r.status_mut() = status;
    finish_headers(r.headers_mut(), v, cache, blen as u64, len, range);
    r
}

impl AppError {
    fn from_precondition() -> Response {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::PRECONDITION_FAILED;
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        r
    }
}

fn unsatisfiable(len: u64) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    r.headers_mut().insert(
        header::CONTENT_RANGE,
        HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
    );
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    r
}

fn finish_headers(
    h: &mut HeaderMap,
    v: &Validators,
    cache: HeaderValue,
    body_len: u64,
    total: u64,
    range: Option<(u64, u64)>,
) {
    base_headers(h, v, cache);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some((s, e)) = range {
        h.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("bytes {s}-{e}/{total}")).expect("ascii"),
        );
    }
}

async fn respond_file(
    h: &HeaderMap,
    file: std::fs::File,
    len: u64,
    v: &Validators,
    cache: HeaderValue,
    head: bool,
) -> Result<Response, AppError> {
    match conditional::evaluate(h, v) {
        Precondition::NotModified => return Ok(status_only(StatusCode::NOT_MODIFIED, v, cache)),
        Precondition::Failed => return Ok(AppError::from_precondition()),
        Precondition::Proceed => {}
    }
    let (status, start, count, range) = match conditional::range(h, len, v) {
        RangeOutcome::Full => (StatusCode::OK, 0, len, None),
        RangeOutcome::Partial { start, end } => (
            StatusCode::PARTIAL_CONTENT,
            start,
            end - start + 1,
            Some((start, end)),
        ),
        RangeOutcome::Unsatisfiable => return Ok(unsatisfiable(len)),
    };
    let body = if head {
        Body::empty()
    } else {
        let mut f = tokio::fs::File::from_std(file);
        if start > 0 {
            f.seek(std::io::SeekFrom::Start(start))
                .await
                .map_err(|e| anyhow::anyhow!("seek: {e}"))?;
        }
        // `take` bounds the body to what Content-Length promised, even if
        // the file grows underneath.
        Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
            f.take(count),
            CHUNK,
        ))
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    finish_headers(r.headers_mut(), v, cache, count, len, range);
    Ok(r)
}
