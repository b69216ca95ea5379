//! The Bearer-token challenge: a small token server and authorizing proxy
//! (axum, on loopback) in front of the real `docker-registry`, the way
//! Quay, Docker Hub or an OpenShift registry answer. Tokens are only
//! issued for the right Basic credentials, and are revoked once mid-pull to
//! check that the client renews an expired token.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod source_support;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use oscontent_server::source::SourceError;
use source_support::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Proxy {
    upstream: String,
    realm: String,
    /// Tokens carry the epoch they were issued in; bumping it revokes them.
    epoch: AtomicU64,
    /// Authorized /v2 requests served; the epoch is bumped after the first.
    served: AtomicU64,
    tokens_issued: AtomicU64,
    client: reqwest::Client,
}

const USER: &str = "robot";
const PASS: &str = "t0ken-pass";

async fn token(State(p): State<Arc<Proxy>>, headers: HeaderMap, req: Request) -> Response {
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASS}"))
    );
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let q = req.uri().query().unwrap_or("");
    if !q.contains("scope=repository%3Aos%3Apull") || !q.contains("service=test-registry") {
        return (StatusCode::BAD_REQUEST, format!("bad query {q}")).into_response();
    }
    p.tokens_issued.fetch_add(1, Ordering::SeqCst);
    let t = format!("tok-{}", p.epoch.load(Ordering::SeqCst));
    let body = serde_json::json!({"token": t, "expires_in": 300}).to_string();
    (StatusCode::OK, [("content-type", "application/json")], body).into_response()
}

async fn v2(State(p): State<Arc<Proxy>>, req: Request) -> Response {
    let want = format!("Bearer tok-{}", p.epoch.load(Ordering::SeqCst));
    let ok = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(want.as_str());
    if !ok {
        let challenge = format!(
            r#"Bearer realm="{}",service="test-registry",scope="repository:os:pull""#,
            p.realm
        );
        let mut r = StatusCode::UNAUTHORIZED.into_response();
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_str(&challenge).unwrap(),
        );
        return r;
    }
    if p.served.fetch_add(1, Ordering::SeqCst) == 0 {
        // Revoke: the next request must renew its token.
        p.epoch.fetch_add(1, Ordering::SeqCst);
    }
    let url = format!(
        "{}{}",
        p.upstream,
        req.uri()
            .path_and_query()
            .map(|x| x.as_str())
            .unwrap_or("/")
    );
    let mut up = p.client.get(url);
    if let Some(a) = req.headers().get("accept") {
        up = up.header("accept", a.clone());
    }
    let resp = match up.send().await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let mut out = Response::builder().status(resp.status().as_u16());
    for h in ["content-type", "content-length", "docker-content-digest"] {
        if let Some(v) = resp.headers().get(h) {
            out = out.header(h, v.as_bytes());
        }
    }
    out.body(Body::from_stream(resp.bytes_stream())).unwrap()
}

/// Runs the proxy on a thread of its own; returns its address.
fn start_proxy(upstream: String) -> (String, Arc<Proxy>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let proxy = Arc::new(Proxy {
        upstream,
        realm: format!("http://{addr}/token"),
        epoch: AtomicU64::new(0),
        served: AtomicU64::new(0),
        tokens_issued: AtomicU64::new(0),
        client: reqwest::Client::new(),
    });
    let state = proxy.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/token", get(token))
                .fallback(v2)
                .with_state(state);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (addr, proxy)
}

#[test]
fn bearer_token_challenge_with_renewal() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    reg.push(&os.layout, "1", "os:1", &[]);
    let (addr, proxy) = start_proxy(format!("http://{}", reg.host()));
    let work = tempfile::tempdir().unwrap();
    let parent = work.path().join("staging");
    let image = format!("docker://{addr}/os:1");

    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASS}"));
    let authfile = work.path().join("auth.json");
    std::fs::write(
        &authfile,
        format!(r#"{{"auths": {{"{addr}/os": {{"auth": "{auth}"}}}}}}"#),
    )
    .unwrap();
    let mut o = opts(std::slice::from_ref(&addr));
    o.authfile = Some(authfile);
    let s = fetch(&image, &o, &parent).unwrap();
    assert_eq!(s.commit, os.commit);
    assert_staged_repo(&s.root, &os.commit);
    assert_eq!(
        proxy.tokens_issued.load(Ordering::SeqCst),
        2,
        "one token, then one renewal after the revocation"
    );

    // Wrong credentials: the token server refuses, and that is the error.
    let bad = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:nope"));
    let badfile = work.path().join("bad.json");
    std::fs::write(
        &badfile,
        format!(r#"{{"auths": {{"{addr}": {{"auth": "{bad}"}}}}}}"#),
    )
    .unwrap();
    o.authfile = Some(badfile);
    let parent = work.path().join("staging2");
    let e = assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["authentication", "token server", "401"],
    );
    assert!(matches!(e, SourceError::Auth { .. }), "{e:?}");
}
