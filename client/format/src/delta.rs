//! Static delta superblocks:
//! `(a{sv}tayay(commit)aya(uayttay)a(yaytt))`: metadata, timestamp, from,
//! to, the target commit object, prerequisite deltas (unused), one entry
//! per part (version, sha256, compressed size, uncompressed size, packed
//! object list) and fallback objects fetched loose.
//!
//! Only what the client needs to choose between the delta and loose
//! objects, and to check each downloaded part, is read here; applying the
//! parts is libostree's job.

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::variant::{check_size, parse_normal};
use glib::prelude::ToVariant;
use glib::{Variant, VariantDict, VariantTy};

pub const SUPERBLOCK_GVARIANT_TYPE: &str = "(a{sv}tayay(a{sv}aya(say)sstayay)aya(uayttay)a(yaytt))";
/// Superblocks above this size are refused: they list objects (33 bytes
/// each) and part headers, so 16 MiB covers ~500,000 objects.
pub const MAX_SUPERBLOCK_SIZE: usize = 16 << 20;
/// Bytes per entry of a part's packed object list: type byte + checksum.
const OBJTYPE_CSUM_LEN: usize = 1 + Checksum::LEN;
/// Metadata key giving the byte order of the sizes ('l' or 'B').
const KEY_ENDIANNESS: &str = "ostree.endianness";

/// One delta part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaPart {
    pub checksum: Checksum,
    /// Bytes to download.
    pub size: u64,
    pub uncompressed_size: u64,
    /// (libostree object type number, checksum) of every object it writes.
    pub objects: Vec<(u8, Checksum)>,
}

/// A fallback: an object the delta says to fetch loose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaFallback {
    pub objtype: u8,
    pub checksum: Checksum,
    pub size: u64,
}

#[derive(Debug, Clone)]
pub struct Superblock {
    pub from: Option<Checksum>,
    pub to: Checksum,
    /// The target commit object's bytes, as embedded.
    pub commit: Vec<u8>,
    pub parts: Vec<DeltaPart>,
    pub fallbacks: Vec<DeltaFallback>,
}

const WHAT: &str = "delta superblock";

fn err(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

impl Superblock {
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        check_size(bytes, MAX_SUPERBLOCK_SIZE, WHAT)?;
        let v = parse_normal(bytes, SUPERBLOCK_GVARIANT_TYPE, WHAT)?;
        let big_endian = big_endian(&v);
        let size = |v: Variant| -> u64 {
            let raw = v.get::<u64>().unwrap_or(0);
            if big_endian {
                u64::from_be(raw)
            } else {
                u64::from_le(raw)
            }
        };
        let bytes_of = |v: &Variant| -> Result<Vec<u8>, FormatError> {
            v.fixed_array::<u8>()
                .map(<[u8]>::to_vec)
                .map_err(|e| err(e.to_string()))
        };
        let from = match bytes_of(&v.child_value(2))?.as_slice() {
            [] => None,
            b => Some(Checksum::from_bytes(b).map_err(|_| err("from checksum"))?),
        };
        let to =
            Checksum::from_bytes(&bytes_of(&v.child_value(3))?).map_err(|_| err("to checksum"))?;
        let commit = v.child_value(4).data().to_vec();
        let mut parts = Vec::new();
        for p in v.child_value(6).iter() {
            let objs = bytes_of(&p.child_value(4))?;
            if objs.len() % OBJTYPE_CSUM_LEN != 0 {
                return Err(err(format!("object list of {} bytes", objs.len())));
            }
            let objects = objs
                .chunks(OBJTYPE_CSUM_LEN)
                .map(|c| Ok((c[0], Checksum::from_bytes(&c[1..]).expect("33-byte chunk"))))
                .collect::<Result<Vec<_>, FormatError>>()?;
            parts.push(DeltaPart {
                checksum: Checksum::from_bytes(&bytes_of(&p.child_value(1))?)
                    .map_err(|_| err("part checksum"))?,
                size: size(p.child_value(2)),
                uncompressed_size: size(p.child_value(3)),
                objects,
            });
        }
        let mut fallbacks = Vec::new();
        for f in v.child_value(7).iter() {
            fallbacks.push(DeltaFallback {
                objtype: f.child_value(0).get::<u8>().unwrap_or(0),
                checksum: Checksum::from_bytes(&bytes_of(&f.child_value(1))?)
                    .map_err(|_| err("fallback checksum"))?,
                size: size(f.child_value(2)),
            });
        }
        let sb = Self {
            from,
            to,
            commit,
            parts,
            fallbacks,
        };
        if sb.total_size().is_none() || sb.total_uncompressed_size().is_none() {
            return Err(err("part and fallback sizes overflow 64 bits"));
        }
        Ok(sb)
    }

    /// Bytes to download for the whole delta (parts and fallbacks);
    /// `None` when the sizes a remote declared overflow a u64 (which
    /// [`Superblock::parse`] refuses, so only a hand-built value has it).
    pub fn total_size(&self) -> Option<u64> {
        checked_sum(
            self.parts
                .iter()
                .map(|p| p.size)
                .chain(self.fallbacks.iter().map(|f| f.size)),
        )
    }

    /// Bytes the parts unpack to (what applying them can write at most,
    /// besides the fallbacks fetched loose); `None` on overflow.
    pub fn total_uncompressed_size(&self) -> Option<u64> {
        checked_sum(self.parts.iter().map(|p| p.uncompressed_size))
    }
}

