//! Where a mirror reads an archive remote from: an oscontent (or any
//! ostree archive) server over HTTP, a bundle directory, or a generation
//! this process just published from an image. All three answer the same
//! question, "the bytes at this repo path, or absent", through [`Remote`];
//! none of them is trusted: [`super::sync`] verifies everything it reads.

use crate::fsutil;
use crate::redact::RedactedUrl;
use crate::served::{Generation, Resolved};
use anyhow::{bail, Context, Result};
use oscontent_format::{response_retry_after, GiveUp, RepoPath, Retries, RetryPolicy};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Connect bound for an upstream server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest silence while reading a response (a whole large object may
/// take longer; a stalled one may not).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Retries of errors that may go away (connection, 5xx): the node client's.
const RETRY: RetryPolicy = RetryPolicy::DEFAULT;
/// Copy buffer.
const CHUNK: usize = 64 << 10;

/// A source of archive-repo files. Paths are relative to the repo root and
/// must be valid [`RepoPath`]s; nothing else is ever requested.
pub trait Remote: Send + Sync {
    /// For messages: the URL or directory.
    fn describe(&self) -> String;
    /// Streams `rel` into `out`, at most `max` bytes (more is an error).
    /// `Ok(None)` if the remote does not have it.
    fn copy_to(&self, rel: &str, out: &mut dyn Write, max: u64) -> Result<Option<u64>>;
    /// A small file, in memory.
    fn get(&self, rel: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let mut buf = Vec::new();
        Ok(self.copy_to(rel, &mut buf, max)?.map(|_| buf))
    }
}

fn check_rel(rel: &str) -> Result<()> {
    if RepoPath::parse(rel).is_none() {
        bail!("internal: {rel:?} is not an archive repo path");
    }
    Ok(())
}

/// Copies at most `max` bytes from `r` to `out`; an error if there is more.
/// Paced by `limit`, if any.
/// A body that broke off part-way: the one failure worth fetching the
/// file again for at once. [`Remote::copy_to`] has already retried the
/// request itself as the retry policy allows; any other error it returns
/// is its final answer.
#[derive(Debug, thiserror::Error)]
#[error("reading {what} after {bytes} bytes")]
pub struct Interrupted {
    what: String,
    bytes: u64,
    #[source]
    source: std::io::Error,
}

impl Interrupted {
    /// Whether `e` is, or was caused by, a body breaking off.
    pub fn caused(e: &anyhow::Error) -> bool {
        e.chain().any(|c| c.is::<Interrupted>())
    }
}

pub fn copy_bounded(
    mut r: impl Read,
    out: &mut dyn Write,
    max: u64,
    what: &str,
    limit: Option<&RateLimit>,
) -> Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut n: u64 = 0;
    loop {
        let got = match r.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(g) => g,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(Interrupted {
                    what: what.to_owned(),
                    bytes: n,
                    source,
                }
                .into())
            }
        };
        n += got as u64;
        if n > max {
            bail!("{what} is larger than its {max} byte limit");
        }
        if let Some(l) = limit {
            l.take(got as u64);
        }
        out.write_all(&buf[..got])
            .with_context(|| format!("writing {what}"))?;
    }
}

/// A byte rate shared by every worker of one mirror (`--max-rate`): a
/// token bucket of one second's worth.
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_sec: u64,
    state: std::sync::Mutex<(std::time::Instant, f64)>,
}

impl crate::source::verify::Pace for RateLimit {
    fn take(&self, bytes: u64) {
        RateLimit::take(self, bytes);
    }
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> Self {
        Self {
            bytes_per_sec: bytes_per_sec.max(1),
            state: std::sync::Mutex::new((std::time::Instant::now(), 0.0)),
        }
    }

    /// Accounts for `n` bytes, sleeping as long as the rate requires.
    pub fn take(&self, n: u64) {
        let wait = {
            let mut s = self.state.lock().expect("rate limit lock");
            let now = std::time::Instant::now();
            let rate = self.bytes_per_sec as f64;
            // Refill, capped at one second's worth of burst.
            let refill = now.duration_since(s.0).as_secs_f64() * rate;
            s.1 = (s.1 + refill).min(rate) - n as f64;
            s.0 = now;
            (s.1 < 0.0).then(|| Duration::from_secs_f64(-s.1 / rate))
        };
        if let Some(w) = wait {
            std::thread::sleep(w);
        }
    }
}

