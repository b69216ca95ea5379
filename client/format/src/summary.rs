//! The remote `summary` file: `(a(s(taya{sv}))a{sv})`.
//!
//! [`build_summary`] is deterministic: the same [`Summary`] always gives the
//! same bytes (refs, deltas and every dictionary sorted by key, and no clock
//! read), because a signer elsewhere must reproduce the exact bytes it signs.

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::path::DeltaName;
use crate::refname::validate_collection_id;
use crate::staging::{self, StagingIndex};
use crate::variant::{check_size, parse_normal, ty};
use glib::{prelude::ToVariant, Variant, VariantDict};
use std::collections::BTreeMap;

pub const SUMMARY_GVARIANT_TYPE: &str = "(a(s(taya{sv}))a{sv})";
/// Summaries above this size are refused when parsing (untrusted input).
pub const MAX_SUMMARY_SIZE: usize = 64 << 20;
/// Refs above this count are refused when building or parsing.
pub const MAX_REFS: usize = 100_000;

pub const KEY_COMMIT_TIMESTAMP: &str = "ostree.commit.timestamp";
pub const KEY_COMMIT_VERSION: &str = "ostree.commit.version";
pub const KEY_STATIC_DELTAS: &str = "ostree.static-deltas";
pub const KEY_LAST_MODIFIED: &str = "ostree.summary.last-modified";
pub const KEY_MODE: &str = "ostree.summary.mode";
pub const KEY_TOMBSTONE_COMMITS: &str = "ostree.summary.tombstone-commits";
pub const KEY_INDEXED_DELTAS: &str = "ostree.summary.indexed-deltas";
pub const KEY_COLLECTION_ID: &str = "ostree.summary.collection-id";
pub const KEY_COLLECTION_MAP: &str = "ostree.summary.collection-map";
pub const KEY_EXPIRES: &str = "ostree.summary.expires";

/// One ref entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRef {
    pub name: String,
    pub commit: Checksum,
    /// Size of the commit object in bytes.
    pub commit_size: u64,
    /// The commit's timestamp, seconds since the epoch.
    pub timestamp: Option<u64>,
    pub version: Option<String>,
}

/// One static delta and the SHA-256 of its superblock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryDelta {
    pub name: DeltaName,
    pub superblock: Checksum,
}

/// Everything a summary says that ostree 2022.7 reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Refs of the main list (`refs/heads`, or the repo's own collection).
    pub refs: Vec<SummaryRef>,
    /// Refs of other collections (`refs/mirrors/<collection-id>/…`).
    pub collection_map: BTreeMap<String, Vec<SummaryRef>>,
    pub collection_id: Option<String>,
    pub deltas: Vec<SummaryDelta>,
    /// Whether clients should look deltas up in `delta-indexes/`.
    pub indexed_deltas: bool,
    pub last_modified: Option<u64>,
    pub expires: Option<u64>,
    pub mode: Option<String>,
    pub tombstone_commits: bool,
    /// The images a node can stage from this remote ([`staging::SUMMARY_KEY`]).
    pub staging: Option<StagingIndex>,
}

/// `a{sv}` from sorted entries.
fn asv(entries: BTreeMap<&str, Variant>) -> Variant {
    Variant::array_from_iter_with_type(
        ty("{sv}"),
        entries
            .into_iter()
            .map(|(k, v)| Variant::from_dict_entry(&k.to_variant(), &Variant::from_variant(&v))),
    )
}

fn ay(b: &[u8]) -> Variant {
    Variant::array_from_fixed_array(b)
}

fn ref_list(refs: &[SummaryRef]) -> Result<Variant, FormatError> {
    let mut sorted: Vec<&SummaryRef> = refs.iter().collect();
    sorted.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    for w in sorted.windows(2) {
        if w[0].name == w[1].name {
            return Err(FormatError::DuplicateRef(w[0].name.clone()));
        }
    }
    if sorted.len() > MAX_REFS {
        return Err(FormatError::Variant {
            what: "summary",
            why: format!("more than {MAX_REFS} refs"),
        });
    }
    let entries = sorted.into_iter().map(|r| {
        let mut meta = BTreeMap::new();
        if let Some(ts) = r.timestamp {
            meta.insert(KEY_COMMIT_TIMESTAMP, ts.to_be().to_variant());
        }
        if let Some(v) = &r.version {
            meta.insert(KEY_COMMIT_VERSION, v.to_variant());
        }
        // libostree writes the size in host order (unlike the timestamps,
        // which it stores big-endian): GVariant's own little-endian here.
        let inner = Variant::tuple_from_iter([
            r.commit_size.to_variant(),
            ay(r.commit.as_bytes()),
            asv(meta),
        ]);
        Variant::tuple_from_iter([r.name.to_variant(), inner])
    });
    Ok(Variant::array_from_iter_with_type(
        ty("(s(taya{sv}))"),
        entries,
    ))
}

