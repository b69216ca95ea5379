//! HTTP: one reqwest client per fetcher (HTTP/1.1 keep-alive, or HTTP/2
//! with prior knowledge when the server speaks it), a semaphore bounding
//! requests in flight, retries with backoff, size caps, and streaming of
//! large bodies into a blocking writer through a bounded channel.
//!
//! A pull begins over HTTP/1.1: config, summary, commit and a static delta
//! are a handful of requests one after the other, which one keep-alive
//! connection carries at less cost to the server than an HTTP/2 one (and
//! a delta part goes out by `sendfile`). HTTP/2 is tried only when the
//! object walk needs objects ([`Fetcher::for_objects`]): hundreds of
//! requests in flight at once are where multiplexing pays.

use super::error::{PullError, PullResult};
use super::origin;
use super::report::Reporter;
use anyhow::anyhow;
use bytes::Bytes;
use futures_util::StreamExt;
use oscontent_format::{response_retry_after, GiveUp, Retries, RetryPolicy};
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// Connection establishment bound.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence while reading a response; there is deliberately no
/// bound on a whole body, which may be a large object on a slow link.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for the HTTP/2 probe: a server that does not answer a prior-
/// knowledge preface quickly is treated as HTTP/1.1-only.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Body chunks buffered between the network and a writer thread. With
/// hyper's chunks of at most a few tens of KiB this bounds each object in
/// flight to well under a MiB of memory.
const STREAM_CHUNKS: usize = 8;

/// The protocol in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http2,
    Http11,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http2 => "HTTP/2",
            Protocol::Http11 => "HTTP/1.1",
        }
    }
}

/// Counters shared with the progress reporter.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub retries: AtomicU64,
}

/// Why a fetch failed, for the caller to decide what it means.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{path}: not found (HTTP 404)")]
    NotFound { path: String },
    #[error("{path}: HTTP {status}")]
    Status {
        path: String,
        status: u16,
        /// The server's `Retry-After`, if it sent one we understand.
        retry_after: Option<Duration>,
    },
    /// The server answered "later" for longer than we wait.
    #[error("{path}: HTTP {status}: {why}")]
    Throttled {
        path: String,
        status: u16,
        why: GiveUp,
    },
    #[error("{path}: {bytes} bytes exceeds the {max} byte limit for this object")]
    TooLarge { path: String, bytes: u64, max: u64 },
    // `error`, not `source`: thiserror would make it the error's source,
    // and `{:#}` of the chain would then say it twice.
    #[error("{path}: {error:#}")]
    Network { path: String, error: anyhow::Error },
    /// The server answered with something we refuse to follow (a redirect
    /// to another origin): asking again would get the same answer.
    #[error("{path}: {error:#}")]
    Refused { path: String, error: anyhow::Error },
    /// The consumer refused the bytes (bad checksum, bad format).
    #[error("{0:#}")]
    Corrupt(anyhow::Error),
    /// The consumer failed locally (disk, repo).
    #[error("{0:#}")]
    Local(anyhow::Error),
}

impl FetchError {
    fn retryable(&self) -> bool {
        match self {
            FetchError::Status { status, .. } => RetryPolicy::retryable_status(*status),
            FetchError::Network { .. } => true,
            _ => false,
        }
    }

    pub fn into_pull(self) -> PullError {
        match self {
            FetchError::Corrupt(e) => PullError::Verification(e),
            FetchError::Local(e) => PullError::LocalRepo(e),
            FetchError::TooLarge { .. } => PullError::Verification(self.into()),
            other => PullError::Network(other.into()),
        }
    }
}

/// What a streaming consumer reports.
#[derive(Debug)]
pub enum ConsumeError {
    Corrupt(anyhow::Error),
    Local(anyhow::Error),
}

