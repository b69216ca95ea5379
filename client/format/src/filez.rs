//! Building content objects from a file's parts: the bare content checksum
//! (what names a content object in every repo mode) and the archive
//! `.filez` encoding an archive remote serves.
//!
//! From ostree's `docs/formats.md` and libostree's `ostree-core.c`:
//! - the *file header* is the GVariant `(uuuusa(ayay))`: uid, gid, mode
//!   (with the file-type bits), rdev 0, the symlink target (empty for a
//!   regular file), the xattrs; integers big-endian;
//! - the content checksum is SHA-256 over the header *size-prefixed* (a
//!   big-endian u32 length, 4 bytes of padding, the header) followed by
//!   the file's bytes (none for a symlink);
//! - a `.filez` is the same framing around `(tuuuusa(ayay))` (the
//!   uncompressed size first), then, for a regular file, its bytes as raw
//!   deflate; a symlink has no body.
//!
//! The reading side (a `.filez` header back to the stream libostree
//! writes) is [`crate::content`].

use crate::checksum::Checksum;
use crate::content::{ARCHIVE_HEADER_GVARIANT_TYPE, FILE_HEADER_GVARIANT_TYPE, MAX_HEADER_SIZE};
use crate::error::FormatError;
use crate::variant::{parse_normal, ty};
use glib::prelude::ToVariant;
use glib::Variant;
use sha2::{Digest, Sha256};
use std::io::{self, Write};

pub const XATTRS_GVARIANT_TYPE: &str = "a(ayay)";
/// The deflate level whose output is the size of libostree's archive
/// objects (`OSTREE_ARCHIVE_DEFAULT_COMPRESSION_LEVEL`, zlib's 6), so that
/// our `.filez` objects are the size a `pull-local` would make. flate2
/// runs on zlib-rs, whose 6 takes zlib-ng's faster strategy and came out
/// 3.0% bigger than zlib's 6 on 204 MiB of 16 KiB objects; its 9 came out
/// 0.2% smaller, in the time miniz_oxide's 6 took (RESULTS.md).
pub const ARCHIVE_COMPRESSION_LEVEL: u32 = 9;

pub const S_IFMT: u32 = 0o170000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

const WHAT: &str = "content object";

fn err(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

/// What a content object records besides its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    pub uid: u32,
    pub gid: u32,
    /// With the file-type bits (`S_IFREG` or `S_IFLNK`).
    pub mode: u32,
    /// `Some` for a symlink.
    pub symlink_target: Option<String>,
    /// The serialized `a(ayay)` (empty bytes: no xattrs).
    pub xattrs: Vec<u8>,
}

impl FileMeta {
    /// A regular file: `perms` are the permission bits (any type bits in
    /// them, as tar headers sometimes carry, are replaced).
    pub fn regular(uid: u32, gid: u32, perms: u32, xattrs: Vec<u8>) -> Self {
        Self {
            uid,
            gid,
            mode: S_IFREG | (perms & !S_IFMT),
            symlink_target: None,
            xattrs,
        }
    }

    /// A symlink; its mode is always 0777, as libostree writes symlinks.
    pub fn symlink(uid: u32, gid: u32, target: String, xattrs: Vec<u8>) -> Self {
        Self {
            uid,
            gid,
            mode: S_IFLNK | 0o777,
            symlink_target: Some(target),
            xattrs,
        }
    }

    /// The fields after the size, as variants (the xattrs checked to be a
    /// normal-form `a(ayay)`, the target to have no NUL byte).
    fn fields(&self) -> Result<Vec<Variant>, FormatError> {
        let xattrs = parse_normal(&self.xattrs, XATTRS_GVARIANT_TYPE, "xattrs")?;
        let target = self.symlink_target.as_deref().unwrap_or("");
        if target.contains('\0') {
            return Err(err("symlink target with a NUL byte"));
        }
        if self.symlink_target.as_deref() == Some("") {
            return Err(err("empty symlink target"));
        }
        Ok(vec![
            self.uid.to_be().to_variant(),
            self.gid.to_be().to_variant(),
            self.mode.to_be().to_variant(),
            0u32.to_variant(),
            target.to_variant(),
            xattrs,
        ])
    }