/// `bytes`, a superblock, with its timestamp (libostree's compiler writes
/// the time it ran) replaced by the target commit's: every compilation of
/// the same delta from the same inputs is then the same bytes, so replicas
/// of a server (and a cache in front of them) serve one superblock, one
/// delta index entry, and a node that got the index from one replica can
/// use the superblock from another. Both fields are stored as libostree
/// wrote them (big-endian), so the value is copied as is.
pub fn reproducible_superblock(bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    check_size(bytes, MAX_SUPERBLOCK_SIZE, WHAT)?;
    let v = parse_normal(bytes, SUPERBLOCK_GVARIANT_TYPE, WHAT)?;
    let commit_time = v.child_value(4).child_value(5);
    let children = (0..v.n_children()).map(|i| {
        if i == 1 {
            commit_time.clone()
        } else {
            v.child_value(i)
        }
    });
    Ok(Variant::tuple_from_iter(children).data().to_vec())
}

/// `bytes`, a superblock, with its part entries replaced by `parts` (as
/// many, in order: each part's version kept, its checksum, sizes and
/// object list from `parts`, sizes stored in the byte order the
/// superblock declares). The client
/// stores each checked part uncompressed and has libostree apply those,
/// so libostree never inflates a remote's bytes itself; the superblock it
/// reads must then name them.
pub fn superblock_with_parts(bytes: &[u8], parts: &[DeltaPart]) -> Result<Vec<u8>, FormatError> {
    check_size(bytes, MAX_SUPERBLOCK_SIZE, WHAT)?;
    let v = parse_normal(bytes, SUPERBLOCK_GVARIANT_TYPE, WHAT)?;
    let old = v.child_value(6);
    if old.n_children() != parts.len() {
        return Err(err(format!(
            "{} parts, {} replacements",
            old.n_children(),
            parts.len()
        )));
    }
    let big_endian = big_endian(&v);
    let raw = |n: u64| if big_endian { n.to_be() } else { n.to_le() };
    let entries = old.iter().zip(parts).map(|(o, p)| {
        Variant::tuple_from_iter([
            o.child_value(0),
            Variant::array_from_fixed_array(p.checksum.as_bytes()),
            raw(p.size).to_variant(),
            raw(p.uncompressed_size).to_variant(),
            Variant::array_from_fixed_array(&object_list(&p.objects)),
        ])
    });
    let ty = VariantTy::new("(uayttay)").expect("valid type string");
    let new_parts = Variant::array_from_iter_with_type(ty, entries);
    let children = (0..v.n_children()).map(|i| {
        if i == 6 {
            new_parts.clone()
        } else {
            v.child_value(i)
        }
    });
    Ok(Variant::tuple_from_iter(children).data().to_vec())
}

/// A part's packed object list: type byte and checksum, each.
fn object_list(objects: &[(u8, Checksum)]) -> Vec<u8> {
    objects
        .iter()
        .flat_map(|(t, c)| std::iter::once(*t).chain(c.as_bytes().iter().copied()))
        .collect()
}

/// Whether the superblock's sizes are big-endian (`ostree.endianness`,
/// else the host's order, as libostree reads them).
fn big_endian(v: &Variant) -> bool {
    VariantDict::new(Some(&v.child_value(0)))
        .lookup_value(KEY_ENDIANNESS, Some(VariantTy::BYTE))
        .and_then(|e| e.get::<u8>())
        .map(|e| e == b'B')
        .unwrap_or(cfg!(target_endian = "big"))
}

/// The sum, or `None` if it does not fit: sizes come from the remote, so a
/// wrapped sum would turn a huge delta into a small one.
fn checked_sum(sizes: impl IntoIterator<Item = u64>) -> Option<u64> {
    sizes.into_iter().try_fold(0u64, u64::checked_add)
}

