//! Content objects as an archive remote serves them (`.filez`): a BE u32
//! header length, 4 bytes of padding, the header `(tuuuusa(ayay))` (size,
//! uid, gid, mode, rdev, symlink target, xattrs; integers big-endian),
//! then the file's bytes as raw deflate.
//!
//! libostree writes content from the *uncompressed* stream: the same
//! framing around `(uuuusa(ayay))`, then the bytes. [`ArchiveHeader`]
//! turns one header into the other, so that a `.filez` body can be
//! streamed into `ostree_repo_write_content_trusted`, hashed on the way
//! (over [`ArchiveHeader::content_stream_prefix`] and the bytes) by the
//! client itself.

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::variant::parse_normal;
use glib::Variant;

pub const ARCHIVE_HEADER_GVARIANT_TYPE: &str = "(tuuuusa(ayay))";
pub const FILE_HEADER_GVARIANT_TYPE: &str = "(uuuusa(ayay))";
/// Length prefix plus padding before a header.
pub const HEADER_PREFIX_LEN: usize = 8;
/// Headers above this size are refused: uid, gid, mode, a symlink target
/// (PATH_MAX) and a few xattrs (SELinux label, capabilities, IMA).
pub const MAX_HEADER_SIZE: usize = 1 << 20;

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

const WHAT: &str = "content object header";

fn err(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

/// The header length from the 8-byte prefix.
pub fn header_len(prefix: &[u8; HEADER_PREFIX_LEN]) -> Result<usize, FormatError> {
    let len = u32::from_be_bytes(prefix[..4].try_into().expect("4 bytes")) as usize;
    if len == 0 || len > MAX_HEADER_SIZE {
        return Err(err(format!(
            "header of {len} bytes (limit {MAX_HEADER_SIZE})"
        )));
    }
    Ok(len)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveHeader {
    /// Uncompressed content length (0 for symlinks).
    pub size: u64,
    pub mode: u32,
    /// The `(uuuusa(ayay))` header, serialized.
    pub file_header: Vec<u8>,
}

impl ArchiveHeader {
    /// Parses the header bytes (after the prefix).
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() > MAX_HEADER_SIZE {
            return Err(err("too large"));
        }
        let v = parse_normal(bytes, ARCHIVE_HEADER_GVARIANT_TYPE, WHAT)?;
        let size = u64::from_be(v.child_value(0).get::<u64>().unwrap_or(0));
        let mode = u32::from_be(v.child_value(3).get::<u32>().unwrap_or(0));
        match mode & S_IFMT {
            S_IFREG => {}
            S_IFLNK if size == 0 => {}
            S_IFLNK => return Err(err("symlink with content")),
            other => return Err(err(format!("unsupported file type {other:o}"))),
        }
        let file_header = Variant::tuple_from_iter((1..=6).map(|i| v.child_value(i)));
        debug_assert_eq!(file_header.type_().as_str(), FILE_HEADER_GVARIANT_TYPE);
        Ok(Self {
            size,
            mode,
            file_header: file_header.data().to_vec(),
        })
    }

    /// The framing libostree expects before the content bytes.
    pub fn content_stream_prefix(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_PREFIX_LEN + self.file_header.len());
        out.extend_from_slice(&(self.file_header.len() as u32).to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.file_header);
        out
    }

    /// Total length of the uncompressed content stream; saturates, since
    /// `size` is whatever the remote declared (found by the `filez` fuzz
    /// target: u64::MAX overflowed), and callers cap it anyway.
    pub fn content_stream_len(&self) -> u64 {
        ((HEADER_PREFIX_LEN + self.file_header.len()) as u64).saturating_add(self.size)
    }
}

