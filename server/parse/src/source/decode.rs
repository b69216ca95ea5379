//! The entry decoder: a layer's tar entries as validated [`Entry`] values.
//!
//! Everything that turns bytes into a decision lives here, without touching
//! the staging tree: extension headers (PAX, GNU long names and links,
//! bounded) applied to the entry they precede, path normalisation, the
//! entry kind, and the refusals of the rules in the server's
//! `source::unpack`. What is left for its applier depends on what earlier
//! entries wrote.

use super::{Limits, SourceError, Subject};
use std::io::{self, Read};

/// The only subtree extracted.
const KEEP: [&[u8]; 2] = [b"srv", b"repo"];
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// Where an entry's path falls relative to `srv/repo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `.` (the layer root).
    Root,
    /// `srv`.
    Srv,
    /// `srv/repo`.
    Repo,
    /// Below `srv/repo`.
    Inside,
    /// What the server derives itself (see `DERIVED`): dropped like
    /// what is outside `srv/repo`.
    Derived,
    Outside,
}

/// Top-level names in `srv/repo` the server derives from the commit and
/// the deltas it publishes: an image's own would otherwise win, so a
/// hostile image could point a bound ref at an older commit or replay an
/// old, validly signed summary. `delta-indexes` describe `deltas`.
const DERIVED: [&[u8]; 5] = [
    b"summary",
    b"summary.sig",
    b"refs",
    b"deltas",
    b"delta-indexes",
];

/// Dropped at unpack: outside `srv/repo`, or derived by the server.
fn dropped(p: Place) -> bool {
    matches!(p, Place::Outside | Place::Derived)
}

pub fn place(comps: &[&[u8]]) -> Place {
    match comps {
        [] => Place::Root,
        [a] if *a == KEEP[0] => Place::Srv,
        [a, b] if *a == KEEP[0] && *b == KEEP[1] => Place::Repo,
        [a, b, c, ..] if *a == KEEP[0] && *b == KEEP[1] && DERIVED.contains(c) => Place::Derived,
        [a, b, ..] if *a == KEEP[0] && *b == KEEP[1] => Place::Inside,
        _ => Place::Outside,
    }
}

/// Splits a tar path into components, refusing what could escape.
pub fn components(p: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if p.is_empty() {
        return Err("empty path");
    }
    if p.starts_with(b"/") {
        return Err("absolute path");
    }
    if p.contains(&0) {
        return Err("NUL byte in path");
    }
    let mut out = Vec::new();
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("`..` component"),
            c => out.push(c),
        }
    }
    Ok(out)
}

pub fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

pub fn join(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

/// A corrupt tar stream.
pub fn invalid(subject: &Subject, e: io::Error) -> SourceError {
    SourceError::Invalid {
        subject: subject.clone(),
        reason: format!("tar: {e}"),
    }
}

/// An entry refused for what it would do to the tree.
pub fn unsafe_entry(subject: &Subject, path: &[u8], why: String) -> SourceError {
    SourceError::UnsafeEntry {
        subject: subject.clone(),
        path: show(path),
        why,
    }
}

/// Where an entry goes, split for the `*at` calls: the components of its
/// directory (relative to the layer root) and its name in it.
#[derive(Debug, PartialEq, Eq)]
pub struct At<'a> {
    pub dir: Vec<&'a [u8]>,
    pub name: &'a [u8],
}

impl<'a> At<'a> {
    /// `None` for the layer root, which has no name.
    fn new(mut comps: Vec<&'a [u8]>) -> Option<Self> {
        let name = comps.pop()?;
        Some(Self { dir: comps, name })
    }

    /// All its components, the name last.
    pub fn components(&self) -> Vec<&'a [u8]> {
        let mut c = self.dir.clone();
        c.push(self.name);
        c
    }
}

/// What a validated entry asks of the tree.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind<'a> {
    /// `.wh..wh..opq`: hide what lower layers put in the entry's directory.
    Opaque,
    /// `.wh.NAME`: remove `victim` if a lower layer put it there.
    Whiteout {
        victim: At<'a>,
    },
    Dir,
    /// A regular file; its data follows in the stream.
    File {
        mtime: i64,
    },
    /// A symlink whose target is relative and has no `..`.
    Symlink {
        target: &'a [u8],
    },
    /// A hardlink to `target` (as written), which normalises to `to`,
    /// inside `srv/repo`.
    Hardlink {
        target: &'a [u8],
        to: At<'a>,
    },
}

/// A tar entry to apply: validated, and inside `srv/repo` (or a whiteout
/// that reaches into it).
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The path as the layer wrote it, for messages.
    pub path: &'a [u8],
    pub at: At<'a>,
    pub kind: Kind<'a>,
}

/// A tar header with the extension headers before it applied.
#[derive(Debug, Clone)]
pub struct Header {
    pub kind: tar::EntryType,
    /// The size in the ustar header.
    pub size: u64,
    /// The size a PAX header gave, if any.
    pub pax_size: Option<u64>,
    pub path: Vec<u8>,
    pub link: Option<Vec<u8>>,
    /// Seconds since the epoch (0 if unreadable).
    pub mtime: i64,
    /// Owner and permission bits from the ustar header (0 if unreadable;
    /// a native image's content objects take them from here).
    pub uid: u64,
    pub gid: u64,
    pub mode: u32,
}

