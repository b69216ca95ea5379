//! `summary`: what a remote serves at `/summary`. Whatever parses must
//! name only grammatical refs and collections, and rebuild to a fixed
//! point (the summary we build is deterministic).
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::{
    build_summary, parse_summary, validate_collection_id, validate_ref, Summary,
};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = parse_summary(data) else { return };
    let refs = s.refs.iter().chain(s.collection_map.values().flatten());
    for r in refs {
        assert!(validate_ref(&r.name).is_ok(), "{:?}", r.name);
    }
    for cid in s.collection_map.keys().chain(s.collection_id.iter()) {
        assert!(validate_collection_id(cid).is_ok(), "{cid:?}");
    }
    let built = build_summary(&s).expect("a parsed summary rebuilds");
    let again = parse_summary(&built).expect("a rebuilt summary parses");
    // Deltas are a dictionary: the parser keeps the wire order (and any
    // repeated name), the builder sorts by name, one entry a name.
    let names = |s: &Summary| {
        let mut n: Vec<String> = s.deltas.iter().map(|d| d.name.summary_name()).collect();
        n.sort();
        n.dedup();
        n
    };
    assert_eq!(names(&again), names(&s), "the same deltas");
    let strip = |s: &Summary| Summary {
        deltas: Vec::new(),
        ..s.clone()
    };
    assert_eq!(strip(&again), strip(&s), "parse(build(s)) == s");
    assert_eq!(
        build_summary(&again).expect("rebuilds"),
        built,
        "a fixed point"
    );
});