#[derive(Debug)]
pub struct Fetcher {
    client: reqwest::Client,
    /// What requests go to; may carry credentials (reqwest turns them
    /// into a Basic authorization header).
    base: String,
    /// `base` with any credentials redacted: the only form that is shown.
    shown: String,
    pub protocol: Protocol,
    /// HTTP/2 may still be tried: `http://`, and not `--http1`. The object
    /// walk tries it ([`Fetcher::for_objects`]).
    h2_untried: bool,
    /// Requests in flight at most (`permits`' size).
    concurrency: usize,
    permits: Arc<Semaphore>,
    pub counters: Arc<Counters>,
    reporter: Arc<Reporter>,
}

/// An HTTP/2 prior-knowledge client, if `base` is `http://`, HTTP/1.1 was
/// not asked for, and the server answers `GET base/config` over HTTP/2 at
/// all (any status); otherwise `None` (HTTP/1.1 it is).
async fn probe_h2(base: &str, http1_only: bool) -> PullResult<Option<reqwest::Client>> {
    if http1_only || !base.starts_with("http://") {
        return Ok(None);
    }
    let h2 = builder()
        .http2_prior_knowledge()
        .build()
        .map_err(|e| PullError::Usage(e.into()))?;
    let probe = h2
        .get(format!("{base}/config"))
        .timeout(PROBE_TIMEOUT)
        .send()
        .await;
    match probe {
        Ok(_) => Ok(Some(h2)),
        Err(e) => {
            tracing::debug!("HTTP/2 prior knowledge failed ({e}); using HTTP/1.1");
            Ok(None)
        }
    }
}

fn h1_client(concurrency: usize) -> PullResult<reqwest::Client> {
    builder()
        .http1_only()
        .pool_max_idle_per_host(concurrency)
        .build()
        .map_err(|e| PullError::Usage(e.into()))
}

/// The settings every client of a remote shares (timeouts, redirects kept
/// within the origin, the user agent).
pub(crate) fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .tcp_nodelay(true)
        .redirect(origin::redirect_policy())
        .user_agent(concat!("oscontent/", env!("CARGO_PKG_VERSION")))
}

impl Fetcher {
    /// Connects to `base` over HTTP/1.1 and returns the fetcher and the
    /// remote's `config`. HTTP/2 is left for the object walk to try
    /// ([`Self::for_objects`]), unless `http1_only`.
    pub async fn connect(
        base: &str,
        concurrency: usize,
        http1_only: bool,
        reporter: Arc<Reporter>,
    ) -> PullResult<(Self, Bytes)> {
        let base = base.trim_end_matches('/').to_owned();
        origin::check_remote_url(&base).map_err(PullError::Usage)?;
        let concurrency = concurrency.max(1);
        let f = Self {
            client: h1_client(concurrency)?,
            shown: origin::redact(&base),
            h2_untried: !http1_only && base.starts_with("http://"),
            base,
            protocol: Protocol::Http11,
            concurrency,
            permits: Arc::new(Semaphore::new(concurrency)),
            counters: Arc::new(Counters::default()),
            reporter,
        };
        let config = f
            .get_bytes("config", MAX_CONFIG_SIZE)
            .await
            .map_err(FetchError::into_pull)?
            .ok_or_else(|| {
                PullError::Network(anyhow!(
                    "{}/config: not found: not an ostree remote",
                    f.shown
                ))
            })?;
        Ok((f, config))
    }

    /// A fetcher for the remote's content URL (`contenturl`) that shares
    /// this one's bound on requests in flight and its counters, so that
    /// concurrency and totals cover both origins. The content origin need
    /// not serve `config` (an object cache does not), so any answer to the
    /// HTTP/2 probe proves HTTP/2, and none is required. Deltas and objects
    /// both come from there, so HTTP/2 is decided at once.
    pub async fn connect_content(&self, base: &str, http1_only: bool) -> PullResult<Self> {
        let base = base.trim_end_matches('/').to_owned();
        origin::check_remote_url(&base)
            .map_err(|e| PullError::Usage(e.context("the remote's contenturl")))?;
        Ok(match probe_h2(&base, http1_only).await? {
            Some(h2) => self.sharing(base, h2, Protocol::Http2),
            None => self.sharing(base, h1_client(self.concurrency)?, Protocol::Http11),
        })
    }

