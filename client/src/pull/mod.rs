//! `oscontent pull` and `oscontent verify`: the node side of the data flow
//! (ARCHITECTURE.md, "Data flow"): remote → plan → fetch → verify → write
//! (I/O governor) → barrier → ref moves.
//!
//! Order of a pull, and why (one step a function, in `pull_async`):
//! 1. `config` (must be an archive repo), `summary` (and `summary.sig`
//!    when verifying), the target commit (summary, else `refs/heads/REF`,
//!    or `--commit`): `connect`, `remote.rs`.
//! 2. The commit object and its detached metadata, hashed and verified
//!    (signatures, ref binding, downgrade) **before anything is written**:
//!    `target.rs`. After an interrupted pull, objects it may have left torn
//!    are checked before they are trusted, from here on (`object_context`).
//! 3. `state/C.commitpartial` is written, then the commit object: from
//!    here on a killed pull leaves a partial commit that `ostree fsck`
//!    accepts and a rerun resumes: `objects.rs`.
//! 4. A static delta if one from the local commit is listed and smaller,
//!    then the walk, which fetches every object still missing:
//!    `objects.rs`, `delta.rs`, `walk.rs`.
//! 5. One durability barrier (`syncfs`), the partial marker removed, and
//!    only then the ref moves (written with fsync, its directory fsynced):
//!    `finish.rs`.

pub mod delta;
pub mod error;
pub mod fetch;
pub(crate) mod finish;
pub mod inflate;
pub(crate) mod objects;
pub mod options;
pub mod origin;
pub(crate) mod remote;
pub mod report;
pub mod space;
pub mod store;
pub(crate) mod target;
pub mod verify;
pub mod walk;

use crate::governor::Governor;
use anyhow::{anyhow, Context};
use error::{PullError, PullResult, Tag};
use fetch::{FetchError, Fetcher};
use options::PullRequest;
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::gpgsigs::MAX_DETACHED_METADATA_SIZE;
use oscontent_format::summary::MAX_SUMMARY_SIZE;
use oscontent_format::{parse_summary, validate_ref, Checksum, Commit, ObjectKind, ObjectName};
use report::{Progress, Reporter};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use store::Store;
use target::commitmeta;
use verify::Keyring;
use walk::Ctx;

pub use options::{PullOptions, Source};
pub use report::Output;

/// Worker threads for the async side (network and walk); writes happen on
/// blocking threads, one per object in flight.
const RUNTIME_THREADS: usize = 2;

pub(crate) fn runtime(concurrency: usize) -> PullResult<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_THREADS)
        .max_blocking_threads(concurrency + 4)
        .enable_all()
        .build()
        .context("starting the async runtime")
        .usage()
}

/// Runs a pull; the reporter is shared so that the caller can report the
/// final error in the same format.
pub fn pull(opts: &PullOptions, reporter: Arc<Reporter>) -> PullResult<()> {
    check_usage(opts)?;
    // libostree inflates a static delta's xz parts into an anonymous file
    // under `$TMPDIR`: in the repo's own `tmp/` they are on the filesystem
    // the space guard keeps, within what it reserved for them (`delta/`),
    // not on whatever `$TMPDIR` is. Set before any thread exists (nothing
    // reads the environment meanwhile).
    std::env::set_var("TMPDIR", opts.repo.join("tmp"));
    // Before any thread exists, so that all of them inherit the I/O class.
    let governor = Arc::new(
        Governor::new(opts.io_mode, opts.io_latency_target, opts.io_max_rate)
            .context("starting the I/O governor")
            .local()?,
    );
    let store = Store::open(&opts.repo).local()?;
    let remote = remote::resolve_source(opts, &store)?;
    let rt = runtime(opts.concurrency)?;
    let req = PullRequest {
        opts,
        store,
        remote,
        governor: governor.clone(),
        reporter: reporter.clone(),
    };
    // A signal ends the pull between two steps of it (a ref is moved by
    // one synchronous call, never cut in half), reported like any failure.
    let r = rt.block_on(async {
        tokio::select! {
            r = pull_async(req) => r,
            why = interrupted() => Err(PullError::Interrupted(anyhow!(
                "{why}: the pull was stopped; the ref did not move, and the next pull \
                 resumes"
            ))),
        }
    });
    // Writer threads still streaming when the deadline struck end as their
    // bodies close, and those waiting on the governor's backlog as it gives
    // up; none of them can link an object that did not verify.
    if r.is_err() {
        governor.abandon("the pull failed");
    }
    rt.shutdown_timeout(SHUTDOWN_GRACE);
    reporter.finish();
    r
}

/// Resolves at the first SIGINT or SIGTERM, naming it; never if the
/// handlers cannot be installed (the signal then kills, as by default,
/// which a pull survives too).
pub(crate) async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}