/// An upstream archive remote over HTTP(S): an oscontent server, or any
/// static web server holding an archive repo or a bundle.
#[derive(Debug)]
pub struct HttpRemote {
    /// Without its userinfo: what requests go to, and what logs and
    /// errors show.
    base: String,
    /// The URL's userinfo, sent as basic auth.
    auth: Option<BasicAuth>,
    client: reqwest::blocking::Client,
    limit: Option<Arc<RateLimit>>,
}

/// A user and password taken out of an upstream URL.
struct BasicAuth {
    user: String,
    password: Option<String>,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(crate::redact::MASK)
    }
}

impl HttpRemote {
    /// Must be called off the async runtime (the blocking client owns one).
    pub fn new(url: &RedactedUrl, limit: Option<Arc<RateLimit>>) -> Result<Self> {
        let mut parsed = reqwest::Url::parse(url.expose())
            // The parser's message never quotes the input.
            .with_context(|| format!("upstream URL {url:?}"))?;
        anyhow::ensure!(
            matches!(parsed.scheme(), "http" | "https"),
            "upstream URL {url:?}: only http:// and https:// are supported"
        );
        anyhow::ensure!(
            parsed.query().is_none() && parsed.fragment().is_none(),
            "upstream URL {url:?}: no query or fragment, please"
        );
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .with_context(|| format!("upstream URL {url:?}: the userinfo is not UTF-8"))
        };
        let auth = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (user, password) => Some(BasicAuth {
                user: decode(user)?,
                password: password.map(decode).transpose()?,
            }),
        };
        // Never fails for http(s), which have a host.
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        let mut base = parsed.to_string();
        if !base.ends_with('/') {
            base.push('/');
        }
        let client = reqwest::blocking::Client::builder()
            .user_agent(concat!(
                "oscontent-server/",
                env!("CARGO_PKG_VERSION"),
                " (mirror)"
            ))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(READ_TIMEOUT)
            .tcp_nodelay(true)
            .redirect(crate::redirect::policy(crate::redirect::Rule::SameOrigin))
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            base,
            auth,
            client,
            limit,
        })
    }

    fn get(&self, url: &str) -> reqwest::blocking::RequestBuilder {
        let req = self.client.get(url);
        match &self.auth {
            Some(a) => req.basic_auth(&a.user, a.password.as_ref()),
            None => req,
        }
    }

    fn url(&self, rel: &str) -> String {
        format!("{}{rel}", self.base)
    }
}

/// A uniform random number in [0, 1) for the backoff's jitter. std's
/// `RandomState` is keyed afresh for each instance, which is all jitter
/// needs, without a dependency for it.
fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let h = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Remote for HttpRemote {
    fn describe(&self) -> String {
        self.base.clone()
    }

    fn copy_to(&self, rel: &str, out: &mut dyn Write, max: u64) -> Result<Option<u64>> {
        check_rel(rel)?;
        let url = self.url(rel);
        let mut used = Retries::default();
        let mut attempt = 0u32;
        let resp = loop {
            attempt += 1;
            let (retry_after, failed) = match self.get(&url).send() {
                Ok(r) => match r.status().as_u16() {
                    200 => break r,
                    404 => return Ok(None),
                    s if RetryPolicy::retryable_status(s) => {
                        let h = r.headers();
                        let after = response_retry_after(
                            s,
                            h.get(reqwest::header::RETRY_AFTER).map(|v| v.as_bytes()),
                            h.get(reqwest::header::DATE).map(|v| v.as_bytes()),
                            SystemTime::now(),
                        );
                        (after, anyhow::anyhow!("HTTP {s}"))
                    }
                    s => bail!("GET {url}: HTTP {s}"),
                },
                Err(e) => (None, anyhow::Error::from(e)),
            };
            match RETRY.after_failure(&mut used, retry_after, jitter()) {
                Ok(delay) => {
                    tracing::warn!(url, attempt, ?delay, "retrying: {failed:#}");
                    std::thread::sleep(delay);
                }
                Err(GiveUp::Attempts) => return Err(failed).with_context(|| format!("GET {url}")),
                Err(why) => return Err(failed.context(why)).with_context(|| format!("GET {url}")),
            }
        };
        if let Some(len) = resp.content_length() {
            anyhow::ensure!(
                len <= max,
                "GET {url}: {len} bytes is over the {max} byte limit for it"
            );
        }
        // A body cut short is not retried here: the caller's buffer
        // has part of it. The caller's verification fails, and the next
        // run (or refresh) fetches it again.
        let n = copy_bounded(resp, out, max, &url, self.limit.as_deref())?;
        Ok(Some(n))
    }
}

