//! One downloaded delta part, unpacked and checked before libostree sees
//! it: inflated here (xz) to at most the size the superblock declares,
//! that size itself within what the commit's `ostree.sizes` allows for
//! the part's objects, its op stream walked by
//! [`oscontent_format::deltapart::check_part_payload`], and stored
//! uncompressed beside the superblock, so libostree maps it as it is and
//! never inflates a remote's bytes into `$TMPDIR` itself.

use super::kind_of;
use crate::pull::store::MAX_CONTENT_SIZE;
use crate::pull::walk::Ctx;
use anyhow::{anyhow, Context, Result};
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::delta::DeltaPart;
use oscontent_format::deltapart::{
    check_part_payload, PartCompression, PartWrites, MAX_PART_PAYLOAD,
};
use oscontent_format::tree::{MAX_DIRMETA_SIZE, MAX_DIRTREE_SIZE};
use oscontent_format::{Checksum, ObjectKind};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;

/// Memory the xz decoder may use: ostree compresses parts at preset 6
/// (an 8 MiB dictionary); preset 9 needs 65 MiB.
const XZ_MEMLIMIT: u64 = 128 << 20;
/// Room in a part's payload besides its objects' bytes: the mode and
/// xattr tables and the op stream, per object and in all.
const PER_OBJECT_SLACK: u64 = 4 << 10;
const PART_SLACK: u64 = 64 << 10;

/// Why a part was refused: its bytes (the remote's fault) or our side.
#[derive(Debug)]
pub enum PartError {
    Corrupt(anyhow::Error),
    Local(anyhow::Error),
}

/// The most bytes object `c` of libostree type `objtype` may declare:
/// the verified commit's `ostree.sizes` where it has the object, else the
/// cap for its kind.
fn object_cap(ctx: &Ctx, objtype: u8, c: &Checksum) -> u64 {
    match kind_of(objtype) {
        Some(ObjectKind::File) => ctx.content_size(c).unwrap_or(MAX_CONTENT_SIZE),
        Some(ObjectKind::DirTree) => ctx.metadata_cap(c, MAX_DIRTREE_SIZE) as u64,
        Some(ObjectKind::DirMeta) => ctx.metadata_cap(c, MAX_DIRMETA_SIZE) as u64,
        Some(ObjectKind::Commit) => ctx.metadata_cap(c, MAX_COMMIT_SIZE) as u64,
        _ => 0,
    }
}

/// The most the part's payload may inflate to: what the superblock
/// declares, within [`MAX_PART_PAYLOAD`], and, when the commit's
/// `ostree.sizes` lists every object of the part, within their sizes
/// plus the part's tables.
pub fn payload_cap(ctx: &Ctx, part: &DeltaPart) -> Result<u64, PartError> {
    let mut cap = part.uncompressed_size.min(MAX_PART_PAYLOAD);
    let listed: Option<u64> = part
        .objects
        .iter()
        .map(|(t, c)| match kind_of(*t) {
            Some(ObjectKind::File) => ctx.content_size(c),
            _ => ctx.declared_metadata(c),
        })
        .try_fold(0u64, |sum, s| s.map(|s| sum.saturating_add(s)));
    if let Some(sum) = listed {
        let slack = PART_SLACK
            .saturating_add(PER_OBJECT_SLACK.saturating_mul(part.objects.len() as u64))
            .saturating_add(sum / 8);
        let allowed = sum.saturating_add(slack);
        if part.uncompressed_size > allowed {
            return Err(PartError::Corrupt(anyhow!(
                "declares {} bytes unpacked, but its objects' ostree.sizes allow {allowed}",
                part.uncompressed_size
            )));
        }
        cap = cap.min(allowed);
    }
    if part.uncompressed_size > MAX_PART_PAYLOAD {
        return Err(PartError::Corrupt(anyhow!(
            "declares {} bytes unpacked, above the {MAX_PART_PAYLOAD} byte limit",
            part.uncompressed_size
        )));
    }
    Ok(cap)
}

/// Unpacks the downloaded part `src` into `dest` (compression byte 0, the
/// payload), inflating at most `cap` bytes, and checks its op stream.
/// Returns the part entry that describes `dest` and what it writes.
pub fn unpack(
    ctx: &Ctx,
    src: &Path,
    dest: &Path,
    part: &DeltaPart,
    cap: u64,
) -> Result<(DeltaPart, PartWrites), PartError> {
    let corrupt = PartError::Corrupt;
    let local = |e: std::io::Error, what: &str, p: &Path| {
        PartError::Local(anyhow!("{what} {}: {e}", p.display()))
    };
    let mut f = std::fs::File::open(src).map_err(|e| local(e, "opening", src))?;
    let mut first = [0u8; 1];
    f.read_exact(&mut first)
        .map_err(|_| corrupt(anyhow!("empty part file")))?;
    let compression = PartCompression::from_byte(first[0]).map_err(|e| corrupt(e.into()))?;
    let reader: Box<dyn Read> = match compression {
        PartCompression::None => Box::new(std::io::BufReader::new(f)),
        PartCompression::Xz => {
            let stream = xz2::stream::Stream::new_stream_decoder(XZ_MEMLIMIT, 0)
                .map_err(|e| PartError::Local(anyhow!("starting the xz decoder: {e}")))?;
            Box::new(xz2::read::XzDecoder::new_stream(
                std::io::BufReader::new(f),
                stream,
            ))
        }
    };
    // One byte past the cap tells a payload that inflates further.
    let mut payload = Vec::new();
    reader
        .take(cap.saturating_add(1))
        .read_to_end(&mut payload)
        .map_err(|e| corrupt(anyhow!("inflating: {e}")))?;
    if payload.len() as u64 > cap {
        return Err(corrupt(anyhow!(
            "inflates past {cap} bytes; the superblock declares {} unpacked",
            part.uncompressed_size
        )));
    }
    let writes = check_part_payload(&payload, &part.objects, |t, c| object_cap(ctx, t, c))
        .map_err(|e| corrupt(e.into()))?;
    let mut out = std::fs::File::create(dest).map_err(|e| local(e, "creating", dest))?;
    let mut h = Sha256::new();
    let head = [PartCompression::None.byte()];
    h.update(head);
    h.update(&payload);
    out.write_all(&head)
        .and_then(|()| out.write_all(&payload))
        .map_err(|e| local(e, "writing", dest))?;
    let unpacked = DeltaPart {
        checksum: Checksum::from(<[u8; 32]>::from(h.finalize())),
        size: payload.len() as u64 + 1,
        uncompressed_size: payload.len() as u64,
        objects: part.objects.clone(),
    };
    Ok((unpacked, writes))
}

/// The part files that libostree reads, described to it.
pub fn write_superblock(dir: &Path, original: &[u8], parts: &[DeltaPart]) -> Result<()> {
    let sb = oscontent_format::delta::superblock_with_parts(original, parts)
        .context("rewriting the superblock for the unpacked parts")?;
    std::fs::write(dir.join("superblock"), sb).context("writing the superblock")
}