/// Extension headers waiting for the entry they describe.
#[derive(Debug, Default, PartialEq, Eq)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

impl Pending {
    /// Takes what a PAX header says about the next entry: its path, link
    /// target and size (other keys do not matter to us).
    fn pax(&mut self, data: &[u8], subject: &Subject) -> Result<(), SourceError> {
        for ext in tar::PaxExtensions::new(data) {
            let ext = ext.map_err(|e| invalid(subject, e))?;
            match ext.key_bytes() {
                b"path" => self.path = Some(ext.value_bytes().to_vec()),
                b"linkpath" => self.link = Some(ext.value_bytes().to_vec()),
                b"size" => {
                    let v = std::str::from_utf8(ext.value_bytes())
                        .ok()
                        .and_then(|s| s.parse().ok());
                    self.size = Some(v.ok_or_else(|| SourceError::Invalid {
                        subject: subject.clone(),
                        reason: "tar: bad PAX size".into(),
                    })?);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn strip_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// Reads the tar entries of one layer, keeping extension headers for the
/// entry they describe.
#[derive(Debug)]
pub struct Decoder<'a> {
    subject: &'a Subject,
    limits: &'a Limits,
    pending: Pending,
}

impl<'a> Decoder<'a> {
    pub fn new(subject: &'a Subject, limits: &'a Limits) -> Self {
        Self {
            subject,
            limits,
            pending: Pending::default(),
        }
    }

    /// The header of `entry` with the extension headers before it applied;
    /// `None` if `entry` is itself an extension header (read and kept for
    /// the next entry).
    pub fn header<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
    ) -> Result<Option<Header>, SourceError> {
        let kind = entry.header().entry_type();
        let size = entry
            .header()
            .entry_size()
            .map_err(|e| invalid(self.subject, e))?;
        match kind {
            tar::EntryType::GNULongName => {
                let v = self.extension(entry, size, "GNU long name")?;
                self.pending.path = Some(strip_nuls(v));
                return Ok(None);
            }
            tar::EntryType::GNULongLink => {
                let v = self.extension(entry, size, "GNU long link")?;
                self.pending.link = Some(strip_nuls(v));
                return Ok(None);
            }
            tar::EntryType::XHeader => {
                let data = self.extension(entry, size, "PAX")?;
                self.pending.pax(&data, self.subject)?;
                return Ok(None);
            }
            tar::EntryType::XGlobalHeader => {
                self.extension(entry, size, "PAX global")?;
                return Ok(None);
            }
            _ => {}
        }
        let ext = std::mem::take(&mut self.pending);
        let h = entry.header();
        Ok(Some(Header {
            kind,
            size,
            pax_size: ext.size,
            path: ext.path.unwrap_or_else(|| h.path_bytes().into_owned()),
            link: ext
                .link
                .or_else(|| h.link_name_bytes().map(|c| c.into_owned())),
            // Beyond year 9999 no HTTP date can say it (and it is nonsense).
            mtime: h
                .mtime()
                .unwrap_or(0)
                .min(crate::conditional::MAX_HTTP_DATE_SECS) as i64,
            uid: h.uid().unwrap_or(0),
            gid: h.gid().unwrap_or(0),
            mode: h.mode().unwrap_or(0),
        }))
    }

    /// An extension header's data, bounded.
    fn extension<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, SourceError> {
        check_extension(size, what, self.limits, self.subject)?;
        let mut v = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut v)
            .map_err(|e| invalid(self.subject, e))?;
        Ok(v)
    }

    /// At the end of the layer: a path or link extension must not be left
    /// without its entry.
    pub fn finish(self) -> Result<(), SourceError> {
        if self.pending.path.is_some() || self.pending.link.is_some() {
            return Err(SourceError::Invalid {
                subject: self.subject.clone(),
                reason: "tar: extension header without the entry it describes".into(),
            });
        }
        Ok(())
    }
}

/// Decides what to do with one entry: `Ok(None)` to skip it (outside
/// `srv/repo`, the layer root, a whiteout of something outside), an error
/// to refuse the layer.
pub fn classify<'h>(
    h: &'h Header,
    subject: &Subject,
    limits: &Limits,
) -> Result<Option<Entry<'h>>, SourceError> {
    let refuse = |why: String| unsafe_entry(subject, &h.path, why);
    check_anywhere(h, subject, limits)?;
    let comps = components(&h.path).map_err(|why| refuse(why.into()))?;
    let depth = comps.len();
    let here = place(&comps);
    // The (empty) ref directories stay: stock ostree cannot open a repo
    // without `refs/heads`, and a directory points nowhere.
    let ref_dir = here == Place::Derived
        && comps.get(2) == Some(&&b"refs"[..])
        && h.kind == tar::EntryType::Directory;
    let Some(at) = At::new(comps) else {
        return Ok(None);
    };
    if let Some(target) = at.name.strip_prefix(WHITEOUT) {
        return whiteout(h, at, target, subject);
    }
    if (dropped(here) && !ref_dir) || here == Place::Root {
        return Ok(None);
    }
    if depth > limits.max_depth {
        return Err(refuse(format!(
            "deeper than {} components",
            limits.max_depth
        )));
    }
    if matches!(here, Place::Srv | Place::Repo) && h.kind != tar::EntryType::Directory {
        return Err(refuse("srv and srv/repo must be directories".into()));
    }
    let kind = node(h, subject)?;
    Ok(Some(Entry {
        path: &h.path,
        at,
        kind,
    }))
}

