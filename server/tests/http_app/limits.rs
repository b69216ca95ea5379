//! The listener's caps and timeouts, and the metadata size caps, in
//! process: `oscontent_server::serve::socket::run` on a loopback port with tiny limits,
//! raw sockets against it.

use crate::support::*;
use oscontent_server::listen::limits::Limits;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until EOF or reset, at most `within`; what was read and whether
/// the server closed the connection.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// One request on `s`, and the start of its answer.
async fn ask(s: &mut TcpStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// A metric once it reads `want`, or its value after two seconds: the
/// server counts a closed connection just after closing it.
async fn eventually(server: &Server, (name, labels): (&str, &[(&str, &str)]), want: f64) -> f64 {
    let mut v = f64::NAN;
    for _ in 0..40 {
        v = server.metric(name, labels).await.unwrap_or(0.0);
        if v == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    v
}

async fn listen(server: &Server, limits: Limits) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = server.state.clone();
    // Two workers, as on a 2-core node: the caps hold across them.
    let workers = std::num::NonZeroUsize::new(2).unwrap();
    tokio::spawn(oscontent_server::serve::socket::run(
        listener,
        workers,
        state,
        limits,
        std::future::pending(),
    ));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_only_probes_are_answered_then_connections_are_refused() {
    let (_fx, server) = serving_v1().await;
    let addr = listen(
        &server,
        Limits {
            max_connections: 2,
            max_per_ip: 2,
            probe_reserve: 1,
            probe_reserve_per_ip: 1,
            first_byte_timeout: Duration::from_secs(3),
            ..Limits::default()
        },
    )
    .await;
    let t0 = Instant::now();
    // Two silent connections fill the cap.
    let mut silent = [
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The third lands in the probe reserve: content is refused there...
    let mut reserve = TcpStream::connect(addr).await.unwrap();
    let a = ask(&mut reserve, "/summary").await;
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    assert!(a.to_ascii_lowercase().contains("connection: close"), "{a}");
    // (and closed, which frees its place).
    let (_, closed) = read_until_closed(&mut reserve, Duration::from_millis(500)).await;
    assert!(closed, "the server kept a refused reserve connection");
    drop(reserve);
    let open = (
        "oscontent_http_connections_open",
        &[("kind", "probe_reserve")][..],
    );
    assert_eq!(eventually(&server, open, 0.0).await, 0.0);
    // ...and the probes are answered.
    let mut reserve = TcpStream::connect(addr).await.unwrap();
    let a = ask(&mut reserve, "/healthz").await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    // That one served its one request and is gone; a silent one holds the
    // reserve (for a second at most)...
    let (_, closed) = read_until_closed(&mut reserve, Duration::from_millis(500)).await;
    assert!(closed, "a reserve connection served a second request");
    assert_eq!(eventually(&server, open, 0.0).await, 0.0);
    let mut hold = TcpStream::connect(addr).await.unwrap();
    assert_eq!(eventually(&server, open, 1.0).await, 1.0);
    // ...and with the reserve held, the next connection is refused at once.
    // (The reset can come back before connect() has even returned.)
    let closed = match TcpStream::connect(addr).await {
        Ok(mut over) => {
            read_until_closed(&mut over, Duration::from_millis(500))
                .await
                .1
        }
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "a connection over cap and reserve was kept");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // The reserve's silent holder goes after a second.
    let t1 = Instant::now();
    let (_, closed) = read_until_closed(&mut hold, Duration::from_secs(3)).await;
    assert!(closed, "a silent reserve connection was kept");
    assert!(
        t1.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t1.elapsed()
    );

    // The silent ones are closed at the first-byte timeout.
    for s in &mut silent {
        let (_, closed) = read_until_closed(s, Duration::from_secs(5)).await;
        assert!(closed, "a silent connection was kept");
    }
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_secs(3), "closed early: {waited:?}");

    let refused = (
        "oscontent_http_connections_refused_total",
        &[("reason", "total")][..],
    );
    assert_eq!(eventually(&server, refused, 1.0).await, 1.0);
    let expired = (
        "oscontent_http_connections_expired_total",
        &[("reason", "first_byte")][..],
    );
    // The two silent ones, and the reserve's holder.
    assert_eq!(eventually(&server, expired, 3.0).await, 3.0);
    // The cap is free again: a normal connection gets content.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let a = ask(&mut s, "/config").await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_head_is_cut_off_and_an_idle_connection_closed() {
    let (_fx, server) = serving_v1().await;
    let addr = listen(
        &server,
        Limits {
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(2),
            ..Limits::default()
        },
    )
    .await;
    // Slowloris: a header line every 200 ms, never the end of the head.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /summary HTTP/1.1\r\n").await.unwrap();
    let t0 = Instant::now();
    let mut cut = false;
    for _ in 0..25 {
        if slow
            .write_all(b"X-Slow: aaaaaaaaaaaaaaaaaaaa\r\n")
            .await
            .is_err()
        {
            cut = true;
            break;
        }
        let (_, closed) = read_until_closed(&mut slow, Duration::from_millis(200)).await;
        if closed {
            cut = true;
            break;
        }
    }
    assert!(cut, "slowloris kept for {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[tokio::test]
async fn metadata_over_its_cap_is_refused_with_a_clear_error() {
    let (_fx, server) = serving_v1().await;
    // A planted 5 KiB ref where the served refs live (refs are capped at
    // 4 KiB).
    let heads = server.overlay().join("refs/heads");
    std::fs::write(heads.join("huge"), vec![b'a'; 5 * 1024]).unwrap();
    let r = server.get("/refs/heads/huge").await;
    assert_eq!(r.status, 500);
    assert!(r.body.is_empty());
    let n = server
        .metric("oscontent_oversized_metadata_total", &[("kind", "ref")])
        .await;
    assert_eq!(n, Some(1.0));
    // The other refs are still served.
    assert_eq!(server.get(&format!("/refs/heads/{REF}")).await.status, 200);
}

/// Past `--max-streamed-files`, a body is streamed all the same, opening
/// its file for each read: nobody waits or is refused, and the bytes are
/// the file's, whether the body held its file or not.
#[tokio::test]
async fn past_the_streamed_file_budget_bodies_reopen_their_file() {
    use tower::ServiceExt;
    let fx = Fixture::new();
    // No object cache: everything over a chunk is streamed. One file held
    // open at most (an eighth of 1 is 1, for the one client here).
    let server = Server::with_config(oscontent_server::HttpConfig {
        cache_size: 0,
        max_streamed_files: 1,
        ..Default::default()
    });
    server.publish(fx.publish(&fx.v1)).await;
    let big = fx.v1.object("filez");
    let part = fx
        .v1
        .files("deltas")
        .into_iter()
        .find(|f| f.ends_with("/0"))
        .map(|f| format!("/{f}"))
        .expect("a delta part");
    let get = |path: String| {
        let req = http::Request::get(path)
            .header("host", "a")
            .body(axum::body::Body::empty())
            .unwrap();
        oscontent_server::app(server.state.clone()).oneshot(req)
    };
    let reopened = || server.metric("oscontent_http_streams_reopened_total", &[]);
    // The first holds the one place while it is not read.
    let held = get(big.clone()).await.unwrap();
    assert_eq!(held.status(), 200);
    assert_eq!(
        server.metric("oscontent_http_streamed_files", &[]).await,
        Some(1.0)
    );
    for path in [&big, &part] {
        let before = reopened().await.unwrap_or(0.0);
        let r = get(path.clone()).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let body = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(body.len(), fx.v1.disk(path).len(), "{path}");
        assert!(
            body[..] == fx.v1.disk(path)[..],
            "{path}: not the file's bytes"
        );
        assert_eq!(reopened().await, Some(before + 1.0), "{path}");
    }
    let body = axum::body::to_bytes(held.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(body[..] == fx.v1.disk(&big)[..]);
    assert_eq!(
        server.metric("oscontent_http_streamed_files", &[]).await,
        Some(0.0)
    );
}
