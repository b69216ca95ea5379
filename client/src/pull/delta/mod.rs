//! Static deltas: when the summary lists one from the local commit to the
//! target, and it costs fewer bytes than the loose objects still missing,
//! download its parts into the repo's `tmp/`, check each (`part.rs`:
//! inflated size, op stream, object sizes), and let libostree apply them
//! (`ostree_repo_static_delta_execute_offline`: it checks each part
//! against the superblock's checksum and each object's as it writes). The walk that follows
//! fetches loose anything the delta did not bring (fallbacks).
//!
//! Which deltas are taken: from a remote whose summary is verified
//! (`gpg-verify-summary`, or `--trusted-keys`), only those its signed
//! `ostree.static-deltas` lists; a delta index is not signed, so there it
//! is not read and the objects come loose. From an unverified remote, the
//! summary's list and the target's delta index alike, as stock ostree
//! does: nothing vouches for either, and the bounds of `part.rs` and the
//! space guard hold for every delta however it was found.

use super::error::{PullError, PullResult, Tag};
use super::fetch::{BodyReader, ConsumeError, FetchError};
use super::report::Reporter;
use super::space::Reservation;
use super::walk::Ctx;
use anyhow::{anyhow, Context};
use bytes::Bytes;
use oscontent_format::delta::{delta_is_smaller, MAX_SUPERBLOCK_SIZE};
use oscontent_format::deltapart::{payload_allowance, PartWrites};
use oscontent_format::{Checksum, DeltaName, ObjectKind, Summary, Superblock};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

mod part;

fn kind_of(objtype: u8) -> Option<ObjectKind> {
    // libostree's OstreeObjectType numbering.
    match objtype {
        1 => Some(ObjectKind::File),
        2 => Some(ObjectKind::DirTree),
        3 => Some(ObjectKind::DirMeta),
        4 => Some(ObjectKind::Commit),
        _ => None,
    }
}

/// Tries the delta `from` → `to`: if the summary lists it (or, when the
/// summary is not `verified`, the target's delta index), its superblock
/// checks out, and it is smaller than the loose objects still missing,
/// its parts are downloaded, checked and applied. Returns whether it was
/// applied.
pub async fn try_delta(
    ctx: &Arc<Ctx>,
    reporter: &Reporter,
    summary: &Summary,
    verified: bool,
    from: Checksum,
    to: Checksum,
) -> PullResult<bool> {
    let name = DeltaName {
        from: Some(from),
        to,
    };
    let listed = match summary.deltas.iter().find(|d| d.name == name) {
        Some(d) => Some(d.superblock),
        None if summary.indexed_deltas && verified => {
            reporter.event(
                "delta-skipped",
                json!({"reason": "not in the signed summary (a delta index is not signed)"}),
                None,
            );
            None
        }
        None if summary.indexed_deltas => indexed(ctx, &name).await?,
        None => None,
    };
    let Some(listed) = listed else {
        return Ok(false);
    };
    let Some((sb_bytes, sb)) = fetch_superblock(ctx, reporter, &name, listed).await? else {
        return Ok(false);
    };
    if !worth_it(ctx, reporter, &name, &sb) {
        return Ok(false);
    }
    // The parts are downloaded whole, and libostree inflates each within
    // what the superblock declares allows (checked first): room for both,
    // held until it has applied them; and, before it runs, room for
    // every object their checked op streams may write.
    let what = format!("static delta {}", name.summary_name());
    let need = sb
        .parts
        .iter()
        .map(|p| payload_allowance(p.uncompressed_size, p.objects.len()))
        .try_fold(sb.total_size().unwrap_or(u64::MAX), u64::checked_add)
        .unwrap_or(u64::MAX);
    let room = reserve(ctx, format!("{what} parts"), need).await?;
    let tmp = download(ctx, &name, &sb_bytes, &sb).await?;
    let writes = check_all(ctx, tmp.path(), &sb).await?;
    // Each object takes whole blocks and an inode besides its bytes.
    let objects_need = writes
        .bytes
        .saturating_add(writes.objects.saturating_mul(2 * 4096));
    let _objects = reserve(ctx, format!("{what} objects"), objects_need).await?;
    apply(ctx, tmp.path(), &sb).await?;
    drop(room);
    Ok(true)
}

