//! ostree's ref and collection-ID grammar, checked against a restatement
//! of it, and the sanitizer that makes ref components of labels.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::{sanitize_ref_component, validate_collection_id, validate_ref};
use oscontent_fuzz::plain_path;

fn word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let ref_ok = !s.is_empty()
        && s.len() <= 1024
        && s.split('/').all(|c| {
            let b = c.as_bytes();
            !b.is_empty() && word(b[0]) && b.iter().all(|&x| word(x) || x == b'-' || x == b'.')
        });
    assert_eq!(validate_ref(s).is_ok(), ref_ok, "ref {s:?}");
    if ref_ok {
        assert!(plain_path(s), "{s:?}");
    }
    let cid_ok = s.len() <= 255
        && s.split('.').count() >= 2
        && s.split('.').all(|e| {
            let b = e.as_bytes();
            !b.is_empty()
                && (b[0].is_ascii_alphabetic() || b[0] == b'_')
                && b.iter().all(|&x| word(x) || x == b'-')
        });
    assert_eq!(
        validate_collection_id(s).is_ok(),
        cid_ok,
        "collection {s:?}"
    );
    if let Some(c) = sanitize_ref_component(s) {
        assert!(
            validate_ref(&c).is_ok() && !c.contains('/'),
            "{s:?} -> {c:?}"
        );
    }
});
