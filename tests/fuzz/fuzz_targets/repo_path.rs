//! `RepoPath`, the URL grammar of an archive remote (and delta names in a
//! summary): what parses is plain, and prints back to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::{DeltaName, RepoPath};
use oscontent_fuzz::plain_path;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(p) = RepoPath::parse(s) {
        let printed = p.to_path();
        assert!(plain_path(&printed), "{printed:?}");
        assert_eq!(RepoPath::parse(&printed).as_ref(), Some(&p), "{s:?}");
        assert_eq!(printed, s, "one path, one spelling");
    }
    if let Some(d) = DeltaName::parse_summary_name(s) {
        assert_eq!(DeltaName::parse_summary_name(&d.summary_name()), Some(d));
        let dir = d.dir();
        assert!(plain_path(&dir), "{dir:?}");
    }
});
