//! The HTTP surface: exactly ostree's archive layout, plus `/healthz`,
//! `/readyz`, `/metrics` and the staging slots (`slots.rs`). Everything
//! else is 404. Error responses on repo
//! paths have empty bodies: ostree's fetcher can take an error body for
//! object content when it falls through a mirrorlist.
//!
//! Every error answer is `no-store`: a cache in front keeps a 404 for a
//! while (Varnish's default is 120 s), and what is missing now may be
//! published a moment later, or be on another replica already.

pub mod access_log;
pub mod answer;
mod observe;
pub mod saturation;
pub mod slots;

pub(crate) use observe::log_date;

use crate::cache::ObjectCache;
use crate::metrics::{gauge_value, Metrics};
use crate::served::memory::BodyMemory;
use crate::served::streams::StreamBudget;
use crate::sink::Sink;
use crate::slots::{SlotConfig, Slots};
use access_log::AccessLog;
use axum::extract::State;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{self, HeaderValue};
use http::StatusCode;
use oscontent_format::RepoPath;
use saturation::Saturation;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Files streamed with a descriptor held at once, by default; the
/// listener's `Limits` take the same figure, since both bound one budget.
pub const DEFAULT_MAX_STREAMED_FILES: usize = 1024;

/// Objects are content-addressed: their bytes never change.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// `Cache-Control` of what sets no policy of its own (errors, probes,
/// metrics): not to be stored.
const NO_STORE: &str = "no-store";
/// The object cache's default size (`--cache-size`): with the metadata
/// caches and connections, well inside the deployment's 512 MiB limit.
pub const DEFAULT_CACHE_SIZE: usize = 128 << 20;
/// `--unready-after-refusing`'s default: longer than a burst that fills
/// the cap for a moment, shorter than a kubelet's default probe period
/// times its failure threshold (10 s x 3).
pub const DEFAULT_UNREADY_AFTER_REFUSING: Duration = Duration::from_secs(10);

/// HTTP settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// max-age for summary, summary.sig, refs, config, commitmeta, deltas.
    pub metadata_max_age: Duration,
    /// Bytes of immutable objects kept in memory (0: none).
    pub cache_size: usize,
    /// Files streamed with a descriptor held at once, all clients together
    /// (`served::streams`).
    pub max_streamed_files: usize,
    /// Bytes of streamed bodies' chunks held at once, all clients together
    /// (`served::memory`).
    pub body_memory: usize,
    /// How long the listener may refuse normal clients (its cap full with
    /// no idle connection to close) before `/readyz` says not ready.
    pub unready_after_refusing: Duration,
    /// The staging slots' caps and times (`--stage-*`); `None` hands out
    /// none (`--stage-slots 0`).
    pub stage_slots: Option<SlotConfig>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            metadata_max_age: Duration::from_secs(30),
            cache_size: DEFAULT_CACHE_SIZE,
            max_streamed_files: DEFAULT_MAX_STREAMED_FILES,
            body_memory: crate::served::memory::DEFAULT_BODY_MEMORY,
            unready_after_refusing: DEFAULT_UNREADY_AFTER_REFUSING,
            stage_slots: Some(SlotConfig::default()),
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
    /// Immutable objects, by generation and name; the sink's, which
    /// publication warms before a generation becomes visible.
    pub cache: Arc<ObjectCache>,
    /// Places for files being streamed.
    pub streams: Arc<StreamBudget>,
    /// Bytes held by streamed bodies' chunks.
    pub memory: Arc<BodyMemory>,
    /// Whether the listener has been refusing normal clients, and since
    /// when (it records; `/readyz` reads).
    pub saturation: Arc<Saturation>,
    /// The staging slots' lease table, when slots are handed out.
    pub slots: Option<Arc<slots::SlotTable>>,
    /// `Cache-Control` of what is not immutable, made once.
    short_lived: HeaderValue,
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
    /// lines go to `access_log`, which must not block, when a worker is
    /// idle ([`Self::idle`]). The
    /// object cache is attached to `sink`, so that publication can warm it
    /// (a sink keeps the first one attached).
    pub fn new(
        config: HttpConfig,
        sink: Arc<Sink>,
        access_log: Option<Box<dyn Write + Send>>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let metrics = sink.metrics().clone();
        let access_log = access_log.map(|w| AccessLog::new(w, metrics.access_log_dropped.clone()));
        let short_lived = HeaderValue::from_str(&format!(
            "public, max-age={}",
            config.metadata_max_age.as_secs()
        ))
        .context("the metadata max-age as a header")?;
        let cache = sink.attach_cache(ObjectCache::new(config.cache_size));
        let streams = StreamBudget::new(config.max_streamed_files);
        let memory = BodyMemory::new(config.body_memory);
        let saturation = Arc::new(Saturation::new(config.unready_after_refusing));
        let slots = config
            .stage_slots
            .clone()
            .map(|c| Arc::new(slots::SlotTable::new(Slots::new(c))));
        Ok(Self(Arc::new(Inner {
            metrics,
            sink,
            cache,
            streams,
            memory,
            saturation,
            slots,
            short_lived,
            config,
            access_log,
            draining: AtomicBool::new(false),
        })))
    }

    /// What a worker does before it parks: writes the access log lines
    /// queued meanwhile (`access_log`).
    pub fn idle(&self) {
        if let Some(log) = &self.access_log {
            log.flush();
        }
    }

    /// Waits (bounded) until the access log lines of the requests answered
    /// so far are written; false if the output stays full.
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
        self.sink.has_generation()
            && !self.draining.load(Ordering::SeqCst)
            && self.saturation.refusing().is_none()
    }
}

