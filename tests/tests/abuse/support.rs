//! The suite's lab: a server with short timeouts, the normal traffic that
//! must keep being answered, the server's RSS, and sockets from many
//! loopback addresses (so the per-client cap sees many clients).

use oscontent_testkit::metrics::Metrics;
use oscontent_testkit::objects::{largest_filez, object_url_path};
use oscontent_testkit::server::builder::ServerBuilder;
use oscontent_testkit::server::Server;
use oscontent_testkit::tools::v1;
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The timeouts the suite runs the server with (seconds), short so that
/// "dropped within the timeout" is quick to see.
pub const FIRST_BYTE: u64 = 2;
pub const HEADER_READ: u64 = 3;
pub const IDLE: u64 = 4;
/// Slack on top of a timeout for the server's timer and our polling.
pub const SLACK: Duration = Duration::from_secs(3);
/// The bound normal requests must keep during an attack. Generous: it says
/// the server still answers, it is not a benchmark.
pub const P99_BOUND: Duration = Duration::from_secs(1);

/// One attack at a time: they share two cores, and each measures the
/// server while it runs.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Raises this process's open-file limit to its hard limit (the 10,000
/// idle connections need it) and returns it.
pub fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    setrlimit(Resource::Nofile, l).unwrap();
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The deployment's memory limit (deploy/base), in bytes: what the
/// server's RSS must stay under.
pub fn memory_limit() -> u64 {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/deployment.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let containers = doc["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap();
    let server = containers.iter().find(|c| c["name"] == "server").unwrap();
    let mem = server["resources"]["limits"]["memory"].as_str().unwrap();
    let mib: u64 = mem.strip_suffix("Mi").unwrap().parse().unwrap();
    mib << 20
}

/// The server, started on the v1 fixture with the suite's timeouts and
/// `extra` arguments.
pub struct Lab {
    pub server: Server,
    pub pid: u32,
    /// A content object, the biggest of the release.
    pub big_object: String,
    pub big_len: u64,
}

impl Lab {
    pub fn start(extra: &[&str]) -> Self {
        let release = v1();
        Self::serving(
            Server::oscontainer(&release.oscontainer),
            &release.repo,
            extra,
        )
    }

    /// The server started by `builder`, which serves `repo` (its biggest
    /// object is the normal traffic's), with the suite's timeouts and
    /// `extra` arguments.
    pub fn serving(builder: ServerBuilder, repo: &Path, extra: &[&str]) -> Self {
        // The suite's timeouts, unless the attack sets its own; and its
        // abusers, from 127.0.1.0/24 on, are the nodes of a few subnets,
        // which the cap per /24 does not hold back unless the attack is
        // about it (`capfull.rs`).
        let timeouts: Vec<String> = [
            format!("--first-byte-timeout={FIRST_BYTE}"),
            format!("--header-read-timeout={HEADER_READ}"),
            format!("--idle-timeout={IDLE}"),
            "--h2-keepalive=2".to_owned(),
            "--max-connections-per-net=100000".to_owned(),
        ]
        .into_iter()
        .filter(|t| {
            let flag = t.split('=').next().unwrap_or_default();
            !extra.iter().any(|e| e.starts_with(flag))
        })
        .collect();
        let server = builder.args(&timeouts).args(extra).start().unwrap();
        let pid = server.pid().unwrap();
        let (checksum, big_len) = largest_filez(repo).unwrap();
        Self {
            server,
            pid,
            big_object: object_url_path(&checksum, "filez"),
            big_len,
        }
    }

    pub fn metrics(&self) -> Metrics {
        self.server.metrics().unwrap()
    }

    /// A counter or gauge, 0 when absent.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metrics().get(name, labels).unwrap_or(0.0)
    }

    /// The server's resident set size, from /proc.
    pub fn rss(&self) -> u64 {
        rss_of(self.pid).unwrap()
    }

    /// The server's open file descriptors.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .unwrap()
            .count()
    }

    /// Normal requests, from 127.0.0.1, until stopped.
    pub fn normal_traffic(&self) -> Prober {
        Prober::start(self.server.url.clone(), self.big_object.clone())
    }

    /// Asserts the server is back to normal once the attack is over: no
    /// connection left open but the ones probing, normal requests answered.
    pub fn assert_recovered(&mut self, what: &str) {
        assert!(self.server.is_running(), "{what}: the server died");
        let start = Instant::now();
        let mut open = f64::MAX;
        for _ in 0..100 {
            open = self.metric("oscontent_http_connections_open", &[("kind", "normal")])
                + self.metric(
                    "oscontent_http_connections_open",
                    &[("kind", "probe_reserve")],
                );
            // The one /metrics connection itself.
            if open <= 1.0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let r = self.server.get("/summary").unwrap();
        println!(
            "{what}: recovered in {:.1} s: {open} connection(s) open, /summary {}",
            start.elapsed().as_secs_f64(),
            r.status
        );
        assert!(open <= 1.0, "{what}: {open} connections still open");
        assert_eq!(r.status, 200, "{what}: /summary after the attack");
    }
}

