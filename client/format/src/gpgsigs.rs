//! OpenPGP signatures as ostree stores them: an `a{sv}` whose
//! `ostree.gpgsigs` entry is an `aay`, one detached signature packet per
//! element.
//!
//! The same container is used for a commit's detached metadata
//! (`objects/XX/REST.commitmeta`, next to other detached keys such as
//! `ostree.sign.ed25519`) and for `summary.sig` (libostree 2022.7
//! `ostree-repo.c`: `_OSTREE_METADATA_GPGSIGS_NAME`, written with a
//! `GVariantDict` and read back as `a{sv}`).
//!
//! Pure: bytes in, bytes out. Output is deterministic (entries sorted by
//! key) so the signer and the server produce the same bundle bytes.

use crate::error::FormatError;
use crate::variant::{check_size, parse_normal, ty};
use glib::{prelude::ToVariant, Variant};
use std::collections::BTreeMap;

/// Signatures beyond this count per object are refused unread: ostree
/// carries one per signing key, and a hostile server must not make us run
/// thousands of public-key operations.
pub const MAX_SIGNATURES: usize = 64;
/// One v4 signature packet is well under 1 KiB even for RSA-4096 with a
/// salt notation; anything larger is not a signature we made.
pub const MAX_SIGNATURE_SIZE: usize = 16 * 1024;

/// The detached-metadata key ostree's gpgme verifier reads.
pub const KEY_GPGSIGS: &str = "ostree.gpgsigs";
/// Detached metadata and `summary.sig` above this size are refused when
/// parsing: ours hold a few signatures of well under a KiB each, and an
/// untrusted server must not make us buffer or walk more than this.
pub const MAX_DETACHED_METADATA_SIZE: usize = 16 << 20;
/// Entries above this count in the `a{sv}` are refused (same reason).
pub const MAX_DETACHED_METADATA_ENTRIES: usize = 1024;

const WHAT: &str = "detached metadata";

fn verr(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

fn check_sigs<'a>(sigs: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<(), FormatError> {
    if sigs.len() > MAX_SIGNATURES {
        return Err(verr(format!(
            "{} signatures exceeds the limit of {MAX_SIGNATURES}",
            sigs.len()
        )));
    }
    for (i, s) in sigs.enumerate() {
        if s.is_empty() || s.len() > MAX_SIGNATURE_SIZE {
            return Err(verr(format!(
                "signature {i} is {} bytes, want 1..={MAX_SIGNATURE_SIZE}",
                s.len()
            )));
        }
    }
    Ok(())
}

fn aay(sigs: &[Vec<u8>]) -> Variant {
    Variant::array_from_iter_with_type(
        ty("ay"),
        sigs.iter().map(|s| Variant::array_from_fixed_array(s)),
    )
}

fn serialize(entries: BTreeMap<String, Variant>) -> Vec<u8> {
    let v = Variant::array_from_iter_with_type(
        ty("{sv}"),
        entries
            .into_iter()
            .map(|(k, v)| Variant::from_dict_entry(&k.to_variant(), &Variant::from_variant(&v))),
    );
    v.data().to_vec()
}

/// Parses untrusted `a{sv}` bytes into its entries (values unboxed).
fn parse_entries(bytes: &[u8]) -> Result<BTreeMap<String, Variant>, FormatError> {
    check_size(bytes, MAX_DETACHED_METADATA_SIZE, WHAT)?;
    let v = parse_normal(bytes, "a{sv}", WHAT)?;
    if v.n_children() > MAX_DETACHED_METADATA_ENTRIES {
        return Err(verr(format!(
            "more than {MAX_DETACHED_METADATA_ENTRIES} entries"
        )));
    }
    let mut out = BTreeMap::new();
    for e in v.iter() {
        let key = e.child_value(0).str().unwrap_or_default().to_owned();
        let val = e
            .child_value(1)
            .as_variant()
            .ok_or_else(|| verr(format!("{key:?}: not a variant")))?;
        // A repeated key is ambiguous (GVariantDict keeps the last, a linear
        // lookup finds the first): refuse rather than pick one.
        if out.insert(key.clone(), val).is_some() {
            return Err(verr(format!("duplicate key {key:?}")));
        }
    }
    Ok(out)
}

