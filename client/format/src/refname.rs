//! ostree's ref and collection-ID grammar (`ostree_validate_rev`,
//! `ostree_validate_collection_id`), ASCII only.

use crate::error::FormatError;

/// Longer names are refused: nothing real comes close, and it bounds work.
pub const MAX_REF_LEN: usize = 1024;

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A ref is `/`-separated components, each `[\w\d][-._\w\d]*`.
pub fn validate_ref(r: &str) -> Result<(), FormatError> {
    let bad = || FormatError::RefName(r.chars().take(80).collect());
    if r.is_empty() || r.len() > MAX_REF_LEN {
        return Err(bad());
    }
    for comp in r.split('/') {
        let b = comp.as_bytes();
        let ok = !b.is_empty()
            && is_word(b[0])
            && b[1..]
                .iter()
                .all(|&c| is_word(c) || matches!(c, b'-' | b'.'));
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}

/// A collection ID is reverse-DNS: at least two `.`-separated elements, each
/// `[A-Za-z_][A-Za-z0-9_-]*`, at most 255 bytes.
pub fn validate_collection_id(c: &str) -> Result<(), FormatError> {
    const MAX_LEN: usize = 255;
    let bad = || FormatError::CollectionId(c.chars().take(80).collect());
    if c.len() > MAX_LEN || c.split('.').count() < 2 {
        return Err(bad());
    }
    for el in c.split('.') {
        let b = el.as_bytes();
        let ok = !b.is_empty()
            && (b[0].is_ascii_alphabetic() || b[0] == b'_')
            && b[1..].iter().all(|&x| is_word(x) || x == b'-');
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}

/// Makes one valid ref component out of arbitrary text (a `version` label,
/// say): characters outside `[-._A-Za-z0-9]` become `_`, and a leading
/// `-`/`.` gets a `_` in front. Returns `None` for empty input.
pub fn sanitize_ref_component(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    let mut out: String = s
        .chars()
        .take(MAX_REF_LEN / 2)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.as_bytes()[0].is_ascii_alphanumeric() && out.as_bytes()[0] != b'_' {
        out.insert(0, '_');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs() {
        let cases: &[(&str, bool)] = &[
            ("fedora/x86_64/coreos/stable", true),
            ("a", true),
            ("41.20250101.3.0", true),
            ("a-b.c_d/e", true),
            ("", false),
            ("/a", false),
            ("a/", false),
            ("a//b", false),
            ("-a", false),
            (".a", false),
            ("a/..", false),
            ("a/../b", false),
            ("a b", false),
            ("a+b", false),
            ("a:b", false),
            ("é", false),
        ];
        for (r, ok) in cases {
            assert_eq!(validate_ref(r).is_ok(), *ok, "{r:?}");
        }
        assert!(validate_ref(&"a".repeat(MAX_REF_LEN + 1)).is_err());
    }

    #[test]
    fn collection_ids() {
        let cases: &[(&str, bool)] = &[
            ("org.example.Os", true),
            ("com.redhat.rhcos", true),
            ("a_b.c-d", true),
            ("single", false),
            ("org..x", false),
            ("1org.x", false),
            ("org.x/y", false),
        ];
        for (c, ok) in cases {
            assert_eq!(validate_collection_id(c).is_ok(), *ok, "{c:?}");
        }
    }

    #[test]
    fn sanitize() {
        let cases: &[(&str, Option<&str>)] = &[
            ("41.20250101.3.0", Some("41.20250101.3.0")),
            ("1.0+git~3", Some("1.0_git_3")),
            ("-rc1", Some("_-rc1")),
            ("v 2", Some("v_2")),
            ("", None),
        ];
        for (s, want) in cases {
            let got = sanitize_ref_component(s);
            assert_eq!(got.as_deref(), *want, "{s:?}");
            if let Some(g) = got {
                validate_ref(&g).unwrap();
            }
        }
    }
}
