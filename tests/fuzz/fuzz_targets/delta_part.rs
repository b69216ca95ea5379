//! Static delta part payloads: the op-stream checker never panics, and
//! what it accepts writes no more than the sizes it let objects declare.
#![no_main]
use libfuzzer_sys::fuzz_target;
use oscontent_format::deltapart::check_part_payload;
use oscontent_format::Checksum;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the part's object list (types 0 to 7, so that
    // unknown and metadata types are tried too), and the cap.
    let Some((&pick, payload)) = data.split_first() else {
        return;
    };
    let objects: Vec<(u8, Checksum)> = (0..(pick & 7))
        .map(|i| ((pick >> 3).wrapping_add(i) & 7, Checksum::from([i; 32])))
        .collect();
    let cap = u64::from(pick) << 8;
    if let Ok(w) = check_part_payload(payload, &objects, |_, _| cap) {
        assert!(w.objects <= objects.len() as u64, "opened more than listed");
        assert!(w.bytes <= cap.saturating_mul(w.objects), "wrote past the caps");
    }
});
