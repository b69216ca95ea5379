//! Static delta superblocks: sizes a remote declares never overflow once
//! parsed, and the delta-or-loose decision holds for any missing set.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::delta::delta_is_smaller;
use oscontent_format::{Commit, Superblock};

fuzz_target!(|data: &[u8]| {
    let Ok(sb) = Superblock::parse(data) else {
        return;
    };
    assert!(sb.total_size().is_some(), "parse refuses overflowing sizes");
    let _ = sb.total_uncompressed_size();
    let _ = delta_is_smaller(&sb, |_, _| true);
    assert!(
        !delta_is_smaller(&sb, |_, _| false) || sb.total_size() == Some(0),
        "nothing missing: a non-empty delta never wins"
    );
    // The embedded commit is parsed by the client like any other.
    let _ = Commit::parse(&sb.commit);
});
