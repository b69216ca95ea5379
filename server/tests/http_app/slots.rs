//! The staging-slot routes through `app(state)`, as production routes
//! them: grants, the caps' 429s with `Retry-After`, renewal, release,
//! expiry, every refused request, the metrics, and the routes gone with
//! slots off.

use crate::support::Server;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, StatusCode};
use oscontent_server::slots::SlotConfig;
use oscontent_server::{app, HttpConfig};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tower::ServiceExt;

const SLOTS: &str = "/oscontent/v1/stage/slots";
const JSON: &str = "application/json";

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// One request from `peer` (`None`: no connection, as in-process callers).
async fn call(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Body,
    peer: Option<&str>,
) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "oscontent.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(body).unwrap();
    if let Some(p) = peer {
        let addr: SocketAddr = format!("{p}:40000").parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(addr));
    }
    let resp = app(server.state.clone()).oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap().to_vec();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

fn ask(node: &str, pool: &str, control_plane: bool) -> String {
    json!({
        "node": node,
        "pool": pool,
        "control_plane": control_plane,
        "digest": format!("sha256:{}", "0".repeat(64)),
    })
    .to_string()
}

async fn post_slot(server: &Server, body: String, peer: &str) -> Answer {
    let ctype = [("content-type", JSON)];
    call(server, "POST", SLOTS, &ctype, Body::from(body), Some(peer)).await
}

fn with_slots(config: SlotConfig) -> Server {
    Server::with_config(HttpConfig {
        stage_slots: Some(config),
        ..Default::default()
    })
}

fn small() -> SlotConfig {
    SlotConfig {
        per_pool: 2,
        control_plane: 1,
        ttl: Duration::from_secs(60),
        retry_after: Duration::from_secs(30),
        max_pools: 2,
        per_address: 2,
    }
}

