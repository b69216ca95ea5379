//! Dirmeta objects: what passes is a directory's metadata in normal form.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::tree::DIRMETA_GVARIANT_TYPE;
use oscontent_format::{check_dirmeta, parse_normal};

fuzz_target!(|data: &[u8]| {
    if check_dirmeta(data).is_err() {
        return;
    }
    let v = parse_normal(data, DIRMETA_GVARIANT_TYPE, "dirmeta").expect("checked once");
    let mode = u32::from_be(v.child_value(2).get::<u32>().expect("a u32"));
    assert_eq!(mode & 0o170000, 0o040000, "mode {mode:o}");
});
