//! One downloaded delta part, checked before libostree sees it: inflated
//! here (xz) to at most what the size the superblock declares allows,
//! that size itself within what the commit's `ostree.sizes` allows for
//! the part's objects, and its op stream walked by
//! [`oscontent_format::deltapart::check_part_payload`]. libostree then
//! applies the very file that was checked (its checksum is the one the
//! superblock gives), so its own inflation stops where this one did.
//!
//! The part is handed over as downloaded, not stored uncompressed:
//! libostree 2022.7 maps an uncompressed part file at offset 1
//! (`ot_variant_read_fd`), which `mmap` refuses for any part past 16 KiB.

use super::kind_of;
use crate::pull::store::MAX_CONTENT_SIZE;
use crate::pull::walk::Ctx;
use anyhow::anyhow;
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::delta::DeltaPart;
use oscontent_format::deltapart::{
    check_part_payload, payload_allowance, PartCompression, PartWrites, MAX_PART_PAYLOAD,
};
use oscontent_format::tree::{MAX_DIRMETA_SIZE, MAX_DIRTREE_SIZE};
use oscontent_format::{Checksum, ObjectKind};
use std::io::Read;
use std::path::Path;

/// Memory the xz decoder may use: ostree compresses parts at preset 6
/// (an 8 MiB dictionary); preset 9 needs 65 MiB.
const XZ_MEMLIMIT: u64 = 128 << 20;
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
/// declares for its objects ([`payload_allowance`]), within
/// [`MAX_PART_PAYLOAD`]; when the commit's `ostree.sizes` lists every
/// object of the part, the declaration may not exceed their sizes (with
/// the same allowance).
pub fn payload_cap(ctx: &Ctx, part: &DeltaPart) -> Result<u64, PartError> {
    let n = part.objects.len();
    let listed: Option<u64> = part
        .objects
        .iter()
        .map(|(t, c)| match kind_of(*t) {
            Some(ObjectKind::File) => ctx.content_size(c),
            _ => ctx.declared_metadata(c),
        })
        .try_fold(0u64, |sum, s| s.map(|s| sum.saturating_add(s)));
    if let Some(sum) = listed {
        let allowed = payload_allowance(sum, n);
        if part.uncompressed_size > allowed {
            return Err(PartError::Corrupt(anyhow!(
                "declares {} bytes unpacked, but its objects' ostree.sizes allow {allowed}",
                part.uncompressed_size
            )));
        }
    }
    let cap = payload_allowance(part.uncompressed_size, n);
    if cap > MAX_PART_PAYLOAD {
        return Err(PartError::Corrupt(anyhow!(
            "declares {} bytes unpacked, above the {MAX_PART_PAYLOAD} byte limit",
            part.uncompressed_size
        )));
    }
    Ok(cap)
}

/// Inflates the downloaded part `src`, at most `cap` bytes, and checks
/// its op stream; returns what it writes.
pub fn check(ctx: &Ctx, src: &Path, part: &DeltaPart, cap: u64) -> Result<PartWrites, PartError> {
    let corrupt = PartError::Corrupt;
    let mut f = std::fs::File::open(src)
        .map_err(|e| PartError::Local(anyhow!("opening {}: {e}", src.display())))?;
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
            "inflates past {cap} bytes, more than the {} the superblock declares allow",
            part.uncompressed_size
        )));
    }
    check_part_payload(&payload, &part.objects, |t, c| object_cap(ctx, t, c))
        .map_err(|e| corrupt(e.into()))
}
