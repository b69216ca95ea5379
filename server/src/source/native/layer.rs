//! One native layer's entries, in stream order: what each entry of
//! ostree-ext's tar format asks of the staged repo.
//!
//! The xattrs of a content object come out of band and before it: a
//! `.file-xattrs` (an `a(ayay)` named by its SHA-256) is cached, and the
//! `.file-xattrs-link` (a hardlink to it, or a copy past the hardlink
//! limit) just before a `.file` says which xattrs that file has. The
//! older form is the same with `xattrs/<sha256>` and `.file.xattrs`. As in
//! ostree-ext's importer, the cache lives for one layer, one reference is
//! pending at a time, and every `.file` needs one; the cache is bounded.

use super::objects::{max_metadata_size, Objects, WriteError};
use super::path::{self, Place};
use crate::source::unpack::decode::{self, components, Header};
use crate::source::{Limits, SourceError, Subject};
use oscontent_format::filez::FileMeta;
use oscontent_format::{Checksum, ObjectKind, ObjectName};
use std::collections::HashMap;
use std::io::Read;
use tar::EntryType;

/// Largest xattrs set (ostree-ext's own limit).
pub const MAX_XATTRS_SIZE: u64 = 1 << 20;
/// Most bytes of distinct xattrs sets cached for one layer: real images
/// have a few hundred SELinux label sets of under a KiB each.
pub const MAX_XATTRS_CACHE: u64 = 64 << 20;

/// What one layer has told us so far.
pub struct LayerState<'a> {
    pub subject: &'a Subject,
    limits: &'a Limits,
    /// The commit the label names: the only commit accepted.
    pub commit: Checksum,
    xattrs: HashMap<Checksum, Vec<u8>>,
    xattrs_bytes: u64,
    /// (content object, the xattrs it gets), set by a link entry.
    pending: Option<(Checksum, Checksum)>,
    /// The content objects the layer carries, in stream order (those an
    /// earlier layer wrote too): its object set, as the importer records
    /// it. One per `.file` entry, which the entry limit bounds.
    carried: Vec<Checksum>,
}

impl<'a> LayerState<'a> {
    pub fn new(subject: &'a Subject, limits: &'a Limits, commit: Checksum) -> Self {
        Self {
            subject,
            limits,
            commit,
            xattrs: HashMap::new(),
            xattrs_bytes: 0,
            pending: None,
            carried: Vec::new(),
        }
    }

    fn bad(&self, object: String, reason: impl Into<String>) -> SourceError {
        SourceError::BadObject {
            subject: self.subject.clone(),
            object,
            reason: reason.into(),
        }
    }

    fn write_err(&self, object: String, e: WriteError) -> SourceError {
        super::object_err(self.subject, object, e)
    }

    /// Handles one entry.
    pub fn entry(
        &mut self,
        objects: &mut Objects,
        h: &Header,
        data: &mut dyn Read,
    ) -> Result<(), SourceError> {
        let unsafe_entry = |why: String| decode::unsafe_entry(self.subject, &h.path, why);
        // What every layer refuses anywhere: sizes we would misread,
        // sparse files, overlong paths.
        decode::check_anywhere(h, self.subject, self.limits)?;
        let comps = components(&h.path).map_err(|w| unsafe_entry(w.into()))?;
        if h.kind == EntryType::Link {
            // A checkout path is a hardlink to an object: never followed,
            // but one that names something outside the layer is refused.
            let target = h.link.as_deref().unwrap_or_default();
            components(target).map_err(|w| {
                unsafe_entry(format!("hardlink target {:?}: {w}", decode::show(target)))
            })?;
        }
        if h.kind == EntryType::Directory {
            return Ok(());
        }
        let place = path::classify(&comps).map_err(unsafe_entry)?;
        match place {
            Place::Ignored => Ok(()),
            Place::Object(name) if name.kind == ObjectKind::File => {
                self.content(objects, &name, h, data)
            }
            Place::Object(name) => self.metadata(objects, &name, h, data),
            Place::Xattrs(c) | Place::XattrsBlob(c) => {
                let what = format!("{c}.file-xattrs");
                self.cache_xattrs(h, data, Some(c), what).map(drop)
            }
            Place::XattrsLink(file) => self.xattrs_link(file, h, data),
            Place::XattrsRef(file) => self.xattrs_ref(file, h),
        }
    }

