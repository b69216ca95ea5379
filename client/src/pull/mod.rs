//! `oscontent pull` and `oscontent verify`: the node side of the data flow
//! (DESIGN.md): remote → plan → fetch → verify → write (I/O governor) →
//! barrier → ref moves.
//!
//! Order of a pull, and why:
//! 1. `config` (must be an archive repo), `summary` (and `summary.sig`
//!    when verifying), the target commit (summary, else `refs/heads/REF`,
//!    or `--commit`).
//! 2. The commit object and its detached metadata, hashed and verified
//!    (signatures, ref binding, downgrade) **before anything is written**.
//! 3. `state/C.commitpartial` is written, then the commit object: from
//!    here on a killed pull leaves a partial commit that `ostree fsck`
//!    accepts and a rerun resumes.
//! 4. A static delta if one from the local commit is listed and smaller,
//!    then the walk, which fetches every object still missing.
//! 5. One durability barrier (`syncfs`), the partial marker removed, and
//!    only then the ref moves (written with fsync, its directory fsynced).

pub mod delta;
pub mod error;
pub mod fetch;
pub mod policy;
pub mod report;
pub mod store;
pub mod verify;
pub mod walk;

use crate::governor::{Governor, IoMode};
use anyhow::{anyhow, Context};
use error::{PullError, PullResult, Tag};
use fetch::{FetchError, Fetcher};
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::gpgsigs::MAX_DETACHED_METADATA_SIZE;
use oscontent_format::summary::MAX_SUMMARY_SIZE;
use oscontent_format::{
    parse_summary, validate_ref, Checksum, Commit, ObjectKind, ObjectName, Summary,
    COMMIT_GVARIANT_TYPE,
};
use report::{Progress, Reporter};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use store::Store;
use verify::Keyring;
use walk::Ctx;

pub use report::Output;

/// Where to pull from.
#[derive(Debug, Clone)]
pub enum Source {
    Url(String),
    /// A remote configured in the repo (`ostree remote add`).
    Remote(String),
}

#[derive(Debug, Clone)]
pub struct PullOptions {
    pub repo: PathBuf,
    pub source: Source,
    pub ref_name: Option<String>,
    pub commit: Option<Checksum>,
    pub trusted_keys: Option<PathBuf>,
    pub allow_downgrade: bool,
    pub io_mode: IoMode,
    pub io_latency_target: Duration,
    pub concurrency: usize,
    pub http1_only: bool,
    pub output: Output,
}

/// `refs/heads/REF` bodies: a checksum and a newline.
const MAX_REF_FILE_SIZE: usize = 1024;
/// Worker threads for the async side (network and walk); writes happen on
/// blocking threads, one per object in flight.
const RUNTIME_THREADS: usize = 2;

/// What verification is required, and against which keys.
#[derive(Debug, Clone)]
struct Trust {
    keyring: Option<Keyring>,
    commits: bool,
    summary: bool,
}

fn runtime(concurrency: usize) -> PullResult<tokio::runtime::Runtime> {
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
    if opts.ref_name.is_none() && opts.commit.is_none() {
        return Err(PullError::Usage(anyhow!("give --ref, --commit, or both")));
    }
    if let Some(r) = &opts.ref_name {
        validate_ref(r).usage()?;
    }
    if opts.concurrency == 0 {
        return Err(PullError::Usage(anyhow!(
            "--concurrency must be at least 1"
        )));
    }
    // Before any thread exists, so that all of them inherit the I/O class.
    let governor = Arc::new(
        Governor::new(opts.io_mode, opts.io_latency_target)
            .context("starting the I/O governor")
            .local()?,
    );
    let store = Store::open(&opts.repo).local()?;
    let (url, remote, trust) = resolve_source(opts, &store)?;
    let rt = runtime(opts.concurrency)?;
    let r = rt.block_on(pull_async(
        opts,
        store,
        url,
        remote,
        trust,
        governor,
        reporter.clone(),
    ));
    reporter.finish();
    r
}

