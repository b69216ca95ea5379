//! Step 5 of a pull: one durability barrier (governor drain, `syncfs`),
//! the partial marker removed (and `state/` fsynced), and only then the
//! ref moves; then the `done` report.

use super::error::{PullError, PullResult, Tag};
use super::objects::Written;
use super::options::PullRequest;
use super::target::Target;
use super::walk::Ctx;
use anyhow::{anyhow, Context};
use oscontent_format::Checksum;
use serde_json::json;
use std::sync::atomic::Ordering;

/// Makes everything written durable, then moves the ref, then reports
/// `done`.
pub async fn finish(
    req: &PullRequest<'_>,
    ctx: &Ctx,
    target: &Target,
    written: &Written,
) -> PullResult<()> {
    barrier(req).await?;
    if !written.complete {
        req.store.mark_partial(&target.checksum, false).local()?;
        req.store.sync_state_dir().local()?;
    }
    let moved = move_ref(req, target)?;
    req.reporter.finish();
    report_done(req, ctx, target, written, moved);
    Ok(())
}

/// The one durability barrier: the governor drains, then `syncfs` on the
/// repo's filesystem. Reports `barrier`.
async fn barrier(req: &PullRequest<'_>) -> PullResult<()> {
    let dir = req.store.dir().local()?;
    let g = req.governor.clone();
    let barrier = tokio::task::spawn_blocking(move || g.barrier(&dir))
        .await
        .map_err(|e| PullError::LocalRepo(anyhow!("barrier task: {e}")))?
        .context("syncfs on the repo filesystem")
        .local()?;
    req.reporter.event(
        "barrier",
        json!({"duration_ms": barrier.as_secs_f64() * 1e3}),
        None,
    );
    Ok(())
}

/// Moves the ref to the target, durably, unless it is there already or no
/// ref was given. Returns whether it moved, and reports `ref-moved` if so.
fn move_ref(req: &PullRequest<'_>, target: &Target) -> PullResult<bool> {
    let Some(r) = &req.opts.ref_name else {
        return Ok(false);
    };
    if target.current == Some(target.checksum) {
        return Ok(false);
    }
    req.store
        .set_ref(req.remote.name.as_deref(), r, &target.checksum)
        .local()?;
    req.reporter.event(
        "ref-moved",
        json!({
            "ref": req.refspec(), "from": target.current.map(|c| c.to_hex()),
            "to": target.checksum.to_hex(),
        }),
        None,
    );
    Ok(true)
}

/// The `done` event: what the pull fetched and wrote, and the governor's
/// stats.
fn report_done(req: &PullRequest<'_>, ctx: &Ctx, target: &Target, written: &Written, moved: bool) {
    let refspec = req.refspec();
    let (progress, c) = (&ctx.progress, &ctx.content.counters);
    let human = done_line(
        req,
        ctx,
        target.checksum,
        refspec.as_deref(),
        written,
        moved,
    );
    req.reporter.event(
        "done",
        json!({
            "commit": target.checksum.to_hex(), "ref": refspec,
            "previous": target.current.map(|c| c.to_hex()),
            "ref_moved": moved, "up_to_date": written.complete,
            "objects_written": progress.written.load(Ordering::Relaxed),
            "metadata_written": progress.metadata_written.load(Ordering::Relaxed),
            "content_written": progress.content_written.load(Ordering::Relaxed),
            "objects_present": progress.present.load(Ordering::Relaxed),
            "objects_rechecked": progress.rechecked.load(Ordering::Relaxed),
            "objects_repaired": progress.repaired.load(Ordering::Relaxed),
            "bytes_downloaded": c.bytes.load(Ordering::Relaxed),
            "requests": c.requests.load(Ordering::Relaxed),
            "retries": c.retries.load(Ordering::Relaxed),
            "protocol": ctx.meta.protocol.as_str(),
            "objects_protocol": ctx.objects_protocol().map(|p| p.as_str()),
            "delta": written.delta,
            "governor": req.governor.stats(),
        }),
        Some(human),
    );
}

/// The `done` event's line for a human.
fn done_line(
    req: &PullRequest<'_>,
    ctx: &Ctx,
    target: Checksum,
    refspec: Option<&str>,
    written: &Written,
    moved: bool,
) -> String {
    let (progress, c) = (&ctx.progress, &ctx.content.counters);
    let what = match (refspec, moved, written.complete) {
        (Some(r), true, _) => format!("{r} moved to {target}"),
        (Some(r), false, _) => format!("{r} already at {target}"),
        (None, _, true) => format!("commit {target} already complete"),
        (None, _, false) => format!("commit {target} complete"),
    };
    format!(
        "{what}: {} objects fetched ({}), {} already present, {} retries, {:.1}s",
        progress.written.load(Ordering::Relaxed),
        indicatif::HumanBytes(c.bytes.load(Ordering::Relaxed)),
        progress.present.load(Ordering::Relaxed),
        c.retries.load(Ordering::Relaxed),
        req.reporter.elapsed().as_secs_f64(),
    )
}