    fn metadata(
        &mut self,
        objects: &mut Objects,
        name: &ObjectName,
        h: &Header,
        data: &mut dyn Read,
    ) -> Result<(), SourceError> {
        let shown = format!("{}.{}", name.checksum, name.kind.extension());
        if h.kind != EntryType::Regular && h.kind != EntryType::Continuous {
            return Err(self.bad(
                shown,
                format!("a {:?} entry; metadata objects are regular files", h.kind),
            ));
        }
        if matches!(name.kind, ObjectKind::Commit | ObjectKind::CommitMeta)
            && name.checksum != self.commit
        {
            return Err(self.bad(
                shown,
                format!(
                    "the image's commit is not the one its label {} names ({})",
                    crate::source::detect::NATIVE_COMMIT_LABEL,
                    self.commit
                ),
            ));
        }
        let max = max_metadata_size(name.kind);
        if h.size > max {
            return Err(self.bad(
                shown,
                format!("{} bytes, over the {max} byte limit", h.size),
            ));
        }
        if objects
            .has(name)
            .map_err(|e| self.write_err(shown.clone(), e))?
            && name.kind != ObjectKind::CommitMeta
        {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(h.size as usize);
        data.take(h.size)
            .read_to_end(&mut bytes)
            .map_err(|e| decode::invalid(self.subject, e))?;
        objects
            .write_metadata(name, &bytes, h.mtime)
            .map_err(|e| self.write_err(shown, e))
    }

    fn content(
        &mut self,
        objects: &mut Objects,
        name: &ObjectName,
        h: &Header,
        data: &mut dyn Read,
    ) -> Result<(), SourceError> {
        let shown = format!("{}.file", name.checksum);
        let xattrs_of = match self.pending.take() {
            Some((file, x)) if file == name.checksum => x,
            Some((file, _)) => {
                return Err(self.bad(
                    shown,
                    format!("the xattrs link before it is for {file}.file"),
                ))
            }
            None => {
                return Err(self.bad(
                    shown,
                    "no .file-xattrs-link precedes it: its xattrs are unknown",
                ))
            }
        };
        self.carried.push(name.checksum);
        if objects
            .has(name)
            .map_err(|e| self.write_err(shown.clone(), e))?
        {
            return Ok(());
        }
        let xattrs = self.xattrs.get(&xattrs_of).cloned().unwrap_or_default();
        let (uid, gid) = (owner(h.uid), owner(h.gid));
        let (meta, size) = match h.kind {
            EntryType::Regular | EntryType::Continuous => {
                (FileMeta::regular(uid, gid, h.mode, xattrs), h.size)
            }
            EntryType::Symlink => {
                let target = h.link.clone().unwrap_or_default();
                let target = String::from_utf8(target)
                    .map_err(|_| self.bad(shown.clone(), "symlink target is not UTF-8"))?;
                (FileMeta::symlink(uid, gid, target, xattrs), 0)
            }
            other => {
                return Err(self.bad(
                    shown,
                    format!("a {other:?} entry; content objects are regular files or symlinks"),
                ))
            }
        };
        objects
            .write_content(name, &meta, size, data, h.mtime)
            .map_err(|e| self.write_err(shown, e))
    }

    /// Reads an xattrs set (regular file, bounded), checks it against
    /// `expected`, caches it, and returns its checksum.
    fn cache_xattrs(
        &mut self,
        h: &Header,
        data: &mut dyn Read,
        expected: Option<Checksum>,
        shown: String,
    ) -> Result<Checksum, SourceError> {
        if h.kind != EntryType::Regular && h.kind != EntryType::Continuous {
            return Err(self.bad(
                shown,
                format!("a {:?} entry; xattrs are regular files", h.kind),
            ));
        }
        if h.size > MAX_XATTRS_SIZE {
            return Err(self.bad(
                shown,
                format!(
                    "{} bytes of xattrs, over the {MAX_XATTRS_SIZE} byte limit",
                    h.size
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(h.size as usize);
        data.take(h.size)
            .read_to_end(&mut bytes)
            .map_err(|e| decode::invalid(self.subject, e))?;
        let actual = Checksum::digest(&bytes);
        if expected.is_some_and(|e| e != actual) {
            return Err(self.bad(
                shown,
                format!("does not match its name: its bytes hash to {actual}"),
            ));
        }
        if !self.xattrs.contains_key(&actual) {
            self.xattrs_bytes += bytes.len() as u64;
            if self.xattrs_bytes > MAX_XATTRS_CACHE {
                return Err(SourceError::LimitExceeded {
                    subject: self.subject.clone(),
                    limit: "xattrs per layer",
                    detail: format!("more than {MAX_XATTRS_CACHE} bytes of distinct xattrs"),
                });
            }
            self.xattrs.insert(actual, bytes);
        }
        Ok(actual)
    }

    fn set_pending(
        &mut self,
        file: Checksum,
        xattrs: Checksum,
        shown: String,
    ) -> Result<(), SourceError> {
        if let Some((prev, _)) = self.pending {
            return Err(self.bad(
                shown,
                format!("the xattrs link for {prev}.file before it has no .file after it"),
            ));
        }
        if !self.xattrs.contains_key(&xattrs) {
            return Err(self.bad(
                shown,
                format!("links to xattrs {xattrs}, which no earlier entry of this layer carries"),
            ));
        }
        self.pending = Some((file, xattrs));
        Ok(())
    }

    fn xattrs_link(
        &mut self,
        file: Checksum,
        h: &Header,
        data: &mut dyn Read,
    ) -> Result<(), SourceError> {
        let shown = format!("{file}.file-xattrs-link");
        let xattrs = match h.kind {
            EntryType::Link => {
                let target = h.link.as_deref().unwrap_or_default();
                let comps = components(target).unwrap_or_default();
                match path::classify(&comps) {
                    Ok(Place::Xattrs(x)) => x,
                    _ => {
                        return Err(self.bad(
                            shown,
                            format!(
                                "links to {:?}, not to a .file-xattrs object",
                                decode::show(target)
                            ),
                        ))
                    }
                }
            }
            _ => self.cache_xattrs(h, data, None, shown.clone())?,
        };
        self.set_pending(file, xattrs, shown)
    }

    fn xattrs_ref(&mut self, file: Checksum, h: &Header) -> Result<(), SourceError> {
        let shown = format!("{file}.file.xattrs");
        let target = h.link.as_deref().unwrap_or_default();
        let blob = match (
            h.kind,
            path::classify(&components(target).unwrap_or_default()),
        ) {
            (EntryType::Link, Ok(Place::XattrsBlob(x))) => x,
            _ => {
                return Err(self.bad(
                    shown,
                    format!(
                        "must be a hardlink to xattrs/<sha256>, not a {:?} to {:?}",
                        h.kind,
                        decode::show(target)
                    ),
                ))
            }
        };
        self.set_pending(file, blob, shown)
    }

    /// At the end of the layer, a reference must not be left without its
    /// file. Returns the content objects the layer carried.
    pub fn finish(self) -> Result<Vec<Checksum>, SourceError> {
        match self.pending {
            Some((file, _)) => Err(self.bad(
                format!("{file}.file-xattrs-link"),
                "the layer ends before the .file it is for",
            )),
            None => Ok(self.carried),
        }
    }
}

/// tar's 64-bit owner ids as ostree's 32-bit ones (larger ones cannot be
/// in a valid object, whose checksum then fails).
fn owner(id: u64) -> u32 {
    u32::try_from(id).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