/// How long a pull that failed waits for its writer threads to stop.
pub(crate) const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `work` within `limit` (`--timeout`); past it, a network failure
/// that says which deadline struck, and what was last being retried.
pub(crate) async fn within<T>(
    limit: std::time::Duration,
    what: &str,
    reporter: &Reporter,
    work: impl std::future::Future<Output = PullResult<T>>,
) -> PullResult<T> {
    tokio::time::timeout(limit, work).await.map_err(|_| {
        let waiting = match reporter.last_retry() {
            Some(e) => format!(" (last retried: {e})"),
            None => String::new(),
        };
        PullError::Network(anyhow!(
            "{what} did not finish within --timeout {}s{waiting}: the server is too slow or \
             stalls on purpose, or writes are paced slower than that (--io-max-rate, a slow \
             disk); nothing was moved",
            limit.as_secs_f64()
        ))
    })?
}

/// The most requests in flight: over HTTP/1.1 each is a connection, and
/// oscontent-server accepts 64 from one address by default
/// (`--max-connections-per-ip`); past that a pull only collects resets.
pub const MAX_CONCURRENCY: usize = 64;

/// What the command line cannot check by itself.
fn check_usage(opts: &PullOptions) -> PullResult<()> {
    if opts.ref_name.is_none() && opts.commit.is_none() {
        return Err(PullError::Usage(anyhow!("give --ref, --commit, or both")));
    }
    if let Some(r) = &opts.ref_name {
        validate_ref(r).usage()?;
    }
    if !(1..=MAX_CONCURRENCY).contains(&opts.concurrency) {
        return Err(PullError::Usage(anyhow!(
            "--concurrency must be 1 to {MAX_CONCURRENCY} (a server's default cap on one \
             address's connections), not {}",
            opts.concurrency
        )));
    }
    Ok(())
}

/// The steps of a pull, in the order of the module doc. Takes the request
/// by value so that the repo and the governor are released when the pull
/// ends, before the caller finishes its report.
async fn pull_async(req: PullRequest<'_>) -> PullResult<()> {
    let req = &req;
    // The deadline covers everything the remote can slow down; the barrier
    // and the ref move are local, and are not cut off half-way.
    let (ctx, target, written) =
        within(req.opts.timeout, "the pull", &req.reporter, fetch_all(req)).await?;
    finish::finish(req, &ctx, &target, &written).await
}

/// Steps 1 to 4: everything that talks to the remote.
pub(crate) async fn fetch_all(
    req: &PullRequest<'_>,
) -> PullResult<(Arc<Ctx>, target::Target, objects::Written)> {
    let (meta, content) = connect(req).await?;
    let opts = req.opts;
    let view = remote::resolve_target(
        &meta,
        opts.ref_name.as_deref(),
        opts.commit,
        &req.remote.trust,
    )
    .await?;
    let current = req.current()?;
    let ctx = object_context(req, meta, content)?;
    let target = target::verify_target(req, &ctx, &view, current).await?;
    let written = objects::write_objects(req, &ctx, &view, &target).await?;
    Ok((ctx, target, written))
}

/// Connects to the remote (and to its `contenturl`, if it has one), checks
/// that it is an archive repo, and reports `start`. Returns the metadata
/// and the content fetchers, one and the same without a `contenturl`.
async fn connect(req: &PullRequest<'_>) -> PullResult<(Arc<Fetcher>, Arc<Fetcher>)> {
    let (opts, reporter) = (req.opts, &req.reporter);
    let (url, remote, trust) = (req.remote.url.clone(), &req.remote.name, &req.remote.trust);
    let (fetcher, config) =
        Fetcher::connect(&url, opts.concurrency, opts.http1_only, reporter.clone()).await?;
    check_config(&config)?;
    let fetcher = Arc::new(fetcher);
    let content = match &req.remote.content_url {
        Some(c) => Arc::new(fetcher.connect_content(c, opts.http1_only).await?),
        None => fetcher.clone(),
    };
    let split = req.remote.content_url.is_some();
    reporter.event(
        "start",
        json!({
            "repo": opts.repo, "url": fetcher.shown_base(), "remote": remote, "ref": opts.ref_name,
            "content_url": split.then(|| content.shown_base()),
            "content_protocol": split.then(|| content.protocol.as_str()),
            "protocol": fetcher.protocol.as_str(), "io_mode": opts.io_mode.as_str(),
            "io_latency_target_ms": opts.io_latency_target.as_secs_f64() * 1e3,
            "io_max_rate": opts.io_max_rate,
            "concurrency": opts.concurrency, "verify": trust.commits,
        }),
        None,
    );
    Ok((fetcher, content))
}

pub(crate) fn check_config(config: &[u8]) -> PullResult<()> {
    let config = oscontent_format::RepoConfig::parse(config)
        .map_err(|e| PullError::Network(anyhow!("the remote's config: {e}")))?;
    match config.mode.as_deref() {
        _ if config.is_archive() => Ok(()),
        Some(m) => Err(PullError::Network(anyhow!(
            "the remote repo has mode {m:?}; only archive repos can be pulled over HTTP"
        ))),
        None => Err(PullError::Network(anyhow!(
            "the remote's config has no core.mode: not an ostree repo"
        ))),
    }
}

