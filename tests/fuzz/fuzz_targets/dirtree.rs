//! Dirtree objects: every name that parses is one plain path component,
//! and the entries are sorted and unique (one tree, one encoding).
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::parse_dirtree;
use oscontent_fuzz::plain_component;

fuzz_target!(|data: &[u8]| {
    let Ok(t) = parse_dirtree(data) else { return };
    let files: Vec<&str> = t.files.iter().map(|f| f.0.as_str()).collect();
    let dirs: Vec<&str> = t.dirs.iter().map(|d| d.0.as_str()).collect();
    for names in [files, dirs] {
        for n in &names {
            assert!(plain_component(n.as_bytes()), "{n:?}");
        }
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
    }
});
