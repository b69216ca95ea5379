//! `oscontent stage`: seeds a host repo in the form ostree-ext's container
//! importer leaves it after fetching an image, so that the importer (what
//! rpm-ostree, bootc and the MCO run) later finds every ostree layer
//! present and downloads none.
//!
//! Order, and why:
//! 1. The repo's shared lock is taken (a libostree transaction on a handle
//!    of its own, [`repo::Lock`]), as stock pull and the importer take it,
//!    so `ostree prune` cannot delete what the stage is about to name.
//! 2. The remote's summary (its signature checked first when required),
//!    and the staging index it carries; the pinned digest's entry.
//! 3. The manifest and config from `blobs/sha256/<hex>`, bounded, and the
//!    chain from the digest down checked ([`chain::check`]) **before
//!    anything is written**.
//! 4. The commit, through `pull`'s own steps (target verified, signatures
//!    when the remote or `--trusted-keys` asks, partial marker, only the
//!    missing objects, written under the I/O governor).
//! 5. Each object set: its commit and dirtree fetched and hashed, every
//!    object in it checked to be in the verified commit's closure, the
//!    commit recomputed locally and compared ([`objset`]), then written.
//! 6. `pull`'s durability barrier; then the layer refs, the record commit
//!    and `oscontent/staged/<hex>` in the one transaction's commit. Killed
//!    anywhere before, nothing is visible and a rerun fetches only what is
//!    still missing.
//! 7. Stages the importer has since imported (its image ref's
//!    `ostree.manifest-digest`) are dropped.

pub mod chain;
pub mod follow;
pub mod image;
mod objset;
pub mod options;
pub mod record;
mod repo;

use crate::governor::Governor;
use crate::pull::error::{PullError, PullResult, Tag};
use crate::pull::fetch::{FetchError, Fetcher};
use crate::pull::options::{PullRequest, Remote};
use crate::pull::report::Reporter;
use crate::pull::store::Store;
use crate::pull::{self, finish, remote, PullOptions};
use anyhow::{anyhow, Context};
use chain::{Kind, Plan};
use image::{PinnedImage, MAX_CONFIG_SIZE, MAX_MANIFEST_SIZE};
pub use options::{IoProfile, StageOptions, StageTarget};
use oscontent_format::staging::{digest_string, layer_ref, parse_digest, StagingIndex};
use oscontent_format::{Checksum, RepoPath};
use record::Record;
use serde_json::json;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a stage did, for the `staged` event.
struct Staged {
    record: Record,
    object_sets_written: usize,
    object_sets_present: usize,
    bytes_downloaded: u64,
}

/// What a finished stage staged: what `stage --follow` reports and exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageDone {
    pub digest: String,
    pub commit: String,
    /// Bytes fetched from the remote (objects and deltas).
    pub bytes_downloaded: u64,
}

/// Runs `oscontent stage`.
pub fn stage(opts: &StageOptions, reporter: Arc<Reporter>) -> PullResult<()> {
    stage_until(opts, reporter, async {
        let why = pull::interrupted().await;
        PullError::Interrupted(anyhow!(
            "{why}: the stage was stopped; no ref was written, and the next stage resumes"
        ))
    })
    .map(|_| ())
}

/// Runs a stage unless `stop` resolves first: then the stage ends between
/// two of its steps (no ref is written; the next stage resumes) with the
/// error `stop` gives. Call it outside any async runtime: it runs its own.
pub fn stage_until(
    opts: &StageOptions,
    reporter: Arc<Reporter>,
    stop: impl Future<Output = PullError>,
) -> PullResult<StageDone> {
    let io = opts.io.checked()?;
    // Before any thread exists, so that all of them inherit the I/O class.
    let governor = Arc::new(
        Governor::new(io.mode, io.latency_target, io.max_rate)
            .context("starting the I/O governor")
            .local()?,
    );
    let store = Store::open(&opts.repo).local()?;
    let pull_opts = pull_options(opts, &io);
    let remote = remote::resolve_source(&pull_opts, &store)?;
    let lock = repo::Lock::take(&opts.repo).local()?;
    let rt = pull::runtime(io.concurrency)?;
    let r = rt.block_on(async {
        tokio::select! {
            r = stage_async(opts, &pull_opts, &store, &remote, &governor, &reporter) => r,
            e = stop => Err(e),
        }
    });
    if r.is_err() {
        governor.abandon("the stage failed");
    }
    rt.shutdown_timeout(pull::SHUTDOWN_GRACE);
    let staged = r?;
    let record_commit = lock.commit_stage(&staged.record).local()?;
    report_staged(&reporter, &staged, &record_commit);
    tidy(&opts.repo, &reporter)?;
    Ok(StageDone {
        digest: staged.record.digest.clone(),
        commit: staged.record.commit.clone(),
        bytes_downloaded: staged.bytes_downloaded,
    })
}

