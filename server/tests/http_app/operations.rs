//! `/healthz`, `/readyz`, `/metrics`, the access log, and switching from one
//! generation to the next.

use crate::support::*;
use http::StatusCode;

#[tokio::test]
async fn readiness_follows_publication_and_draining() {
    let fx = Fixture::new();
    let server = Server::new();
    let h = server.get("/healthz").await;
    assert_eq!(
        (h.status, h.body.as_slice()),
        (StatusCode::OK, &b"ok\n"[..])
    );
    let r = server.get("/readyz").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.body, b"no verified content published yet\n");
    // Repo paths before any generation: 503, retry soon, empty body.
    let s = server.get("/summary").await;
    assert_eq!(
        (s.status, s.body.len()),
        (StatusCode::SERVICE_UNAVAILABLE, 0)
    );
    assert_eq!(s.header("retry-after"), Some("5"));
    assert_eq!(server.metric("oscontent_ready", &[]).await, Some(0.0));

    server.publish(fx.publish(&fx.v1)).await;
    let r = server.get("/readyz").await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (StatusCode::OK, &b"ready\n"[..])
    );
    assert_eq!(server.get("/summary").await.status, 200);
    assert_eq!(server.metric("oscontent_ready", &[]).await, Some(1.0));
    assert_eq!(
        server.metric("oscontent_published_refs", &[]).await,
        Some(1.0)
    );

    server.state.start_draining();
    let r = server.get("/readyz").await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (StatusCode::SERVICE_UNAVAILABLE, &b"shutting down\n"[..])
    );
    assert_eq!(server.get("/healthz").await.status, 200);
    // In-flight and late requests are still answered while draining.
    assert_eq!(server.get("/summary").await.status, 200);
    assert_eq!(server.metric("oscontent_ready", &[]).await, Some(0.0));
}