/// Whether fetching the delta costs fewer bytes than fetching loose the
/// objects still missing. Loose cost is estimated from the delta itself:
/// each part's size is shared out over its objects, and only the missing
/// ones count. Deltas compress better than per-object zlib, so this
/// underestimates the loose cost: the delta wins whenever most of what it
/// carries is still needed, and loses when a resumed pull already has most
/// of it.
pub fn delta_is_smaller(sb: &Superblock, is_missing: impl Fn(u8, &Checksum) -> bool) -> bool {
    let mut loose_estimate = 0f64;
    for p in &sb.parts {
        if p.objects.is_empty() {
            continue;
        }
        let per_object = p.size as f64 / p.objects.len() as f64;
        let missing = p.objects.iter().filter(|(t, c)| is_missing(*t, c)).count();
        loose_estimate += per_object * missing as f64;
    }
    for f in &sb.fallbacks {
        if is_missing(f.objtype, &f.checksum) {
            loose_estimate += f.size as f64;
        }
    }
    sb.total_size()
        .is_some_and(|total| (total as f64) <= loose_estimate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(parts: &[(u64, usize)]) -> Superblock {
        let mut n = 0u8;
        Superblock {
            from: None,
            to: Checksum::from([0; 32]),
            commit: vec![],
            parts: parts
                .iter()
                .map(|&(size, count)| DeltaPart {
                    checksum: Checksum::from([0; 32]),
                    size,
                    uncompressed_size: size * 2,
                    objects: (0..count)
                        .map(|_| {
                            n += 1;
                            (2, Checksum::from([n; 32]))
                        })
                        .collect(),
                })
                .collect(),
            fallbacks: vec![],
        }
    }

    #[test]
    fn chooses_the_delta_only_when_most_of_it_is_needed() {
        // (parts, objects numbered from 1 that are already present, want delta)
        type Case<'a> = (&'a [(u64, usize)], &'a [u8], bool);
        let cases: &[Case] = &[
            (&[(1000, 10)], &[], true),
            (&[(1000, 10)], &[1], false),
            (&[(1000, 10), (10, 1)], &[], true),
            (&[(1000, 4), (1000, 4)], &[1, 2, 3, 4], false),
            (&[], &[], true),
        ];
        for (parts, present, want) in cases {
            let s = sb(parts);
            let got = delta_is_smaller(&s, |_, c| !present.contains(&c.as_bytes()[0]));
            assert_eq!(got, *want, "parts {parts:?} present {present:?}");
        }
    }

    #[test]
    fn total_sizes_are_checked() {
        // (part sizes, fallback sizes, want total_size)
        type Case<'a> = (&'a [u64], &'a [u64], Option<u64>);
        let cases: &[Case] = &[
            (&[], &[], Some(0)),
            (&[1, 2], &[3], Some(6)),
            (&[u64::MAX], &[], Some(u64::MAX)),
            (&[u64::MAX, 1], &[], None),
            (&[u64::MAX / 2 + 1], &[u64::MAX / 2 + 1], None),
            (&[1], &[u64::MAX], None),
        ];
        for (parts, fallbacks, want) in cases {
            let mut s = sb(&[]);
            s.parts = parts
                .iter()
                .map(|&size| DeltaPart {
                    checksum: Checksum::from([0; 32]),
                    size,
                    uncompressed_size: size,
                    objects: vec![],
                })
                .collect();
            s.fallbacks = fallbacks
                .iter()
                .map(|&size| DeltaFallback {
                    objtype: 1,
                    checksum: Checksum::from([0; 32]),
                    size,
                })
                .collect();
            assert_eq!(
                s.total_size(),
                *want,
                "parts {parts:?} fallbacks {fallbacks:?}"
            );
            if s.total_size().is_none() {
                // A delta whose size overflows is never the cheaper choice.
                assert!(!delta_is_smaller(&s, |_, _| true));
            }
        }
        let mut s = sb(&[(u64::MAX / 2, 1), (u64::MAX / 2, 1)]);
        assert_eq!(s.total_uncompressed_size(), None);
        s.parts[0].uncompressed_size = 1;
        assert!(s.total_uncompressed_size().is_some());
    }

    /// A superblock (GVariant text) with parts of these download sizes.
    fn superblock_bytes(sizes: &[u64]) -> Vec<u8> {
        let zeros = format!("[{}]", vec!["0"; 32].join(", "));
        let parts: Vec<String> = sizes
            .iter()
            .map(|s| format!("(uint32 0, @ay {zeros}, uint64 {s}, uint64 1, @ay [])"))
            .collect();
        let text = format!(
            "(@a{{sv}} {{}}, uint64 0, @ay [], @ay {zeros}, \
             (@a{{sv}} {{}}, @ay [], @a(say) [], '', '', uint64 0, @ay {zeros}, @ay {zeros}), \
             @ay [], @a(uayttay) [{}], @a(yaytt) [])",
            parts.join(", ")
        );
        let ty = VariantTy::new(SUPERBLOCK_GVARIANT_TYPE).unwrap();
        Variant::parse(Some(ty), &text).unwrap().data().to_vec()
    }

    #[test]
    fn parse_refuses_sizes_that_overflow() {
        // (part sizes, accepted)
        let cases: &[(&[u64], bool)] = &[
            (&[], true),
            (&[1, 2], true),
            (&[u64::MAX], true),
            (&[u64::MAX, 1], false),
            (&[u64::MAX / 2 + 1, u64::MAX / 2 + 1], false),
        ];
        for (sizes, ok) in cases {
            let got = Superblock::parse(&superblock_bytes(sizes));
            assert_eq!(got.is_ok(), *ok, "{sizes:?}: {got:?}");
            if let Ok(sb) = got {
                assert_eq!(sb.parts.len(), sizes.len());
                assert!(sb.total_size().is_some());
            }
        }
    }

    #[test]
    fn a_reproducible_superblock_carries_its_commits_time_and_nothing_else_changes() {
        let ty = VariantTy::new(SUPERBLOCK_GVARIANT_TYPE).unwrap();
        let zeros = format!("[{}]", vec!["0"; 32].join(", "));
        let with_time = |built: u64| {
            let text = format!(
                "(@a{{sv}} {{'ostree.endianness': <byte 0x6c>}}, uint64 {built}, @ay [], @ay {zeros}, \
                 (@a{{sv}} {{}}, @ay [], @a(say) [], 'subject', '', uint64 1234, @ay {zeros}, @ay {zeros}), \
                 @ay [], @a(uayttay) [(uint32 0, @ay {zeros}, uint64 7, uint64 9, @ay [])], @a(yaytt) [])"
            );
            Variant::parse(Some(ty), &text).unwrap().data().to_vec()
        };
        let (a, b) = (with_time(1_700_000_000), with_time(1_700_000_123));
        assert_ne!(a, b);
        let (ra, rb) = (
            reproducible_superblock(&a).unwrap(),
            reproducible_superblock(&b).unwrap(),
        );
        assert_eq!(ra, rb, "compiled at different times, the same bytes");
        assert_eq!(ra, with_time(1234), "the commit's timestamp");
        assert_eq!(reproducible_superblock(&ra).unwrap(), ra, "idempotent");
        assert!(reproducible_superblock(b"garbage").is_err());
    }

    #[test]
    fn parts_are_replaced_and_nothing_else_changes() {
        for endianness in [
            "",
            "'ostree.endianness': <byte 0x42>",
            "'ostree.endianness': <byte 0x6c>",
        ] {
            let ty = VariantTy::new(SUPERBLOCK_GVARIANT_TYPE).unwrap();
            let zeros = format!("[{}]", vec!["0"; 32].join(", "));
            let objs = format!("[{}]", vec!["1"; 33].join(", "));
            let text = format!(
                "(@a{{sv}} {{{endianness}}}, uint64 5, @ay [], @ay {zeros}, \
                 (@a{{sv}} {{}}, @ay [], @a(say) [], 'subject', '', uint64 1234, @ay {zeros}, @ay {zeros}), \
                 @ay [], @a(uayttay) [(uint32 0, @ay {zeros}, uint64 7, uint64 9, @ay {objs})], \
                 @a(yaytt) [(1, @ay {zeros}, 3, 4)])"
            );
            let orig = Variant::parse(Some(ty), &text).unwrap().data().to_vec();
            let before = Superblock::parse(&orig).unwrap();
            let mut part = before.parts[0].clone();
            part.checksum = Checksum::from([9; 32]);
            part.size = 1 << 33;
            part.uncompressed_size = 12345;
            part.objects.push((2, Checksum::from([3; 32])));
            let out = superblock_with_parts(&orig, std::slice::from_ref(&part)).unwrap();
            let after = Superblock::parse(&out).unwrap();
            assert_eq!(after.parts, vec![part], "{endianness}");
            assert_eq!(after.fallbacks, before.fallbacks, "{endianness}");
            assert_eq!((after.from, after.to), (before.from, before.to));
            assert_eq!(after.commit, before.commit);
            assert!(superblock_with_parts(&orig, &[]).is_err());
        }
    }

    #[test]
    fn refuses_garbage() {
        assert!(Superblock::parse(&vec![0; MAX_SUPERBLOCK_SIZE + 1]).is_err());
        // Garbage either fails or yields no parts; it never panics.
        if let Ok(s) = Superblock::parse(b"garbage") {
            assert!(s.parts.is_empty());
        }
    }
}