/// A bundle (or any archive repo) directory. Reads never follow a symlink
/// inside it.
#[derive(Debug)]
pub struct DirRemote {
    pub root: PathBuf,
    limit: Option<Arc<RateLimit>>,
}

impl DirRemote {
    pub fn new(root: &Path, limit: Option<Arc<RateLimit>>) -> Self {
        Self {
            root: root.to_path_buf(),
            limit,
        }
    }
}

impl Remote for DirRemote {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn copy_to(&self, rel: &str, out: &mut dyn Write, max: u64) -> Result<Option<u64>> {
        check_rel(rel)?;
        let what = format!("{}/{rel}", self.root.display());
        let Some((f, meta)) =
            fsutil::open_file(&self.root, rel).with_context(|| format!("opening {what}"))?
        else {
            return Ok(None);
        };
        anyhow::ensure!(
            meta.len() <= max,
            "{what} is {} bytes, over the {max} byte limit for it",
            meta.len()
        );
        copy_bounded(f, out, max, &what, self.limit.as_deref()).map(Some)
    }
}

/// What a generation serves, as the HTTP surface would: how an image
/// becomes a bundle with exactly the bytes `serve --image` publishes.
#[derive(Debug)]
pub struct GenerationRemote {
    pub generation: Arc<Generation>,
}

impl Remote for GenerationRemote {
    fn describe(&self) -> String {
        format!("generation {}", self.generation.id)
    }

    fn copy_to(&self, rel: &str, out: &mut dyn Write, max: u64) -> Result<Option<u64>> {
        let path = RepoPath::parse(rel)
            .with_context(|| format!("internal: {rel:?} is not an archive repo path"))?;
        match self.generation.resolve(&path)? {
            Resolved::Missing => Ok(None),
            Resolved::Generated(g) => {
                anyhow::ensure!(
                    g.bytes.len() as u64 <= max,
                    "{rel} is over its {max} byte limit"
                );
                out.write_all(&g.bytes)
                    .with_context(|| format!("writing {rel}"))?;
                Ok(Some(g.bytes.len() as u64))
            }
            Resolved::File { root, rel: r, .. } => {
                let what = format!("{}/{r}", root.display());
                let Some((f, _)) =
                    fsutil::open_file(&root, &r).with_context(|| format!("opening {what}"))?
                else {
                    return Ok(None);
                };
                copy_bounded(f, out, max, &what, None).map(Some)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_copies() {
        let mut out = Vec::new();
        assert_eq!(
            copy_bounded(&b"hello"[..], &mut out, 5, "x", None).unwrap(),
            5
        );
        assert_eq!(out, b"hello");
        let e = copy_bounded(&b"hello!"[..], &mut Vec::new(), 5, "x", None).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
    }

    #[test]
    fn urls_are_checked() {
        let cases = [
            ("http://h:1", true),
            ("https://h/base/", true),
            ("ftp://h/", false),
            ("http://h/?q=1", false),
            ("not a url", false),
        ];
        for (u, ok) in cases {
            let r = HttpRemote::new(&RedactedUrl::new(u), None);
            assert_eq!(r.is_ok(), ok, "{u}");
        }
        let r = HttpRemote::new(&RedactedUrl::new("http://h:1/base"), None).unwrap();
        assert_eq!(r.url("summary"), "http://h:1/base/summary");
    }

    #[test]
    fn userinfo_is_sent_as_basic_auth_and_never_shown() {
        let url = RedactedUrl::new("http://u%20x:s%40cret@h:1/base?tok=s3cret");
        let e = format!("{:#}", HttpRemote::new(&url, None).unwrap_err());
        assert!(e.contains("no query") && !e.contains("cret"), "{e}");
        let url = RedactedUrl::new("http://u%20x:s%40cret@h:1/base");
        let r = HttpRemote::new(&url, None).unwrap();
        assert_eq!(r.describe(), "http://h:1/base/");
        let a = r.auth.as_ref().unwrap();
        assert_eq!(
            (a.user.as_str(), a.password.as_deref()),
            ("u x", Some("s@cret"))
        );
        let shown = format!("{r:?}");
        assert!(
            !shown.contains("cret") && !shown.contains("u%20x"),
            "{shown}"
        );
    }
}
