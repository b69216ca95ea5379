//! Step 2 of a pull: the target commit, checked before anything is
//! written. Its bytes hash to its name, its signatures verify when they
//! are required, its `ostree.ref-binding` allows the ref, and it is not
//! older than what the ref has (unless `--allow-downgrade`). A refusal here
//! leaves the repo untouched.

use super::error::{PullError, PullResult, Tag};
use super::fetch::{FetchError, Fetcher};
use super::options::{PullRequest, Trust};
use super::remote::RemoteView;
use super::verify;
use super::walk::{self, Ctx, DeclaredSizes};
use anyhow::{anyhow, Context};
use oscontent_format::age::Vouched;
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::gpgsigs::MAX_DETACHED_METADATA_SIZE;
use oscontent_format::{Checksum, Commit, ObjectKind, ObjectName};
use serde_json::json;

/// The target commit, verified, and what the later steps need of it.
pub struct Target {
    pub checksum: Checksum,
    /// The commit object's bytes, hashed to `checksum`.
    pub bytes: Vec<u8>,
    pub commit: Commit,
    /// Its detached metadata on the remote, if any.
    pub meta: Option<bytes::Bytes>,
    /// Whether the repo already has the commit object.
    pub stored: bool,
    /// The commit the local ref points at now, if any.
    pub current: Option<Checksum>,
}

/// Loads or fetches the target commit and its detached metadata, checks
/// them (signatures, ref binding, downgrade), and reports `verified`.
pub async fn verify_target(
    req: &PullRequest<'_>,
    ctx: &Ctx,
    view: &RemoteView,
    current: Option<Checksum>,
) -> PullResult<Target> {
    let target = load(ctx, view.target, current).await?;
    let signed_by = check_signature(&req.remote.trust, &target)?;
    if let Some(r) = &req.opts.ref_name {
        verify::check_binding(&target.commit, r)?;
    }
    verify::check_collection(
        &target.commit,
        req.remote.collection_id.as_deref(),
        declared_collection(req, view),
    )?;
    ctx.set_sizes(declared_sizes(&target.commit)?);
    let vouched = vouched(req, signed_by.is_some());
    check_future(req, &target, vouched)?;
    let downgrade_checked = check_downgrade(req, &target, vouched)?;
    req.reporter.event(
        "verified",
        json!({
            "commit": target.checksum.to_hex(), "resolved_by": view.resolved_by,
            "version": target.commit.version(), "timestamp": target.commit.timestamp,
            "signature": signed_by, "summary_signature": view.summary_sig,
            "ref_binding": target.commit.ref_binding(), "downgrade_checked": downgrade_checked,
        }),
        None,
    );
    Ok(target)
}

/// The collection a verified summary declares (an unsigned one proves
/// nothing).
fn declared_collection<'a>(req: &'a PullRequest<'_>, view: &'a RemoteView) -> Option<&'a str> {
    view.summary
        .as_ref()
        .filter(|_| req.remote.trust.summary)
        .and_then(|s| s.collection_id.as_deref())
}

/// The sizes a verified commit declares (`ostree.sizes`), which cap what
/// its `.filez` headers may declare and how much of a dirtree or dirmeta
/// is read; a malformed list refuses the commit.
fn declared_sizes(commit: &Commit) -> PullResult<DeclaredSizes> {
    let sizes = commit
        .object_sizes()
        .with_context(|| format!("commit {}", commit.checksum))
        .verification()?;
    let mut out = DeclaredSizes::default();
    for s in sizes {
        if s.is_content() {
            out.content.insert(s.checksum, s.unpacked);
        } else {
            out.metadata.insert(s.checksum, s.archived);
        }
    }
    Ok(out)
}

/// The commit `c` (from the repo, else fetched and hashed), parsed, and its
/// detached metadata from the remote.
async fn load(ctx: &Ctx, c: Checksum, current: Option<Checksum>) -> PullResult<Target> {
    let (bytes, stored) = commit_bytes(ctx, &c).await?;
    let commit = Commit::parse(&bytes)
        .with_context(|| format!("commit {c}"))
        .verification()?;
    let meta = commitmeta(&ctx.meta, &c).await?;
    Ok(Target {
        checksum: c,
        bytes,
        commit,
        meta,
        stored,
        current,
    })
}

