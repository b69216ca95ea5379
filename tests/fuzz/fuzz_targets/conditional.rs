//! The Range and conditional request headers (RFC 9110), as a client
//! sends them: one `Name: value` a line. A partial answer always lies
//! within the representation.
#![no_main]
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use oscontent_parse::conditional::{evaluate, range, RangeOutcome, Validators};
use std::time::{Duration, UNIX_EPOCH};

const LENGTHS: [u64; 5] = [0, 1, 4096, 1 << 40, u64::MAX];

fuzz_target!(|data: &[u8]| {
    let mut h = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        h.append(name, value);
    }
    let v = Validators {
        etag: "\"3f2a\"".into(),
        last_modified: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        exact_date: data.first().is_some_and(|b| b & 1 == 1),
    };
    let _ = evaluate(&h, &v);
    for len in LENGTHS {
        match range(&h, len, &v) {
            RangeOutcome::Partial { start, end } => {
                assert!(start <= end && end < len, "{start}-{end} of {len}");
            }
            RangeOutcome::Full | RangeOutcome::Unsatisfiable => {}
        }
    }
});