#[tokio::test]
async fn metrics_and_access_log_count_requests_by_kind_and_status() {
    let (_fx, server) = serving_v1().await;
    let summary = server.get("/summary").await;
    // Revalidated: a 304 carries the 200's Content-Length and no body,
    // and counts no bytes.
    let etag = summary.header("etag").unwrap().to_owned();
    let revalidated = server
        .get_with("/summary", &[("If-None-Match", &etag)])
        .await;
    assert_eq!(revalidated.status, StatusCode::NOT_MODIFIED);
    let absent = format!("/objects/{}/{}.filez", &ABSENT[..2], &ABSENT[2..]);
    assert_eq!(server.get(&absent).await.status, 404);
    assert_eq!(server.get("/no/such/thing").await.status, 404);
    assert_eq!(server.get("/healthz").await.status, 200);
    assert_eq!(server.get("/readyz").await.status, 200);

    let m = server.get("/metrics").await;
    assert_eq!(m.status, 200);
    let ctype = m.header("content-type").unwrap();
    assert!(
        ctype.starts_with("text/plain") && ctype.contains("version=0.0.4"),
        "{ctype}"
    );
    let text = String::from_utf8(m.body).unwrap();
    for (name, kind) in [
        ("oscontent_http_requests_total", "counter"),
        ("oscontent_http_response_bytes_total", "counter"),
        ("oscontent_http_request_duration_seconds", "histogram"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
    }
    assert_eq!(server.requests("summary", "200").await, Some(1.0));
    assert_eq!(server.requests("summary", "304").await, Some(1.0));
    assert_eq!(server.requests("filez", "404").await, Some(1.0));
    assert_eq!(server.requests("other", "404").await, Some(1.0));
    assert_eq!(server.requests("health", "200").await, Some(2.0));
    let bytes = server
        .metric(
            "oscontent_http_response_bytes_total",
            &[("kind", "summary")],
        )
        .await;
    assert_eq!(bytes, Some(summary.body.len() as f64));
    let inf = server
        .metric(
            "oscontent_http_request_duration_seconds_bucket",
            &[("kind", "summary"), ("le", "+Inf")],
        )
        .await;
    assert_eq!(inf, Some(2.0));

    // The access log: one JSON line per request.
    let log = server.access_log();
    let line = |path: &str| log.iter().find(|e| e["path"] == path).unwrap().clone();
    let s = line("/summary");
    assert_eq!(
        (s["method"].as_str(), s["status"].as_u64()),
        (Some("GET"), Some(200))
    );
    assert_eq!(s["kind"], "summary");
    assert_eq!(s["bytes"].as_u64(), Some(summary.body.len() as u64));
    assert_eq!(s["version"], "HTTP/1.1");
    let a = line(&absent);
    assert_eq!(
        (
            a["status"].as_u64(),
            a["kind"].as_str(),
            a["bytes"].as_u64()
        ),
        (Some(404), Some("filez"), Some(0))
    );
    assert_eq!(line("/no/such/thing")["kind"], "other");
    for e in &log {
        assert!(e["duration_ms"].as_f64().unwrap() >= 0.0, "{e}");
        // Written when the body ended: the whole request, head included.
        assert!(
            e["total_ms"].as_f64().unwrap() >= e["duration_ms"].as_f64().unwrap(),
            "{e}"
        );
        assert!(!e["ts"].as_str().unwrap().is_empty(), "{e}");
    }
}

/// A response dropped part-way (a client that resets its stream or goes
/// away) counts, in the metric and the access log, the bytes that went out,
/// not its Content-Length; one read to the end counts all of it.
#[tokio::test]
async fn bytes_counted_are_the_bytes_sent() {
    use hyper::body::Body as _;
    use tower::ServiceExt;
    let fx = Fixture::new();
    // No object cache: the object is streamed in chunks.
    let server = Server::with_config(oscontent_server::HttpConfig {
        cache_size: 0,
        ..Default::default()
    });
    server.publish(fx.publish(&fx.v1)).await;
    let big = fx.v1.object("filez");
    let size = fx.v1.disk(&big).len() as u64;
    let get = || {
        let req = http::Request::get(big.clone())
            .header("host", "a")
            .body(axum::body::Body::empty())
            .unwrap();
        oscontent_server::app(server.state.clone()).oneshot(req)
    };
    let filez = || server.metric("oscontent_http_response_bytes_total", &[("kind", "filez")]);

    let cut = get().await.unwrap();
    assert_eq!(cut.status(), 200);
    assert_eq!(cut.headers()["content-length"], size.to_string().as_str());
    let mut body = cut.into_body();
    let first = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx))
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    let sent = first.len() as u64;
    assert!(sent > 0 && sent < size, "{sent} of {size}: not cut");
    assert_eq!(filez().await, None, "counted before the body ended");
    drop(body);
    assert_eq!(filez().await, Some(sent as f64));

    let whole = get().await.unwrap();
    let read = axum::body::to_bytes(whole.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(read.len() as u64, size);
    assert_eq!(filez().await, Some((sent + size) as f64));

    let logged: Vec<u64> = server
        .access_log()
        .iter()
        .filter(|e| e["path"] == big.as_str())
        .map(|e| e["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(logged, [sent, size]);
}

#[tokio::test]
async fn a_new_generation_is_served_from_the_next_request() {
    let (fx, server) = serving_v1().await;
    let v1 = &fx.v1;
    let v2 = &fx.release("2.0");
    let old_commit = v1.object("commit");
    let ref_path = format!("/refs/heads/{REF}");
    let before = server.get("/summary").await;
    assert_eq!(server.get(&old_commit).await.status, 200);
    assert_eq!(
        server.get(&ref_path).await.body,
        format!("{}\n", v1.commit).into_bytes()
    );
    let old_etag = before.header("etag").unwrap().to_owned();

    server.publish(fx.publish(v2)).await;

    // Only in the old generation: now answered from the new one.
    let gone = server.get(&old_commit).await;
    assert_eq!((gone.status, gone.body.len()), (StatusCode::NOT_FOUND, 0));
    let new_commit = v2.object("commit");
    let r = server.get(&new_commit).await;
    assert_eq!(r.status, 200);
    assert!(r.body == v2.disk(&new_commit));
    // Refs and the summary moved to v2.
    assert_eq!(
        server.get(&ref_path).await.body,
        format!("{}\n", v2.commit).into_bytes()
    );
    let after = server.get("/summary").await;
    assert_ne!(after.body, before.body);
    let s = oscontent_format::parse_summary(&after.body).unwrap();
    assert_eq!(s.refs[0].commit.to_hex(), v2.commit);
    assert_eq!(s.refs[0].version.as_deref(), Some("2.0"));
    // A client revalidating the old summary gets the new one.
    let r = server
        .get_with("/summary", &[("If-None-Match", &old_etag)])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, after.body);
    assert_eq!(server.metric("oscontent_generation", &[]).await, Some(2.0));
}