/// What the object steps share. If an earlier pull was interrupted, says
/// so: present objects written since it began are checked before they are
/// trusted (see [`Ctx::present`]).
fn object_context(
    req: &PullRequest<'_>,
    meta: Arc<Fetcher>,
    content: Arc<Fetcher>,
) -> PullResult<Arc<Ctx>> {
    let progress = Arc::new(Progress::default());
    let suspect_since = req.store.oldest_partial_marker().local()?;
    if let Some(t) = suspect_since {
        let unix = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ago = t.elapsed().unwrap_or_default();
        req.reporter.event(
            "resume",
            json!({"interrupted_since_unix": unix.as_secs()}),
            Some(format!(
                "an earlier pull was interrupted ({}s ago): objects written since are checked before they are trusted",
                ago.as_secs()
            )),
        );
    }
    let space = space::SpaceGuard::new(
        req.store.dir().local()?,
        req.store.path.display().to_string(),
        req.store.min_free().local()?,
    );
    Ok(Arc::new(Ctx::new(
        meta,
        content,
        req.store.clone(),
        req.governor.clone(),
        progress,
        req.opts.concurrency,
        suspect_since,
        Arc::new(space),
    )))
}

/// `oscontent verify` options.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub url: String,
    pub ref_name: String,
    pub commit: Option<Checksum>,
    pub trusted_keys: PathBuf,
    pub timeout: std::time::Duration,
    pub http1_only: bool,
}

/// What `verify` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyReport {
    pub url: String,
    #[serde(rename = "ref")]
    pub ref_name: String,
    pub commit: String,
    /// Where the summary's ref points (may differ from a pinned commit).
    pub summary_commit: Option<String>,
    pub version: Option<String>,
    pub timestamp: u64,
    pub summary_signature: serde_json::Value,
    pub commit_signature: serde_json::Value,
    pub ref_binding: Option<Vec<String>>,
}

/// Fetches summary + summary.sig, the commit + commitmeta, and verifies
/// all of it (signatures, checksum, ref binding) without writing anything.
pub fn verify(opts: &VerifyOptions, reporter: Arc<Reporter>) -> PullResult<VerifyReport> {
    validate_ref(&opts.ref_name).usage()?;
    let keyring = Keyring::load(&opts.trusted_keys)?;
    let rt = runtime(2)?;
    let r = rt.block_on(within(opts.timeout, "verify", &reporter.clone(), async {
        let (fetcher, config) = Fetcher::connect(&opts.url, 2, opts.http1_only, reporter).await?;
        check_config(&config)?;
        let summary = fetcher
            .get_bytes("summary", MAX_SUMMARY_SIZE)
            .await
            .map_err(FetchError::into_pull)?
            .ok_or_else(|| remote::no_summary(&fetcher.url("summary")))?;
        let sig = fetcher
            .get_bytes("summary.sig", MAX_DETACHED_METADATA_SIZE)
            .await
            .map_err(FetchError::into_pull)?;
        let ssig = verify::verify_summary(&keyring, &summary, sig.as_deref())?;
        let parsed = parse_summary(&summary)
            .context("parsing the summary")
            .net()?;
        let summary_commit = parsed
            .refs
            .iter()
            .find(|r| r.name == opts.ref_name)
            .map(|r| r.commit);
        let target = opts.commit.or(summary_commit).ok_or_else(|| {
            PullError::Verification(anyhow!(
                "ref {:?} is not in the signed summary",
                opts.ref_name
            ))
        })?;
        let path = ObjectName::new(target, ObjectKind::Commit).path();
        let cbytes = fetcher
            .get_bytes(&path, MAX_COMMIT_SIZE)
            .await
            .map_err(FetchError::into_pull)?
            .ok_or_else(|| PullError::Network(anyhow!("{}: not found", fetcher.url(&path))))?;
        if Checksum::digest(&cbytes) != target {
            return Err(PullError::Verification(anyhow!(
                "{}: checksum mismatch",
                fetcher.url(&path)
            )));
        }
        let commit = Commit::parse(&cbytes).verification()?;
        let meta = commitmeta(&fetcher, &target).await?;
        let csig = verify::verify_commit(
            &keyring,
            &cbytes,
            meta.as_deref(),
            &format!("commit {target}"),
        )?;
        verify::check_binding(&commit, &opts.ref_name)?;
        Ok(VerifyReport {
            url: fetcher.shown_base().to_owned(),
            ref_name: opts.ref_name.clone(),
            commit: target.to_hex(),
            summary_commit: summary_commit.map(|c| c.to_hex()),
            version: commit.version(),
            timestamp: commit.timestamp,
            summary_signature: verify::describe(&ssig),
            commit_signature: verify::describe(&csig),
            ref_binding: commit.ref_binding(),
        })
    }));
    rt.shutdown_timeout(SHUTDOWN_GRACE);
    r
}
