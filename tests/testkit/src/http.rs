//! HTTP clients and raw exchanges with the server under test.

use crate::process::MAX_READ;
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A free loopback port, for a peer that binds it itself (nginx, the
/// registry, etcd). The port can be taken by another process between this
/// call and the peer's bind; the peer's bind error then says so.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("finding a free loopback port")?
        .local_addr()
        .context("reading a bound loopback port")?
        .port())
}

/// A blocking client for plain HTTP to loopback: no proxy from the
/// environment, no redirects followed, and no CA roots loaded (reqwest
/// parses all of them at each `build()`, and at the suites' opt-level that
/// was half the CPU of a test polling its server).
pub fn client_builder() -> reqwest::blocking::ClientBuilder {
    reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
}

/// An HTTP/1.1 client (keep-alive).
pub fn http1() -> reqwest::blocking::Client {
    client_builder()
        .http1_only()
        .build()
        .expect("building an HTTP/1.1 client")
}

/// An HTTP/2 client with prior knowledge (h2c).
pub fn http2() -> reqwest::blocking::Client {
    client_builder()
        .http2_prior_knowledge()
        .build()
        .expect("building an HTTP/2 client")
}

/// A response, read in full.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub version: reqwest::Version,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// GET `url` with extra headers.
pub fn fetch(
    client: &reqwest::blocking::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    request(client, reqwest::Method::GET, url, headers)
}

/// Any method.
pub fn request(
    client: &reqwest::blocking::Client,
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    let mut rb = client.request(method.clone(), url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().with_context(|| format!("{method} {url}"))?;
    let status = r.status().as_u16();
    let version = r.version();
    let headers = r.headers().clone();
    let mut body = Vec::new();
    r.take(MAX_READ as u64)
        .read_to_end(&mut body)
        .with_context(|| format!("reading {url}"))?;
    Ok(HttpResponse {
        status,
        version,
        headers,
        body,
    })
}

/// A response read off a raw socket.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub status_line: String,
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunked encoding undone).
    pub body: Vec<u8>,
    /// Everything the server sent.
    pub raw: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request on a fresh connection with `Connection: close` and
/// reads the response to EOF. The target is sent byte for byte.
pub fn raw_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse> {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let raw = raw_exchange(addr, req.as_bytes(), Duration::from_secs(30))?;
    parse_raw_response(&raw, method == "HEAD")
}

/// One request of [`keep_alive`]: method, target, extra headers.
pub type Asked<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// Sends `requests` on one connection, in one write (the last with
/// `Connection: close`), and reads their responses, each framed by its
/// Content-Length (none for a HEAD's or a 304's body).
pub fn keep_alive(addr: SocketAddr, requests: &[Asked<'_>]) -> Result<Vec<RawResponse>> {
    let mut req = String::new();
    for (i, (method, target, headers)) in requests.iter().enumerate() {
        req.push_str(&format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\n"));
        for (k, v) in *headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if i + 1 == requests.len() {
            req.push_str("Connection: close\r\n");
        }
        req.push_str("\r\n");
    }
    let raw = raw_exchange(addr, req.as_bytes(), Duration::from_secs(30))?;
    let mut rest = &raw[..];
    let mut out = Vec::new();
    for (method, target, _) in requests {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| anyhow!("{method} {target}: no response head"))?
            + 4;
        let mut r = parse_raw_response(&rest[..end], true)?;
        let len: usize = match r.header("content-length") {
            _ if *method == "HEAD" || r.status == 304 => 0,
            Some(n) => n.parse().context("Content-Length")?,
            None => bail!("{method} {target}: no Content-Length"),
        };
        ensure!(rest.len() >= end + len, "{method} {target}: body cut short");
        r.body = rest[end..end + len].to_vec();
        r.raw = rest[..end + len].to_vec();
        rest = &rest[end + len..];
        out.push(r);
    }
    ensure!(
        rest.is_empty(),
        "{} bytes after the last response",
        rest.len()
    );
    Ok(out)
}

/// Writes `request` and reads until the server closes, within `timeout`.
pub fn raw_exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> Result<Vec<u8>> {
    ensure!(addr.ip().is_loopback(), "refusing to talk to {addr}");
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request)?;
    let deadline = Instant::now() + timeout;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        ensure!(
            Instant::now() < deadline,
            "no EOF from {addr} within {timeout:?} (got {} bytes)",
            raw.len()
        );
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                ensure!(
                    raw.len() <= MAX_READ,
                    "response from {addr} over {MAX_READ} bytes"
                );
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // A reset after the full response is still a response.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !raw.is_empty() => break,
            Err(e) => return Err(e).with_context(|| format!("reading from {addr}")),
        }
    }
    Ok(raw)
}

/// Parses a raw HTTP/1.1 response (one, up to EOF).
pub fn parse_raw_response(raw: &[u8], head_request: bool) -> Result<RawResponse> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            anyhow!(
                "no end of headers in {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(500)])
            )
        })?;
    let head = std::str::from_utf8(&raw[..end]).context("non-UTF-8 response head")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_owned();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked && !head_request {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(RawResponse {
        status,
        status_line,
        headers,
        body,
        raw: raw.to_vec(),
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("bad chunk header"))?;
        let size_str = std::str::from_utf8(&b[..eol])?
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let size = usize::from_str_radix(&size_str, 16)
            .with_context(|| format!("chunk size {size_str:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        ensure!(b.len() >= size + 2, "truncated chunk");
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
    bail!("too many chunks")
}
