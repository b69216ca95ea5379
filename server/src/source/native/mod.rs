//! Ostree-native images (ostree-ext's "tar format": `ostree container
//! encapsulate`, rpm-ostree and bootc builds) converted, while their layers
//! stream, into the archive repo a legacy image carries (`srv/repo`), so
//! that publication and serving are the same for both.
//!
//! Each layer holds objects of a `bare-split-xattrs` repo under
//! `sysroot/ostree/repo/objects/`, and a checkout made of hardlinks to
//! them. What is done with each entry:
//! - `.commit`, `.commitmeta`, `.dirtree`, `.dirmeta`: kept verbatim, each
//!   verified to hash to its name (the commit and its detached metadata
//!   must be the `ostree.commit` label's);
//! - `.file` (a regular file or a symlink; uid, gid and mode in the tar
//!   header) with the xattrs its `.file-xattrs-link` names ([`layer`])
//!   becomes a `.filez`, kept only if libostree's content checksum of
//!   header and bytes is its name ([`objects`]);
//! - everything outside `sysroot/ostree/repo` (the checkout) and the
//!   repo's own `config` and `refs/` are skipped, never followed; a path
//!   or hardlink target that is absolute or has `..` is refused wherever
//!   it is.
//!
//! After the last ostree layer, the commit's closure must be complete
//! ([`closure`]) before the image is staged. Derived layers (after
//! `ostree.final-diffid`) are the caller's decision (see
//! [`super::detect::base_layers`]). Memory is bounded whatever the image:
//! content streams through a fixed buffer; metadata, xattrs and their
//! per-layer cache have size caps; the closure walk keeps one checksum per
//! directory object.

pub mod closure;
mod layer;
pub mod objects;
// Entry path classification is `oscontent-parse`'s (fuzzed there).
pub use oscontent_parse::source::native_path as path;
pub mod root;
pub mod staging;

use super::unpack::{self, LayerInfo, LayerSink, StreamTotals};
use super::verify::VerifyingReader;
use super::{Limits, SourceError, Subject};
use objects::{Objects, WriteError};
use oscontent_format::Checksum;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;

/// A native image being converted into a staging directory.
#[derive(Debug)]
pub struct Converter {
    objects: Objects,
    /// The staging directory, for the room each entry needs.
    staging: std::os::fd::OwnedFd,
    commit: Checksum,
    entries: u64,
    decompressed: u64,
    /// Each layer's content objects, in layer order.
    carried: Vec<Vec<Checksum>>,
}

fn write_err(subject: &Subject, e: WriteError) -> SourceError {
    match e {
        WriteError::Bad(reason) => SourceError::Invalid {
            subject: subject.clone(),
            reason,
        },
        WriteError::Io(p, e) => SourceError::from_io(subject, p.display().to_string(), e),
    }
}

/// A content or metadata object that failed to stage: refused naming it
/// (`HEX.ext`), or the staging filesystem's error.
pub(super) fn object_err(subject: &Subject, object: String, e: WriteError) -> SourceError {
    match e {
        WriteError::Bad(reason) => SourceError::BadObject {
            subject: subject.clone(),
            object,
            reason,
        },
        WriteError::Io(p, e) => SourceError::from_io(subject, p.display().to_string(), e),
    }
}

impl Converter {
    /// Starts the archive repo under `root` (the new staging directory)
    /// for the commit the label names.
    pub fn create(root: &Path, commit: Checksum, subject: &Subject) -> Result<Self, SourceError> {
        let objects = Objects::create(root).map_err(|e| write_err(subject, e))?;
        let staging = std::fs::File::open(root)
            .map_err(|e| SourceError::from_io(subject, root.display().to_string(), e))?
            .into();
        Ok(Self {
            objects,
            staging,
            commit,
            entries: 0,
            decompressed: 0,
            carried: Vec::new(),
        })
    }

    /// The content objects each layer applied so far carried, in layer
    /// order: what the importer's object-set commits are made of.
    pub fn take_carried(&mut self) -> Vec<Vec<Checksum>> {
        std::mem::take(&mut self.carried)
    }

    /// Bytes written into object files.
    pub fn written_bytes(&self) -> u64 {
        self.objects.written_bytes()
    }

    /// After the last ostree layer: the commit's closure is complete, and
    /// nothing temporary is left.
    pub fn finish(&mut self, subject: &Subject, limits: &Limits) -> Result<(), SourceError> {
        self.objects.drain().map_err(|e| write_err(subject, e))?;
        let walked =
            closure::check(&self.objects, &self.commit, limits.max_depth).map_err(|e| match e {
                closure::ClosureError::Object { object, reason } => SourceError::BadObject {
                    subject: subject.clone(),
                    object,
                    reason,
                },
                closure::ClosureError::Write(e) => write_err(subject, e),
            })?;
        self.objects.finish().map_err(|e| write_err(subject, e))?;
        tracing::debug!(
            image = subject.image,
            commit = %self.commit,
            objects_written = self.objects.written(),
            dirtrees = walked.dirtrees,
            dirmetas = walked.dirmetas,
            files = walked.files,
            "native image converted; the commit's closure is complete"
        );
        Ok(())
    }
}

impl LayerSink for Converter {
    fn apply_layer<R: Read>(
        &mut self,
        blob: &mut VerifyingReader<R>,
        info: &LayerInfo<'_>,
        limits: &Limits,
    ) -> Result<(), SourceError> {
        let mut state = layer::LayerState::new(info.subject, limits, self.commit);
        let mut totals = StreamTotals {
            entries: &mut self.entries,
            decompressed: &mut self.decompressed,
        };
        let objects = &mut self.objects;
        let staging = self.staging.as_fd();
        unpack::each_entry(blob, info, limits, &mut totals, &mut |h, data| {
            // As a legacy layer's entries: an object is no smaller than
            // its entry's content (zlib of incompressible bytes is a
            // little bigger, within the reserve).
            unpack::check_room(
                staging,
                &unpack::decode::show(&h.path),
                h.size,
                info.subject,
            )?;
            state.entry(objects, h, data)
        })?;
        self.carried.push(state.finish()?);
        Ok(())
    }
}
