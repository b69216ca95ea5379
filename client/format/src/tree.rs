//! Directory objects: `dirtree` (`(a(say)a(sayay))`, the names and
//! checksums of a directory's files and subdirectories) and `dirmeta`
//! (`(uuua(ayay))`: uid, gid, mode, xattrs). Both are untrusted input when
//! they come from a remote: sizes are bounded and every name is checked
//! before it can steer the walk.

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::variant::{check_size, parse_normal};
use glib::Variant;

pub const DIRTREE_GVARIANT_TYPE: &str = "(a(say)a(sayay))";
pub const DIRMETA_GVARIANT_TYPE: &str = "(uuua(ayay))";
/// Dirtree objects above this size are refused. A directory of 100,000
/// entries is about 5 MiB; libostree's own cap for any metadata object is
/// 128 MiB, which is more than a node should buffer per request.
pub const MAX_DIRTREE_SIZE: usize = 16 << 20;
/// Dirmeta objects above this size are refused: uid, gid, mode and a few
/// xattrs (SELinux labels, capabilities) are well under a KiB.
pub const MAX_DIRMETA_SIZE: usize = 1 << 20;

/// A parsed dirtree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirTree {
    /// (name, content checksum).
    pub files: Vec<(String, Checksum)>,
    /// (name, dirtree checksum, dirmeta checksum).
    pub dirs: Vec<(String, Checksum, Checksum)>,
}

fn err(what: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what,
        why: why.into(),
    }
}

/// ostree's rule for a path component in a tree (`ostree_validate_filename`).
fn check_name(name: &str) -> Result<(), FormatError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(err("dirtree", format!("invalid file name {name:?}")));
    }
    Ok(())
}

fn parse_bounded(
    bytes: &[u8],
    ty: &str,
    what: &'static str,
    max: usize,
) -> Result<Variant, FormatError> {
    check_size(bytes, max, what)?;
    parse_normal(bytes, ty, what)
}

fn checksum_of(v: &Variant, what: &'static str) -> Result<Checksum, FormatError> {
    let b = v
        .fixed_array::<u8>()
        .map_err(|e| err(what, e.to_string()))?;
    Checksum::from_bytes(b).map_err(|_| err(what, format!("checksum of {} bytes", b.len())))
}

/// Parses dirtree bytes. Names must be valid, sorted and unique, as
/// libostree writes them, so that one tree has exactly one encoding.
pub fn parse_dirtree(bytes: &[u8]) -> Result<DirTree, FormatError> {
    let v = parse_bounded(bytes, DIRTREE_GVARIANT_TYPE, "dirtree", MAX_DIRTREE_SIZE)?;
    let mut out = DirTree::default();
    for f in v.child_value(0).iter() {
        let name = f.child_value(0).str().unwrap_or_default().to_owned();
        check_name(&name)?;
        out.files
            .push((name, checksum_of(&f.child_value(1), "dirtree")?));
    }
    for d in v.child_value(1).iter() {
        let name = d.child_value(0).str().unwrap_or_default().to_owned();
        check_name(&name)?;
        out.dirs.push((
            name,
            checksum_of(&d.child_value(1), "dirtree")?,
            checksum_of(&d.child_value(2), "dirtree")?,
        ));
    }
    let sorted_unique = |names: Vec<&str>| names.windows(2).all(|w| w[0] < w[1]);
    if !sorted_unique(out.files.iter().map(|f| f.0.as_str()).collect())
        || !sorted_unique(out.dirs.iter().map(|d| d.0.as_str()).collect())
    {
        return Err(err("dirtree", "entries are not sorted and unique"));
    }
    Ok(out)
}

/// Checks dirmeta bytes: the type, the size bound, and a directory mode.
pub fn check_dirmeta(bytes: &[u8]) -> Result<(), FormatError> {
    let v = parse_bounded(bytes, DIRMETA_GVARIANT_TYPE, "dirmeta", MAX_DIRMETA_SIZE)?;
    let mode = u32::from_be(v.child_value(2).get::<u32>().unwrap_or(0));
    const S_IFMT: u32 = 0o170000;
    const S_IFDIR: u32 = 0o040000;
    if mode & S_IFMT != S_IFDIR {
        return Err(err("dirmeta", format!("mode {mode:o} is not a directory")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use glib::prelude::ToVariant;
    use glib::VariantTy;

    fn c(n: u8) -> Checksum {
        Checksum::from([n; 32])
    }

    fn dirtree(files: &[(&str, u8)], dirs: &[(&str, u8, u8)]) -> Vec<u8> {
        let ay = |n: u8| Variant::array_from_fixed_array(c(n).as_bytes());
        let f = Variant::array_from_iter_with_type(
            VariantTy::new("(say)").unwrap(),
            files
                .iter()
                .map(|(n, x)| Variant::tuple_from_iter([n.to_variant(), ay(*x)])),
        );
        let d = Variant::array_from_iter_with_type(
            VariantTy::new("(sayay)").unwrap(),
            dirs.iter()
                .map(|(n, t, m)| Variant::tuple_from_iter([n.to_variant(), ay(*t), ay(*m)])),
        );
        Variant::tuple_from_iter([f, d]).data().to_vec()
    }

    #[test]
    fn parses_a_dirtree() {
        let t = parse_dirtree(&dirtree(&[("a", 1), ("b", 2)], &[("d", 3, 4)])).unwrap();
        assert_eq!(t.files, vec![("a".into(), c(1)), ("b".into(), c(2))]);
        assert_eq!(t.dirs, vec![("d".into(), c(3), c(4))]);
    }

    #[test]
    fn refuses_hostile_dirtrees() {
        let cases: &[(&str, Vec<u8>)] = &[
            ("dot-dot", dirtree(&[("..", 1)], &[])),
            ("slash", dirtree(&[], &[("a/b", 1, 2)])),
            ("empty name", dirtree(&[("", 1)], &[])),
            ("unsorted", dirtree(&[("b", 1), ("a", 2)], &[])),
            ("duplicate", dirtree(&[], &[("x", 1, 2), ("x", 1, 2)])),
            ("oversized", vec![0u8; MAX_DIRTREE_SIZE + 1]),
        ];
        for (name, bytes) in cases {
            assert!(parse_dirtree(bytes).is_err(), "{name} accepted");
        }
        for junk in [&b"garbage"[..], &[0xff; 80]] {
            // Garbage either fails or parses to nothing; it never panics.
            if let Ok(t) = parse_dirtree(junk) {
                assert!(t.files.is_empty() && t.dirs.is_empty());
            }
        }
    }

    #[test]
    fn dirmeta_must_be_a_directory() {
        let meta = |mode: u32| {
            Variant::tuple_from_iter([
                0u32.to_variant(),
                0u32.to_variant(),
                mode.to_be().to_variant(),
                Variant::array_from_iter_with_type(
                    VariantTy::new("(ayay)").unwrap(),
                    [] as [Variant; 0],
                ),
            ])
            .data()
            .to_vec()
        };
        assert!(check_dirmeta(&meta(0o040755)).is_ok());
        assert!(check_dirmeta(&meta(0o100644)).is_err());
        assert!(check_dirmeta(&vec![0; MAX_DIRMETA_SIZE + 1]).is_err());
    }
}
