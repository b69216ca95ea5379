//! Applying layers to the staging tree: only `srv/repo/**` (and the
//! directories leading to it) is written, with OCI whiteouts honoured, and
//! nothing ever written through a symlink.
//!
//! Every path is resolved one component at a time from the staging
//! directory's fd with `O_NOFOLLOW`; missing parents are created as
//! directories; a parent that is a symlink or a non-directory is an error.
//!
//! Entry rules (anywhere in the layer):
//! - an absolute path, a `..` component or a NUL byte is an error, even
//!   outside `srv/repo` (no sane writer produces one);
//! - GNU sparse entries are an error (unsupported);
//! - everything outside `srv/repo` is skipped (its data is still
//!   decompressed, and counted against the limits);
//! - so is what the server derives itself: `srv/repo/{summary,summary.sig}`,
//!   `refs/`, `deltas/` and `delta-indexes/` (an image's own would win over
//!   the derived ones: an old signed summary replayed, a bound ref moved);
//!   only the directories under `refs/` stay, for stock ostree to open it.
//!
//! Inside `srv/repo` (and for `srv`, `srv/repo` themselves):
//! - `srv` and `srv/repo` must be directories;
//! - regular files are written 0644 with the entry's mtime (so every
//!   replica serves the same Last-Modified); directories are 0755; owners,
//!   setuid bits and xattrs are dropped;
//! - a symlink must be relative and have no `..` component, so that
//!   however it is resolved it stays inside `srv/repo` (stricter than
//!   "does not escape", and enough: ostree repos have no symlinks);
//! - a hardlink must name an already extracted regular file inside
//!   `srv/repo`;
//! - device nodes and FIFOs are an error.
//!
//! Whiteouts (OCI image spec, "Representing Changes"): `.wh.NAME` removes
//! NAME from lower layers; `.wh..wh..opq` hides everything the lower layers
//! put in its directory. Neither touches what the same layer created (in
//! whatever order the entries come). Other `.wh..wh.*` names are ignored.
//!
//! [`decode`] turns the tar stream into validated entries (extension
//! headers, paths, kinds, the refusals above), [`apply`] writes them
//! through directory fds, and [`limits`] bounds the stream itself
//! (decompressed size, ratio, entry count).

mod apply;
// The entry decoder is `oscontent-parse`'s (the fuzz targets build it).
pub(in crate::source) use oscontent_parse::source::decode;
mod limits;

use super::error::{SourceError, Subject};
use super::verify::VerifyingReader;
use super::Limits;
use apply::{Applier, Fs};
use decode::Decoder;
pub(in crate::source) use decode::Header;
pub(in crate::source) use limits::check_room;
use limits::Counted;
use sha2::{Digest as _, Sha256};
use std::io::{self, Read};
use std::path::Path;

/// How a layer's bytes are compressed (from its media type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The staging tree being built: a directory fd, never a path walked by
/// the kernel.
#[derive(Debug)]
pub struct Tree {
    fs: Fs,
    /// Bytes written into files.
    pub written_bytes: u64,
    /// Tar entries seen, all layers.
    pub entries: u64,
    /// Decompressed bytes, all layers.
    pub decompressed: u64,
}

impl Tree {
    /// Opens the (new, empty) staging directory.
    pub fn open(dir: &Path) -> io::Result<Self> {
        Ok(Self {
            fs: Fs::open(dir)?,
            written_bytes: 0,
            entries: 0,
            decompressed: 0,
        })
    }

    /// Flushes everything written to stable storage (the whole filesystem:
    /// one syscall instead of one fsync per file).
    pub fn sync(&self) -> io::Result<()> {
        self.fs.sync()
    }

    /// Applies one layer, read (compressed) from `blob`. On success the
    /// layer's tar stream has been fully applied; the caller still has to
    /// `blob.finish()` to verify the digest.
    pub(in crate::source) fn apply_layer<R: Read>(
        &mut self,
        blob: &mut VerifyingReader<R>,
        layer: &LayerInfo<'_>,
        limits: &Limits,
    ) -> Result<(), SourceError> {
        let subject = layer.subject;
        let fs = &self.fs;
        let mut applier = Applier::new(fs, subject, &mut self.written_bytes);
        // Entries applied so far, all layers: with the parents they made
        // (an entry 40 components deep makes up to 40 directories), they
        // must stay within the entry limit.
        let mut applied = self.entries;
        let mut totals = StreamTotals {
            entries: &mut self.entries,
            decompressed: &mut self.decompressed,
        };
        each_entry(blob, layer, limits, &mut totals, &mut |h, data| {
            applied += 1;
            let Some(e) = decode::classify(h, subject, limits)? else {
                return Ok(());
            };
            limits::check_room(fs.dir(), &decode::show(&h.path), h.size, subject)?;
            applier.apply(&e, &mut &mut *data)?;
            limits::count_dirs(applied, fs.implicit_dirs(), limits, subject)
        })
    }
}

/// Where a layer's entries go: the legacy [`Tree`], or the conversion of
/// an ostree-native image ([`crate::source::native::Converter`]).
pub(in crate::source) trait LayerSink {
    /// Applies one layer, read (compressed) from `blob`; the caller still
    /// has to `blob.finish()` to verify the digest.
    fn apply_layer<R: Read>(
        &mut self,
        blob: &mut VerifyingReader<R>,
        layer: &LayerInfo<'_>,
        limits: &Limits,
    ) -> Result<(), SourceError>;
}

