//! The manifest's caps, applied while it is deserialised: each string is
//! refused by length before it is copied out of the parser's buffer, and
//! each list or map by count before its next element is built, so a file
//! of millions of tiny values fails at the first one past a cap.

use super::{
    listable, FileEntry, ReleaseEntry, MAX_FILES, MAX_HASH, MAX_PATH, MAX_REFS, MAX_RELEASES,
    MAX_TEXT,
};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};

/// A reader that fails once more than `max` bytes came through it, naming
/// the limit (the manifest's size is checked before reading too, but a
/// file can grow while it is read).
pub struct Capped<R> {
    inner: R,
    left: u64,
    max: u64,
}

impl<R> Capped<R> {
    pub fn new(inner: R, max: u64) -> Self {
        Self {
            inner,
            left: max,
            max,
        }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One byte past the limit is enough to know it was passed.
        let want = buf
            .len()
            .min(usize::try_from(self.left + 1).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("over the {} byte limit of a bundle manifest", self.max),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A string of at most `max` bytes; `what` names it in the error.
struct Short {
    max: usize,
    what: &'static str,
}

impl Visitor<'_> for Short {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} of at most {} bytes", self.what, self.max)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        if s.len() > self.max {
            return Err(E::custom(format_args!(
                "a {} of {} bytes, over the {} byte limit",
                self.what,
                s.len(),
                self.max
            )));
        }
        Ok(s.to_owned())
    }
}

fn short<'de, D: Deserializer<'de>>(
    d: D,
    max: usize,
    what: &'static str,
) -> Result<String, D::Error> {
    d.deserialize_str(Short { max, what })
}

/// `kind`, `source`: at most [`MAX_TEXT`] bytes.
pub fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    short(d, MAX_TEXT, "text field")
}

/// A checksum in hex: at most [`MAX_HASH`] bytes.
pub fn hash<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    short(d, MAX_HASH, "checksum")
}

/// `version`: null, absent, or at most [`MAX_TEXT`] bytes.
pub fn opt_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Opt;
    impl<'de> Visitor<'de> for Opt {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "null or a version of at most {MAX_TEXT} bytes")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            short(d, MAX_TEXT, "version").map(Some)
        }
    }
    d.deserialize_option(Opt)
}

/// One ref name: ostree's grammar, so at most `MAX_REF_LEN` bytes.
struct RefName(String);

impl<'de> de::Deserialize<'de> for RefName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = short(d, oscontent_format::MAX_REF_LEN, "ref name")?;
        oscontent_format::validate_ref(&s).map_err(de::Error::custom)?;
        Ok(RefName(s))
    }
}

/// A release's refs: at most [`MAX_REFS`] names.
pub fn refs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Refs;
    impl<'de> Visitor<'de> for Refs {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {MAX_REFS} ref names")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(RefName(r)) = seq.next_element()? {
                if out.len() == MAX_REFS {
                    return Err(de::Error::custom(format_args!(
                        "more than {MAX_REFS} refs in one release"
                    )));
                }
                out.push(r);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Refs)
}

/// `releases`: at most [`MAX_RELEASES`], naming at most [`MAX_REFS`] refs
/// between them (each release's own list is capped as it is read, so the
/// total is checked after each one).
pub fn releases<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ReleaseEntry>, D::Error> {
    struct Releases;
    impl<'de> Visitor<'de> for Releases {
        type Value = Vec<ReleaseEntry>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {MAX_RELEASES} releases")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out: Vec<ReleaseEntry> = Vec::new();
            let mut refs = 0usize;
            while let Some(r) = seq.next_element::<ReleaseEntry>()? {
                refs += r.refs.len();
                if out.len() == MAX_RELEASES {
                    return Err(de::Error::custom(format_args!(
                        "more than {MAX_RELEASES} releases"
                    )));
                }
                if refs > MAX_REFS {
                    return Err(de::Error::custom(format_args!(
                        "more than {MAX_REFS} refs across the releases"
                    )));
                }
                out.push(r);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Releases)
}

/// A listed path: an archive repo path of at most [`MAX_PATH`] bytes.
struct Listed(String);

impl<'de> de::Deserialize<'de> for Listed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let p = short(d, MAX_PATH, "file path")?;
        if !listable(&p) {
            return Err(de::Error::custom(format_args!(
                "lists {p:?}, which is not an archive repo path"
            )));
        }
        Ok(Listed(p))
    }
}

/// `files`: at most [`MAX_FILES`] entries, each path an archive repo path.
pub fn files<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, FileEntry>, D::Error> {
    struct Files;
    impl<'de> Visitor<'de> for Files {
        type Value = BTreeMap<String, FileEntry>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a map of at most {MAX_FILES} files")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            let mut seen = 0usize;
            while let Some(Listed(p)) = map.next_key()? {
                seen += 1;
                if seen > MAX_FILES {
                    return Err(de::Error::custom(format_args!(
                        "more than {MAX_FILES} files listed"
                    )));
                }
                let e: FileEntry = map.next_value()?;
                out.insert(p, e);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Files)
}

/// What [`super::BundleManifest::to_bytes`] refuses to write: counts a
/// reader would refuse.
pub fn check_counts(m: &super::BundleManifest) -> Result<(), String> {
    let refs: usize = m.releases.iter().map(|r| r.refs.len()).sum();
    let over = [
        (m.files.len(), MAX_FILES, "files"),
        (m.releases.len(), MAX_RELEASES, "releases"),
        (refs, MAX_REFS, "refs"),
    ];
    match over.iter().find(|(n, max, _)| n > max) {
        Some((n, max, what)) => Err(format!("{n} {what}, over the limit of {max}")),
        None => Ok(()),
    }
}