/// The router. Health endpoints answer with text; the staging slots with
/// JSON; repo paths as ostree expects.
pub fn app(state: AppState) -> Router {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    let router = match &state.slots {
        Some(table) => router.merge(slots::routes(table.clone())),
        None => router,
    };
    router
        .fallback(answer::repo)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            observe::observe,
        ))
        .with_state(state)
}

/// The paths [`app`] routes (the probes and the scrape) besides the
/// staging slots'; everything else is its fallback, the repo.
pub const ROUTES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Whether [`app`] routes `path` rather than handing it to the repo
/// answer (`answer`), whatever the method or protocol.
pub fn routed(path: &str) -> bool {
    ROUTES.contains(&path) || path.starts_with(slots::PATH)
}

async fn readyz(State(st): State<AppState>) -> Response {
    if st.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else if st.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else if let Some(d) = st.saturation.refusing() {
        let why = format!(
            "refusing new clients for {} s: every connection in use\n",
            d.as_secs()
        );
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no verified content published yet\n",
        )
            .into_response()
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    let m = &st.metrics;
    m.connections
        .streamed_files
        .set(gauge_value(st.streams.in_use()));
    m.connections
        .body_bytes
        .set(gauge_value(st.memory.in_use()));
    m.connections
        .refusing
        .set(i64::from(st.saturation.refusing().is_some()));
    let (bytes, objects) = st.cache.usage();
    m.cache_bytes.set(gauge_value(bytes));
    m.cache_objects.set(gauge_value(objects));
    if let Some(table) = &st.slots {
        table.with_report(|r| m.stage_slots.show(r));
    }
    let (text, ctype) = st.metrics.render();
    ([(header::CONTENT_TYPE, ctype)], text).into_response()
}

/// The repo path a request path names, if any.
pub(crate) fn repo_path(path: &str) -> Option<RepoPath> {
    path.strip_prefix('/').and_then(RepoPath::parse)
}

/// Path kind, the metrics label. Bounded set, so label cardinality is too.
pub fn classify(path: &str) -> &'static str {
    kind(path, repo_path(path).as_ref())
}

/// [`classify`], of a path already parsed ([`repo_path`]).
fn kind(path: &str, parsed: Option<&RepoPath>) -> &'static str {
    match path {
        "/healthz" | "/readyz" => return "health",
        "/metrics" => return "metrics",
        p if p.starts_with(slots::PATH) => return "stage_slots",
        _ => {}
    }
    match parsed {
        Some(RepoPath::Config) => "config",
        Some(RepoPath::Summary) => "summary",
        Some(RepoPath::SummarySig) => "summary_sig",
        Some(RepoPath::Ref { .. }) => "ref",
        Some(RepoPath::Object(o)) => o.kind.extension(),
        Some(RepoPath::Delta { .. }) => "delta",
        Some(RepoPath::DeltaIndex { .. }) => "delta_index",
        Some(RepoPath::Blob(_)) => "blob",
        None => "other",
    }
}

/// Requests refused before routing, by what their head says.
/// RFC 9112 §3.2: an HTTP/1.1 request carries exactly one Host, or is
/// answered 400 (as nginx does). HTTP/1.0 need not; HTTP/2's authority is a
/// pseudo-header, and a Host beside it is optional. RFC 9110 §10.1.1: an
/// expectation other than `100-continue` (which hyper answers) cannot be
/// met, and says so with 417 rather than being ignored.
fn refused_head<H: answer::Fields + ?Sized>(
    version: axum::http::Version,
    headers: &H,
) -> Option<AppError> {
    let hosts = answer::Fields::lines(headers, &header::HOST).count();
    let host_ok = match version {
        axum::http::Version::HTTP_11 => hosts == 1,
        _ => hosts <= 1,
    };
    if !host_ok {
        return Some(AppError::BadRequest);
    }
    let unmet = answer::Fields::lines(headers, &header::EXPECT)
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|e| !e.is_empty() && !e.eq_ignore_ascii_case(b"100-continue"));
    unmet.then_some(AppError::ExpectationFailed)
}

/// Errors on repo paths: a status and an empty body, never internals.
#[derive(Debug)]
pub enum AppError {
    /// A request HTTP forbids answering (an HTTP/1.1 request without
    /// exactly one Host).
    BadRequest,
    /// An `Expect` other than `100-continue`.
    ExpectationFailed,
    NotFound,
    /// A precondition (`If-Match`, `If-Unmodified-Since`) failed.
    PreconditionFailed,
    /// A range outside the representation's length.
    RangeNotSatisfiable(u64),
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
        answer::Answer::of_error(self).into_response()
    }
}
