//! The server's HTTP surface under abuse, against the real binary: half-open
//! connections, slowloris, an HTTP/2 reader that stops reading, 10,000 idle
//! keep-alive connections, and random and oversized requests. During each,
//! normal requests from another client keep a p99 under
//! [`support::P99_BOUND`], the server's RSS stays under the deployment's
//! memory limit, the abusers' sockets are closed by the server within the
//! configured timeouts (short ones, set by flags), and the server is back
//! to normal when they stop. Every figure is printed (`--nocapture`).
//!
//! Abusers connect from 127.0.1.0/24 and up (all loopback), so the
//! per-client cap sees many clients, as it would in a cluster; the normal
//! traffic comes from 127.0.0.1. They share a few /24s, as a cluster's
//! nodes do, so the suite lifts the cap per /24 except where it is the
//! point (`capfull.rs`).
//!
//! Build the binaries first: `cargo build --workspace --bins`.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod capfull;
mod garbage;
mod h2slow;
mod h2stall;
mod memory;
mod starved;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::*;

const REFUSED: &str = "oscontent_http_connections_refused_total";
const EXPIRED: &str = "oscontent_http_connections_expired_total";
/// Header-read and idle timeout of the 10,000 keep-alive connections: the
/// first must outlive the making of the last, which took 37 s, and once
/// 45.8 s, against the debug server on a loaded 2-core machine (CI, beside
/// two other suites and the fuzz build; 15 s and 45 s were too short). The
/// test waits it out once more, on a lane of its own.
const KEEPALIVE_IDLE: u64 = 90;
/// Header-read and idle timeout while the cap is full.
const CAP_FULL_TIMEOUT: u64 = 8;

