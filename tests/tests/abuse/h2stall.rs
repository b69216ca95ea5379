//! HTTP/2 clients that open their streams with a zero flow-control window,
//! so that not one DATA byte can be sent, and never open it: each stream
//! for a file too big for the object cache would hold a descriptor and a
//! chunk for as long as the connection lives. The budget of files held
//! open bounds the first (past it, bodies open their file for each read,
//! and nobody waits or is refused); the idle timeout, counted on requests
//! and response payload only, bounds the second, however busy the client
//! keeps the connection with frames of its own.

use crate::support::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const STREAMED: &str = "oscontent_http_streamed_files";
const REOPENED: &str = "oscontent_http_streams_reopened_total";

/// One connection of the h2 crate with a zero initial window, `streams`
/// requests for `path`, and the status each got (or `None`: no answer).
async fn zero_window_client(
    from: IpAddr,
    server: SocketAddr,
    path: String,
    streams: usize,
) -> (Vec<Option<u16>>, Vec<h2::RecvStream>) {
    let io = connect_from_async(from, server).await;
    let client = h2_client(h2::client::Builder::new().initial_window_size(0), io).await;
    let pending = send_gets(client, server, &path, streams).await;
    let mut statuses = Vec::new();
    let mut bodies = Vec::new();
    for resp in pending {
        match tokio::time::timeout(Duration::from_secs(20), resp).await {
            Ok(Ok(r)) => {
                statuses.push(Some(r.status().as_u16()));
                bodies.push(r.into_body());
            }
            _ => statuses.push(None),
        }
    }
    (statuses, bodies)
}

#[test]
fn zero_window_streams_hold_no_more_files_than_the_budget() {
    let _one = one_at_a_time();
    const FILES: usize = 32;
    // An address's share is an eighth: 4 files. Six abusers hold 24, and
    // the normal traffic keeps a share of its own.
    const ABUSERS: usize = 6;
    const CONNS: usize = 4;
    // Long enough to look at the connections before they expire.
    let mut lab = Lab::start(&[
        &format!("--max-streamed-files={FILES}"),
        "--idle-timeout=30",
    ]);
    let rss = RssSampler::start(&lab);
    let fds_before = lab.open_fds();
    let normal = lab.normal_traffic();
    let rt = runtime();
    let addr = lab.server.addr;
    let t0 = Instant::now();
    let clients = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..ABUSERS * CONNS {
            let path = lab.big_object.clone();
            tasks.push(tokio::spawn(zero_window_client(
                abuser_ip(i / CONNS),
                addr,
                path,
                16,
            )));
        }
        let mut v = Vec::new();
        for t in tasks {
            v.push(t.await.unwrap());
        }
        v
    });
    let fds_held = lab.open_fds();
    let streamed = lab.metric(STREAMED, &[]);
    let reopened = lab.metric(REOPENED, &[]);
    let count = |s: Option<u16>| {
        clients
            .iter()
            .flat_map(|c| &c.0)
            .filter(|x| **x == s)
            .count()
    };
    let ok = count(Some(200));
    let conns = ABUSERS * CONNS;
    println!(
        "h2 zero window: {conns} connections x 16 streams of a {} byte object from {ABUSERS} addresses, answered in {:.1} s: {ok} x 200; {streamed} files held open (budget {FILES}), {reopened} bodies opening theirs at each read; fds {fds_before} before, {fds_held} held",
        lab.big_len,
        t0.elapsed().as_secs_f64()
    );
    // Nobody waits or is refused for want of a place.
    assert_eq!(ok, conns * 16, "every stream answered 200");
    // The normal traffic asks for the same object, one request at a time
    // from an address of its own, so its body may hold one more place
    // while the gauge is read.
    let shares = (ABUSERS * FILES / 8) as f64;
    assert!(
        (shares..=shares + 1.0).contains(&streamed),
        "each address holds its share: {streamed} places held, the abusers' shares are {shares}"
    );
    // Every abuser's stream either holds a place of its address's share or
    // opens its file at each read.
    assert_eq!(shares + reopened, ok as f64);
    // Without the budget every stream held its file: 17 fds a connection.
    assert!(
        fds_held <= fds_before + conns + FILES + 8,
        "{fds_held} fds held by {conns} connections (budget {FILES} files)"
    );
    drop(clients);
    rt.shutdown_timeout(Duration::from_secs(1));
    normal.finish().check("h2 zero window");
    rss.finish("h2 zero window");
    lab.assert_recovered("h2 zero window");
    assert_eq!(lab.metric(STREAMED, &[]), 0.0, "places released");
}