fn resolve_source(
    opts: &PullOptions,
    store: &Store,
) -> PullResult<(String, Option<String>, Trust)> {
    let explicit = opts
        .trusted_keys
        .as_deref()
        .map(Keyring::load)
        .transpose()?;
    match &opts.source {
        Source::Url(u) => {
            let on = explicit.is_some();
            Ok((
                u.clone(),
                None,
                Trust {
                    keyring: explicit,
                    commits: on,
                    summary: on,
                },
            ))
        }
        Source::Remote(name) => {
            let url = store.remote_url(name).usage()?;
            let (gpg_commits, gpg_summary) = store.remote_gpg_verify(name).usage()?;
            if let Some(k) = explicit {
                return Ok((
                    url,
                    Some(name.clone()),
                    Trust {
                        keyring: Some(k),
                        commits: true,
                        summary: true,
                    },
                ));
            }
            if !gpg_commits && !gpg_summary {
                return Ok((
                    url,
                    Some(name.clone()),
                    Trust {
                        keyring: None,
                        commits: false,
                        summary: false,
                    },
                ));
            }
            let keyring = remote_keyring(store, name)?.ok_or_else(|| {
                PullError::Usage(anyhow!(
                    "remote {name:?} requires GPG verification but has no keyring oscontent can read \
                     (gpgkeypath, or {name}.trustedkeys.gpg in the repo); pass --trusted-keys FILE"
                ))
            })?;
            Ok((
                url,
                Some(name.clone()),
                Trust {
                    keyring: Some(keyring),
                    commits: gpg_commits,
                    summary: gpg_summary,
                },
            ))
        }
    }
}