    /// The fetcher the object walk uses: an HTTP/2 one on the same base
    /// when HTTP/2 was left untried and the server speaks it (sharing the
    /// bound on requests and the counters), else `None`: this one.
    pub async fn for_objects(&self) -> PullResult<Option<Self>> {
        if !self.h2_untried {
            return Ok(None);
        }
        Ok(probe_h2(&self.base, false)
            .await?
            .map(|h2| self.sharing(self.base.clone(), h2, Protocol::Http2)))
    }

    fn sharing(&self, base: String, client: reqwest::Client, protocol: Protocol) -> Self {
        Self {
            client,
            shown: origin::redact(&base),
            base,
            protocol,
            h2_untried: false,
            concurrency: self.concurrency,
            permits: self.permits.clone(),
            counters: self.counters.clone(),
            reporter: self.reporter.clone(),
        }
    }

    /// The URL of `path`, for messages: credentials redacted.
    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.shown)
    }

    /// The remote's base URL, for messages: credentials redacted.
    pub fn shown_base(&self) -> &str {
        &self.shown
    }

    /// Runs `attempt` as often as [`RetryPolicy::DEFAULT`] allows, sleeping
    /// between retryable failures (at least as long as a `Retry-After`
    /// asks) and reporting each retry.
    async fn with_retries<T, F, Fut>(&self, path: &str, mut attempt: F) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, FetchError>>,
    {
        let mut used = Retries::default();
        let mut n = 1;
        loop {
            let r = {
                let _permit = self.permits.acquire().await.expect("semaphore open");
                self.counters.requests.fetch_add(1, Ordering::Relaxed);
                attempt().await
            };
            let e = match r {
                Err(e) if e.retryable() => e,
                other => return other,
            };
            let retry_after = match &e {
                FetchError::Status { retry_after, .. } => *retry_after,
                _ => None,
            };
            let delay =
                match RetryPolicy::DEFAULT.after_failure(&mut used, retry_after, rand::random()) {
                    Ok(delay) => delay,
                    Err(GiveUp::Attempts) => return Err(e),
                    Err(why) => {
                        let FetchError::Status { path, status, .. } = e else {
                            unreachable!("only a status carries a Retry-After")
                        };
                        return Err(FetchError::Throttled { path, status, why });
                    }
                };
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            self.reporter.retry(path, n, &e, delay);
            tokio::time::sleep(delay).await;
            n += 1;
        }
    }

    async fn send(&self, path: &str) -> Result<Option<reqwest::Response>, FetchError> {
        let resp = self
            .client
            .get(format!("{}/{path}", self.base))
            .send()
            .await
            .map_err(|e| {
                let path = path.to_owned();
                if e.is_redirect() {
                    FetchError::Refused {
                        path,
                        error: e.without_url().into(),
                    }
                } else {
                    FetchError::Network {
                        path,
                        error: e.without_url().into(),
                    }
                }
            })?;
        match resp.status().as_u16() {
            200 => Ok(Some(resp)),
            404 => Ok(None),
            status => Err(FetchError::Status {
                path: path.to_owned(),
                status,
                retry_after: response_retry_after(
                    status,
                    resp.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .map(|v| v.as_bytes()),
                    resp.headers()
                        .get(reqwest::header::DATE)
                        .map(|v| v.as_bytes()),
                    std::time::SystemTime::now(),
                ),
            }),
        }
    }

    fn check_len(path: &str, resp: &reqwest::Response, max: u64) -> Result<(), FetchError> {
        match resp.content_length() {
            Some(n) if n > max => Err(FetchError::TooLarge {
                path: path.to_owned(),
                bytes: n,
                max,
            }),
            _ => Ok(()),
        }
    }

    /// GETs a whole (small) body: `None` on 404. Bodies over `max` are
    /// refused, whether or not the server announced their length.
    pub async fn get_bytes(&self, path: &str, max: usize) -> Result<Option<Bytes>, FetchError> {
        self.with_retries(path, || async {
            let Some(resp) = self.send(path).await? else {
                return Ok(None);
            };
            Self::check_len(path, &resp, max as u64)?;
            let mut buf = Vec::with_capacity(resp.content_length().unwrap_or(0) as usize);
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| FetchError::Network {
                    path: path.to_owned(),
                    error: e.into(),
                })?;
                self.counters
                    .bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if buf.len() + chunk.len() > max {
                    return Err(FetchError::TooLarge {
                        path: path.to_owned(),
                        bytes: (buf.len() + chunk.len()) as u64,
                        max: max as u64,
                    });
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(Some(Bytes::from(buf)))
        })
        .await
    }

    /// GETs a body of any size up to `max` and streams it into `consume`,
    /// which runs on a blocking thread with a reader over the body and its
    /// length. A body that breaks off is retried from the start: the
    /// consumer must not have made anything visible unless it returns Ok.
    /// `Ok(None)` on 404.
    pub async fn get_streamed<T, C>(
        &self,
        path: &str,
        max: u64,
        consume: C,
    ) -> Result<Option<T>, FetchError>
    where
        T: Send + 'static,
        C: Fn(BodyReader, u64) -> Result<T, ConsumeError> + Send + Clone + 'static,
    {
        self.with_retries(path, move || {
            let consume = consume.clone();
            async move {
                let Some(resp) = self.send(path).await? else {
                    return Ok(None);
                };
                Self::check_len(path, &resp, max)?;
                let len = resp.content_length().ok_or_else(|| FetchError::Network {
                    path: path.to_owned(),
                    error: anyhow!("response has no Content-Length"),
                })?;
                let (tx, rx) = mpsc::channel(STREAM_CHUNKS);
                let broken = Arc::new(AtomicBool::new(false));
                let reader = BodyReader {
                    rx,
                    cur: Bytes::new(),
                    remaining: len,
                    broken: broken.clone(),
                };
                let writer = tokio::task::spawn_blocking(move || consume(reader, len));
                let mut body = resp.bytes_stream();
                let mut net_err = None;
                while let Some(chunk) = body.next().await {
                    match chunk {
                        Ok(c) => {
                            self.counters
                                .bytes
                                .fetch_add(c.len() as u64, Ordering::Relaxed);
                            if tx.send(Ok(c)).await.is_err() {
                                // The writer stopped reading (done, or failed).
                                break;
                            }
                        }
                        Err(e) => {
                            let msg = format!("{e:#}");
                            let _ = tx
                                .send(Err(io::Error::new(io::ErrorKind::ConnectionReset, msg)))
                                .await;
                            net_err = Some(e);
                            break;
                        }
                    }
                }
                drop(tx);
                let outcome = writer
                    .await
                    .map_err(|e| FetchError::Local(anyhow!("writer thread: {e}")))?;
                match outcome {
                    Ok(v) => Ok(Some(v)),
                    // A failure caused by the body breaking off is the
                    // network's, and worth a retry.
                    Err(_) if net_err.is_some() || broken.load(Ordering::SeqCst) => {
                        Err(FetchError::Network {
                            path: path.to_owned(),
                            error: net_err.map_or_else(
                                || anyhow!("response body ended early"),
                                anyhow::Error::from,
                            ),
                        })
                    }
                    Err(ConsumeError::Corrupt(e)) => Err(FetchError::Corrupt(
                        e.context(format!("{}: refused", self.url(path))),
                    )),
                    Err(ConsumeError::Local(e)) => Err(FetchError::Local(e)),
                }
            }
        })
        .await
    }
}

/// `config` files are a few lines.
pub const MAX_CONFIG_SIZE: usize = 64 << 10;

/// A blocking `Read` over a response body arriving through a bounded
/// channel. Ends with an error, and records that the network broke, if
/// the body stops before its announced length.
#[derive(Debug)]
pub struct BodyReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    cur: Bytes,
    remaining: u64,
    broken: Arc<AtomicBool>,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => {
                    self.broken.store(true, Ordering::SeqCst);
                    return Err(e);
                }
                None if self.remaining > 0 => {
                    self.broken.store(true, Ordering::SeqCst);
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("body ended {} bytes early", self.remaining),
                    ));
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        self.remaining = self.remaining.saturating_sub(n as u64);
        Ok(n)
    }
}
