//! Steps 3 and 4 of a pull: the target's objects. The partial marker is
//! made durable first, then the commit object and its detached metadata
//! are written; from there a killed pull leaves a partial commit that the
//! next run resumes. Then a static delta if one is worth it, and the walk,
//! which fetches whatever is still missing.

use super::delta;
use super::error::{PullResult, Tag};
use super::fetch::Fetcher;
use super::options::PullRequest;
use super::remote::RemoteView;
use super::report::{Progress, Reporter};
use super::target::Target;
use super::walk::{self, Ctx};
use oscontent_format::{ObjectKind, COMMIT_GVARIANT_TYPE};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What writing the objects did.
pub struct Written {
    /// The commit was already complete in the repo: nothing was fetched.
    pub complete: bool,
    /// A static delta was applied.
    pub delta: bool,
}

/// Writes every object of the target that the repo lacks. A commit that is
/// already complete only gets its detached metadata again.
pub async fn write_objects(
    req: &PullRequest<'_>,
    ctx: &Arc<Ctx>,
    view: &RemoteView,
    target: &Target,
) -> PullResult<Written> {
    let complete = target.stored && !req.store.is_partial(&target.checksum).local()?;
    if complete {
        if let Some(m) = &target.meta {
            // Signatures may have been added since.
            write_commitmeta(req, ctx, target, m)?;
        }
        return Ok(Written {
            complete,
            delta: false,
        });
    }
    write_commit(req, ctx, target).await?;
    let delta = fetch_missing(req, ctx, view, target).await?;
    Ok(Written { complete, delta })
}

/// Marks the commit partial (durably, before any of its objects exists),
/// then writes the commit object and its detached metadata.
async fn write_commit(req: &PullRequest<'_>, ctx: &Ctx, target: &Target) -> PullResult<()> {
    req.store.begin_partial(&target.checksum).local()?;
    if !target.stored {
        // Counted as needed too, so that progress ends at needed = written.
        ctx.progress.needed.fetch_add(1, Ordering::Relaxed);
        walk::write_metadata(
            ctx,
            ObjectKind::Commit,
            target.checksum,
            target.bytes.clone(),
            COMMIT_GVARIANT_TYPE,
        )
        .await?;
    }
    if let Some(m) = &target.meta {
        write_commitmeta(req, ctx, target, m)?;
    }
    Ok(())
}

/// The target's detached metadata, as fetched, within the free-space
/// reserve like every other write.
fn write_commitmeta(req: &PullRequest<'_>, ctx: &Ctx, target: &Target, m: &[u8]) -> PullResult<()> {
    let _room = ctx
        .space
        .reserve(&format!("commitmeta {}", target.checksum), m.len() as u64)
        .local()?;
    req.store.write_commitmeta(&target.checksum, m).local()
}

/// Runs [`delta_then_walk`] with progress reported as it goes, and once
/// more when it ends. Returns whether a delta was applied.
async fn fetch_missing(
    req: &PullRequest<'_>,
    ctx: &Arc<Ctx>,
    view: &RemoteView,
    target: &Target,
) -> PullResult<bool> {
    let ticker = spawn_ticker(
        req.reporter.clone(),
        ctx.progress.clone(),
        ctx.content.clone(),
    );
    let r = delta_then_walk(req, ctx, view, target).await;
    ticker.abort();
    report_progress(&req.reporter, &ctx.progress, &ctx.content);
    r
}

/// A static delta from the ref's current commit, if that commit is
/// complete and the summary lists one, then the walk. Returns whether the
/// delta was applied.
async fn delta_then_walk(
    req: &PullRequest<'_>,
    ctx: &Arc<Ctx>,
    view: &RemoteView,
    target: &Target,
) -> PullResult<bool> {
    let mut delta_used = false;
    if let (Some(cur), Some(summary)) = (target.current, &view.summary) {
        if cur != target.checksum && !req.store.is_partial(&cur).local()? {
            delta_used = delta::try_delta(
                ctx,
                &req.reporter,
                summary,
                req.remote.trust.summary,
                cur,
                target.checksum,
            )
            .await?;
        }
    }
    walk::walk(
        ctx.clone(),
        target.commit.root_tree,
        target.commit.root_meta,
    )
    .await?;
    Ok(delta_used)
}

fn report_progress(reporter: &Reporter, progress: &Progress, fetcher: &Fetcher) {
    reporter.progress(
        progress,
        fetcher.counters.bytes.load(Ordering::Relaxed),
        fetcher.counters.requests.load(Ordering::Relaxed),
    );
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
            report_progress(&reporter, &progress, &fetcher);
        }
    })
}
