//! Commit objects: `(a{sv}aya(say)sstayay)`.

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::variant::{check_size, parse_normal};
use glib::{Variant, VariantDict, VariantTy};

pub const COMMIT_GVARIANT_TYPE: &str = "(a{sv}aya(say)sstayay)";

/// Commit objects above this size are refused: real ones are a few KiB
/// (metadata included), and this bounds what untrusted input can cost.
pub const MAX_COMMIT_SIZE: usize = 16 << 20;

/// The ref-binding metadata key stock ostree checks on pull.
pub const REF_BINDING_KEY: &str = "ostree.ref-binding";
pub const COLLECTION_BINDING_KEY: &str = "ostree.collection-binding";
pub const VERSION_KEY: &str = "version";
/// The commit's object size list (`ostree commit --generate-sizes`): `aay`,
/// one entry per object (see [`ObjectSize::parse`]).
pub const SIZES_KEY: &str = "ostree.sizes";
/// More entries than any commit has (an OS image has ~100,000 objects);
/// the commit's own size cap bounds it too.
pub const MAX_SIZE_ENTRIES: usize = 4_000_000;

/// One entry of `ostree.sizes`: what an object takes in an archive repo
/// and unpacked, as its commit (signed with it) declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectSize {
    pub checksum: Checksum,
    /// Bytes of the object as an archive repo stores it.
    pub archived: u64,
    /// Bytes of the object unpacked: a content object's file size.
    pub unpacked: u64,
    /// libostree's object type number; `None` in the older layout, which
    /// listed content objects only.
    pub objtype: Option<u8>,
}

impl ObjectSize {
    /// One entry: the 32 checksum bytes, the archived and unpacked sizes
    /// as LEB128 varints, and (in libostree 2020.1 and later) one byte of
    /// object type.
    pub fn parse(entry: &[u8]) -> Result<Self, FormatError> {
        let bad = |why: &str| err(format!("{SIZES_KEY} entry: {why}"));
        let (csum, rest) = entry
            .split_at_checked(Checksum::LEN)
            .ok_or_else(|| bad("shorter than a checksum"))?;
        let checksum = Checksum::from_bytes(csum).map_err(|_| bad("checksum"))?;
        let (archived, rest) = read_varint(rest).ok_or_else(|| bad("archived size"))?;
        let (unpacked, rest) = read_varint(rest).ok_or_else(|| bad("unpacked size"))?;
        let objtype = match rest {
            [] => None,
            [t] => Some(*t),
            _ => return Err(bad("trailing bytes")),
        };
        Ok(Self {
            checksum,
            archived,
            unpacked,
            objtype,
        })
    }

    /// Whether this entry describes a content object.
    pub fn is_content(&self) -> bool {
        // libostree's OSTREE_OBJECT_TYPE_FILE.
        self.objtype.is_none_or(|t| t == 1)
    }
}

/// A LEB128 varint (at most 10 bytes, no bits past 64) and what follows.
pub(crate) fn read_varint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7f);
        if i == 9 && bits > 1 {
            return None;
        }
        v |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

/// A parsed commit object.
#[derive(Debug, Clone)]
pub struct Commit {
    /// The checksum of the exact bytes parsed.
    pub checksum: Checksum,
    /// Serialized size in bytes (what a summary records).
    pub size: u64,
    pub metadata: Variant,
    pub parent: Option<Checksum>,
    pub subject: String,
    pub body: String,
    /// Seconds since the epoch (stored big-endian on disk).
    pub timestamp: u64,
    pub root_tree: Checksum,
    pub root_meta: Checksum,
}

const WHAT: &str = "commit object";

