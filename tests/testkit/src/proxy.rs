//! Misbehaving proxies on loopback.
//!
//! [`FaultProxy`]: an HTTP/1.1 proxy that injects faults in front of a
//! server: `503`s for the first requests of chosen paths, and connections
//! reset in the middle of a response body. It speaks HTTP/1.1 only, so a
//! client's HTTP/2 prior-knowledge attempt fails against it (which is how
//! the suites exercise the client's fallback).
//!
//! [`StallProxy`]: a TCP proxy whose connections stall after a number of
//! response bytes, until it is unthrottled.
//!
//! Bounded: one thread per connection, every read has a timeout and a
//! size cap, and the accept loops stop when the proxy is dropped.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per-socket read/write timeout.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Request heads above this size are refused.
const MAX_HEAD: usize = 64 << 10;

/// Which faults to inject. Counts are over requests whose path starts with
/// `prefix` (default `/objects/`).
#[derive(Debug, Clone)]
pub struct Faults {
    pub prefix: String,
    /// Answer the first N matching requests with `503`, without forwarding.
    pub fail_first: usize,
    /// Answer the first `fail_each` requests of every `fail_path_every`-th
    /// distinct matching path with `503` (0: never).
    pub fail_path_every: usize,
    pub fail_each: usize,
    /// Reset the connection half-way through every Nth forwarded matching
    /// response (0: never), counting from 1. Only bodies of at least 64
    /// bytes are cut.
    pub reset_every: usize,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            prefix: "/objects/".into(),
            fail_first: 0,
            fail_path_every: 0,
            fail_each: 0,
            reset_every: 0,
        }
    }
}

#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Matching requests seen (including failed ones).
    pub matched: AtomicUsize,
    /// Matching requests forwarded to the server.
    pub forwarded: AtomicUsize,
    pub injected_503: AtomicUsize,
    pub injected_resets: AtomicUsize,
    /// Connections that opened with the HTTP/2 preface (and were closed).
    pub h2_prefaces: AtomicUsize,
    /// Paths requested, in order.
    pub paths: Mutex<Vec<String>>,
    /// Distinct matching paths: (order of first appearance, requests).
    pub per_path: Mutex<std::collections::HashMap<String, (usize, usize)>>,
}

#[derive(Debug)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    pub url: String,
    pub stats: Arc<ProxyStats>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub fn start(upstream: SocketAddr, faults: Faults) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the proxy")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(ProxyStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (stats, stop) = (stats.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            let (stats, faults) = (stats.clone(), faults.clone());
                            std::thread::spawn(move || {
                                let _ = serve_conn(s, upstream, &faults, &stats);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            });
        }
        Ok(Self {
            addr,
            url: format!("http://{addr}"),
            stats,
            stop,
        })
    }

    pub fn forwarded(&self) -> usize {
        self.stats.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn read_head(s: &mut TcpStream) -> Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b)? {
            0 => return Ok(None),
            _ => head.push(b[0]),
        }
        if head.ends_with(b"\r\n\r\n") {
            return Ok(Some(head));
        }
        if head.starts_with(b"PRI * HTTP/2.0") {
            return Ok(Some(head));
        }
        anyhow::ensure!(head.len() <= MAX_HEAD, "request head too large");
    }
}

