//! A remote's `config` (glib's GKeyFile, as libostree reads it).
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::RepoConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(c) = RepoConfig::parse(data) else {
        return;
    };
    if c.is_archive() {
        assert!(matches!(c.mode.as_deref(), Some("archive" | "archive-z2")));
    }
});