fn sigs_of(entries: &BTreeMap<String, Variant>) -> Result<Vec<Vec<u8>>, FormatError> {
    let Some(v) = entries.get(KEY_GPGSIGS) else {
        return Ok(Vec::new());
    };
    if v.type_() != ty("aay") {
        return Err(verr(format!(
            "{KEY_GPGSIGS} has type {}, want aay",
            v.type_()
        )));
    }
    if v.n_children() > MAX_SIGNATURES {
        return Err(verr(format!("more than {MAX_SIGNATURES} signatures")));
    }
    let sigs: Vec<Vec<u8>> = v
        .iter()
        .map(|s| {
            s.fixed_array::<u8>()
                .map(<[u8]>::to_vec)
                .map_err(|e| verr(e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    check_sigs(sigs.iter().map(Vec::as_slice))?;
    Ok(sigs)
}

/// `a{sv}` holding only `ostree.gpgsigs` = `sigs`: a fresh `.commitmeta` or
/// a `summary.sig`.
pub fn build_gpgsigs(sigs: &[Vec<u8>]) -> Result<Vec<u8>, FormatError> {
    check_sigs(sigs.iter().map(Vec::as_slice))?;
    Ok(serialize(BTreeMap::from([(
        KEY_GPGSIGS.to_owned(),
        aay(sigs),
    )])))
}

/// The signature packets in a `.commitmeta` or `summary.sig`, in stored
/// order; empty when the key is absent. The packets themselves are not
/// parsed here (that is `openpgp::verify_detached`'s job).
pub fn parse_gpgsigs(bytes: &[u8]) -> Result<Vec<Vec<u8>>, FormatError> {
    sigs_of(&parse_entries(bytes)?)
}

/// Adds `sigs` to existing detached metadata (`None` or empty bytes for
/// none), keeping every other key and every existing signature, and
/// dropping byte-identical duplicates so that re-running the signer over
/// the same bundle is idempotent.
pub fn merge_gpgsigs(existing: Option<&[u8]>, sigs: &[Vec<u8>]) -> Result<Vec<u8>, FormatError> {
    let mut entries = match existing {
        Some(b) if !b.is_empty() => parse_entries(b)?,
        _ => BTreeMap::new(),
    };
    let mut merged = sigs_of(&entries)?;
    for s in sigs {
        if !merged.contains(s) {
            merged.push(s.clone());
        }
    }
    check_sigs(merged.iter().map(Vec::as_slice))?;
    if merged.is_empty() {
        // An empty aay would read as "signed, by nobody": leave it out.
        entries.remove(KEY_GPGSIGS);
    } else {
        entries.insert(KEY_GPGSIGS.to_owned(), aay(&merged));
    }
    Ok(serialize(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other_meta() -> Vec<u8> {
        let mut m = BTreeMap::new();
        m.insert("ostree.sign.ed25519".to_owned(), aay(&[vec![7; 64]]));
        m.insert("xa.note".to_owned(), "hello".to_variant());
        serialize(m)
    }

    #[test]
    fn build_parse_roundtrip() {
        let sigs = vec![vec![1, 2, 3], vec![4; 600]];
        let bytes = build_gpgsigs(&sigs).unwrap();
        assert_eq!(parse_gpgsigs(&bytes).unwrap(), sigs);
        // Readable as a plain a{sv} with the aay boxed in a variant.
        let v = Variant::from_data_with_type(bytes, ty("a{sv}"));
        let d = glib::VariantDict::new(Some(&v));
        assert!(d.lookup_value(KEY_GPGSIGS, Some(ty("aay"))).is_some());
    }

    #[test]
    fn merge_keeps_other_keys_and_dedups() {
        let a = vec![1u8; 100];
        let b = vec![2u8; 100];
        let first = merge_gpgsigs(Some(&other_meta()), std::slice::from_ref(&a)).unwrap();
        let second = merge_gpgsigs(Some(&first), &[a.clone(), b.clone()]).unwrap();
        assert_eq!(parse_gpgsigs(&second).unwrap(), vec![a.clone(), b.clone()]);
        // Idempotent, and nothing else was lost.
        assert_eq!(merge_gpgsigs(Some(&second), &[b, a]).unwrap(), second);
        let entries = parse_entries(&second).unwrap();
        assert_eq!(
            entries.keys().collect::<Vec<_>>(),
            ["ostree.gpgsigs", "ostree.sign.ed25519", "xa.note"]
        );
        assert_eq!(entries["xa.note"].str(), Some("hello"));
    }

    #[test]
    fn merge_from_nothing_and_with_nothing() {
        assert_eq!(
            merge_gpgsigs(None, &[vec![9]]).unwrap(),
            build_gpgsigs(&[vec![9]]).unwrap()
        );
        assert_eq!(
            merge_gpgsigs(Some(b""), &[vec![9]]).unwrap(),
            build_gpgsigs(&[vec![9]]).unwrap()
        );
        let untouched = merge_gpgsigs(Some(&other_meta()), &[]).unwrap();
        assert_eq!(parse_entries(&untouched).unwrap().len(), 2);
        assert!(parse_gpgsigs(&untouched).unwrap().is_empty());
    }

    #[test]
    fn refuses_bad_input() {
        let too_many: Vec<Vec<u8>> = (0..=MAX_SIGNATURES).map(|i| vec![i as u8]).collect();
        let too_big = vec![vec![0u8; MAX_SIGNATURE_SIZE + 1]];
        let wrong_type = serialize(BTreeMap::from([(KEY_GPGSIGS.to_owned(), "x".to_variant())]));
        type Case = (&'static str, Result<Vec<Vec<u8>>, FormatError>);
        let cases: Vec<Case> = vec![
            (
                "too many to build",
                build_gpgsigs(&too_many).map(|_| vec![]),
            ),
            ("too big to build", build_gpgsigs(&too_big).map(|_| vec![])),
            ("empty signature", build_gpgsigs(&[vec![]]).map(|_| vec![])),
            (
                "too many to parse",
                parse_gpgsigs(&serialize(BTreeMap::from([(
                    KEY_GPGSIGS.to_owned(),
                    aay(&too_many),
                )]))),
            ),
            ("wrong value type", parse_gpgsigs(&wrong_type)),
            (
                "oversized input",
                parse_gpgsigs(&vec![0u8; MAX_DETACHED_METADATA_SIZE + 1]),
            ),
            (
                "merge past the limit",
                merge_gpgsigs(Some(&build_gpgsigs(&too_many[1..]).unwrap()), &[vec![0xff]])
                    .map(|_| vec![]),
            ),
        ];
        for (name, got) in cases {
            assert!(
                matches!(got, Err(FormatError::Variant { .. })),
                "{name}: {got:?}"
            );
        }
        for junk in [&b"garbage"[..], &[0xff; 64]] {
            // Garbage either fails or holds no signatures; it never panics.
            if let Ok(s) = parse_gpgsigs(junk) {
                assert!(s.is_empty());
            }
        }
    }
}