/// `ostree.static-deltas`: delta name → superblock SHA-256, sorted by name.
fn delta_list(deltas: &[SummaryDelta]) -> Variant {
    let mut by_name: BTreeMap<String, Variant> = BTreeMap::new();
    for d in deltas {
        by_name.insert(d.name.summary_name(), ay(d.superblock.as_bytes()));
    }
    let borrowed = by_name
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    asv(borrowed)
}

/// A delta index, `delta-indexes/XX/REST.index`: the deltas to one commit
/// in an `a{sv}` under the summary's own key, as libostree writes it.
/// Listing deltas there rather than in the summary leaves the summary's
/// bytes (and so its signature) unchanged when deltas appear.
pub fn build_delta_index(deltas: &[SummaryDelta]) -> Vec<u8> {
    let mut meta = BTreeMap::new();
    meta.insert(KEY_STATIC_DELTAS, delta_list(deltas));
    asv(meta).data().to_vec()
}

/// Parses a delta index from an untrusted remote (bounded like a summary).
pub fn parse_delta_index(bytes: &[u8]) -> Result<Vec<SummaryDelta>, FormatError> {
    const WHAT_INDEX: &str = "delta index";
    check_size(bytes, MAX_SUMMARY_SIZE, WHAT_INDEX)?;
    let v = parse_normal(bytes, "a{sv}", WHAT_INDEX)?;
    parse_delta_list(&VariantDict::new(Some(&v)))
}

fn parse_delta_list(meta: &VariantDict) -> Result<Vec<SummaryDelta>, FormatError> {
    let mut deltas = Vec::new();
    if let Some(d) = meta.lookup_value(KEY_STATIC_DELTAS, Some(ty("a{sv}"))) {
        for e in d.iter() {
            let name = e.child_value(0).str().unwrap_or_default().to_owned();
            let val = e
                .child_value(1)
                .as_variant()
                .ok_or_else(|| verr("static delta value"))?;
            let name = DeltaName::parse_summary_name(&name)
                .ok_or_else(|| verr(format!("bad static delta name {name:?}")))?;
            let sb = val.fixed_array::<u8>().map_err(|e| verr(e.to_string()))?;
            let superblock =
                Checksum::from_bytes(sb).map_err(|_| verr("delta superblock checksum"))?;
            deltas.push(SummaryDelta { name, superblock });
        }
    }
    Ok(deltas)
}

/// Serializes a summary. Deterministic; see the module docs.
pub fn build_summary(s: &Summary) -> Result<Vec<u8>, FormatError> {
    let refs = ref_list(&s.refs)?;
    let mut meta: BTreeMap<&str, Variant> = BTreeMap::new();
    if let Some(m) = &s.mode {
        meta.insert(KEY_MODE, m.to_variant());
    }
    if let Some(t) = s.last_modified {
        meta.insert(KEY_LAST_MODIFIED, t.to_be().to_variant());
    }
    if let Some(t) = s.expires {
        meta.insert(KEY_EXPIRES, t.to_be().to_variant());
    }
    meta.insert(KEY_TOMBSTONE_COMMITS, s.tombstone_commits.to_variant());
    if s.indexed_deltas {
        meta.insert(KEY_INDEXED_DELTAS, true.to_variant());
    }
    if let Some(c) = &s.collection_id {
        meta.insert(KEY_COLLECTION_ID, c.to_variant());
    }
    if !s.deltas.is_empty() {
        meta.insert(KEY_STATIC_DELTAS, delta_list(&s.deltas));
    }
    if !s.collection_map.is_empty() {
        let mut entries = Vec::new();
        for (cid, refs) in &s.collection_map {
            entries.push(Variant::from_dict_entry(
                &cid.to_variant(),
                &ref_list(refs)?,
            ));
        }
        meta.insert(
            KEY_COLLECTION_MAP,
            Variant::array_from_iter_with_type(ty("{sa(s(taya{sv}))}"), entries),
        );
    }
    if let Some(index) = &s.staging {
        meta.insert(staging::SUMMARY_KEY, index.to_variant()?);
    }
    let v = Variant::tuple_from_iter([refs, asv(meta)]);
    Ok(v.data().to_vec())
}

const WHAT: &str = "summary";