#[test]
fn half_open_connections_are_dropped_and_capped_per_client() {
    let _one = one_at_a_time();
    raise_nofile();
    let mut lab = Lab::start(&[]);
    let addr = lab.server.addr;
    let rss = RssSampler::start(&lab);
    let normal = lab.normal_traffic();
    let t0 = Instant::now();
    // 2,000 connections from 40 clients (50 each, under the per-client
    // cap): half say nothing, half send part of a request head and stop.
    let (mut silent, mut half_sent) = (Vec::new(), Vec::new());
    for i in 0..2000 {
        let mut s = connect_from(abuser_ip(i / 50), addr).unwrap();
        if i % 2 == 0 {
            silent.push(s);
        } else {
            s.write_all(b"GET /summary HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            half_sent.push(s);
        }
    }
    let opened = t0.elapsed();
    println!(
        "half-open: 2000 connections opened in {:.1} s, server holds {} fds",
        opened.as_secs_f64(),
        lab.open_fds()
    );

    // One more client opens 100: its share keeps 64, the probe reserve two
    // more (probes only, gone within a second), and the rest are refused at
    // once.
    let refused_before = lab.metric(REFUSED, &[("reason", "per_ip")]);
    // A reset can come back before connect() has even returned.
    let (mut greedy, mut reset_at_connect) = (Vec::new(), 0);
    for _ in 0..100 {
        match connect_from(abuser_ip(200), addr) {
            Ok(s) => greedy.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => reset_at_connect += 1,
            Err(e) => panic!("connecting: {e}"),
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let refused = lab.metric(REFUSED, &[("reason", "per_ip")]) - refused_before;
    for s in &greedy {
        s.set_nonblocking(true).unwrap();
    }
    let greedy_closed =
        reset_at_connect + greedy.iter_mut().map(closed_by_peer).filter(|&c| c).count();
    println!(
        "half-open: one client opened 100, {greedy_closed} refused at once ({refused} counted)"
    );
    assert_eq!((greedy_closed, refused), (34, 34.0));

    let first = Duration::from_secs(FIRST_BYTE);
    let (t, left) = wait_all_closed(&mut silent, t0, opened + first + SLACK);
    println!(
        "half-open: silent connections all closed {:.1} s after the first opened (first-byte timeout {FIRST_BYTE} s), {left} left",
        t.as_secs_f64()
    );
    assert_eq!(left, 0, "silent connections the server kept");
    let header = Duration::from_secs(HEADER_READ);
    let (t, left) = wait_all_closed(&mut half_sent, t0, opened + header + SLACK);
    println!(
        "half-open: half-sent requests all closed {:.1} s after the first opened (header-read timeout {HEADER_READ} s), {left} left",
        t.as_secs_f64()
    );
    assert_eq!(left, 0, "half-sent connections the server kept");
    drop(greedy);
    println!(
        "half-open: expired first_byte {}, idle {}",
        lab.metric(EXPIRED, &[("reason", "first_byte")]),
        lab.metric(EXPIRED, &[("reason", "idle")])
    );

    normal.finish().check("half-open");
    rss.finish("half-open");
    lab.assert_recovered("half-open");
}

#[test]
fn slowloris_is_cut_off_by_the_header_read_timeout() {
    let _one = one_at_a_time();
    raise_nofile();
    let mut lab = Lab::start(&[]);
    let addr = lab.server.addr;
    let rss = RssSampler::start(&lab);
    let normal = lab.normal_traffic();
    let header_read_before = lab.metric(EXPIRED, &[("reason", "header_read")]);
    let t0 = Instant::now();
    // 300 connections from 6 clients, each sending a request line and then
    // a header line every 250 ms: the header-read timeout (shorter than
    // the idle one) stops them.
    let mut socks: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut s = connect_from(abuser_ip(i / 50), addr).unwrap();
            s.write_all(b"GET /summary HTTP/1.1\r\n").unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let deadline = Duration::from_secs(HEADER_READ) + SLACK;
    let mut drips = 0usize;
    // Bounded: at most deadline / 250 ms rounds.
    while !socks.is_empty() && t0.elapsed() < deadline {
        socks.retain_mut(|s| {
            if closed_by_peer(s) {
                return false;
            }
            drips += 1;
            s.write_all(b"X-Slow: aaaaaaaaaaaaaaaaaaaa\r\n").is_ok()
        });
        std::thread::sleep(Duration::from_millis(250));
    }
    println!(
        "slowloris: 300 connections, {drips} header lines dripped; all closed after {:.1} s (header-read timeout {HEADER_READ} s), {} left",
        t0.elapsed().as_secs_f64(),
        socks.len()
    );
    assert!(
        socks.is_empty(),
        "{} slowloris connections kept",
        socks.len()
    );
    let header_read = lab.metric(EXPIRED, &[("reason", "header_read")]) - header_read_before;
    println!("slowloris: {header_read} counted as expired (header_read)");
    assert!(header_read >= 300.0, "{header_read} counted, of 300");
    normal.finish().check("slowloris");
    rss.finish("slowloris");
    lab.assert_recovered("slowloris");
}

#[test]
fn ten_thousand_idle_keepalive_connections() {
    let _one = one_at_a_time();
    let nofile = raise_nofile();
    assert!(
        nofile >= 13_000,
        "RLIMIT_NOFILE hard limit {nofile} < 13000 (10,000 connections, the streamed files, the headroom and the fan-out directories)"
    );
    // Timeouts long enough that the first connections are still idle when
    // the last ones are made (checked below: all 10,000 open at once), and
    // no longer, since the test waits them out; a cap that lets all in.
    let mut lab = Lab::start(&[
        "--max-connections=11000",
        "--max-connections-per-ip=100",
        &format!("--header-read-timeout={KEEPALIVE_IDLE}"),
        &format!("--idle-timeout={KEEPALIVE_IDLE}"),
    ]);
    let addr = lab.server.addr;
    let rss = RssSampler::start(&lab);
    let t0 = Instant::now();
    let mut socks = Vec::with_capacity(10_000);
    let mut buf = [0u8; 512];
    // In rounds of 1,000 (under the listen backlog, so no SYN is dropped
    // and retried a second later): connect and ask, then read the answers.
    for round in 0..10 {
        for i in round * 1000..(round + 1) * 1000 {
            let mut s = connect_from(abuser_ip(i / 100), addr).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            socks.push(s);
        }
        for s in &mut socks[round * 1000..] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        }
    }
    let made = t0.elapsed();
    let open = lab.metric("oscontent_http_connections_open", &[("kind", "normal")]);
    assert!(
        open >= 10_000.0,
        "only {open} connections open at once (making them took {:.1} s, idle timeout {KEEPALIVE_IDLE} s)",
        made.as_secs_f64()
    );
    let idle_since = Instant::now();
    println!(
        "idle keep-alive: 10000 connections made and answered in {:.1} s, {open} open at once; server holds {} fds, RSS {:.1} MiB",
        t0.elapsed().as_secs_f64(),
        lab.open_fds(),
        lab.rss() as f64 / (1 << 20) as f64
    );
    let normal = lab.normal_traffic();
    std::thread::sleep(Duration::from_secs(3));
    let figures = normal.finish();
    let timeout = Duration::from_secs(KEEPALIVE_IDLE);
    let (t, left) = wait_all_closed(&mut socks, idle_since, timeout + SLACK);
    println!(
        "idle keep-alive: all closed {:.1} s after the last went idle (timeout {KEEPALIVE_IDLE} s), {left} left",
        t.as_secs_f64()
    );
    assert_eq!(left, 0, "idle connections the server kept");
    figures.check("idle keep-alive");
    rss.finish("idle keep-alive");
    lab.assert_recovered("idle keep-alive");
}

/// The reproduction: more half-sent requests than the server takes.
/// Over the cap, probes (on fresh connections, as a kubelet makes them)
/// still get their answer from the reserve; content does not. (Abusers
/// that keep refilling the reserve faster than it expires are not
/// covered: the reserve gives probes a place, not a guarantee.)
#[test]
fn probes_are_answered_while_the_connection_cap_is_full() {
    let _one = one_at_a_time();
    raise_nofile();
    // The abusers must hold the cap while the probes run (a few seconds at
    // most), and the test waits the header-read timeout out.
    let mut lab = Lab::start(&[
        "--max-connections=1000",
        "--max-connections-per-ip=100",
        "--probe-reserve=8",
        &format!("--header-read-timeout={CAP_FULL_TIMEOUT}"),
        &format!("--idle-timeout={CAP_FULL_TIMEOUT}"),
    ]);
    let addr = lab.server.addr;
    let rss = RssSampler::start(&lab);
    let t0 = Instant::now();
    let mut abusers = Vec::new();
    for i in 0..1100 {
        match connect_from(abuser_ip(i / 100), addr) {
            Ok(mut s) => {
                // Refused ones are reset; writing to them may fail.
                let _ = s.write_all(b"GET /summary HTTP/1.1\r\nHost: x\r\n");
                abusers.push(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("connecting: {e}"),
        }
    }
    // Abusers that landed in the probe reserve are dropped within a second.
    std::thread::sleep(Duration::from_millis(1500));
    let open = lab.metric("oscontent_http_connections_open", &[("kind", "normal")]);
    let refused =
        lab.metric(REFUSED, &[("reason", "total")]) + lab.metric(REFUSED, &[("reason", "per_ip")]);
    println!(
        "cap full: 1100 half-sent requests in {:.1} s: {open} held, {refused} refused",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(open, 1000.0);

    let (mut times, mut statuses) = (Vec::new(), std::collections::BTreeMap::new());
    for i in 0..100 {
        let path = ["/healthz", "/readyz"][i % 2];
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let t = Instant::now();
        let raw =
            oscontent_testkit::http::raw_exchange(addr, req.as_bytes(), Duration::from_secs(5))
                .unwrap();
        times.push(t.elapsed());
        let status = String::from_utf8_lossy(&raw[..raw.len().min(12)]).into_owned();
        *statuses.entry(status).or_insert(0) += 1;
    }
    times.sort();
    let p99 = times[98];
    let content = oscontent_testkit::http::raw_exchange(
        addr,
        b"GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .unwrap();
    println!(
        "cap full: 100 probes on fresh connections: {statuses:?}, p99 {:.1} ms (bound {} ms); /summary: {:?}",
        p99.as_secs_f64() * 1e3,
        P99_BOUND.as_millis(),
        String::from_utf8_lossy(&content[..content.len().min(12)])
    );
    assert_eq!(statuses.get("HTTP/1.1 200"), Some(&100), "{statuses:?}");
    assert!(p99 < P99_BOUND, "probe p99 {p99:?}");
    assert!(content.starts_with(b"HTTP/1.1 503"));

    let timeout = Duration::from_secs(CAP_FULL_TIMEOUT);
    assert!(
        t0.elapsed() < timeout,
        "the probes ran past the abusers' timeout: the cap was not full throughout"
    );
    let (t, left) = wait_all_closed(&mut abusers, t0, timeout + SLACK + SLACK);
    println!(
        "cap full: abusers all closed {:.1} s after the first connected (header-read timeout {CAP_FULL_TIMEOUT} s), {left} left",
        t.as_secs_f64()
    );
    assert_eq!(left, 0);
    rss.finish("cap full");
    lab.assert_recovered("cap full");
}
