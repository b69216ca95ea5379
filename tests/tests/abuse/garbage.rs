//! Random and oversized requests: every one is answered with a 4xx or the
//! connection is closed, never a 5xx, a hang or a crash, while normal
//! requests go on.

use crate::support::*;
use oscontent_testkit::http::raw_exchange;
use std::time::Duration;

/// xorshift: reproducible "random" bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Path pieces an attacker would try: traversal, encodings, repo-like
/// names, NULs and controls (percent-encoded, as a request line needs).
const PIECES: &[&str] = &[
    "..", ".", "%2e%2e", "%2f", "%00", "objects", "refs", "heads", "deltas", "summary", "config",
    "%ff", "~", "a", "00", "\\", "%5c", "..%2f", "?x=1", "#", ";", "%0d%0a",
];

/// The requests: (what, bytes).
fn requests(rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..400 {
        let depth = 1 + rng.next() % 12;
        let path: String = (0..depth)
            .map(|_| format!("/{}", rng.pick(PIECES)))
            .collect();
        out.push((
            format!("random path {i}"),
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes(),
        ));
    }
    let long = "a".repeat(100_000);
    out.push((
        "100 KB path".into(),
        format!("GET /refs/heads/{long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .into_bytes(),
    ));
    out.push((
        "64 KB header".into(),
        format!(
            "GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
            &long[..65_536]
        )
        .into_bytes(),
    ));
    let many: String = (0..500).map(|i| format!("X-H{i}: v\r\n")).collect();
    out.push((
        "500 headers".into(),
        format!("GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{many}\r\n").into_bytes(),
    ));
    for i in 0..50 {
        let junk: Vec<u8> = (0..1 + rng.next() % 4096)
            .map(|_| rng.next() as u8)
            .collect();
        out.push((format!("binary junk {i}"), junk));
    }
    for m in [
        "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "BREW",
    ] {
        out.push((
            format!("method {m}"),
            format!("{m} /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").into_bytes(),
        ));
    }
    out.push((
        "huge Content-Length".into(),
        b"GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 99999999999\r\n\r\n".to_vec(),
    ));
    out.push((
        "bad Range".into(),
        format!(
            "GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\nRange: bytes={}\r\n\r\n",
            "0-1,".repeat(2000)
        )
        .into_bytes(),
    ));
    out
}

#[test]
fn random_and_oversized_requests_get_4xx_or_a_closed_connection() {
    let _one = one_at_a_time();
    let mut lab = Lab::start(&[]);
    let rss = RssSampler::start(&lab);
    let normal = lab.normal_traffic();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Twice over, so the attack lasts long enough to time normal requests.
    let reqs: Vec<_> = requests(&mut rng)
        .into_iter()
        .chain(requests(&mut rng))
        .collect();
    let (mut by_status, mut closed) = (std::collections::BTreeMap::new(), 0usize);
    let mut bad = Vec::new();
    for (what, bytes) in &reqs {
        // An error is a reset while we were still sending: refused, as it
        // should be.
        let raw = raw_exchange(lab.server.addr, bytes, Duration::from_secs(10)).unwrap_or_default();
        if raw.is_empty() {
            closed += 1;
            continue;
        }
        let status = std::str::from_utf8(&raw[..raw.len().min(12)])
            .ok()
            .and_then(|l| l.strip_prefix("HTTP/1.1 "))
            .and_then(|c| c.get(..3))
            .and_then(|c| c.parse::<u16>().ok());
        match status {
            Some(s) if (400..500).contains(&s) || s == 200 || s == 206 => {
                *by_status.entry(s).or_insert(0usize) += 1
            }
            _ => bad.push(format!(
                "{what}: {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(80)])
            )),
        }
    }
    println!(
        "garbage: {} requests: {by_status:?} by status, {closed} closed without an answer",
        reqs.len()
    );
    assert!(
        bad.is_empty(),
        "answers other than 4xx or a close: {bad:#?}"
    );
    normal.finish().check("garbage");
    rss.finish("garbage");
    lab.assert_recovered("garbage");
}
