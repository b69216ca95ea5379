//! Commit objects (and their `ostree.sizes`): a parsed commit is named by
//! the SHA-256 of exactly the bytes parsed, which are in normal form.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::{parse_normal, Checksum, Commit, COMMIT_GVARIANT_TYPE};

fuzz_target!(|data: &[u8]| {
    let Ok(c) = Commit::parse(data) else { return };
    assert_eq!(c.checksum, Checksum::digest(data));
    assert_eq!(c.size, data.len() as u64);
    let v = parse_normal(data, COMMIT_GVARIANT_TYPE, "commit").expect("parsed once");
    assert_eq!(v.data(), data, "normal form re-serializes to itself");
    let _ = (c.version(), c.ref_bindings(), c.collection_binding());
    let _ = c.object_sizes();
});