/// What a stage asks of `pull`'s steps, given its I/O settings.
pub(crate) fn pull_options(opts: &StageOptions, io: &options::IoSettings) -> PullOptions {
    PullOptions {
        repo: opts.repo.clone(),
        source: opts.source.clone(),
        ref_name: None,
        commit: None,
        trusted_keys: opts.trusted_keys.clone(),
        allow_downgrade: false,
        // The pinned digest vouches for the commit; the bound is pull's.
        max_future_skew: oscontent_format::age::DEFAULT_MAX_FUTURE_SKEW,
        io_mode: io.mode,
        io_latency_target: io.latency_target,
        io_max_rate: io.max_rate,
        concurrency: io.concurrency,
        timeout: opts.timeout,
        http1_only: opts.http1_only,
        output: opts.output,
    }
}

/// Steps 2 to 6 (the refs are the caller's, on the lock). `--timeout`
/// covers everything the remote can slow down, as in `pull`; the barrier
/// is local.
async fn stage_async(
    opts: &StageOptions,
    pull_opts: &PullOptions,
    store: &Store,
    remote: &Remote,
    governor: &Arc<Governor>,
    reporter: &Arc<Reporter>,
) -> PullResult<Staged> {
    let deadline = std::time::Instant::now() + opts.timeout;
    let (pinned, plan) = pull::within(opts.timeout, "the stage", reporter, async {
        let (fetcher, config) =
            Fetcher::connect(&remote.url, 2, opts.http1_only, reporter.clone()).await?;
        pull::check_config(&config)?;
        verified_plan(opts, &fetcher, remote, reporter).await
    })
    .await?;
    let commit_opts = PullOptions {
        commit: Some(plan.commit),
        ..pull_opts.clone()
    };
    let req = PullRequest {
        opts: &commit_opts,
        store: store.clone(),
        remote: remote.clone(),
        governor: governor.clone(),
        reporter: reporter.clone(),
    };
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let ((ctx, target, written), (sets_written, sets_present)) =
        pull::within(left, "the stage", reporter, async {
            let fetched = pull::fetch_all(&req).await?;
            let sets = objset::stage_sets(&fetched.0, &plan).await?;
            Ok((fetched, sets))
        })
        .await?;
    finish::finish(&req, &ctx, &target, &written).await?;
    Ok(Staged {
        record: Record::new(&pinned.digest, &pinned.reference, &plan),
        object_sets_written: sets_written,
        object_sets_present: sets_present,
        bytes_downloaded: ctx.content.counters.bytes.load(Ordering::Relaxed),
    })
}

/// Steps 2 and 3: the index entry of the image, its manifest and config,
/// and the chain from the digest checked. Reports `image-verified`.
async fn verified_plan(
    opts: &StageOptions,
    fetcher: &Fetcher,
    remote: &Remote,
    reporter: &Reporter,
) -> PullResult<(PinnedImage, Plan)> {
    let (summary, index) = indexed_summary(fetcher, remote).await?;
    let index = &index;
    let pinned = match &opts.target {
        StageTarget::Image(p) => p.clone(),
        StageTarget::Ref(r) => pinned_by_ref(&summary, index, r)?,
    };
    let digest = parse_digest(&pinned.digest).expect("checked when parsed");
    let served = index.image(&digest).ok_or_else(|| {
        PullError::Network(anyhow!(
            "the remote does not stage image {} (its staging index lists {} other images)",
            pinned.digest,
            index.images.len()
        ))
    })?;
    let manifest = blob(
        fetcher,
        &served.manifest,
        served.manifest_size,
        MAX_MANIFEST_SIZE,
        "manifest",
    )
    .await?;
    let config = blob(
        fetcher,
        &served.config,
        served.config_size,
        MAX_CONFIG_SIZE,
        "config",
    )
    .await?;
    let served = chain::ServedImage::of(served);
    let plan = chain::check(&pinned.digest, &manifest, &config, &served, layer_ref_of)
        .with_context(|| format!("image {}", pinned.digest))
        .verification()?;
    let count = |f: fn(&Kind) -> bool| plan.layers.iter().filter(|l| f(&l.kind)).count();
    let derived = count(|k| matches!(k, Kind::Derived));
    report_verified(reporter, &pinned, &plan, derived);
    Ok((pinned, plan))
}

