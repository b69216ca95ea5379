//! Static deltas: when the summary lists one from the local commit to the
//! target, and it costs fewer bytes than the loose objects still missing,
//! download its parts into the repo's `tmp/` and let libostree apply them
//! (`ostree_repo_static_delta_execute_offline`: it checks each part against
//! the superblock's checksum and each object's checksum as it writes).
//! The walk that follows fetches loose anything the delta did not bring
//! (fallbacks), so a delta that fails to apply costs time, not correctness.

use super::error::{PullError, PullResult, Tag};
use super::fetch::{ConsumeError, FetchError};
use super::report::Reporter;
use super::walk::Ctx;
use anyhow::{anyhow, Context};
use oscontent_format::delta::{delta_is_smaller, MAX_SUPERBLOCK_SIZE};
use oscontent_format::{Checksum, DeltaName, ObjectKind, Summary, Superblock};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::sync::Arc;

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

/// Tries the delta `from` → `to`. Returns whether it was applied.
pub async fn try_delta(
    ctx: &Arc<Ctx>,
    reporter: &Reporter,
    summary: &Summary,
    from: Checksum,
    to: Checksum,
) -> PullResult<bool> {
    let name = DeltaName {
        from: Some(from),
        to,
    };
    let Some(listed) = summary.deltas.iter().find(|d| d.name == name) else {
        return Ok(false);
    };
    let sb_path = format!("{}/superblock", name.dir());
    let Some(sb_bytes) = ctx
        .fetcher
        .get_bytes(&sb_path, MAX_SUPERBLOCK_SIZE)
        .await
        .map_err(FetchError::into_pull)?
    else {
        reporter.event(
            "delta-skipped",
            json!({"reason": "superblock not found"}),
            None,
        );
        return Ok(false);
    };
    if Checksum::digest(&sb_bytes) != listed.superblock {
        return Err(PullError::Verification(anyhow!(
            "{}: does not match the checksum the summary lists",
            ctx.fetcher.url(&sb_path)
        )));
    }
    let sb = Superblock::parse(&sb_bytes).verification()?;
    if sb.to != to || sb.from != Some(from) || Checksum::digest(&sb.commit) != to {
        return Err(PullError::Verification(anyhow!(
            "{}: describes another delta than {}",
            ctx.fetcher.url(&sb_path),
            name.summary_name()
        )));
    }
    let store = ctx.store();
    let smaller = delta_is_smaller(&sb, |t, c| {
        kind_of(t).is_none_or(|k| !store.has(k, c).unwrap_or(false))
    });
    if !smaller {
        reporter.event(
            "delta-skipped",
            json!({"reason": "loose objects are smaller", "delta_bytes": sb.total_size()}),
            None,
        );
        return Ok(false);
    }
    reporter.event(
        "delta",
        json!({"from": from.to_hex(), "to": to.to_hex(), "parts": sb.parts.len(), "bytes": sb.total_size()}),
        Some(format!(
            "using static delta {} ({} parts, {})",
            name.summary_name(),
            sb.parts.len(),
            indicatif::HumanBytes(sb.total_size())
        )),
    );
    let tmp = tempfile::Builder::new()
        .prefix("oscontent-delta-")
        .tempdir_in(store.path.join("tmp"))
        .context("creating a delta directory in the repo's tmp/")
        .local()?;
    std::fs::write(tmp.path().join("superblock"), &sb_bytes)
        .context("writing the superblock")
        .local()?;
    for (i, part) in sb.parts.iter().enumerate() {
        let path = format!("{}/{i}", name.dir());
        let dest = tmp.path().join(i.to_string());
        let want = part.checksum;
        let got = ctx
            .fetcher
            .get_streamed(&path, part.size, move |mut body, _len| {
                let mut f = std::fs::File::create(&dest).map_err(|e| {
                    ConsumeError::Local(anyhow!("creating {}: {e}", dest.display()))
                })?;
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
            })
            .await
            .map_err(FetchError::into_pull)?;
        if got.is_none() {
            return Err(PullError::Network(anyhow!(
                "{}: not found on the remote",
                ctx.fetcher.url(&path)
            )));
        }
    }
    let dir = tmp.path().to_path_buf();
    let store2 = store.clone();
    let governor = ctx.governor.clone();
    let objects: Vec<(u8, Checksum)> = sb
        .parts
        .iter()
        .flat_map(|p| p.objects.iter().copied())
        .collect();
    let applied = tokio::task::spawn_blocking(move || {
        store2.apply_delta(&dir)?;
        // libostree wrote the delta's objects with our fsync disabled and
        // without telling us: hand them to the governor now, while they
        // are still dirty in the page cache, so they reach the disk paced
        // rather than in one burst from the kernel's flusher or the barrier.
        for (t, c) in objects {
            let Some(kind) = kind_of(t) else { continue };
            let file = store2.open_object(kind, &c).map_err(ConsumeError::Local)?;
            governor
                .after_write(file)
                .map_err(|e| ConsumeError::Local(anyhow!("writing back delta object {c}: {e}")))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| PullError::LocalRepo(anyhow!("delta task: {e}")))?;
    match applied {
        Ok(()) => Ok(true),
        Err(ConsumeError::Corrupt(e)) => Err(PullError::Verification(e)),
        Err(ConsumeError::Local(e)) => Err(PullError::LocalRepo(e)),
    }
}