impl LayerSink for Tree {
    fn apply_layer<R: Read>(
        &mut self,
        blob: &mut VerifyingReader<R>,
        layer: &LayerInfo<'_>,
        limits: &Limits,
    ) -> Result<(), SourceError> {
        Tree::apply_layer(self, blob, layer, limits)
    }
}

/// What the layers of one image add up to, checked against the limits.
#[derive(Debug)]
pub(in crate::source) struct StreamTotals<'a> {
    /// Tar entries, all layers.
    pub entries: &'a mut u64,
    /// Decompressed bytes, all layers.
    pub decompressed: &'a mut u64,
}

/// Decompresses one layer and hands each entry (extension headers applied,
/// counted and bounded) to `on_entry` with its data. The layout of the
/// image (legacy `srv/repo`, or an ostree-native repo) is `on_entry`'s
/// business; the stream's limits, the layer's diff ID (the SHA-256 of the
/// whole decompressed stream, past the tar end marker, must be
/// `layer.diff_id`) and the error reported when the stream itself is at
/// fault are this function's.
pub(in crate::source) fn each_entry<R: Read>(
    blob: &mut VerifyingReader<R>,
    layer: &LayerInfo<'_>,
    limits: &Limits,
    totals: &mut StreamTotals<'_>,
    on_entry: &mut dyn FnMut(&Header, &mut dyn Read) -> Result<(), SourceError>,
) -> Result<(), SourceError> {
    let subject = layer.subject;
    let count = blob.count_handle();
    let mut limit_hit = None;
    let result = {
        let counted = Counted {
            inner: DiffIdReader {
                inner: decompress(blob, layer.compression, subject)?,
                hasher: Sha256::new(),
            },
            compressed: || count.get(),
            layer: 0,
            total: totals.decompressed,
            limits,
            subject,
            failure: &mut limit_hit,
        };
        let mut archive = tar::Archive::new(counted);
        read_entries(totals.entries, &mut archive, subject, limits, on_entry).and_then(|()| {
            // What follows the end marker is part of the diff ID too.
            let mut rest = archive.into_inner();
            io::copy(&mut rest, &mut io::sink()).map_err(|e| decode::invalid(subject, e))?;
            Ok(format!(
                "sha256:{}",
                hex::encode(rest.inner.hasher.finalize())
            ))
        })
    };
    let actual = result.map_err(|e| root_cause(blob, limit_hit, e))?;
    if actual != layer.diff_id {
        // A corrupted transfer is the likelier cause: say that if so.
        blob.finish()?;
        return Err(SourceError::DiffIdMismatch {
            subject: subject.clone(),
            expected: layer.diff_id.to_owned(),
            actual,
        });
    }
    Ok(())
}

/// What [`each_entry`] needs to know about a layer besides its bytes.
#[derive(Debug, Clone, Copy)]
pub(in crate::source) struct LayerInfo<'a> {
    /// The image and `layer I/N sha256:…`.
    pub subject: &'a Subject,
    pub compression: Compression,
    /// Its entry in the config's `rootfs.diff_ids`.
    pub diff_id: &'a str,
}

/// The decompressed stream, hashed as it is read: the layer's diff ID.
struct DiffIdReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for DiffIdReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// The decompressed stream of a layer.
fn decompress<'b, R: Read>(
    blob: &'b mut VerifyingReader<R>,
    compression: Compression,
    subject: &Subject,
) -> Result<Box<dyn Read + 'b>, SourceError> {
    Ok(match compression {
        Compression::None => Box::new(blob),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(blob)),
        Compression::Zstd => match zstd::stream::read::Decoder::new(blob) {
            Ok(d) => Box::new(d),
            Err(e) => {
                return Err(SourceError::Invalid {
                    subject: subject.clone(),
                    reason: format!("zstd: {e}"),
                })
            }
        },
    })
}

/// The error to report for a failed layer: the root cause first, a broken
/// stream (digest, size, truncation, network) or a limit hit while
/// decompressing, over what the tar reader made of it.
fn root_cause<R: Read>(
    blob: &mut VerifyingReader<R>,
    limit_hit: Option<SourceError>,
    e: SourceError,
) -> SourceError {
    if let Some(f) = blob.failure.take() {
        return f;
    }
    if let Some(f) = limit_hit {
        return f;
    }
    if let SourceError::Invalid { .. } = e {
        // Corrupt data is often a corrupted transfer: if the blob's
        // digest does not match, say that.
        if let Err(f) = blob.finish() {
            return f;
        }
    }
    e
}

/// Decodes each entry of a layer's tar stream and hands it on.
fn read_entries<R: Read>(
    entries: &mut u64,
    archive: &mut tar::Archive<R>,
    subject: &Subject,
    limits: &Limits,
    on_entry: &mut dyn FnMut(&Header, &mut dyn Read) -> Result<(), SourceError>,
) -> Result<(), SourceError> {
    let invalid = |e| decode::invalid(subject, e);
    let mut decoder = Decoder::new(subject, limits);
    for entry in archive.entries().map_err(invalid)?.raw(true) {
        let mut entry = entry.map_err(invalid)?;
        limits::count_entry(entries, limits, subject)?;
        let Some(header) = decoder.header(&mut entry)? else {
            continue;
        };
        on_entry(&header, &mut entry)?;
    }
    decoder.finish()
}
