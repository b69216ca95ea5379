//! `--etcd`: a real etcd as a second neighbour, its data dir on the
//! trial's filesystem, loopback only.
//!
//! Load: one client putting 2300-byte values in a loop through etcd's
//! JSON gateway (`POST /v3/kv/put`) on a kept-alive connection, each put
//! timed with its start, so that its latency is windowed by the update
//! exactly like the built-in neighbour's fdatasyncs. etcd's own view comes
//! from its `/metrics`: the `etcd_disk_wal_fsync_duration_seconds` and
//! `etcd_disk_backend_commit_duration_seconds` histograms, scraped when
//! the window opens and closes. `etcdctl check perf` is not used inside
//! trials: it always runs for 60 s and reports only a verdict over its
//! whole run, which cannot be windowed by an update.

use super::super::{check_interrupted, stopper, Stopper};
use super::neighbour::Op;
use anyhow::{bail, Context, Result};
use base64::Engine as _;
use oscontent_testkit::free_port;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Distinct keys the load cycles through (etcd keeps every revision; the
/// trial is short enough that this never needs a compaction).
const KEYS: usize = 100;
const VALUE_BYTES: usize = 2300;
/// Response bodies read at most (a bound on memory).
const MAX_BODY: usize = 16 << 20;

/// A running etcd, stopped on drop.
#[derive(Debug)]
pub struct Etcd {
    pub client: SocketAddr,
    _process: Stopper,
}

impl Etcd {
    pub fn start(data_dir: &Path, log: &Path) -> Result<Etcd> {
        let (cp, pp) = (free_port()?, free_port()?);
        let client = format!("http://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bench={peer}")])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting etcd")?;
        let mut process = stopper(child, "etcd");
        process.grace = Duration::from_secs(10);
        let addr: SocketAddr = format!("127.0.0.1:{cp}").parse()?;
        let start = Instant::now();
        loop {
            check_interrupted()?;
            if let Some(status) = process.try_wait()? {
                bail!(
                    "etcd exited ({status}); log:\n{}",
                    super::super::tail(log, 20)
                );
            }
            if crate::bench::http_status(addr, "/health") == Some(200) {
                break;
            }
            if start.elapsed() > START_TIMEOUT {
                bail!("etcd not healthy within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Etcd {
            client: addr,
            _process: process,
        })
    }

    /// Its histograms now.
    pub fn metrics(&self) -> Result<EtcdMetrics> {
        let mut conn = Conn::open(self.client)?;
        let body = conn.request("GET", "/metrics", None)?;
        let text = String::from_utf8_lossy(&body);
        Ok(EtcdMetrics {
            wal_fsync: Histogram::parse(&text, "etcd_disk_wal_fsync_duration_seconds")
                .context("no wal_fsync histogram in etcd's /metrics")?,
            backend_commit: Histogram::parse(&text, "etcd_disk_backend_commit_duration_seconds")
                .context("no backend_commit histogram in etcd's /metrics")?,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EtcdMetrics {
    pub wal_fsync: Histogram,
    pub backend_commit: Histogram,
}

/// A Prometheus histogram: cumulative counts by upper bound (seconds).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    /// The unlabelled histogram `name` from the text exposition format.
    pub fn parse(text: &str, name: &str) -> Option<Histogram> {
        let mut h = Histogram::default();
        let bucket = format!("{name}_bucket{{le=\"");
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&bucket) {
                let (le, rest) = rest.split_once("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                h.buckets
                    .push((le, rest.trim().parse::<f64>().ok()? as u64));
            } else if let Some(v) = line.strip_prefix(&format!("{name}_sum ")) {
                h.sum = v.trim().parse().ok()?;
            } else if let Some(v) = line.strip_prefix(&format!("{name}_count ")) {
                h.count = v.trim().parse::<f64>().ok()? as u64;
            }
        }
        (!h.buckets.is_empty()).then_some(h)
    }

    /// Increments from `earlier`.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| {
                    let before = earlier
                        .buckets
                        .iter()
                        .find(|(l, _)| l == le)
                        .map_or(0, |(_, c)| *c);
                    (*le, c.saturating_sub(before))
                })
                .collect(),
            count: self.count.saturating_sub(earlier.count),
            sum: self.sum - earlier.sum,
        }
    }

    /// The upper bound (ms) of the bucket holding quantile `q`: what
    /// Prometheus' histogram_quantile would round up to.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        let rank = (q * self.count as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= rank)
            .map_or(f64::NAN, |(le, _)| le * 1e3)
    }
}

/// Window figures from etcd's own histograms.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct EtcdWindow {
    pub wal_fsyncs: u64,
    pub wal_fsync_mean_ms: f64,
    /// Bucket upper bounds (coarse: etcd's buckets double from 1 ms).
    pub wal_fsync_p99_le_ms: f64,
    pub backend_commits: u64,
    pub backend_commit_mean_ms: f64,
    pub backend_commit_p99_le_ms: f64,
}

