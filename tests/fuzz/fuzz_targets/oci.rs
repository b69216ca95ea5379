//! OCI manifests, indexes, a layout's index.json and the image config, as
//! a fetch resolves them. Input: NUL-separated parts; the first says how
//! the root arrives (`layout`, `layout:TAG`, a media type, or nothing),
//! the rest are the documents in the order they are asked for.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_fuzz::parts;
use oscontent_parse::source::fuzzing::oci_documents;

fuzz_target!(|data: &[u8]| {
    let parts = parts(data);
    let Some((mode, docs)) = parts.split_first() else {
        return;
    };
    let mode = String::from_utf8_lossy(mode);
    let (layout, media) = match mode.split_once(':') {
        _ if mode == "layout" => (Some(None), None),
        Some(("layout", tag)) => (Some(Some(tag.to_owned())), None),
        _ if mode.is_empty() => (None, None),
        _ => (None, Some(mode.into_owned())),
    };
    let Ok(r) = oci_documents(docs, layout, media) else {
        return;
    };
    assert!(r.documents >= 1 && r.documents <= docs.len(), "{r:?}");
    let hex = r
        .manifest_digest
        .strip_prefix("sha256:")
        .expect("a sha256 digest");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{r:?}"
    );
});