/// A remote's keys: its `gpgkeypath` files, else the keyring
/// `ostree remote gpg-import` wrote (`REPO/NAME.trustedkeys.gpg`).
fn remote_keyring(store: &Store, name: &str) -> PullResult<Option<Keyring>> {
    if let Some(p) = store.remote_option(name, "gpgkeypath").usage()? {
        let paths: Vec<PathBuf> = p
            .split([';', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        if !paths.is_empty() {
            return Keyring::load_all(&paths).map(Some);
        }
    }
    let imported = store.path.join(format!("{name}.trustedkeys.gpg"));
    if imported.is_file() {
        return Keyring::load(&imported).map(Some);
    }
    Ok(None)
}

fn check_config(config: &[u8]) -> PullResult<()> {
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

/// The remote's metadata that decides the target.
struct RemoteView {
    summary: Option<Summary>,
    target: Checksum,
    /// How the target was found.
    resolved_by: &'static str,
    summary_sig: Option<serde_json::Value>,
}

async fn resolve_target(
    fetcher: &Fetcher,
    ref_name: Option<&str>,
    pinned: Option<Checksum>,
    trust: &Trust,
) -> PullResult<RemoteView> {
    let summary_bytes = fetcher
        .get_bytes("summary", MAX_SUMMARY_SIZE)
        .await
        .map_err(FetchError::into_pull)?;
    // The signature first: bytes a hostile server made up are reported as
    // what they are (a summary that does not verify), not as a server that
    // cannot write GVariant, and are never parsed.
    let mut summary_sig = None;
    if let (Some(bytes), true) = (&summary_bytes, trust.summary) {
        let keyring = trust.keyring.as_ref().expect("verification has a keyring");
        let sig = fetcher
            .get_bytes("summary.sig", MAX_DETACHED_METADATA_SIZE)
            .await
            .map_err(FetchError::into_pull)?;
        let v = verify::verify_summary(keyring, bytes, sig.as_deref())?;
        summary_sig = Some(verify::describe(&v));
    }
    let summary = summary_bytes
        .as_deref()
        .map(parse_summary)
        .transpose()
        .with_context(|| format!("parsing {}", fetcher.url("summary")))
        .net()?;
    let (target, resolved_by) = match (pinned, ref_name) {
        (Some(c), _) => (c, "pinned"),
        (None, Some(r)) => {
            match summary
                .as_ref()
                .and_then(|s| s.refs.iter().find(|e| e.name == r))
            {
                Some(e) => (e.commit, "summary"),
                None => {
                    let path = format!("refs/heads/{r}");
                    let body = fetcher
                        .get_bytes(&path, MAX_REF_FILE_SIZE)
                        .await
                        .map_err(FetchError::into_pull)?
                        .ok_or_else(|| {
                            PullError::Network(anyhow!(
                                "the remote has no ref {r:?} (not in its summary, and {} is not found)",
                                fetcher.url(&path)
                            ))
                        })?;
                    if summary.is_some() && trust.summary {
                        return Err(PullError::Verification(anyhow!(
                            "ref {r:?} is not in the signed summary"
                        )));
                    }
                    let text = String::from_utf8_lossy(&body);
                    let c = Checksum::from_hex(text.trim())
                        .with_context(|| fetcher.url(&path))
                        .net()?;
                    (c, "ref-file")
                }
            }
        }
        (None, None) => unreachable!("checked by the caller"),
    };
    Ok(RemoteView {
        summary,
        target,
        resolved_by,
        summary_sig,
    })
}

/// The target commit's bytes, from the repo if present, else fetched, and
/// checked to hash to their name.
async fn commit_bytes(ctx: &Ctx, c: &Checksum) -> PullResult<(Vec<u8>, bool)> {
    if ctx.present(ObjectKind::Commit, c).await? {
        return Ok((ctx.store().load(ObjectKind::Commit, c).local()?, true));
    }
    let b = walk::fetch_metadata(ctx, ObjectKind::Commit, c, MAX_COMMIT_SIZE).await?;
    Ok((b, false))
}

async fn commitmeta(fetcher: &Fetcher, c: &Checksum) -> PullResult<Option<bytes::Bytes>> {
    fetcher
        .get_bytes(
            &ObjectName::new(*c, ObjectKind::CommitMeta).path(),
            MAX_DETACHED_METADATA_SIZE,
        )
        .await
        .map_err(FetchError::into_pull)
}

#[allow(clippy::too_many_arguments)]
async fn pull_async(
    opts: &PullOptions,
    store: Store,
    url: String,
    remote: Option<String>,
    trust: Trust,
    governor: Arc<Governor>,
    reporter: Arc<Reporter>,
) -> PullResult<()> {
    let (fetcher, config) =
        Fetcher::connect(&url, opts.concurrency, opts.http1_only, reporter.clone()).await?;
    check_config(&config)?;
    let fetcher = Arc::new(fetcher);
    let refspec = opts.ref_name.as_ref().map(|r| match &remote {
        Some(rm) => format!("{rm}:{r}"),
        None => r.clone(),
    });
    reporter.event(
        "start",
        json!({
            "repo": opts.repo, "url": url, "remote": remote, "ref": opts.ref_name,
            "protocol": fetcher.protocol.as_str(), "io_mode": opts.io_mode.as_str(),
            "io_latency_target_ms": opts.io_latency_target.as_secs_f64() * 1e3,
            "concurrency": opts.concurrency, "verify": trust.commits,
        }),
        None,
    );
    let view = resolve_target(&fetcher, opts.ref_name.as_deref(), opts.commit, &trust).await?;
    let target = view.target;
    let current = match &refspec {
        Some(r) => store.resolve(r).local()?,
        None => None,
    };
    let progress = Arc::new(Progress::default());
    let suspect_since = store.oldest_partial_marker().local()?;
    if let Some(t) = suspect_since {
        let unix = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ago = t.elapsed().unwrap_or_default();
        reporter.event(
            "resume",
            json!({"interrupted_since_unix": unix.as_secs()}),
            Some(format!(
                "an earlier pull was interrupted ({}s ago): objects written since are checked before they are trusted",
                ago.as_secs()
            )),
        );
    }
    let ctx = Arc::new(Ctx::new(
        fetcher.clone(),
        store.clone(),
        governor.clone(),
        progress.clone(),
        opts.concurrency,
        suspect_since,
    ));

    // Verify before writing anything.
    let (cbytes, have_commit) = commit_bytes(&ctx, &target).await?;
    let commit = Commit::parse(&cbytes)
        .with_context(|| format!("commit {target}"))
        .verification()?;
    let meta = commitmeta(&fetcher, &target).await?;
    let mut signed_by = None;
    if trust.commits {
        let keyring = trust.keyring.as_ref().expect("verification has a keyring");
        let v = verify::verify_commit(
            keyring,
            &cbytes,
            meta.as_deref(),
            &format!("commit {target}"),
        )?;
        signed_by = Some(verify::describe(&v));
    }
    if let Some(r) = &opts.ref_name {
        verify::check_binding(&commit, r)?;
    }
    let mut downgrade_checked = false;
    if let Some(cur) = current.filter(|c| *c != target) {
        let cur_bytes = store.load(ObjectKind::Commit, &cur).local()?;
        let cur_commit = Commit::parse(&cur_bytes)
            .with_context(|| format!("local commit {cur}"))
            .local()?;
        let (cv, tv) = (cur_commit.version(), commit.version());
        let reason = policy::downgrade_reason(
            &policy::Age {
                timestamp: cur_commit.timestamp,
                version: cv.as_deref(),
            },
            &policy::Age {
                timestamp: commit.timestamp,
                version: tv.as_deref(),
            },
        );
        if let Some(why) = reason {
            if !opts.allow_downgrade {
                return Err(PullError::Downgrade(anyhow!(
                    "refusing to move {} from {cur} to {target}: {why} (--allow-downgrade overrides)",
                    refspec.as_deref().unwrap_or("the ref")
                )));
            }
            reporter.event(
                "downgrade-allowed",
                json!({"reason": why}),
                Some(format!("warning: {why}; allowed by --allow-downgrade")),
            );
        }
        downgrade_checked = true;
    }
    reporter.event(
        "verified",
        json!({
            "commit": target.to_hex(), "resolved_by": view.resolved_by,
            "version": commit.version(), "timestamp": commit.timestamp,
            "signature": signed_by, "summary_signature": view.summary_sig,
            "ref_binding": commit.ref_binding(), "downgrade_checked": downgrade_checked,
        }),
        None,
    );

    let complete = have_commit && !store.is_partial(&target).local()?;
    let mut delta_used = false;
    if !complete {
        store.begin_partial(&target).local()?;
        if !have_commit {
            walk::write_metadata(
                &ctx,
                ObjectKind::Commit,
                target,
                cbytes.clone(),
                COMMIT_GVARIANT_TYPE,
            )
            .await?;
        }
        if let Some(m) = &meta {
            store.write_commitmeta(&target, m).local()?;
        }
        let ticker = spawn_ticker(reporter.clone(), progress.clone(), fetcher.clone());
        let r = async {
            if let (Some(cur), Some(summary)) = (current, &view.summary) {
                if cur != target && !store.is_partial(&cur).local()? {
                    delta_used = delta::try_delta(&ctx, &reporter, summary, cur, target).await?;
                }
            }
            walk::walk(ctx.clone(), commit.root_tree, commit.root_meta).await
        }
        .await;
        ticker.abort();
        reporter.progress(
            &progress,
            fetcher.counters.bytes.load(Ordering::Relaxed),
            fetcher.counters.requests.load(Ordering::Relaxed),
        );
        r?;
    } else if let Some(m) = &meta {
        // Signatures may have been added since.
        store.write_commitmeta(&target, m).local()?;
    }

    // Durability barrier, then the marker, then the ref.
    let dir = store.dir().local()?;
    let g = governor.clone();
    let barrier = tokio::task::spawn_blocking(move || g.barrier(&dir))
        .await
        .map_err(|e| PullError::LocalRepo(anyhow!("barrier task: {e}")))?
        .context("syncfs on the repo filesystem")
        .local()?;
    reporter.event(
        "barrier",
        json!({"duration_ms": barrier.as_secs_f64() * 1e3}),
        None,
    );
    if !complete {
        store.mark_partial(&target, false).local()?;
        store.sync_state_dir().local()?;
    }
    let mut moved = false;
    if let Some(r) = &opts.ref_name {
        if current != Some(target) {
            store.set_ref(remote.as_deref(), r, &target).local()?;
            moved = true;
            reporter.event(
                "ref-moved",
                json!({"ref": refspec, "from": current.map(|c| c.to_hex()), "to": target.to_hex()}),
                None,
            );
        }
    }
    let stats = governor.stats();
    let c = &fetcher.counters;
    let human = format!(
        "{} {} at {target}: {} objects fetched ({}), {} already present, {} retries, {:.1}s",
        refspec.as_deref().unwrap_or("commit"),
        if moved {
            "moved"
        } else if complete {
            "already"
        } else {
            "complete"
        },
        progress.written.load(Ordering::Relaxed),
        indicatif::HumanBytes(c.bytes.load(Ordering::Relaxed)),
        progress.present.load(Ordering::Relaxed),
        c.retries.load(Ordering::Relaxed),
        reporter.elapsed().as_secs_f64(),
    );
    reporter.event(
        "done",
        json!({
            "commit": target.to_hex(), "ref": refspec, "previous": current.map(|c| c.to_hex()),
            "ref_moved": moved, "up_to_date": complete,
            "objects_written": progress.written.load(Ordering::Relaxed),
            "metadata_written": progress.metadata_written.load(Ordering::Relaxed),
            "content_written": progress.content_written.load(Ordering::Relaxed),
            "objects_present": progress.present.load(Ordering::Relaxed),
            "objects_rechecked": progress.rechecked.load(Ordering::Relaxed),
            "objects_repaired": progress.repaired.load(Ordering::Relaxed),
            "bytes_downloaded": c.bytes.load(Ordering::Relaxed),
            "requests": c.requests.load(Ordering::Relaxed),
            "retries": c.retries.load(Ordering::Relaxed),
            "protocol": fetcher.protocol.as_str(),
            "delta": delta_used,
            "governor": stats,
        }),
        Some(human),
    );
    Ok(())
}

fn spawn_ticker(
    reporter: Arc<Reporter>,
    progress: Arc<Progress>,
    fetcher: Arc<Fetcher>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(reporter.progress_interval());
        loop {
            tick.tick().await;
            reporter.progress(
                &progress,
                fetcher.counters.bytes.load(Ordering::Relaxed),
                fetcher.counters.requests.load(Ordering::Relaxed),
            );
        }
    })
}

/// `oscontent verify` options.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub url: String,
    pub ref_name: String,
    pub commit: Option<Checksum>,
    pub trusted_keys: PathBuf,
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
    rt.block_on(async {
        let (fetcher, config) = Fetcher::connect(&opts.url, 2, opts.http1_only, reporter).await?;
        check_config(&config)?;
        let summary = fetcher
            .get_bytes("summary", MAX_SUMMARY_SIZE)
            .await
            .map_err(FetchError::into_pull)?
            .ok_or_else(|| PullError::Network(anyhow!("{}: not found", fetcher.url("summary"))))?;
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
            url: opts.url.clone(),
            ref_name: opts.ref_name.clone(),
            commit: target.to_hex(),
            summary_commit: summary_commit.map(|c| c.to_hex()),
            version: commit.version(),
            timestamp: commit.timestamp,
            summary_signature: verify::describe(&ssig),
            commit_signature: verify::describe(&csig),
            ref_binding: commit.ref_binding(),
        })
    })
}
