//! A bundle's `oscontent-bundle.json` (untrusted media), parsed as the
//! server reads it: streaming from a reader. Whatever it accepts is
//! within every cap, every listed file is an archive repo path, and the
//! manifest round-trips through what a mirror writes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::RepoPath;
use oscontent_parse::bundle::{self, BundleManifest};

fuzz_target!(|data: &[u8]| {
    let Ok(m) = BundleManifest::read_from(data, "fuzz") else {
        return;
    };
    assert!(m.files.len() <= bundle::MAX_FILES);
    assert!(m.releases.len() <= bundle::MAX_RELEASES);
    let refs: usize = m.releases.iter().map(|r| r.refs.len()).sum();
    assert!(refs <= bundle::MAX_REFS);
    for p in m.files.keys() {
        assert!(p.len() <= bundle::MAX_PATH, "{p:?}");
        assert!(RepoPath::parse(p).is_some(), "{p:?}");
    }
    assert!(m.source.len() <= bundle::MAX_TEXT && m.kind.len() <= bundle::MAX_TEXT);
    let _ = m.commits();
    let bytes = m.to_bytes().expect("what was read can be written");
    assert_eq!(BundleManifest::parse(&bytes, "again").expect("reparses"), m);
});