/// Latency figures of the normal requests made during an attack.
#[derive(Debug)]
pub struct Figures {
    pub requests: usize,
    pub failures: Vec<String>,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Figures {
    /// Prints them, and asserts every request succeeded within the bound.
    pub fn check(&self, what: &str) {
        println!(
            "{what}: {} normal requests, {} failed, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (bound: p99 < {} ms)",
            self.requests,
            self.failures.len(),
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3,
            P99_BOUND.as_millis()
        );
        assert!(
            self.requests >= MIN_PROBES,
            "{what}: only {} requests",
            self.requests
        );
        assert!(
            self.failures.is_empty(),
            "{what}: failed normal requests: {:?}",
            &self.failures[..self.failures.len().min(5)]
        );
        assert!(self.p99 < P99_BOUND, "{what}: p99 {:?}", self.p99);
    }
}

/// A thread making normal requests (the probes, the summary, a content
/// object) one after another on a keep-alive client, timing each.
pub struct Prober {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    thread: JoinHandle<(Vec<Duration>, Vec<String>)>,
}

/// At most this many normal requests per attack (bounded loop).
const MAX_PROBES: usize = 100_000;
/// At least this many, so the p99 is the 99th percentile of something.
pub const MIN_PROBES: usize = 100;

impl Prober {
    fn start(url: String, object: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let client = oscontent_testkit::http::client_builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let paths = ["/healthz", "/readyz", "/summary", "/config", &object];
            let (mut times, mut failures) = (Vec::new(), Vec::new());
            for i in 0..MAX_PROBES {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                let path = paths[i % paths.len()];
                let t = Instant::now();
                let r = client
                    .get(format!("{url}{path}"))
                    .send()
                    .and_then(|r| r.error_for_status())
                    .and_then(|r| r.bytes());
                times.push(t.elapsed());
                count.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = r {
                    failures.push(format!("{path}: {e}"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (times, failures)
        });
        Self { stop, done, thread }
    }

    /// Stops the traffic, once it has made at least [`MIN_PROBES`]
    /// requests (a quick attack still gets a p99 worth the name), or after
    /// ten more seconds.
    pub fn finish(self) -> Figures {
        for _ in 0..200 {
            if self.done.load(Ordering::SeqCst) >= MIN_PROBES {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.store(true, Ordering::SeqCst);
        let (mut times, failures) = self.thread.join().unwrap();
        times.sort();
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or_default()
        };
        Figures {
            requests: times.len(),
            failures,
            p50: at(0.50),
            p99: at(0.99),
            max: times.last().copied().unwrap_or_default(),
        }
    }
}

/// The `i`th abuser address: 127.0.1.0/24 onwards, all loopback, all
/// different clients to the server (127.0.0.1 is the normal traffic's).
pub fn abuser_ip(i: usize) -> IpAddr {
    let i = u32::try_from(i).unwrap();
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 1, 1)) + i))
}