/// The value of one series on `/metrics`.
async fn metric(server: &Server, series: &str) -> Option<f64> {
    let page = call(server, "GET", "/metrics", &[], Body::empty(), None).await;
    let text = String::from_utf8(page.body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A 429 as the contract has it: `Retry-After` whole seconds in [15, 45)
/// for the 30 s base, the same in the body, and the cap that refused.
fn assert_refused(a: &Answer, pool: &str, in_use: u64, slots: u64, says: &str) {
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.json());
    assert_eq!(a.header("content-type"), Some(JSON));
    let after: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!((15..45).contains(&after), "Retry-After {after}");
    let b = a.json();
    assert_eq!(b["retry_after_secs"], json!(after), "{b}");
    assert_eq!(b["pool"], json!(pool), "{b}");
    assert_eq!(
        (b["in_use"].as_u64(), b["slots"].as_u64()),
        (Some(in_use), Some(slots)),
        "{b}"
    );
    let error = b["error"].as_str().unwrap();
    assert!(error.contains(says), "{error:?} should say {says:?}");
}

// long-fn: one lease table through grants, renewals and releases, each step depending on the last
#[tokio::test]
async fn slots_are_granted_within_every_cap_renewed_and_released() {
    let server = with_slots(small());
    let first = post_slot(&server, ask("a", "worker", false), "10.0.0.1").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("content-type"), Some(JSON));
    assert_eq!(first.header("cache-control"), Some("no-store"));
    let b = first.json();
    let lease = b["lease"].as_str().unwrap().to_owned();
    assert!(
        lease.len() == 32
            && lease
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
        "{lease}"
    );
    assert_eq!(b, json!({"lease": lease, "ttl_secs": 60, "pool": "worker"}));
    // Asked again (an agent restarted): the same lease, no second slot.
    let again = post_slot(&server, ask("a", "worker", false), "10.0.0.1").await;
    assert_eq!(again.json()["lease"], json!(lease));
    let b_lease = post_slot(&server, ask("b", "worker", false), "10.0.0.1").await;
    assert_eq!(b_lease.status, StatusCode::OK);
    let refusals = [
        (
            ask("c", "worker", false),
            "10.0.0.1",
            "worker",
            2,
            2,
            "client address",
        ),
        (
            ask("c", "worker", false),
            "10.0.0.2",
            "worker",
            2,
            2,
            "staging slots of the pool",
        ),
    ];
    for (body, peer, pool, in_use, slots, says) in refusals {
        let a = post_slot(&server, body, peer).await;
        assert_refused(&a, pool, in_use, slots, says);
    }
    let m1 = post_slot(&server, ask("m1", "master", true), "10.0.0.3").await;
    assert_eq!(m1.status, StatusCode::OK);
    let m2 = post_slot(&server, ask("m2", "master", true), "10.0.0.4").await;
    assert_refused(&m2, "master", 1, 1, "control-plane");
    let third = post_slot(&server, ask("x", "infra", false), "10.0.0.5").await;
    assert_refused(&third, "infra", 2, 2, "pools");

    let renew = format!("{SLOTS}/{lease}/renew");
    let one = format!("{SLOTS}/{lease}");
    let r = call(
        &server,
        "POST",
        &renew,
        &[],
        Body::empty(),
        Some("10.0.0.1"),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (StatusCode::OK, json!({"ttl_secs": 60}))
    );
    let d = call(
        &server,
        "DELETE",
        &one,
        &[],
        Body::empty(),
        Some("10.0.0.1"),
    )
    .await;
    assert_eq!((d.status, d.body.len()), (StatusCode::NO_CONTENT, 0));
    let gone = json!({"error": "lease expired or unknown"});
    for (method, path) in [("DELETE", &one), ("POST", &renew)] {
        let a = call(&server, method, path, &[], Body::empty(), None).await;
        assert_eq!(
            (a.status, a.json()),
            (StatusCode::NOT_FOUND, gone.clone()),
            "{method} {path}"
        );
    }
    let c = post_slot(&server, ask("c", "worker", false), "10.0.0.2").await;
    assert_eq!(c.status, StatusCode::OK);

    for (series, want) in [
        (r#"oscontent_stage_slots{pool="worker"}"#, 2.0),
        (r#"oscontent_stage_slots_in_use{pool="worker"}"#, 2.0),
        (r#"oscontent_stage_slots_peak{pool="worker"}"#, 2.0),
        (r#"oscontent_stage_slot_grants_total{pool="worker"}"#, 3.0),
        (r#"oscontent_stage_slot_releases_total{pool="worker"}"#, 1.0),
        (r#"oscontent_stage_slot_expiries_total{pool="worker"}"#, 0.0),
        (
            r#"oscontent_stage_slot_refusals_total{pool="worker",reason="full"}"#,
            1.0,
        ),
        (
            r#"oscontent_stage_slot_refusals_total{pool="worker",reason="address"}"#,
            1.0,
        ),
        (
            r#"oscontent_stage_slot_refusals_total{pool="master",reason="control_plane"}"#,
            1.0,
        ),
        (
            r#"oscontent_stage_slot_refusals_total{pool="*",reason="pools"}"#,
            1.0,
        ),
        (r#"oscontent_stage_slots_in_use{pool="master"}"#, 1.0),
        (
            r#"oscontent_http_requests_total{kind="stage_slots",status="429"}"#,
            4.0,
        ),
    ] {
        assert_eq!(metric(&server, series).await, Some(want), "{series}");
    }
    // A scrape twice counts nothing twice.
    let series = r#"oscontent_stage_slot_grants_total{pool="worker"}"#;
    assert_eq!(metric(&server, series).await, Some(3.0));
    assert_eq!(
        metric(&server, r#"oscontent_stage_slots{pool="infra"}"#).await,
        None
    );
}

#[tokio::test]
async fn a_lease_not_renewed_expires_and_frees_its_slot() {
    let server = with_slots(SlotConfig {
        per_pool: 1,
        ttl: Duration::from_millis(200),
        ..small()
    });
    let a = post_slot(&server, ask("a", "worker", false), "10.0.0.1").await;
    let lease = a.json()["lease"].as_str().unwrap().to_owned();
    // Past the TTL with no renewal: the node is taken for dead.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let renew = format!("{SLOTS}/{lease}/renew");
    let r = call(&server, "POST", &renew, &[], Body::empty(), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let expiries = r#"oscontent_stage_slot_expiries_total{pool="worker"}"#;
    assert_eq!(metric(&server, expiries).await, Some(1.0));
    let in_use = r#"oscontent_stage_slots_in_use{pool="worker"}"#;
    assert_eq!(metric(&server, in_use).await, Some(0.0));
}

// long-fn: a table of bad requests, one row a case
#[tokio::test]
async fn bad_slot_requests_are_refused_naming_what_was_wrong() {
    let server = with_slots(small());
    let big = format!("{{\"node\": \"{}\"}}", "a".repeat(5000));
    let length = big.len().to_string();
    let lease = "0123456789abcdef0123456789abcdef";
    // method, path, headers, body, status, the error's start ("": no JSON).
    type Case<'a> = (
        &'a str,
        String,
        Vec<(&'a str, &'a str)>,
        String,
        StatusCode,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "POST",
            SLOTS.into(),
            vec![],
            ask("a", "p", false),
            StatusCode::BAD_REQUEST,
            "Content-Type",
        ),
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", "text/plain")],
            ask("a", "p", false),
            StatusCode::BAD_REQUEST,
            "Content-Type",
        ),
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", JSON), ("content-length", length.as_str())],
            big.clone(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body: larger than 4096",
        ),
        // No declared length: read no further than the bound.
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", JSON)],
            big.clone(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body: larger than 4096",
        ),
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", JSON)],
            "{\"node\": \"a\", \"x\": 1}".into(),
            StatusCode::BAD_REQUEST,
            "body: unknown field `x`",
        ),
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", JSON)],
            ask("A", "p", false),
            StatusCode::BAD_REQUEST,
            "node:",
        ),
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", JSON)],
            ask("a", "p q", false),
            StatusCode::BAD_REQUEST,
            "pool:",
        ),
        (
            "POST",
            SLOTS.into(),
            vec![("content-type", JSON)],
            "{\"node\": \"a\", \"pool\": \"p\", \"control_plane\": 0, \"digest\": \"x\"}".into(),
            StatusCode::BAD_REQUEST,
            "control_plane:",
        ),
        (
            "POST",
            format!("{SLOTS}/{}/renew", lease.to_uppercase()),
            vec![],
            String::new(),
            StatusCode::BAD_REQUEST,
            "lease:",
        ),
        (
            "DELETE",
            format!("{SLOTS}/nope"),
            vec![],
            String::new(),
            StatusCode::BAD_REQUEST,
            "lease:",
        ),
        (
            "POST",
            format!("{SLOTS}/{lease}/renew"),
            vec![],
            String::new(),
            StatusCode::NOT_FOUND,
            "lease expired or unknown",
        ),
        (
            "DELETE",
            format!("{SLOTS}/{lease}"),
            vec![],
            String::new(),
            StatusCode::NOT_FOUND,
            "lease expired or unknown",
        ),
        (
            "GET",
            SLOTS.into(),
            vec![],
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "",
        ),
        (
            "PUT",
            format!("{SLOTS}/{lease}"),
            vec![],
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "",
        ),
        (
            "GET",
            format!("{SLOTS}/{lease}/renew"),
            vec![],
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "",
        ),
    ];
    for (method, path, headers, body, status, says) in cases {
        let a = call(
            &server,
            method,
            &path,
            &headers,
            Body::from(body),
            Some("10.0.0.1"),
        )
        .await;
        assert_eq!(
            a.status,
            status,
            "{method} {path} {headers:?}: {:?}",
            String::from_utf8_lossy(&a.body)
        );
        if says.is_empty() {
            continue;
        }
        let error = a.json()["error"].as_str().unwrap().to_owned();
        assert!(
            error.starts_with(says),
            "{method} {path}: {error:?} should start {says:?}"
        );
    }
    // Nothing refused took a slot.
    let in_use = r#"oscontent_stage_slots_in_use{pool="p"}"#;
    assert_eq!(metric(&server, in_use).await, None);
}

#[tokio::test]
async fn with_slots_off_every_slot_route_is_the_unknown_paths_404() {
    let server = Server::with_config(HttpConfig {
        stage_slots: None,
        ..Default::default()
    });
    let lease = "0123456789abcdef0123456789abcdef";
    for (method, path) in [
        ("POST", SLOTS.to_owned()),
        ("POST", format!("{SLOTS}/{lease}/renew")),
        ("DELETE", format!("{SLOTS}/{lease}")),
    ] {
        let ctype = [("content-type", JSON)];
        let a = call(
            &server,
            method,
            &path,
            &ctype,
            Body::from(ask("a", "p", false)),
            None,
        )
        .await;
        assert_eq!(
            (a.status, a.body.len()),
            (StatusCode::NOT_FOUND, 0),
            "{method} {path}"
        );
    }
    let page = call(&server, "GET", "/metrics", &[], Body::empty(), None).await;
    assert!(!String::from_utf8(page.body)
        .unwrap()
        .contains("oscontent_stage_slots{"));
}

#[test]
fn slot_paths_are_routed_and_repo_paths_are_not() {
    for (path, routed) in [
        (SLOTS, true),
        (
            "/oscontent/v1/stage/slots/0123456789abcdef0123456789abcdef/renew",
            true,
        ),
        ("/metrics", true),
        ("/config", false),
        ("/objects/00/11.commit", false),
    ] {
        assert_eq!(oscontent_server::http::routed(path), routed, "{path}");
    }
}
