//! SIGTERM: requests in flight finish, then the process exits 0; idle
//! connections do not hold it up; `--shutdown-timeout` bounds a stalled one.

use oscontent_testkit::*;
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A connection that makes the server's writes block early: a tiny MSS and
/// receive buffer, so a large response cannot sit in kernel buffers whole.
fn narrow_connection(addr: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.set_tcp_mss(536).unwrap();
    s.connect_timeout(&addr.into(), Duration::from_secs(10))
        .unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends a GET and reads the response head; returns Content-Length and any
/// body bytes that came with the head.
fn start_get(s: &mut TcpStream, addr: SocketAddr, path: &str) -> (usize, Vec<u8>) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let end = loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed before the response head");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        assert!(buf.len() < 64 * 1024, "response head too large");
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .expect("Content-Length");
    (len, buf[end..].to_vec())
}

#[test]
fn sigterm_finishes_in_flight_requests_and_exits_zero() {
    let v1 = v1();
    let (big, size) = largest_filez(&v1.repo).unwrap();
    let disk = std::fs::read(object_path(&v1.repo, &big, "filez")).unwrap();
    assert!(
        size > 1 << 20,
        "need an object over 1 MiB, largest is {size}"
    );
    let mut server = Server::release(v1);
    let mut conn = narrow_connection(server.addr);
    let path = object_url_path(&big, "filez");
    let (len, mut body) = start_get(&mut conn, server.addr, &path);
    assert_eq!(len as u64, size);

    std::thread::sleep(Duration::from_millis(200));
    server.sigterm().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        server.is_running(),
        "the server exited with a response in flight.\nstderr:\n{}",
        server.stderr()
    );

    // While draining, nothing new is served as ready.
    if let Ok(r) = raw_request(server.addr, "GET", "/readyz", &[]) {
        assert_ne!(
            r.status, 200,
            "/readyz must not report ready while shutting down"
        );
    }

    // The in-flight response completes, byte for byte.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut chunk = vec![0u8; 64 * 1024];
    while body.len() < len {
        assert!(
            Instant::now() < deadline,
            "body not complete within 60 s ({} of {len})",
            body.len()
        );
        let n = conn.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "connection closed after {} of {len} bytes.\nstderr:\n{}",
            body.len(),
            server.stderr()
        );
        body.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(body.len(), len);
    assert!(body == disk, "the in-flight object arrived intact");

    let status = server.wait_exit(Duration::from_secs(30)).unwrap();
    let status = status.unwrap_or_else(|| {
        panic!(
            "no exit within 30 s of finishing.\nstderr:\n{}",
            server.stderr()
        )
    });
    assert!(
        status.success(),
        "graceful shutdown exits 0, got {status}.\nstderr:\n{}",
        server.stderr()
    );
    let log = server.access_log().unwrap();
    assert!(
        log.iter().any(|e| e.path == path && e.status == 200),
        "the request was logged"
    );
    // Nothing is accepted any more.
    assert!(
        TcpStream::connect_timeout(&server.addr, Duration::from_secs(2)).is_err(),
        "still listening after exit"
    );
}

#[test]
fn idle_keepalive_connections_do_not_delay_shutdown() {
    let mut server = Server::release(v1());
    // Two idle keep-alive connections, one HTTP/1.1 and one HTTP/2.
    let h1 = http1();
    let h2 = http2();
    assert_eq!(
        fetch(&h1, &server.url_for("/summary"), &[]).unwrap().status,
        200
    );
    assert_eq!(
        fetch(&h2, &server.url_for("/summary"), &[]).unwrap().status,
        200
    );
    let start = Instant::now();
    let status = server.stop(Duration::from_secs(20)).unwrap();
    assert!(
        status.success(),
        "exit {status}.\nstderr:\n{}",
        server.stderr()
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "idle connections held shutdown for {:?}",
        start.elapsed()
    );
}

#[test]
fn shutdown_timeout_bounds_a_stalled_client() {
    let v1 = v1();
    let (big, _) = largest_filez(&v1.repo).unwrap();
    let mut server = Server::oscontainer(&v1.oscontainer)
        .args(["--shutdown-timeout", "2"])
        .start()
        .unwrap();
    let mut conn = narrow_connection(server.addr);
    let (len, _) = start_get(&mut conn, server.addr, &object_url_path(&big, "filez"));
    assert!(len > 1 << 20);
    // The client never reads again.
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    server.sigterm().unwrap();
    let status = server.wait_exit(Duration::from_secs(20)).unwrap();
    let elapsed = start.elapsed();
    let status = status.unwrap_or_else(|| {
        panic!("a stalled client kept the server alive past --shutdown-timeout")
    });
    assert!(
        status.code().is_some(),
        "exited by itself, not by a signal: {status}"
    );
    assert!(
        elapsed >= Duration::from_millis(1500),
        "waited for the in-flight request before giving up ({elapsed:?})"
    );
    assert!(
        elapsed < Duration::from_secs(12),
        "--shutdown-timeout 2 took {elapsed:?}"
    );
    drop(conn);
}