/// The rules for every entry, even outside `srv/repo`: no sizes we would
/// misread, no sparse files, no overlong paths.
pub fn check_anywhere(h: &Header, subject: &Subject, limits: &Limits) -> Result<(), SourceError> {
    if h.pax_size.is_some_and(|s| s != h.size) {
        return Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!(
                "tar entry {:?} has a PAX size (files over 8 GiB are not supported)",
                show(&h.path)
            ),
        });
    }
    if h.kind == tar::EntryType::GNUSparse {
        return Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!("GNU sparse tar entry {:?}", show(&h.path)),
        });
    }
    let too_long = |p: &[u8]| p.len() > limits.max_path_bytes;
    if too_long(&h.path) || h.link.as_deref().is_some_and(too_long) {
        return Err(unsafe_entry(
            subject,
            &h.path,
            format!(
                "path or link target longer than {} bytes",
                limits.max_path_bytes
            ),
        ));
    }
    Ok(())
}

/// A whiteout marker (`at.name` is `.wh.` + `target`). Other `.wh..wh.*`
/// names are ignored, and so are whiteouts of what is outside `srv/repo`.
fn whiteout<'h>(
    h: &'h Header,
    at: At<'h>,
    target: &'h [u8],
    subject: &Subject,
) -> Result<Option<Entry<'h>>, SourceError> {
    let entry = |at, kind| {
        Some(Entry {
            path: &h.path,
            at,
            kind,
        })
    };
    if at.name == OPAQUE {
        if dropped(place(&at.dir)) {
            return Ok(None);
        }
        return Ok(entry(at, Kind::Opaque));
    }
    if target.starts_with(WHITEOUT) {
        return Ok(None);
    }
    if target.is_empty() || target == b"." || target == b".." {
        return Err(unsafe_entry(
            subject,
            &h.path,
            "whiteout of an invalid name".into(),
        ));
    }
    let victim = At {
        dir: at.dir.clone(),
        name: target,
    };
    if dropped(place(&victim.components())) {
        return Ok(None);
    }
    Ok(entry(at, Kind::Whiteout { victim }))
}

/// The kind of an entry inside `srv/repo`, refusing device nodes, FIFOs,
/// links that could lead outside, and types we do not know.
fn node<'h>(h: &'h Header, subject: &Subject) -> Result<Kind<'h>, SourceError> {
    let refuse = |why: String| unsafe_entry(subject, &h.path, why);
    let target = h.link.as_deref().unwrap_or_default();
    match h.kind {
        tar::EntryType::Directory => Ok(Kind::Dir),
        tar::EntryType::Regular | tar::EntryType::Continuous => Ok(Kind::File { mtime: h.mtime }),
        tar::EntryType::Symlink => {
            let bad = target.is_empty()
                || target.starts_with(b"/")
                || target.contains(&0)
                || target.split(|&b| b == b'/').any(|c| c == b"..");
            if bad {
                return Err(refuse(format!(
                    "symlink to {:?}: inside srv/repo a symlink must be relative and have no `..` (it could point outside)",
                    show(target)
                )));
            }
            Ok(Kind::Symlink { target })
        }
        tar::EntryType::Link => {
            let tcomps = components(target)
                .map_err(|why| refuse(format!("hardlink target {:?}: {why}", show(target))))?;
            let inside = place(&tcomps) == Place::Inside;
            match At::new(tcomps) {
                Some(to) if inside => Ok(Kind::Hardlink { target, to }),
                _ => Err(refuse(format!(
                    "hardlink to {:?}, outside srv/repo",
                    show(target)
                ))),
            }
        }
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => Err(refuse(
            "device nodes and FIFOs are not allowed in srv/repo".into(),
        )),
        other => Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!("tar entry {:?} of type {other:?}", show(&h.path)),
        }),
    }
}

/// Refuses an extension header (`what`: PAX, GNU long name, ...) of
/// `size` bytes over the limit, before it is read into memory.
pub fn check_extension(
    size: u64,
    what: &str,
    limits: &Limits,
    subject: &Subject,
) -> Result<(), SourceError> {
    if size > limits.max_extension_bytes {
        return Err(SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: "tar extension header",
            detail: format!(
                "a {what} header of {size} bytes (limit {})",
                limits.max_extension_bytes
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
