//! The S4 finding: many addresses holding keep-alive connections, one
//! cheap request each now and then, filled the total connection cap, and
//! every other client got 503 (the probe reserve) while `/healthz` said
//! 200. Now a network (/24) has a cap of its own, the connection idle the
//! longest is closed to make room for a new client, as nginx does, and
//! when there is none to close (every connection mid-request) `/readyz`
//! fails once that has lasted `--unready-after-refusing`, and passes again
//! when there is room.

use crate::support::*;
use oscontent_testkit::http::raw_exchange;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const MAX: usize = 512;
const PER_IP: usize = 16;
const PER_NET: usize = 128;
/// Addresses of each abusing /24, each opening [`PER_IP`] connections:
/// 160 a network, past its cap.
const ADDRESSES: usize = 10;
/// The abusing /24s: 127.0.1.0/24 to 127.0.6.0/24; four fill the total.
const NETS: usize = 6;
/// Header-read (the keep-alive wait) and idle timeout: past the test.
const KEEPALIVE: u64 = 60;

fn status(raw: &[u8]) -> String {
    String::from_utf8_lossy(&raw[..raw.len().min(12)]).into_owned()
}

/// The `a`th address of the `n`th abusing /24 (127.0.{n+1}.{a+1}).
fn net_ip(n: usize, a: usize) -> IpAddr {
    abuser_ip(n * 256 + a)
}

/// A keep-alive connection from `from` that asked for `/healthz` and read
/// its answer; `None` if the server refused it or it landed in the probe
/// reserve (answered, then closed).
fn keepalive(from: IpAddr, server: SocketAddr) -> Option<TcpStream> {
    let mut s = connect_from(from, server).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    // Bounded: one short answer.
    for _ in 0..16 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if got.ends_with(b"\r\n\r\nok\n") {
            let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
            return (!text.contains("connection: close")).then_some(s);
        }
    }
    None
}

