//! The staging slots of the real binary over TCP, HTTP/1.1 and HTTP/2:
//! granted up to `--stage-slots`, refused with `Retry-After` past it,
//! freed when their holders stop renewing, and counted in `/metrics`.

use oscontent_testkit::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SLOTS: &str = "/oscontent/v1/stage/slots";
/// `--stage-lease-ttl`: its lower bound, so that expiry is quick.
const TTL: u64 = 5;
/// `--stage-retry-after`: a refusal's Retry-After is in [5, 15).
const RETRY_BASE: u64 = 10;

fn ask(node: &str) -> String {
    json!({
        "node": node,
        "pool": "worker",
        "control_plane": false,
        "digest": format!("sha256:{}", "ab".repeat(32)),
    })
    .to_string()
}

/// A slot asked for: status, `Retry-After`, body, and the protocol used.
fn post_slot(
    client: &reqwest::blocking::Client,
    server: &Server,
    node: &str,
) -> (u16, Option<u64>, Value, reqwest::Version) {
    let r = client
        .post(server.url_for(SLOTS))
        .header("content-type", "application/json")
        .body(ask(node))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let version = r.version();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = serde_json::from_str(&r.text().unwrap()).unwrap();
    (status, retry, body, version)
}

fn send(client: &reqwest::blocking::Client, method: reqwest::Method, url: &str) -> (u16, String) {
    let r = client.request(method, url).send().unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

// long-fn: one server's slots through grants, refusals and expiries, each step depending on the last
#[test]
fn slots_are_granted_refused_and_freed_by_expiry_over_tcp() {
    let server = Server::oscontainer(&v1().oscontainer)
        .args(["--stage-slots", "2", "--stage-leases-per-address", "8"])
        .args(["--stage-lease-ttl", &TTL.to_string()])
        .args(["--stage-retry-after", &RETRY_BASE.to_string()])
        .start()
        .unwrap();
    let (h1, h2) = (http1(), http2());
    let mut leases = Vec::new();
    for (client, node, version) in [
        (&h1, "node-a", reqwest::Version::HTTP_11),
        (&h2, "node-b", reqwest::Version::HTTP_2),
    ] {
        let (status, _, body, v) = post_slot(client, &server, node);
        assert_eq!((status, v), (200, version), "{node}: {body}");
        assert_eq!(body["ttl_secs"], json!(TTL));
        assert_eq!(body["pool"], json!("worker"));
        leases.push(body["lease"].as_str().unwrap().to_owned());
    }
    for client in [&h1, &h2] {
        let (status, retry, body, _) = post_slot(client, &server, "node-c");
        assert_eq!(status, 429, "{body}");
        let retry = retry.expect("Retry-After on a 429");
        assert!(
            (RETRY_BASE / 2..RETRY_BASE * 3 / 2).contains(&retry),
            "Retry-After {retry}"
        );
        assert_eq!(body["retry_after_secs"], json!(retry));
        assert_eq!(
            (body["in_use"].clone(), body["slots"].clone()),
            (json!(2), json!(2))
        );
    }
    // A GET of the route over HTTP/1.1 is the router's (405), not the
    // repo fast path's 404.
    assert_eq!(server.raw("GET", SLOTS, &[]).unwrap().status, 405);
    let renew = |lease: &str| server.url_for(&format!("{SLOTS}/{lease}/renew"));
    let (status, body) = send(&h2, reqwest::Method::POST, &renew(&leases[0]));
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()),
        (200, json!({"ttl_secs": TTL}))
    );
    let m = server.metrics().unwrap();
    let worker = [("pool", "worker")];
    assert_eq!(m.get("oscontent_stage_slots", &worker), Some(2.0));
    assert_eq!(m.get("oscontent_stage_slots_in_use", &worker), Some(2.0));
    assert_eq!(
        m.get("oscontent_stage_slot_grants_total", &worker),
        Some(2.0)
    );
    let full = [("pool", "worker"), ("reason", "full")];
    assert_eq!(
        m.get("oscontent_stage_slot_refusals_total", &full),
        Some(2.0)
    );

    // Nobody renews any more, as if both nodes died: within a TTL or so
    // a third node gets a slot. Asked at most every 250 ms for 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut third = None;
    for _ in 0..120 {
        let (status, _, body, _) = post_slot(&h1, &server, "node-c");
        if status == 200 {
            third = body["lease"].as_str().map(str::to_owned);
            break;
        }
        assert_eq!(status, 429, "{body}");
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let third = third.expect("a slot freed by expiry within 30 s");
    let expiries = "oscontent_stage_slot_expiries_total";
    server
        .wait_metric(expiries, &worker, 2.0, Duration::from_secs(30))
        .unwrap();
    for lease in &leases {
        let (status, body) = send(&h1, reqwest::Method::POST, &renew(lease));
        assert_eq!(
            (status, body.as_str()),
            (404, r#"{"error":"lease expired or unknown"}"#)
        );
    }
    let one = server.url_for(&format!("{SLOTS}/{third}"));
    assert_eq!(send(&h2, reqwest::Method::DELETE, &one).0, 204);
    assert_eq!(send(&h1, reqwest::Method::DELETE, &one).0, 404);
    let m = server.metrics().unwrap();
    // Never more than --stage-slots at once.
    assert_eq!(m.get("oscontent_stage_slots_peak", &worker), Some(2.0));
    assert_eq!(m.get("oscontent_stage_slots_in_use", &worker), Some(0.0));
    assert_eq!(
        m.get("oscontent_stage_slot_grants_total", &worker),
        Some(3.0)
    );
    assert_eq!(
        m.get("oscontent_stage_slot_releases_total", &worker),
        Some(1.0)
    );
    assert_eq!(m.get(expiries, &worker), Some(2.0));
    // Logged as every request is, with the peer the caps count.
    let log = server.access_log().unwrap();
    let posts: Vec<_> = log
        .iter()
        .filter(|e| e.method == "POST" && e.path == SLOTS)
        .collect();
    assert!(posts.len() >= 5, "{posts:?}");
    for e in posts {
        assert_eq!(
            (e.kind.as_str(), e.client.as_deref()),
            ("stage_slots", Some("127.0.0.1"))
        );
    }
}

#[test]
fn bad_stage_flags_are_refused_at_start_naming_the_flag() {
    for (flag, value) in [
        ("--stage-lease-ttl", "4"),
        ("--stage-lease-ttl", "3601"),
        ("--stage-slots-control-plane", "0"),
        ("--stage-max-pools", "0"),
    ] {
        let r = Server::oscontainer(&v1().oscontainer)
            .args([flag, value])
            .start_expect_failure()
            .unwrap();
        assert!(r.stderr.contains(flag), "{flag} {value}:\n{}", r.stderr);
    }
}
