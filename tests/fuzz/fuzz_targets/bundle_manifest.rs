//! A bundle's `oscontent-bundle.json` (untrusted media): every listed
//! file is an archive repo path, and the manifest round-trips.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::RepoPath;
use oscontent_parse::bundle::BundleManifest;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = BundleManifest::parse(data, "fuzz") else {
        return;
    };
    for p in m.files.keys() {
        assert!(RepoPath::parse(p).is_some(), "{p:?}");
    }
    let _ = m.commits();
    let bytes = serde_json::to_vec(&m).expect("serializes");
    assert_eq!(BundleManifest::parse(&bytes, "again").expect("reparses"), m);
});