/// Space for `len` bytes of `what`, from a blocking thread (the check may
/// wait for writes in flight).
async fn reserve(ctx: &Ctx, what: String, len: u64) -> PullResult<Reservation> {
    let space = ctx.space.clone();
    tokio::task::spawn_blocking(move || space.reserve(&what, len))
        .await
        .map_err(|e| PullError::LocalRepo(anyhow!("space check: {e}")))?
        .local()
}

/// Checks every downloaded part (`part.rs`); returns what their op
/// streams write, in all.
async fn check_all(ctx: &Arc<Ctx>, dir: &Path, sb: &Superblock) -> PullResult<PartWrites> {
    let (ctx, dir, parts) = (ctx.clone(), dir.to_path_buf(), sb.parts.clone());
    let done = tokio::task::spawn_blocking(move || {
        let mut total = PartWrites::default();
        for (i, p) in parts.iter().enumerate() {
            let writes = part::payload_cap(&ctx, p)
                .and_then(|cap| part::check(&ctx, &dir.join(i.to_string()), p, cap))
                .map_err(|e| match e {
                    part::PartError::Corrupt(e) => {
                        PullError::Verification(e.context(format!("delta part {i}: refused")))
                    }
                    part::PartError::Local(e) => PullError::LocalRepo(e),
                })?;
            total.objects = total.objects.saturating_add(writes.objects);
            total.bytes = total.bytes.saturating_add(writes.bytes);
        }
        Ok(total)
    });
    done.await
        .map_err(|e| PullError::LocalRepo(anyhow!("delta task: {e}")))?
}

/// The superblock checksum the target's delta index lists for `name`
/// (`ostree.summary.indexed-deltas`), if any. The index is not signed:
/// what it names is checked as the summary's deltas are (superblock
/// against it, the embedded commit against the verified target, parts
/// against the superblock).
async fn indexed(ctx: &Ctx, name: &DeltaName) -> PullResult<Option<Checksum>> {
    const MAX_INDEX: usize = 1 << 20;
    let path = DeltaName::index_path(&name.to);
    let Some(bytes) = ctx
        .content
        .get_bytes(&path, MAX_INDEX)
        .await
        .map_err(FetchError::into_pull)?
    else {
        return Ok(None);
    };
    let list = oscontent_format::parse_delta_index(&bytes)
        .with_context(|| ctx.content.url(&path))
        .verification()?;
    Ok(list
        .into_iter()
        .find(|d| d.name == *name)
        .map(|d| d.superblock))
}

/// The delta's superblock, checked against the checksum the summary lists
/// (`listed`) and against the delta it should describe; `None`, reported
/// as `delta-skipped`, when the remote does not have it.
async fn fetch_superblock(
    ctx: &Ctx,
    reporter: &Reporter,
    name: &DeltaName,
    listed: Checksum,
) -> PullResult<Option<(Bytes, Superblock)>> {
    let sb_path = format!("{}/superblock", name.dir());
    let Some(sb_bytes) = ctx
        .content
        .get_bytes(&sb_path, MAX_SUPERBLOCK_SIZE)
        .await
        .map_err(FetchError::into_pull)?
    else {
        reporter.event(
            "delta-skipped",
            json!({"reason": "superblock not found"}),
            None,
        );
        return Ok(None);
    };
    if Checksum::digest(&sb_bytes) != listed {
        return Err(PullError::Verification(anyhow!(
            "{}: does not match the checksum the summary lists",
            ctx.content.url(&sb_path)
        )));
    }
    let sb = Superblock::parse(&sb_bytes).verification()?;
    if sb.to != name.to || sb.from != name.from || Checksum::digest(&sb.commit) != name.to {
        return Err(PullError::Verification(anyhow!(
            "{}: describes another delta than {}",
            ctx.content.url(&sb_path),
            name.summary_name()
        )));
    }
    Ok(Some((sb_bytes, sb)))
}