fn serve_conn(
    mut client: TcpStream,
    upstream: SocketAddr,
    faults: &Faults,
    stats: &ProxyStats,
) -> Result<()> {
    client.set_read_timeout(Some(IO_TIMEOUT))?;
    client.set_write_timeout(Some(IO_TIMEOUT))?;
    loop {
        let Some(head) = read_head(&mut client)? else {
            return Ok(());
        };
        if head.starts_with(b"PRI * HTTP/2.0") {
            stats.h2_prefaces.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let path = text.split_whitespace().nth(1).unwrap_or("").to_owned();
        stats.paths.lock().unwrap().push(path.clone());
        let matched = path.starts_with(&faults.prefix);
        let n = if matched {
            stats.matched.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        let (path_index, path_requests) = if matched {
            let mut m = stats.per_path.lock().unwrap();
            let next = m.len();
            let e = m.entry(path.clone()).or_insert((next, 0));
            e.1 += 1;
            *e
        } else {
            (0, 0)
        };
        let path_fails = matched
            && faults.fail_path_every > 0
            && path_index % faults.fail_path_every == faults.fail_path_every - 1
            && path_requests <= faults.fail_each;
        if matched && (n <= faults.fail_first || path_fails) {
            stats.injected_503.fetch_add(1, Ordering::SeqCst);
            client.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")?;
            continue;
        }
        // Forward with `Connection: close` so the response ends at EOF.
        let mut req = String::new();
        for (i, line) in text.split("\r\n").enumerate() {
            if line.is_empty() {
                continue;
            }
            if i > 0 && line.to_ascii_lowercase().starts_with("connection:") {
                continue;
            }
            req.push_str(line);
            req.push_str("\r\n");
        }
        req.push_str("Connection: close\r\n\r\n");
        let mut up = TcpStream::connect_timeout(&upstream, IO_TIMEOUT)?;
        up.set_read_timeout(Some(IO_TIMEOUT))?;
        up.write_all(req.as_bytes())?;
        let mut resp = Vec::new();
        up.take(crate::MAX_READ as u64).read_to_end(&mut resp)?;
        let fwd = if matched {
            stats.forwarded.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        let body_at = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| p + 4)
            .unwrap_or(resp.len());
        // Drop the server's `connection: close` (an answer to ours) so the
        // client keeps its connection to the proxy.
        let head: String = String::from_utf8_lossy(&resp[..body_at])
            .split("\r\n")
            .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
            .map(|l| format!("{l}\r\n"))
            .collect();
        let mut out = head.into_bytes();
        out.extend_from_slice(b"\r\n");
        let body_at_out = out.len();
        out.extend_from_slice(&resp[body_at..]);
        let (resp, body_at) = (out, body_at_out);
        let cut = matched
            && faults.reset_every > 0
            && fwd % faults.reset_every == 0
            && resp.len() - body_at >= 64;
        if cut {
            stats.injected_resets.fetch_add(1, Ordering::SeqCst);
            let half = body_at + (resp.len() - body_at) / 2;
            client.write_all(&resp[..half])?;
            client.flush()?;
            // RST instead of FIN: the client sees a reset mid-body.
            socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO))?;
            return Ok(());
        }
        client.write_all(&resp)?;
    }
}

/// Forwards 127.0.0.1:port to an upstream; each connection forwards at most
/// `limit` response bytes and then holds the connection open without
/// sending more (a stalled transfer), until the limit is raised or the
/// proxy is dropped.
#[derive(Debug)]
pub struct StallProxy {
    pub port: u16,
    limit: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

/// Longest a proxy thread lives.
const PROXY_LIFETIME: Duration = Duration::from_secs(300);

impl StallProxy {
    pub fn start(upstream: SocketAddr, limit: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let limit = Arc::new(AtomicU64::new(limit));
        let stalled = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s, st) = (limit.clone(), stalled.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            let deadline = Instant::now() + PROXY_LIFETIME;
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                        else {
                            continue;
                        };
                        let (l, s, st) = (l.clone(), s.clone(), st.clone());
                        std::thread::spawn(move || proxy_conn(client, up, l, s, st));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            port,
            limit,
            stalled,
            stop,
            accept: Some(accept),
        }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether a connection has reached the limit and is holding.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// No limit from now on (held connections resume).
    pub fn unthrottle(&self) {
        self.limit.store(u64::MAX, Ordering::Relaxed);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn proxy_conn(
    client: TcpStream,
    up: TcpStream,
    limit: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    let tick = Some(Duration::from_millis(100));
    let _ = client.set_read_timeout(tick);
    let _ = up.set_read_timeout(tick);
    let (mut c_r, mut c_w) = (client.try_clone().unwrap(), client);
    let (mut u_r, mut u_w) = (up.try_clone().unwrap(), up);
    let done = Arc::new(AtomicBool::new(false));
    // Requests: client to upstream, unthrottled.
    let (d, st) = (done.clone(), stop.clone());
    let requests = std::thread::spawn(move || {
        let deadline = Instant::now() + PROXY_LIFETIME;
        let mut buf = [0u8; 16384];
        while !d.load(Ordering::Relaxed) && !st.load(Ordering::Relaxed) && Instant::now() < deadline
        {
            match c_r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if u_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        d.store(true, Ordering::Relaxed);
        let _ = u_w.shutdown(std::net::Shutdown::Both);
    });
    // Responses: upstream to client, at most `limit` bytes.
    let deadline = Instant::now() + PROXY_LIFETIME;
    let mut sent: u64 = 0;
    let mut buf = [0u8; 16384];
    while !done.load(Ordering::Relaxed)
        && !stop.load(Ordering::Relaxed)
        && Instant::now() < deadline
    {
        let room = limit.load(Ordering::Relaxed).saturating_sub(sent);
        if room == 0 {
            stalled.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        match u_r.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => {
                if c_w.write_all(&buf[..n]).is_err() {
                    break;
                }
                sent += n as u64;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = c_w.shutdown(std::net::Shutdown::Both);
    let _ = requests.join();
}