impl EtcdWindow {
    pub fn between(a: &EtcdMetrics, b: &EtcdMetrics) -> EtcdWindow {
        let w = b.wal_fsync.since(&a.wal_fsync);
        let c = b.backend_commit.since(&a.backend_commit);
        let mean = |h: &Histogram| h.sum / h.count as f64 * 1e3;
        EtcdWindow {
            wal_fsyncs: w.count,
            wal_fsync_mean_ms: mean(&w),
            wal_fsync_p99_le_ms: w.quantile_ms(0.99),
            backend_commits: c.count,
            backend_commit_mean_ms: mean(&c),
            backend_commit_p99_le_ms: c.quantile_ms(0.99),
        }
    }
}

/// A plain HTTP/1.1 keep-alive connection to a loopback server.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    host: SocketAddr,
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            writer: s.try_clone()?,
            reader: BufReader::new(s),
            host: addr,
        })
    }

    fn request(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Vec<u8>> {
        let body = body.unwrap_or_default();
        write!(
            self.writer,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        )?;
        self.writer.write_all(body)?;
        let mut status = String::new();
        self.reader.read_line(&mut status)?;
        let code: u16 = status
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("bad status line {status:?}"))?;
        let mut len = None;
        let mut chunked = false;
        loop {
            let mut h = String::new();
            if self.reader.read_line(&mut h)? == 0 {
                bail!("connection closed in headers");
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            } else if k.eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
        let mut out = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                    .with_context(|| format!("bad chunk size {size:?}"))?;
                anyhow::ensure!(out.len() + n <= MAX_BODY, "response too large");
                let mut chunk = vec![0; n + 2];
                self.reader.read_exact(&mut chunk)?;
                out.extend_from_slice(&chunk[..n]);
                if n == 0 {
                    break;
                }
            }
        } else {
            let n = len.context("response without length")?;
            anyhow::ensure!(n <= MAX_BODY, "response too large");
            out.resize(n, 0);
            self.reader.read_exact(&mut out)?;
        }
        anyhow::ensure!(
            (200..300).contains(&code),
            "{method} {path}: {code}: {}",
            String::from_utf8_lossy(&out)
        );
        Ok(out)
    }
}

/// The put loop; stopped and joined on drop.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<Vec<Op>>>>,
}

impl Load {
    /// Starts putting at once; times from `epoch`; stops by itself after
    /// `limit`.
    pub fn start(addr: SocketAddr, epoch: Instant, limit: Duration) -> Result<Load> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let value = b64.encode(vec![b'e'; VALUE_BYTES]);
        let bodies: Vec<Vec<u8>> = (0..KEYS)
            .map(|k| {
                format!(
                    "{{\"key\":\"{}\",\"value\":\"{value}\"}}",
                    b64.encode(format!("bench/key-{k}"))
                )
                .into_bytes()
            })
            .collect();
        let mut conn = Conn::open(addr)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("etcd-load".into())
            .spawn(move || {
                let started = Instant::now();
                let mut ops = Vec::new();
                let mut i = 0usize;
                while !flag.load(Ordering::Relaxed)
                    && started.elapsed() < limit
                    && !super::super::interrupted()
                {
                    let t0 = Instant::now();
                    conn.request("POST", "/v3/kv/put", Some(&bodies[i % KEYS]))?;
                    let d = t0.elapsed();
                    ops.push(Op {
                        start_ns: t0.saturating_duration_since(epoch).as_nanos() as u64,
                        write_ns: 0,
                        sync_ns: u32::try_from(d.as_nanos()).unwrap_or(u32::MAX),
                    });
                    i += 1;
                }
                Ok(ops)
            })
            .context("spawning the etcd load thread")?;
        Ok(Load {
            stop,
            handle: Some(handle),
        })
    }

    pub fn finish(mut self) -> Result<Vec<Op>> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => bail!("the etcd load thread panicked"),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# HELP x\n\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 10\n\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.002\"} 90\n\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.004\"} 99\n\
etcd_disk_wal_fsync_duration_seconds_bucket{le=\"+Inf\"} 100\n\
etcd_disk_wal_fsync_duration_seconds_sum 0.25\n\
etcd_disk_wal_fsync_duration_seconds_count 100\n\
etcd_disk_backend_commit_duration_seconds_bucket{le=\"0.001\"} 1\n";

    #[test]
    fn histogram_quantiles_and_deltas() {
        let h = Histogram::parse(METRICS, "etcd_disk_wal_fsync_duration_seconds").unwrap();
        assert_eq!(h.count, 100);
        assert_eq!(h.quantile_ms(0.5), 2.0);
        assert_eq!(h.quantile_ms(0.99), 4.0);
        assert_eq!(h.quantile_ms(1.0), f64::INFINITY);
        let earlier = Histogram {
            buckets: vec![(0.001, 10), (0.002, 10), (0.004, 10), (f64::INFINITY, 10)],
            count: 10,
            sum: 0.01,
        };
        let d = h.since(&earlier);
        assert_eq!(d.count, 90);
        assert_eq!(d.quantile_ms(0.5), 2.0);
        assert!(Histogram::parse(METRICS, "nope").is_none());
        assert!(Histogram::default().quantile_ms(0.5).is_nan());
    }
}