/// The content checksum of an archive (`.filez`) object, as libostree
/// computes it (and `ostree fsck` checks it): SHA-256 over the 8-byte
/// length prefix, the file header `(uuuusa(ayay))` and the inflated
/// content. The header is parsed and bounded as [`ArchiveHeader::parse`]
/// does; the content must inflate to exactly the size it declares, with
/// nothing after the deflate stream. The one implementation: the mirror's
/// store and the server's publication both verify content with it.
pub fn archive_checksum(mut r: impl std::io::BufRead) -> anyhow::Result<Checksum> {
    use anyhow::{bail, ensure, Context};
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut prefix = [0u8; HEADER_PREFIX_LEN];
    r.read_exact(&mut prefix)
        .context("too short for a content object")?;
    let mut header = vec![0u8; header_len(&prefix)?];
    r.read_exact(&mut header).context("truncated header")?;
    let h = ArchiveHeader::parse(&header)?;
    let mut hasher = Sha256::new();
    hasher.update(h.content_stream_prefix());
    // Symlinks (and libostree's empty files) carry no deflate stream at all.
    if r.fill_buf().context("reading")?.is_empty() {
        ensure!(
            h.size == 0,
            "no content, but the header declares {} bytes",
            h.size
        );
        return Ok(Checksum::from(<[u8; 32]>::from(hasher.finalize())));
    }
    let mut body = flate2::bufread::DeflateDecoder::new(r);
    let mut buf = vec![0u8; 64 << 10];
    let mut n: u64 = 0;
    loop {
        let got = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(g) => g,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => bail!("inflating the content: {e}"),
        };
        n += got as u64;
        ensure!(
            n <= h.size,
            "the content inflates to more than the {} bytes its header declares",
            h.size
        );
        hasher.update(&buf[..got]);
    }
    ensure!(
        n == h.size,
        "the content inflates to {n} bytes, its header declares {}",
        h.size
    );
    let mut rest = body.into_inner();
    ensure!(
        rest.fill_buf().context("reading")?.is_empty(),
        "trailing bytes after the compressed content"
    );
    Ok(Checksum::from(<[u8; 32]>::from(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use glib::prelude::ToVariant;
    use glib::VariantTy;

    fn header(size: u64, mode: u32, target: &str) -> Vec<u8> {
        Variant::tuple_from_iter([
            size.to_be().to_variant(),
            0u32.to_variant(),
            0u32.to_variant(),
            mode.to_be().to_variant(),
            0u32.to_variant(),
            target.to_variant(),
            Variant::array_from_iter_with_type(
                VariantTy::new("(ayay)").unwrap(),
                [] as [Variant; 0],
            ),
        ])
        .data()
        .to_vec()
    }

    #[test]
    fn converts_archive_header() {
        let h = ArchiveHeader::parse(&header(0x4d3f, 0o100644, "")).unwrap();
        assert_eq!(h.size, 0x4d3f);
        assert_eq!(h.mode, 0o100644);
        // The same fields minus the size: 16 bytes of integers, "", framing.
        assert_eq!(h.file_header.len(), 18);
        let p = h.content_stream_prefix();
        assert_eq!(&p[..8], &[0, 0, 0, 18, 0, 0, 0, 0]);
        assert_eq!(h.content_stream_len(), 8 + 18 + 0x4d3f);
    }

    /// tests/fuzz/corpus/filez/regression-size-max: a declared size near
    /// u64::MAX must not overflow the stream length.
    #[test]
    fn huge_declared_size_saturates() {
        for size in [u64::MAX, u64::MAX - 1, u64::MAX - 25] {
            let h = ArchiveHeader::parse(&header(size, 0o100644, "")).unwrap();
            assert_eq!(h.content_stream_len(), u64::MAX, "{size}");
        }
        let h = ArchiveHeader::parse(&header(u64::MAX - 26, 0o100644, "")).unwrap();
        assert_eq!(h.content_stream_len(), u64::MAX - 26 + 8 + 18);
    }

    #[test]
    fn refuses_bad_headers() {
        let cases: &[(&str, Vec<u8>)] = &[
            ("symlink with data", header(5, 0o120777, "x")),
            ("device", header(0, 0o020644, "")),
            ("directory", header(0, 0o040755, "")),
            ("oversized", vec![0; MAX_HEADER_SIZE + 1]),
        ];
        for (name, b) in cases {
            assert!(ArchiveHeader::parse(b).is_err(), "{name} accepted");
        }
        assert!(ArchiveHeader::parse(&header(0, 0o120777, "target")).is_ok());
        assert!(header_len(&[0; 8]).is_err());
        assert!(header_len(&[0xff, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert_eq!(header_len(&[0, 0, 0, 26, 0, 0, 0, 0]).unwrap(), 26);
    }

    /// `archive_checksum` against what the encoder wrote and libostree's
    /// content checksum of the same parts (`ContentHasher`), and the
    /// malformed bodies it must refuse.
    #[test]
    fn archive_checksum_is_the_content_checksum_and_refuses_bad_bodies() {
        use crate::filez::{ContentHasher, FileMeta, FilezWriter};
        use std::io::Write;
        let filez = |meta: &FileMeta, body: &[u8]| {
            let mut w = FilezWriter::new(Vec::new(), meta, body.len() as u64).unwrap();
            w.write_all(body).unwrap();
            w.finish().unwrap()
        };
        let expected = |meta: &FileMeta, body: &[u8]| {
            let mut h = ContentHasher::new(meta).unwrap();
            h.update(body);
            h.finish()
        };
        let file = FileMeta::regular(0, 0, 0o644, Vec::new());
        let link = FileMeta::symlink(0, 0, "target".into(), Vec::new());
        let body = b"hello, content\n".repeat(1000);
        for (meta, body) in [(&file, &body[..]), (&file, &b""[..]), (&link, &b""[..])] {
            let bytes = filez(meta, body);
            let got = archive_checksum(&bytes[..]).unwrap();
            assert_eq!(got, expected(meta, body));
        }
        let good = filez(&file, &body);
        let mut trailing = good.clone();
        trailing.push(0);
        let cases: [(&str, &[u8]); 4] = [
            ("trailing", &trailing),
            ("truncated", &good[..good.len() - 5]),
            ("empty", &[]),
            ("header only", &good[..HEADER_PREFIX_LEN]),
        ];
        for (what, bytes) in cases {
            assert!(archive_checksum(bytes).is_err(), "{what}");
        }
    }
}