fn err(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

impl Commit {
    /// Parses commit bytes. The bytes must be in GVariant normal form, so
    /// that what we parse is what ostree hashes.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        check_size(bytes, MAX_COMMIT_SIZE, WHAT)?;
        let v = parse_normal(bytes, COMMIT_GVARIANT_TYPE, WHAT)?;
        let checksum_at = |i: usize, what: &str| -> Result<Checksum, FormatError> {
            let c = v.child_value(i);
            let b = c
                .fixed_array::<u8>()
                .map_err(|e| err(format!("{what}: {e}")))?;
            Checksum::from_bytes(b).map_err(|_| err(format!("{what}: {} bytes, want 32", b.len())))
        };
        let parent_v = v.child_value(1);
        let parent = match parent_v
            .fixed_array::<u8>()
            .map_err(|e| err(e.to_string()))?
        {
            [] => None,
            b => Some(Checksum::from_bytes(b).map_err(|_| err("parent checksum is not 32 bytes"))?),
        };
        Ok(Self {
            checksum: Checksum::digest(bytes),
            size: bytes.len() as u64,
            metadata: v.child_value(0),
            parent,
            subject: v.child_value(3).str().unwrap_or_default().to_owned(),
            body: v.child_value(4).str().unwrap_or_default().to_owned(),
            timestamp: u64::from_be(
                v.child_value(5)
                    .get::<u64>()
                    .ok_or_else(|| err("timestamp"))?,
            ),
            root_tree: checksum_at(6, "root dirtree")?,
            root_meta: checksum_at(7, "root dirmeta")?,
        })
    }

    fn lookup(&self, key: &str, ty: &str) -> Option<Variant> {
        let ty = VariantTy::new(ty).ok()?;
        VariantDict::new(Some(&self.metadata)).lookup_value(key, Some(ty))
    }

    /// The `version` metadata string, if any.
    pub fn version(&self) -> Option<String> {
        self.lookup(VERSION_KEY, "s")
            .and_then(|v| v.str().map(str::to_owned))
    }

    /// The refs this commit is bound to (`ostree.ref-binding`, `as`), or
    /// `None` if it carries no binding. `Some(empty)` is a commit stock
    /// ostree refuses to pull under any ref name.
    pub fn ref_binding(&self) -> Option<Vec<String>> {
        self.lookup(REF_BINDING_KEY, "as")
            .and_then(|v| v.get::<Vec<String>>())
    }

    /// The bound refs; empty when there is no (or an empty) binding.
    pub fn ref_bindings(&self) -> Vec<String> {
        self.ref_binding().unwrap_or_default()
    }

    pub fn collection_binding(&self) -> Option<String> {
        self.lookup(COLLECTION_BINDING_KEY, "s")
            .and_then(|v| v.str().map(str::to_owned))
    }

    /// The commit's `ostree.sizes` entries; empty when it carries none.
    /// An entry that does not parse fails the whole list: a commit that
    /// lies about one size is not trusted about the others.
    pub fn object_sizes(&self) -> Result<Vec<ObjectSize>, FormatError> {
        let Some(v) = self.lookup(SIZES_KEY, "aay") else {
            return Ok(Vec::new());
        };
        if v.n_children() > MAX_SIZE_ENTRIES {
            return Err(err(format!("{SIZES_KEY}: {} entries", v.n_children())));
        }
        v.iter()
            .map(|e| {
                let b = e.fixed_array::<u8>().map_err(|e| err(e.to_string()))?;
                ObjectSize::parse(b)
            })
            .collect()
    }

    /// A metadata value rendered as text, for `ostree show`-like output.
    pub fn metadata_value(&self, key: &str) -> Option<Variant> {
        VariantDict::new(Some(&self.metadata)).lookup_value(key, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(c: u8, varints: &[u8], tail: &[u8]) -> Vec<u8> {
        let mut e = vec![c; 32];
        e.extend_from_slice(varints);
        e.extend_from_slice(tail);
        e
    }

    #[test]
    fn size_entries() {
        // (what, entry, (archived, unpacked, objtype) or refused)
        type Want = Option<(u64, u64, Option<u8>)>;
        let cases: Vec<(&str, Vec<u8>, Want)> = vec![
            ("old layout", entry(1, &[5, 10], &[]), Some((5, 10, None))),
            (
                "with type",
                entry(1, &[5, 10], &[1]),
                Some((5, 10, Some(1))),
            ),
            ("dirtree", entry(1, &[5, 10], &[2]), Some((5, 10, Some(2)))),
            (
                "multi-byte",
                entry(1, &[0xac, 0x02, 0x80, 0x80, 0x04], &[1]),
                Some((300, 1 << 16, Some(1))),
            ),
            (
                "u64::MAX",
                entry(
                    1,
                    &[
                        0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                    ],
                    &[],
                ),
                Some((0, u64::MAX, None)),
            ),
            (
                "past 64 bits",
                entry(
                    1,
                    &[
                        0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
                    ],
                    &[],
                ),
                None,
            ),
            (
                "11-byte varint",
                entry(
                    1,
                    &[
                        0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0,
                    ],
                    &[],
                ),
                None,
            ),
            ("unterminated", entry(1, &[5, 0x80], &[]), None),
            ("one size", entry(1, &[5], &[]), None),
            ("trailing", entry(1, &[5, 10], &[1, 1]), None),
            ("short checksum", vec![1; 31], None),
            ("empty", vec![], None),
        ];
        for (what, e, want) in cases {
            let got = ObjectSize::parse(&e).ok();
            assert_eq!(
                got.map(|s| (s.archived, s.unpacked, s.objtype)),
                want,
                "{what}"
            );
            if let Some(s) = got {
                assert_eq!(s.checksum, Checksum::from([1; 32]));
                assert_eq!(
                    s.is_content(),
                    matches!(s.objtype, None | Some(1)),
                    "{what}"
                );
            }
        }
    }
}