    /// The `(uuuusa(ayay))` file header.
    pub fn file_header(&self) -> Result<Vec<u8>, FormatError> {
        let v = Variant::tuple_from_iter(self.fields()?);
        debug_assert_eq!(v.type_(), ty(FILE_HEADER_GVARIANT_TYPE));
        bounded(v.data().to_vec())
    }

    /// The `(tuuuusa(ayay))` archive header for `size` bytes of content.
    pub fn archive_header(&self, size: u64) -> Result<Vec<u8>, FormatError> {
        let mut fields = vec![size.to_be().to_variant()];
        fields.extend(self.fields()?);
        let v = Variant::tuple_from_iter(fields);
        debug_assert_eq!(v.type_(), ty(ARCHIVE_HEADER_GVARIANT_TYPE));
        bounded(v.data().to_vec())
    }
}

fn bounded(header: Vec<u8>) -> Result<Vec<u8>, FormatError> {
    if header.len() > MAX_HEADER_SIZE {
        return Err(err(format!(
            "header of {} bytes (limit {MAX_HEADER_SIZE})",
            header.len()
        )));
    }
    Ok(header)
}

/// A header with its length prefix and padding, as both the checksum and
/// the `.filez` framing write it.
pub fn size_prefixed(header: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + header.len());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(header);
    out
}

/// The bare content checksum, fed the file's bytes as they stream.
#[derive(Debug, Clone)]
pub struct ContentHasher(Sha256);

impl ContentHasher {
    pub fn new(meta: &FileMeta) -> Result<Self, FormatError> {
        let mut h = Sha256::new();
        h.update(size_prefixed(&meta.file_header()?));
        Ok(Self(h))
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn finish(self) -> Checksum {
        Checksum::from_bytes(&self.0.finalize()).expect("sha256 is 32 bytes")
    }
}

/// Writes a `.filez` object: the framed archive header, then the content
/// (written through [`Write`]) as raw deflate. The caller writes exactly
/// the `size` bytes it announced (nothing for a symlink), then
/// [`FilezWriter::finish`]es.
#[derive(Debug)]
pub struct FilezWriter<W: Write> {
    body: Body<W>,
    remaining: u64,
}

#[derive(Debug)]
enum Body<W: Write> {
    Deflate(flate2::write::DeflateEncoder<W>),
    Symlink(W),
}

impl<W: Write> FilezWriter<W> {
    pub fn new(mut out: W, meta: &FileMeta, size: u64) -> io::Result<Self> {
        let header = meta
            .archive_header(size)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        out.write_all(&size_prefixed(&header))?;
        let body = if meta.symlink_target.is_some() {
            if size != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a symlink has no content",
                ));
            }
            Body::Symlink(out)
        } else {
            let level = flate2::Compression::new(ARCHIVE_COMPRESSION_LEVEL);
            Body::Deflate(flate2::write::DeflateEncoder::new(out, level))
        };
        Ok(Self {
            body,
            remaining: size,
        })
    }

    /// Ends the deflate stream; the content written must have been exactly
    /// the size announced.
    pub fn finish(self) -> io::Result<W> {
        if self.remaining != 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} bytes of content missing", self.remaining),
            ));
        }
        match self.body {
            Body::Deflate(d) => d.finish(),
            Body::Symlink(w) => Ok(w),
        }
    }
}

impl<W: Write> Write for FilezWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.remaining {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "more content than the header announced",
            ));
        }
        let n = match &mut self.body {
            Body::Deflate(d) => d.write(buf)?,
            Body::Symlink(_) => 0,
        };
        self.remaining -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.body {
            Body::Deflate(d) => d.flush(),
            Body::Symlink(w) => w.flush(),
        }
    }
}

#[cfg(test)]
mod tests;