/// A connection to `server` from `from`.
pub fn connect_from(from: IpAddr, server: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::new(from, 0).into())?;
    s.connect_timeout(&server.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// The runtime the HTTP/2 clients run on: two workers, as the machine
/// has two cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// [`connect_from`] for tokio (the connect blocks: on the blocking pool).
pub async fn connect_from_async(from: IpAddr, server: SocketAddr) -> tokio::net::TcpStream {
    let std = tokio::task::spawn_blocking(move || {
        let s = connect_from(from, server).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    })
    .await
    .unwrap();
    tokio::net::TcpStream::from_std(std).unwrap()
}

/// An HTTP/2 client made by `builder` over `io`, its connection driven in
/// the background, ready to send.
pub async fn h2_client<T>(
    builder: &h2::client::Builder,
    io: T,
) -> h2::client::SendRequest<bytes::Bytes>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (client, conn) = builder.handshake::<_, bytes::Bytes>(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.unwrap()
}

/// `n` GETs of `path` on `client`, sent as the server's stream limit
/// allows; their answers to come.
pub async fn send_gets(
    mut client: h2::client::SendRequest<bytes::Bytes>,
    server: SocketAddr,
    path: &str,
    n: usize,
) -> Vec<h2::client::ResponseFuture> {
    let mut pending = Vec::with_capacity(n);
    for _ in 0..n {
        let req = http::Request::get(format!("http://{server}{path}"))
            .body(())
            .unwrap();
        client = client.ready().await.unwrap();
        pending.push(client.send_request(req, true).unwrap().0);
    }
    pending
}

/// Whether the server closed `s` (EOF or reset); reads and discards
/// whatever it sent meanwhile. `s` must be non-blocking.
pub fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16 * 1024];
    // Bounded: a server streaming to us cannot keep this loop going.
    for _ in 0..64 {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
    false
}

/// Waits until the server has closed every socket, at most `deadline`
/// after `since`; returns how long after `since` the last one was seen
/// closed, and how many were still open at the deadline.
pub fn wait_all_closed(
    socks: &mut Vec<TcpStream>,
    since: Instant,
    deadline: Duration,
) -> (Duration, usize) {
    for s in socks.iter() {
        s.set_nonblocking(true).unwrap();
    }
    loop {
        socks.retain_mut(|s| !closed_by_peer(s));
        if socks.is_empty() || since.elapsed() >= deadline {
            return (since.elapsed(), socks.len());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prints and checks one attack's memory figure.
pub fn check_rss(what: &str, peak: u64) {
    let limit = memory_limit();
    println!(
        "{what}: server RSS peak {:.1} MiB (deployment limit {} MiB)",
        peak as f64 / (1 << 20) as f64,
        limit >> 20
    );
    assert!(peak < limit, "{what}: RSS {peak} over the limit {limit}");
}

/// Samples the server's RSS every 50 ms until finished; keeps the peak.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl RssSampler {
    pub fn start(lab: &Lab) -> Self {
        let pid = lab.pid;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            // Bounded: ten minutes of samples at most.
            for _ in 0..12_000 {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                if let Some(rss) = rss_of(pid) {
                    peak = peak.max(rss);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        Self { stop, thread }
    }

    /// The peak, printed and checked against the deployment's limit.
    pub fn finish(self, what: &str) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let peak = self.thread.join().unwrap();
        check_rss(what, peak);
        peak
    }
}

fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// An HTTP/2 frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A GET as HPACK literals (no Huffman, no table).
pub fn get(stream: u32, authority: &str, path: &str) -> Vec<u8> {
    let mut h = vec![0x82, 0x86]; // :method GET, :scheme http
    for (index, value) in [(4u8, path), (1, authority)] {
        let len = u8::try_from(value.len()).unwrap();
        assert!(len < 127, "one-byte HPACK length");
        h.extend_from_slice(&[index, len]);
        h.extend_from_slice(value.as_bytes());
    }
    frame(1, 0x5, stream, &h) // END_STREAM | END_HEADERS
}