/// A GET of `path` on a new keep-alive connection from `from`, its answer
/// read whole by its length: the status, the time it took, and the
/// connection, kept open.
fn get_keeping(from: IpAddr, server: SocketAddr, path: &str) -> (String, Duration, TcpStream) {
    let t = Instant::now();
    let mut s = connect_from(from, server).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    // Bounded: the biggest answer is a few MiB.
    for _ in 0..10_000 {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                break;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (status(&got), t.elapsed(), s)
}

#[test]
fn a_keepalive_fill_from_many_addresses_leaves_room_for_other_clients() {
    let _one = one_at_a_time();
    raise_nofile();
    let mut lab = Lab::start(&[
        &format!("--max-connections={MAX}"),
        &format!("--max-connections-per-ip={PER_IP}"),
        &format!("--max-connections-per-net={PER_NET}"),
        &format!("--header-read-timeout={KEEPALIVE}"),
        &format!("--idle-timeout={KEEPALIVE}"),
    ]);
    let addr = lab.server.addr;
    let rss = RssSampler::start(&lab);
    let t0 = Instant::now();
    let fill = |n: usize| -> Vec<TcpStream> {
        let mut held = Vec::new();
        for a in 0..ADDRESSES {
            for _ in 0..PER_IP {
                held.extend(keepalive(net_ip(n, a), addr));
            }
        }
        held
    };
    // One /24 past its cap, the total not full: it keeps its cap, and a
    // new address of it gets only the probe reserve.
    let mut held = fill(0);
    let first_net = held.len();
    let (same_net, _, _) = get_keeping(net_ip(0, 200), addr, "/summary");
    println!(
        "keep-alive fill: one /24, {} tries: {first_net} kept (its cap {PER_NET}); a new address of it: {same_net}",
        ADDRESSES * PER_IP
    );
    assert_eq!(first_net, PER_NET, "a /24's connections");
    assert_eq!(same_net, "HTTP/1.1 503", "a new client of a full /24");
    // The others fill the total, and the last ones take the places of
    // the connections idle the longest.
    for n in 1..NETS {
        held.extend(fill(n));
    }
    let per_net = lab.metric(
        "oscontent_http_connections_reserved_total",
        &[("reason", "per_net")],
    ) + lab.metric(
        "oscontent_http_connections_refused_total",
        &[("reason", "per_net")],
    );
    let open = lab.metric("oscontent_http_connections_open", &[("kind", "normal")]);
    // Each scrape takes a place (closing an idle one for it) and gives it
    // back: a keep-alive connection from another /24 fills it again.
    held.extend(keepalive(net_ip(NETS, 0), addr));
    let before = lab.metric("oscontent_http_connections_idle_closed_total", &[]);
    held.extend(keepalive(net_ip(NETS, 0), addr));
    println!(
        "keep-alive fill: {} tries from {NETS} /24s x {ADDRESSES} addresses in {:.1} s: {open} connections open (cap {MAX}), {per_net} turned away for their /24's cap, {before} idle ones closed for newer",
        NETS * ADDRESSES * PER_IP,
        t0.elapsed().as_secs_f64()
    );
    // The gauge counts connections still open: the scrape's own, and the
    // one closed to make room for it if it has not finished closing. One
    // fewer when this scrape arrived before the server saw the previous
    // scrape's close: it closed an idle connection for a place, and the
    // previous scrape's place went free just after.
    assert!(
        (MAX as f64 - 1.0..=MAX as f64 + 2.0).contains(&open),
        "the cap is full: {open} open"
    );
    assert!(
        per_net >= (NETS - 1) as f64,
        "/24s past their cap: {per_net}"
    );

    // Clients of another /24 (127.0.0.1), each on a new connection that it
    // keeps: each served in the place of the connection idle the longest.
    let paths = [
        "/summary",
        "/config",
        &lab.big_object,
        "/readyz",
        "/healthz",
    ]
    .repeat(2);
    let mut waits = Vec::new();
    let mut statuses = std::collections::BTreeMap::new();
    let mut mine = Vec::new();
    for path in &paths {
        let (status, wait, s) = get_keeping(IpAddr::from([127, 0, 0, 1]), addr, path);
        waits.push(wait);
        *statuses.entry(status).or_insert(0) += 1;
        mine.push(s);
    }
    let made_room = lab.metric("oscontent_http_connections_idle_closed_total", &[]) - before;
    let first = waits[0];
    waits.sort();
    println!(
        "keep-alive fill: {} requests from another /24 on new connections, kept: {statuses:?}; the first waited {:.1} ms, p50 {:.1} ms, max {:.1} ms; {made_room} idle connections closed for them",
        paths.len(),
        first.as_secs_f64() * 1e3,
        waits[waits.len() / 2].as_secs_f64() * 1e3,
        waits[waits.len() - 1].as_secs_f64() * 1e3
    );
    assert_eq!(
        statuses.get("HTTP/1.1 200"),
        Some(&paths.len()),
        "{statuses:?}"
    );
    // And one more for the scrape that counted them.
    assert!(
        made_room >= paths.len() as f64,
        "{made_room} closed to make room"
    );
    drop((held, mine));
    rss.finish("keep-alive fill");
    lab.assert_recovered("keep-alive fill");
}

/// Connections that each hold half a request head cannot be closed for
/// room: the cap stays full, new clients get the probe reserve, and once
/// that has lasted `--unready-after-refusing`, `/readyz` fails (the
/// Service then routes elsewhere) while `/healthz` passes; when the
/// abusers' heads time out there is room, and `/readyz` passes again.
#[test]
fn readyz_fails_while_the_full_cap_refuses_clients_and_recovers() {
    let _one = one_at_a_time();
    raise_nofile();
    const UNREADY_AFTER: u64 = 2;
    const HEAD_TIMEOUT: u64 = 10;
    let mut lab = Lab::start(&[
        "--max-connections=200",
        "--max-connections-per-ip=50",
        &format!("--unready-after-refusing={UNREADY_AFTER}"),
        &format!("--header-read-timeout={HEAD_TIMEOUT}"),
        &format!("--idle-timeout={HEAD_TIMEOUT}"),
    ]);
    let addr = lab.server.addr;
    let get = |path: &str| {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        raw_exchange(addr, req.as_bytes(), Duration::from_secs(5))
            .map(|raw| status(&raw))
            .unwrap_or_else(|e| format!("{e}"))
    };
    assert_eq!(get("/readyz"), "HTTP/1.1 200");
    let t0 = Instant::now();
    let mut abusers: Vec<TcpStream> = (0..200)
        .map(|i| {
            let mut s = connect_from(abuser_ip(i / 50), addr).unwrap();
            s.write_all(b"GET /summary HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // Until the server has read every half head, a connection it has not
    // read from yet looks idle and may be closed for room.
    std::thread::sleep(Duration::from_secs(1));
    let open = lab.metric("oscontent_http_connections_open", &[("kind", "normal")]);
    assert!((200.0..=201.0).contains(&open), "{open} open");
    // Normal clients keep trying, as the Service would send them, until
    // /readyz fails; bounded by the abusers' own timeout.
    let mut trace = Vec::new();
    let unready_at = loop {
        let (summary, ready) = (get("/summary"), get("/readyz"));
        trace.push(format!(
            "{:.1}s {} {}",
            t0.elapsed().as_secs_f64(),
            &summary[9..],
            &ready[9..]
        ));
        if ready == "HTTP/1.1 503" {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(HEAD_TIMEOUT - 1) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let healthz = get("/healthz");
    let refusing = lab.metric("oscontent_http_refusing", &[]);
    println!(
        "refusing: cap full of half-sent heads; /summary and /readyz every 200 ms: {}; /readyz failed after {unready_at:?} (threshold {UNREADY_AFTER} s), /healthz then {healthz:?}, oscontent_http_refusing {refusing}",
        trace.join(", ")
    );
    let unready_at = unready_at.expect("/readyz never failed while the cap refused clients");
    assert!(
        unready_at >= Duration::from_secs(UNREADY_AFTER),
        "{unready_at:?}"
    );
    assert_eq!(healthz, "HTTP/1.1 200");
    assert_eq!(refusing, 1.0);
    // The abusers' heads time out: room, and ready again.
    let (t, left) = wait_all_closed(
        &mut abusers,
        t0,
        Duration::from_secs(HEAD_TIMEOUT) + SLACK + SLACK,
    );
    assert_eq!(left, 0, "abusers kept past their timeout");
    let ready_again = oscontent_testkit::wait_for(SLACK, Duration::from_millis(100), || {
        (get("/readyz") == "HTTP/1.1 200").then(Instant::now)
    });
    println!(
        "refusing: abusers closed {:.1} s after the first connected; /readyz 200 again: {}",
        t.as_secs_f64(),
        ready_again.is_some()
    );
    assert!(ready_again.is_some(), "/readyz still failing with room");
    assert_eq!(get("/summary"), "HTTP/1.1 200");
    assert_eq!(lab.metric("oscontent_http_refusing", &[]), 0.0);
    lab.assert_recovered("refusing");
}