fn verr(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

fn parse_ref_list(v: &Variant) -> Result<Vec<SummaryRef>, FormatError> {
    if v.n_children() > MAX_REFS {
        return Err(verr(format!("more than {MAX_REFS} refs")));
    }
    let mut out = Vec::with_capacity(v.n_children());
    for entry in v.iter() {
        let name = entry.child_value(0).str().unwrap_or_default().to_owned();
        let inner = entry.child_value(1);
        let size = inner.child_value(0).get::<u64>().unwrap_or_default();
        let cs = inner.child_value(1);
        let commit = Checksum::from_bytes(cs.fixed_array::<u8>().map_err(|e| verr(e.to_string()))?)
            .map_err(|_| verr(format!("ref {name:?}: checksum is not 32 bytes")))?;
        let meta = VariantDict::new(Some(&inner.child_value(2)));
        out.push(SummaryRef {
            commit,
            commit_size: size,
            timestamp: meta
                .lookup_value(KEY_COMMIT_TIMESTAMP, Some(ty("t")))
                .and_then(|v| v.get::<u64>())
                .map(u64::from_be),
            version: meta
                .lookup_value(KEY_COMMIT_VERSION, Some(ty("s")))
                .and_then(|v| v.str().map(str::to_owned)),
            name,
        });
    }
    for w in out.windows(2) {
        if w[0].name.as_bytes() >= w[1].name.as_bytes() {
            return Err(verr(format!("refs not strictly sorted at {:?}", w[1].name)));
        }
    }
    for r in &out {
        crate::refname::validate_ref(&r.name).map_err(|e| verr(e.to_string()))?;
    }
    Ok(out)
}

/// Parses summary bytes from an untrusted remote.
pub fn parse_summary(bytes: &[u8]) -> Result<Summary, FormatError> {
    check_size(bytes, MAX_SUMMARY_SIZE, WHAT)?;
    let v = parse_normal(bytes, SUMMARY_GVARIANT_TYPE, WHAT)?;
    let refs = parse_ref_list(&v.child_value(0))?;
    let meta = VariantDict::new(Some(&v.child_value(1)));
    let get_t = |k| {
        meta.lookup_value(k, Some(ty("t")))
            .and_then(|v| v.get::<u64>())
            .map(u64::from_be)
    };
    let get_b = |k| {
        meta.lookup_value(k, Some(ty("b")))
            .and_then(|v| v.get::<bool>())
            .unwrap_or(false)
    };
    let get_s = |k| {
        meta.lookup_value(k, Some(ty("s")))
            .and_then(|v| v.str().map(str::to_owned))
    };
    let deltas = parse_delta_list(&meta)?;
    let mut collection_map = BTreeMap::new();
    if let Some(m) = meta.lookup_value(KEY_COLLECTION_MAP, Some(ty("a{sa(s(taya{sv}))}"))) {
        for e in m.iter() {
            let cid = e.child_value(0).str().unwrap_or_default().to_owned();
            // The key becomes a directory (`refs/mirrors/CID/…`) wherever
            // the summary is mirrored: `../..` must never get that far.
            validate_collection_id(&cid).map_err(|e| verr(format!("{KEY_COLLECTION_MAP}: {e}")))?;
            collection_map.insert(cid, parse_ref_list(&e.child_value(1))?);
        }
    }
    let collection_id = get_s(KEY_COLLECTION_ID);
    if let Some(c) = &collection_id {
        validate_collection_id(c).map_err(|e| verr(format!("{KEY_COLLECTION_ID}: {e}")))?;
    }
    // Looked up untyped: a value of another type is a broken index, not
    // an absent one.
    let staging = meta
        .lookup_value(staging::SUMMARY_KEY, None)
        .map(|v| StagingIndex::from_variant(&v))
        .transpose()?;
    Ok(Summary {
        refs,
        collection_map,
        collection_id,
        deltas,
        indexed_deltas: get_b(KEY_INDEXED_DELTAS),
        last_modified: get_t(KEY_LAST_MODIFIED),
        expires: get_t(KEY_EXPIRES),
        mode: get_s(KEY_MODE),
        tombstone_commits: get_b(KEY_TOMBSTONE_COMMITS),
        staging,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: u8) -> Checksum {
        Checksum::from([n; 32])
    }

    fn sample() -> Summary {
        Summary {
            refs: vec![
                SummaryRef {
                    name: "z/last".into(),
                    commit: c(2),
                    commit_size: 150,
                    timestamp: Some(1_706_745_600),
                    version: Some("2.0".into()),
                },
                SummaryRef {
                    name: "a/first".into(),
                    commit: c(1),
                    commit_size: 99,
                    timestamp: Some(1_704_067_200),
                    version: None,
                },
            ],
            deltas: vec![SummaryDelta {
                name: DeltaName {
                    from: Some(c(1)),
                    to: c(2),
                },
                superblock: c(9),
            }],
            indexed_deltas: true,
            last_modified: Some(1_706_745_600),
            mode: Some(crate::config::ARCHIVE_MODE.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_delta_index_round_trips_and_a_summary_is_not_one() {
        let deltas = sample().deltas;
        let bytes = build_delta_index(&deltas);
        assert_eq!(parse_delta_index(&bytes).unwrap(), deltas);
        assert_eq!(parse_delta_index(&build_delta_index(&[])).unwrap(), vec![]);
        assert!(parse_delta_index(&build_summary(&sample()).unwrap()).is_err());
    }

    #[test]
    fn roundtrip_sorts_refs() {
        let bytes = build_summary(&sample()).unwrap();
        let back = parse_summary(&bytes).unwrap();
        let mut want = sample();
        want.refs.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(back, want);
    }

    #[test]
    fn a_staging_index_rides_in_the_metadata() {
        use crate::staging::{LayerKind, StagedImage, StagedLayer};
        let index = StagingIndex {
            images: vec![StagedImage {
                manifest: c(5),
                manifest_size: 10,
                config: c(6),
                config_size: 20,
                commit: c(7),
                layers: vec![StagedLayer {
                    digest: c(8),
                    kind: LayerKind::Commit,
                }],
            }],
        };
        let with = Summary {
            staging: Some(index.clone()),
            ..sample()
        };
        let bytes = build_summary(&with).unwrap();
        assert_eq!(parse_summary(&bytes).unwrap().staging, Some(index));
        assert_eq!(
            parse_summary(&build_summary(&sample()).unwrap())
                .unwrap()
                .staging,
            None
        );
        // A value of another type under the key is refused, not ignored.
        let v = parse_normal(&bytes, SUMMARY_GVARIANT_TYPE, WHAT).unwrap();
        let mut meta: BTreeMap<&str, Variant> = BTreeMap::new();
        meta.insert(staging::SUMMARY_KEY, "forged".to_variant());
        let forged = Variant::tuple_from_iter([v.child_value(0), asv(meta)]);
        let e = parse_summary(forged.data()).unwrap_err().to_string();
        assert!(e.contains("staging index"), "{e}");
    }

    #[test]
    fn deterministic_whatever_the_input_order() {
        let a = build_summary(&sample()).unwrap();
        let mut s = sample();
        s.refs.reverse();
        assert_eq!(a, build_summary(&s).unwrap());
    }

    #[test]
    fn byte_order_like_libostree() {
        // As `ostree summary -u` writes them: the commit size (150 = 0x96)
        // in host order, timestamps big-endian.
        let bytes = build_summary(&sample()).unwrap();
        let size = 150u64.to_le_bytes();
        let ts = 1_706_745_600u64.to_be_bytes();
        for (what, needle) in [("size", size), ("timestamp", ts)] {
            assert!(bytes.windows(8).any(|w| w == needle), "{what} not found");
        }
    }

    #[test]
    fn refuses_duplicates_and_garbage() {
        let mut s = sample();
        s.refs.push(s.refs[0].clone());
        assert_eq!(
            build_summary(&s),
            Err(FormatError::DuplicateRef("z/last".into()))
        );
        for junk in [&b""[..], b"garbage", &[0xff; 64]] {
            // Garbage either fails or parses to nothing; it never panics.
            if let Ok(p) = parse_summary(junk) {
                assert!(p.refs.is_empty());
            }
        }
    }

    /// Summaries as a hostile upstream would forge them: every name that
    /// could become a path must pass the grammar, and the refusal names it.
    #[test]
    fn refuses_names_outside_the_grammar() {
        let good = sample().refs[0].clone();
        let with_map = |cid: &str, name: &str| Summary {
            collection_map: BTreeMap::from([(
                cid.to_owned(),
                vec![SummaryRef {
                    name: name.into(),
                    ..good.clone()
                }],
            )]),
            ..sample()
        };
        let with_cid = |cid: &str| Summary {
            collection_id: Some(cid.into()),
            ..sample()
        };
        let cases: Vec<(Summary, Option<&str>)> = vec![
            (with_map("org.example.Os", "os/stable"), None),
            (with_cid("org.example.Os"), None),
            (with_map("../../tmp/x", "os/stable"), Some("../../tmp/x")),
            (
                with_map("org.example/../..", "a"),
                Some("org.example/../.."),
            ),
            (with_map("/abs.path", "a"), Some("/abs.path")),
            (with_map("single", "a"), Some("single")),
            (with_map("org.1x", "a"), Some("org.1x")),
            (with_map("", "a"), Some("\"\"")),
            (with_map("org.example.Os", "../../x"), Some("../../x")),
            (with_map("org.example.Os", "a/../../x"), Some("a/../../x")),
            (with_cid("../x"), Some("../x")),
        ];
        for (s, refused) in cases {
            let got = parse_summary(&build_summary(&s).unwrap());
            match refused {
                None => {
                    let got = got.unwrap();
                    assert_eq!(
                        (got.collection_map, got.collection_id),
                        (s.collection_map, s.collection_id)
                    );
                }
                Some(name) => {
                    let e = got.unwrap_err().to_string();
                    assert!(e.contains(name), "{name}: {e}");
                }
            }
        }
    }
}
