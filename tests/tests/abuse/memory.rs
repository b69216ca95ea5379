//! The S3 finding: one address, 64 HTTP/2 connections x 16 streams of a
//! 1 MiB object, never reading. Each request read the object whole into a
//! fresh buffer that the unread stream then held: the server's RSS went
//! from 39 to 1,048 MiB, past the Deployment's 512 Mi. Now an object the
//! cache does not keep is streamed, each chunk charged to its client's
//! share of `--max-body-memory` (an address a sixteenth of the default
//! 64 MiB) until the connection lets go of it, and past the share a
//! stream holds one 4 KiB chunk.
//!
//! The client opens every window as wide as HTTP/2 allows (so flow control
//! bounds nothing) and shrinks its socket's receive buffer (so the kernel
//! takes little off the server's hands); the server's RSS is read from
//! /proc while the 1,024 streams are answered and stall.

use crate::support::*;
use oscontent_testkit::ostree::Ostree;
use oscontent_testkit::server::Server;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CONNS: usize = 64;
const STREAMS: u32 = 16;
/// The object's file: random bytes, which deflate cannot shrink, so its
/// `.filez` is just under the cache's 1 MiB largest entry (what main read
/// whole per request).
const BLOB: usize = 1_000_000;
/// What the attack may add to the server's RSS: the address's share of
/// the body budget (4 MiB), 4 KiB for each of its 1,024 streams past it,
/// and what hyper and h2 keep per connection and stream, with room for the
/// allocator; on main it added a gigabyte.
const GROWTH_BOUND: u64 = 96 << 20;
/// The address's share of the default `--max-body-memory` (64 MiB / 16).
const ADDRESS_SHARE: f64 = (4 << 20) as f64;

/// An archive repo with one commit holding a [`BLOB`]-byte random file,
/// made by the stock `ostree` CLI; and the commit.
fn megabyte_repo(dir: &Path) -> (PathBuf, String) {
    let tree = dir.join("tree/usr/share/big");
    std::fs::create_dir_all(&tree).unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let blob: Vec<u8> = (0..BLOB)
        .map(|_| {
            // xorshift64: incompressible, and the same at every run.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(tree.join("blob"), blob).unwrap();
    let repo = dir.join("repo");
    let r = Ostree::init(&repo, "archive").unwrap();
    let commit = r
        .run([
            "commit".to_owned(),
            "--branch=abuse/big".to_owned(),
            "--no-xattrs".to_owned(),
            "--subject=one megabyte".to_owned(),
            format!("--tree=dir={}", dir.join("tree").display()),
        ])
        .unwrap();
    (repo, commit.trim().to_owned())
}

/// One connection from `from` whose windows are all open (stream windows
/// by SETTINGS, the connection's by WINDOW_UPDATE), with [`STREAMS`] GETs
/// of `path`, that will never read a byte.
fn wide_open_non_reader(from: IpAddr, server: SocketAddr, path: &str) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    // Before connecting, so that the window the kernel offers stays small.
    s.set_recv_buffer_size(4096).unwrap();
    s.bind(&SocketAddr::new(from, 0).into()).unwrap();
    s.connect_timeout(&server.into(), Duration::from_secs(5))
        .unwrap();
    let mut s: TcpStream = s.into();
    let max = 0x7fff_ffffu32;
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE (4) = 2^31 - 1.
    let mut settings = vec![0, 4];
    settings.extend_from_slice(&max.to_be_bytes());
    hello.extend(frame(4, 0, 0, &settings));
    hello.extend(frame(8, 0, 0, &(max - 65_535).to_be_bytes()));
    // The server's SETTINGS, acknowledged unread.
    hello.extend(frame(4, 1, 0, &[]));
    for i in 0..STREAMS {
        hello.extend(get(1 + 2 * i, &server.to_string(), path));
    }
    s.write_all(&hello).unwrap();
    s
}

#[test]
fn non_reading_h2_clients_of_a_megabyte_object_pin_bounded_memory() {
    let _one = one_at_a_time();
    raise_nofile();
    let tmp = oscontent_testkit::tools::tempdir();
    let (repo, commit) = megabyte_repo(tmp.path());
    // Timeouts past the measurement: the streams must stay stalled while
    // the RSS is read (unanswered PINGs would end them sooner).
    let mut lab = Lab::serving(
        Server::repo(&repo),
        &repo,
        &["--idle-timeout=60", "--h2-keepalive=60"],
    );
    assert!(
        (900_000..1 << 20).contains(&lab.big_len),
        "the object is {} bytes",
        lab.big_len
    );
    let addr = lab.server.addr;
    // The normal traffic asks for the commit object instead, so that the
    // `.filez` answers counted are the attacker's.
    let attacked = std::mem::replace(
        &mut lab.big_object,
        oscontent_testkit::objects::object_url_path(&commit, "commit"),
    );
    let before = lab.rss();
    let rss = RssSampler::start(&lab);
    let normal = lab.normal_traffic();
    let answered_before = lab.metric(
        "oscontent_http_requests_total",
        &[("kind", "filez"), ("status", "200")],
    );
    let t0 = Instant::now();
    let socks: Vec<TcpStream> = (0..CONNS)
        .map(|_| wide_open_non_reader(abuser_ip(0), addr, &attacked))
        .collect();
    // Every stream answered (its head counted), then a few seconds for
    // what each holds to pile up.
    let want = (CONNS * STREAMS as usize) as f64;
    let answered =
        oscontent_testkit::wait_for(Duration::from_secs(60), Duration::from_millis(200), || {
            let n = lab.metric(
                "oscontent_http_requests_total",
                &[("kind", "filez"), ("status", "200")],
            ) - answered_before;
            (n >= want).then_some(n)
        });
    std::thread::sleep(Duration::from_secs(3));
    let body_bytes = lab.metric("oscontent_http_body_bytes", &[]);
    let during = lab.rss();
    let figures = normal.finish();
    let peak = rss.finish("h2 non-reader, 1 MiB object");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "h2 non-reader: {CONNS} connections x {STREAMS} streams of a {} byte object from one address, {answered:?} answered in {:.1} s; server RSS {:.1} MiB before, {:.1} MiB while stalled, peak {:.1} MiB (growth bound {} MiB); streamed chunks held {:.2} MiB (the address's share {} MiB)",
        lab.big_len,
        t0.elapsed().as_secs_f64(),
        mib(before),
        mib(during),
        mib(peak),
        GROWTH_BOUND >> 20,
        body_bytes / (1 << 20) as f64,
        ADDRESS_SHARE / (1 << 20) as f64,
    );
    assert_eq!(answered, Some(want), "every stream answered 200");
    assert!(
        peak.saturating_sub(before) < GROWTH_BOUND,
        "RSS grew {:.1} MiB under the attack",
        mib(peak.saturating_sub(before))
    );
    // The normal traffic's own answer may hold a chunk as it is read.
    assert!(
        body_bytes <= ADDRESS_SHARE + (64 << 10) as f64,
        "{body_bytes} bytes of chunks held for one address"
    );
    figures.check("h2 non-reader, 1 MiB object");
    drop(socks);
    lab.assert_recovered("h2 non-reader, 1 MiB object");
}
