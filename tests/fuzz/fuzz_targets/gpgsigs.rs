//! The `ostree.gpgsigs` container of `.commitmeta` and `summary.sig`:
//! parse, build and merge agree with each other.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::{build_gpgsigs, merge_gpgsigs, parse_gpgsigs};

fuzz_target!(|data: &[u8]| {
    let Ok(sigs) = parse_gpgsigs(data) else {
        return;
    };
    let built = build_gpgsigs(&sigs).expect("parsed signatures rebuild");
    assert_eq!(parse_gpgsigs(&built).expect("rebuilt parses"), sigs);
    let extra = vec![b"\x88\x00new".to_vec()];
    if let Ok(merged) = merge_gpgsigs(Some(data), &extra) {
        let all = parse_gpgsigs(&merged).expect("merged parses");
        assert!(
            sigs.iter().all(|s| all.contains(s)),
            "merge keeps what was there"
        );
        assert!(all.contains(&extra[0]), "merge adds");
    }
});