/// SETTINGS with two parameters: 21 bytes on the wire, which a watchdog
/// counting reads of 18 bytes or more took for a live client.
fn settings_pair() -> Vec<u8> {
    // HEADER_TABLE_SIZE 4096, INITIAL_WINDOW_SIZE 0.
    let p = [0, 1, 0, 0, 0x10, 0, 0, 4, 0, 0, 0, 0];
    frame(4, 0, 0, &p)
}

/// The attacker of the F3 finding: a zero window, 16 requests it will never
/// let a byte of be sent, PINGs answered, and a 21-byte SETTINGS every
/// second. Returns when the server closed it (with how long after its
/// last response head), or at `limit`.
fn busy_non_reader(
    from: IpAddr,
    server: SocketAddr,
    path: &str,
    limit: Duration,
) -> Option<Duration> {
    let mut s: TcpStream = connect_from(from, server).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(settings_pair());
    for i in 0..16u32 {
        hello.extend(get(1 + 2 * i, &server.to_string(), path));
    }
    s.write_all(&hello).unwrap();
    let start = Instant::now();
    let mut last_head = start;
    let mut last_settings = start;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut chunk) {
            Ok(0) => return Some(last_head.elapsed()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(last_head.elapsed()),
        }
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            let payload = buf[9..9 + len].to_vec();
            buf.drain(..9 + len);
            let reply = match (kind, flags & 1) {
                (1, _) => {
                    last_head = Instant::now();
                    None
                }
                (4, 0) => Some(frame(4, 1, 0, &[])),
                (6, 0) => Some(frame(6, 1, 0, &payload)),
                (7, _) => return Some(last_head.elapsed()), // GOAWAY
                _ => None,
            };
            if let Some(r) = reply {
                if s.write_all(&r).is_err() {
                    return Some(last_head.elapsed());
                }
            }
        }
        if last_settings.elapsed() >= Duration::from_secs(1) {
            last_settings = Instant::now();
            if s.write_all(&settings_pair()).is_err() {
                return Some(last_head.elapsed());
            }
        }
    }
    None
}

#[test]
fn a_client_that_only_sends_frames_of_its_own_is_idle() {
    let _one = one_at_a_time();
    let mut lab = Lab::start(&[]);
    let idle_before = lab.metric(
        "oscontent_http_connections_expired_total",
        &[("reason", "idle")],
    );
    const CLIENTS: usize = 10;
    // Well past the idle timeout: before the fix these lived on for good.
    let limit = Duration::from_secs(IDLE * 4) + SLACK;
    let addr = lab.server.addr;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let path = lab.big_object.clone();
            std::thread::spawn(move || busy_non_reader(abuser_ip(i), addr, &path, limit))
        })
        .collect();
    let closed: Vec<Option<Duration>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // A client sees its socket close a moment before the server's task
    // counts the expiry: the count is read once it has settled, or after
    // SLACK, whichever comes first.
    let expired = || {
        lab.metric(
            "oscontent_http_connections_expired_total",
            &[("reason", "idle")],
        ) - idle_before
    };
    let idle = oscontent_testkit::wait_for(SLACK, Duration::from_millis(50), || {
        let n = expired();
        (n >= CLIENTS as f64).then_some(n)
    })
    .unwrap_or_else(expired);
    let after: Vec<String> = closed
        .iter()
        .map(|c| c.map_or("open".to_owned(), |d| format!("{:.1}", d.as_secs_f64())))
        .collect();
    println!(
        "h2 busy non-reader: {CLIENTS} clients sending SETTINGS every second; closed this long (s) after their last response head: {}; {idle} expired as idle (idle timeout {IDLE} s)",
        after.join(" ")
    );
    for (i, c) in closed.iter().enumerate() {
        let c = c.unwrap_or_else(|| panic!("client {i} still open after {limit:?}"));
        assert!(
            c <= Duration::from_secs(IDLE) + SLACK,
            "client {i} closed only {c:?} after its last answer"
        );
    }
    assert_eq!(idle, CLIENTS as f64, "each closed as idle");
    lab.assert_recovered("h2 busy non-reader");
}