/// Whether the delta costs fewer bytes than the loose objects it would
/// replace that the repo still lacks. Reports `delta` (used) or
/// `delta-skipped`.
fn worth_it(ctx: &Ctx, reporter: &Reporter, name: &DeltaName, sb: &Superblock) -> bool {
    let store = ctx.store();
    let smaller = delta_is_smaller(sb, |t, c| {
        kind_of(t).is_none_or(|k| !store.has(k, c).unwrap_or(false))
    });
    if !smaller {
        reporter.event(
            "delta-skipped",
            json!({"reason": "loose objects are smaller", "delta_bytes": sb.total_size()}),
            None,
        );
        return false;
    }
    let (from, to) = (name.from.map(|c| c.to_hex()), name.to.to_hex());
    reporter.event(
        "delta",
        json!({"from": from, "to": to, "parts": sb.parts.len(), "bytes": sb.total_size()}),
        Some(format!(
            "using static delta {} ({} parts, {})",
            name.summary_name(),
            sb.parts.len(),
            indicatif::HumanBytes(sb.total_size().unwrap_or(u64::MAX))
        )),
    );
    true
}

/// Downloads the superblock and every part, each hashed as it streams,
/// into a fresh directory under the repo's `tmp/` (removed when the
/// returned handle is dropped).
async fn download(
    ctx: &Ctx,
    name: &DeltaName,
    sb_bytes: &[u8],
    sb: &Superblock,
) -> PullResult<tempfile::TempDir> {
    let tmp = tempfile::Builder::new()
        .prefix("oscontent-delta-")
        .tempdir_in(ctx.store().path.join("tmp"))
        .context("creating a delta directory in the repo's tmp/")
        .local()?;
    std::fs::write(tmp.path().join("superblock"), sb_bytes)
        .context("writing the superblock")
        .local()?;
    for (i, part) in sb.parts.iter().enumerate() {
        let path = format!("{}/{i}", name.dir());
        let dest = tmp.path().join(i.to_string());
        let want = part.checksum;
        let got = ctx
            .content
            .get_streamed(&path, part.size, move |body, _len| {
                write_part(body, &dest, i, want)
            })
            .await
            .map_err(FetchError::into_pull)?;
        if got.is_none() {
            return Err(PullError::Network(anyhow!(
                "{}: not found on the remote",
                ctx.content.url(&path)
            )));
        }
    }
    Ok(tmp)
}

/// Streams part `i` into `dest` (blocking), checking that it hashes to
/// `want`, the checksum the superblock gives.
fn write_part(
    mut body: BodyReader,
    dest: &Path,
    i: usize,
    want: Checksum,
) -> Result<(), ConsumeError> {
    let mut f = std::fs::File::create(dest)
        .map_err(|e| ConsumeError::Local(anyhow!("creating {}: {e}", dest.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = body
            .read(&mut buf)
            .map_err(|e| ConsumeError::Corrupt(e.into()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        f.write_all(&buf[..n])
            .map_err(|e| ConsumeError::Local(e.into()))?;
    }
    let got = Checksum::from(<[u8; 32]>::from(h.finalize()));
    if got != want {
        return Err(ConsumeError::Corrupt(anyhow!(
            "delta part {i} hashes to {got}, the superblock says {want}"
        )));
    }
    Ok(())
}

/// Has libostree apply the downloaded delta in `dir`, then hands the
/// objects it wrote to the governor.
async fn apply(ctx: &Ctx, dir: &Path, sb: &Superblock) -> PullResult<()> {
    let dir = dir.to_path_buf();
    let store = ctx.store();
    let governor = ctx.governor.clone();
    let objects: Vec<(u8, Checksum)> = sb
        .parts
        .iter()
        .flat_map(|p| p.objects.iter().copied())
        .collect();
    let applied = tokio::task::spawn_blocking(move || {
        store.apply_delta(&dir)?;
        // libostree wrote the delta's objects with our fsync disabled and
        // without telling us: hand them to the governor now, while they
        // are still dirty in the page cache, so they reach the disk paced
        // rather than in one burst from the kernel's flusher or the barrier.
        for (t, c) in objects {
            let Some(kind) = kind_of(t) else { continue };
            let file = store.open_object(kind, &c).map_err(ConsumeError::Local)?;
            governor
                .after_write(file)
                .map_err(|e| ConsumeError::Local(anyhow!("writing back delta object {c}: {e}")))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| PullError::LocalRepo(anyhow!("delta task: {e}")))?;
    match applied {
        Ok(()) => Ok(()),
        Err(ConsumeError::Corrupt(e)) => Err(PullError::Verification(e)),
        Err(ConsumeError::Local(e)) => Err(PullError::LocalRepo(e)),
    }
}