fn report_verified(reporter: &Reporter, pinned: &PinnedImage, plan: &Plan, derived: usize) {
    reporter.event(
        "image-verified",
        json!({
            "image": pinned.reference, "digest": pinned.digest, "commit": plan.commit.to_hex(),
            "layers": plan.layers.len(), "derived_layers": derived,
        }),
        Some(format!(
            "image {} verified: commit {}, {} layers ({} derived, left to the importer)",
            pinned.digest,
            plan.commit,
            plan.layers.len(),
            derived
        )),
    );
}

/// `--ref REF`: the one image the index stages for the commit the summary
/// names there.
fn pinned_by_ref(
    summary: &oscontent_format::Summary,
    index: &StagingIndex,
    r: &str,
) -> PullResult<PinnedImage> {
    let commit: Checksum = summary
        .refs
        .iter()
        .find(|e| e.name == r)
        .map(|e| e.commit)
        .ok_or_else(|| PullError::Network(anyhow!("the remote's summary has no ref {r:?}")))?;
    let digests: Vec<String> = index
        .images
        .iter()
        .filter(|i| i.commit == commit)
        .map(|i| digest_string(&i.manifest))
        .collect();
    match digests.as_slice() {
        [d] => Ok(PinnedImage {
            reference: r.to_owned(),
            digest: d.clone(),
        }),
        [] => Err(PullError::Network(anyhow!(
            "ref {r:?} names commit {commit}, which the remote stages no image of"
        ))),
        many => Err(PullError::Usage(anyhow!(
            "ref {r:?} names commit {commit}, which {} staged images share ({}); give --image \
             REFERENCE@DIGEST",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// A manifest or config by digest, of the size the index names (within
/// `max`). A server that indexes an image but does not serve its bytes
/// fails here.
async fn blob(
    fetcher: &Fetcher,
    digest: &Checksum,
    size: u64,
    max: usize,
    what: &str,
) -> PullResult<bytes::Bytes> {
    let shown = digest_string(digest);
    let bound = usize::try_from(size).unwrap_or(usize::MAX);
    if bound > max {
        return Err(PullError::Network(anyhow!(
            "the remote indexes image {what} {shown} of {size} bytes; at most {max} are accepted"
        )));
    }
    let path = RepoPath::Blob(*digest).to_path();
    let b = fetcher
        .get_bytes(&path, bound)
        .await
        .map_err(FetchError::into_pull)?
        .ok_or_else(|| {
            PullError::Network(anyhow!(
                "{}: not found: the remote indexes image {what} {shown} but does not serve it",
                fetcher.url(&path)
            ))
        })?;
    Ok(b)
}

fn report_staged(reporter: &Reporter, s: &Staged, record_commit: &str) {
    let r = &s.record;
    let staged: Vec<_> = r.layers.iter().filter(|l| l.commit.is_some()).collect();
    let bytes: u64 = staged.iter().map(|l| l.size).sum();
    reporter.event(
        "staged",
        json!({
            "digest": r.digest, "image": r.reference, "commit": r.commit,
            "ref": record::staged_ref(&r.digest), "record_commit": record_commit,
            "layers": r.layers.len(), "layer_refs": staged.len(),
            "derived_layers": r.layers.len() - staged.len(), "layer_bytes": bytes,
            "object_sets_written": s.object_sets_written,
            "object_sets_present": s.object_sets_present,
        }),
        Some(format!(
            "staged {}: {} of {} layers present to the importer ({}), commit {}",
            r.digest,
            staged.len(),
            r.layers.len(),
            indicatif::HumanBytes(bytes),
            r.commit
        )),
    );
}

/// Step 7: drops the stages the importer has imported since (their layer
/// refs are the importer's now). Reports `unstaged` for each.
pub fn tidy(path: &std::path::Path, reporter: &Reporter) -> PullResult<()> {
    let lock = repo::Lock::take(path).local()?;
    let inv = repo::inventory(lock.repo(), &layer_ref_of).local()?;
    let victims: BTreeSet<String> = inv
        .staged
        .iter()
        .filter(|s| s.imported)
        .map(|s| s.ref_name.clone())
        .collect();
    if victims.is_empty() {
        return Ok(());
    }
    let drop = inv.drop_set(&victims);
    lock.delete_refs(&drop).local()?;
    for s in inv.staged.iter().filter(|s| victims.contains(&s.ref_name)) {
        reporter.event(
            "unstaged",
            json!({"digest": s.record.digest, "reason": "imported"}),
            Some(format!(
                "{} is imported: its stage is dropped",
                s.record.digest
            )),
        );
    }
    Ok(())
}

/// What the repo holds of `digest`: staged (by a stage's record) or
/// imported (an image ref of the importer's names it), or neither.
pub fn holds(path: &std::path::Path, digest: &str) -> PullResult<(bool, bool)> {
    let store = Store::open(path).local()?;
    let inv = repo::inventory(&store.repo, &layer_ref_of).local()?;
    let staged = inv.staged.iter().any(|s| s.record.digest == digest);
    Ok((staged, inv.imported.contains(digest)))
}

/// The image the remote stages for ref `r` now: its summary read (and
/// verified) as `stage --ref` reads it, and the one index entry for the
/// commit there.
pub async fn image_at_ref(
    remote: &Remote,
    r: &str,
    http1_only: bool,
    reporter: &Arc<Reporter>,
) -> PullResult<PinnedImage> {
    let (fetcher, config) = Fetcher::connect(&remote.url, 1, http1_only, reporter.clone()).await?;
    pull::check_config(&config)?;
    let (summary, index) = indexed_summary(&fetcher, remote).await?;
    pinned_by_ref(&summary, &index, r)
}

/// The remote's summary (its signature checked first when the trust asks)
/// and the staging index it carries.
async fn indexed_summary(
    fetcher: &Fetcher,
    remote: &Remote,
) -> PullResult<(oscontent_format::Summary, StagingIndex)> {
    let (summary, _) = remote::fetch_summary(fetcher, &remote.trust).await?;
    let mut summary = summary.ok_or_else(|| {
        PullError::Network(anyhow!(
            "{}: the remote publishes no summary, so no staging index",
            fetcher.url("summary")
        ))
    })?;
    let index = summary.staging.take().ok_or_else(|| {
        PullError::Network(anyhow!(
            "{}: the remote stages no images (its summary has no staging index)",
            fetcher.url("summary")
        ))
    })?;
    Ok((summary, index))
}

/// `--list`: every stage in the repo.
pub fn list(path: &std::path::Path) -> PullResult<Vec<serde_json::Value>> {
    let store = Store::open(path).local()?;
    let inv = repo::inventory(&store.repo, &layer_ref_of).local()?;
    Ok(inv
        .staged
        .iter()
        .map(|s| {
            let present: BTreeSet<&str> = s.present.iter().map(String::as_str).collect();
            let bytes: u64 = s
                .record
                .layers
                .iter()
                .filter(|l| present.contains(l.ref_name.as_str()))
                .map(|l| l.size)
                .sum();
            json!({
                "digest": s.record.digest, "image": s.record.reference, "commit": s.record.commit,
                "layers": s.record.layers.len(), "layer_refs": s.record.refs().count(),
                "layers_present": s.present.len(), "bytes": bytes, "imported": s.imported,
            })
        })
        .collect())
}

/// `--forget DIGEST`: drops that stage (its staged ref, and the layer refs
/// it wrote that nothing else names). Returns the refs deleted.
pub fn forget(path: &std::path::Path, digest: &str) -> PullResult<Vec<String>> {
    if image::digest_hex(digest).is_none() {
        return Err(PullError::Usage(anyhow!(
            "--forget {digest:?}: want sha256:<64 lowercase hex digits>"
        )));
    }
    let lock = repo::Lock::take(path).local()?;
    let inv = repo::inventory(lock.repo(), &layer_ref_of).local()?;
    let want = record::staged_ref(digest);
    if !inv.staged.iter().any(|s| s.ref_name == want) {
        return Err(PullError::Usage(anyhow!(
            "{digest} is not staged in {} (see --list)",
            path.display()
        )));
    }
    let drop = inv.drop_set(&BTreeSet::from([want]));
    lock.delete_refs(&drop).local()?;
    Ok(drop)
}

/// [`layer_ref`] of a `sha256:<hex>` digest the manifest parser checked.
fn layer_ref_of(digest: &str) -> String {
    layer_ref(&parse_digest(digest).expect("a checked sha256 digest"))
}