/// The target commit's bytes, from the repo if present, else fetched, and
/// checked to hash to their name.
async fn commit_bytes(ctx: &Ctx, c: &Checksum) -> PullResult<(Vec<u8>, bool)> {
    if ctx.present(ObjectKind::Commit, c).await? {
        return Ok((ctx.store().load(ObjectKind::Commit, c).local()?, true));
    }
    // Over the connection the pull began on: the object walk may never
    // need another (see `Fetcher::for_objects`).
    let b = walk::fetch_metadata(&ctx.content, ObjectKind::Commit, c, MAX_COMMIT_SIZE).await?;
    Ok((b, false))
}

/// A commit's detached metadata (`.commitmeta`) on the remote, if any.
pub async fn commitmeta(fetcher: &Fetcher, c: &Checksum) -> PullResult<Option<bytes::Bytes>> {
    fetcher
        .get_bytes(
            &ObjectName::new(*c, ObjectKind::CommitMeta).path(),
            MAX_DETACHED_METADATA_SIZE,
        )
        .await
        .map_err(FetchError::into_pull)
}

/// Verifies the commit's signatures when the remote must sign commits;
/// returns the description of the one that verified.
fn check_signature(trust: &Trust, target: &Target) -> PullResult<Option<serde_json::Value>> {
    if !trust.commits {
        return Ok(None);
    }
    let v = verify::verify_commit(
        trust.keyring(),
        &target.bytes,
        target.meta.as_deref(),
        &format!("commit {}", target.checksum),
    )?;
    Ok(Some(verify::describe(&v)))
}

/// Whether a verified signature or a pinned `--commit` vouches for the
/// target (and, as the same settings installed it, for the current one).
fn vouched(req: &PullRequest<'_>, signed: bool) -> Vouched {
    match signed || req.opts.commit.is_some() {
        true => Vouched::Verified,
        false => Vouched::Unverified,
    }
}

/// Refuses an unverified target dated past `--max-future-skew`: the ref
/// would then hold back every later release (a pinned `--commit` or a
/// verified signature vouches for any date).
fn check_future(req: &PullRequest<'_>, target: &Target, vouched: Vouched) -> PullResult<()> {
    use oscontent_format::age::{mark_refusal, Age};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let age = Age {
        timestamp: target.commit.timestamp,
        version: None,
    };
    match mark_refusal(&age, vouched, now, req.opts.max_future_skew) {
        None => Ok(()),
        Some(why) => Err(PullError::Downgrade(anyhow!(
            "refusing to move {} to {}: {why} (verify with --trusted-keys, pin it with \
             --commit, or widen --max-future-skew)",
            req.refspec().as_deref().unwrap_or("the ref"),
            target.checksum
        ))),
    }
}

/// Refuses a target older (timestamp or version) than the ref's current
/// commit, unless `--allow-downgrade`, which reports it instead. Returns
/// whether there was another current commit to compare with.
fn check_downgrade(req: &PullRequest<'_>, target: &Target, vouched: Vouched) -> PullResult<bool> {
    let Some(cur) = target.current.filter(|c| *c != target.checksum) else {
        return Ok(false);
    };
    let cur_bytes = req.store.load(ObjectKind::Commit, &cur).local()?;
    let cur_commit = Commit::parse(&cur_bytes)
        .with_context(|| format!("local commit {cur}"))
        .local()?;
    let (cv, tv) = (cur_commit.version(), target.commit.version());
    let reason = oscontent_format::age::downgrade_reason_from(
        &oscontent_format::age::Age {
            timestamp: cur_commit.timestamp,
            version: cv.as_deref(),
        },
        vouched,
        &oscontent_format::age::Age {
            timestamp: target.commit.timestamp,
            version: tv.as_deref(),
        },
        req.opts.max_future_skew,
    );
    if let Some(why) = reason {
        if !req.opts.allow_downgrade {
            return Err(PullError::Downgrade(anyhow!(
                "refusing to move {} from {cur} to {}: {why} (--allow-downgrade overrides)",
                req.refspec().as_deref().unwrap_or("the ref"),
                target.checksum
            )));
        }
        req.reporter.event(
            "downgrade-allowed",
            json!({"reason": why}),
            Some(format!("warning: {why}; allowed by --allow-downgrade")),
        );
    }
    Ok(true)
}
