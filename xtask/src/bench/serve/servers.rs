//! The three servers of `bench serve`, each serving the same repo on
//! loopback, and what a process tree costs (CPU seconds, peak RSS) from
//! `/proc`.

use super::super::{http_status, stopper, Stopper};
use anyhow::{bail, Context, Result};
use oscontent_testkit::{free_port, ServerProcess};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where stock ostree's test server is installed (Debian's ostree-tests).
pub const TRIVIAL_HTTPD: &str = "/usr/libexec/libostree/ostree-trivial-httpd";

/// One of the servers compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum Arm {
    /// nginx with sendfile, a minimal generated config: the anchor.
    Nginx,
    /// `ostree trivial-httpd` (HTTP/1.1 only).
    TrivialHttpd,
    /// oscontent-server `serve --repo`.
    Oscontent,
}

/// A running server: its root pid and the address for each protocol.
#[derive(Debug)]
pub struct Running {
    pub pid: u32,
    pub h1: SocketAddr,
    /// None: no HTTP/2 (trivial-httpd).
    pub h2: Option<SocketAddr>,
    _proc: Guard,
}

/// Held only so that dropping a [`Running`] stops its process.
#[derive(Debug)]
#[allow(dead_code)]
enum Guard {
    Stopper(Stopper),
    Server(ServerProcess),
}

/// Prefixes `cmd` with `taskset -c CPU` when pinning.
fn pinned(cpu: Option<usize>, program: &Path) -> Command {
    match cpu {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", &c.to_string()]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Waits (bounded) until `addr` answers any HTTP status on `path`.
fn wait_http(addr: SocketAddr, path: &str, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if http_status(addr, path).is_some() {
            return Ok(());
        }
        super::super::sleep(Duration::from_millis(50))?;
    }
    bail!("{what} did not answer on {addr} within 30 s")
}

/// nginx, one worker (it is pinned to one core, as the others are), with
/// sendfile, no access log, keep-alive without a request limit; HTTP/1.1
/// on one port and h2c (prior knowledge) on another.
pub fn nginx(repo: &Path, work: &Path, cpu: Option<usize>) -> Result<Running> {
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let (h1, h2) = (loopback(free_port()?), loopback(free_port()?));
    let dir = work.join("nginx");
    std::fs::create_dir_all(dir.join("tmp")).context("creating nginx's directory")?;
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\nuser root;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  tcp_nodelay on;\n\
         \x20 keepalive_requests 1000000;\n  default_type application/octet-stream;\n\
         \x20 client_body_temp_path {d}/tmp;\n  proxy_temp_path {d}/tmp;\n\
         \x20 fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n  scgi_temp_path {d}/tmp;\n\
         \x20 server {{ listen {h1}; root {r}; }}\n\
         \x20 server {{ listen {h2} http2; root {r}; }}\n}}\n",
        d = dir.display(),
        r = repo.display(),
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).context("writing nginx.conf")?;
    let mut cmd = pinned(cpu, Path::new("nginx"));
    cmd.arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(dir.join("error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd.spawn().context("spawning nginx")?;
    let s = stopper(child, "nginx");
    wait_http(h1, "/config", "nginx")?;
    Ok(Running {
        pid: s.id(),
        h1,
        h2: Some(h2),
        _proc: Guard::Stopper(s),
    })
}

/// Stock ostree's test server (libsoup, HTTP/1.1).
pub fn trivial_httpd(repo: &Path, work: &Path, cpu: Option<usize>) -> Result<Running> {
    let port_file = work.join("trivial-httpd.port");
    let _ = std::fs::remove_file(&port_file);
    let mut cmd = pinned(cpu, Path::new(TRIVIAL_HTTPD));
    cmd.arg("--port-file")
        .arg(&port_file)
        .arg(repo)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd.spawn().context("spawning ostree-trivial-httpd")?;
    let s = stopper(child, "ostree-trivial-httpd");
    let deadline = Instant::now() + Duration::from_secs(30);
    let port: u16 = loop {
        if let Some(p) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        if Instant::now() > deadline {
            bail!("ostree-trivial-httpd wrote no port within 30 s");
        }
        super::super::sleep(Duration::from_millis(50))?;
    };
    let h1 = SocketAddr::from(([127, 0, 0, 1], port));
    wait_http(h1, "/config", "ostree-trivial-httpd")?;
    Ok(Running {
        pid: s.id(),
        h1,
        h2: None,
        _proc: Guard::Stopper(s),
    })
}

/// oscontent-server serving `repo` at `commit`, both protocols on one port.
pub fn oscontent(
    bin: &Path,
    repo: &Path,
    commit: &str,
    state: &Path,
    extra: &[String],
    cpu: Option<usize>,
) -> Result<Running> {
    let mut cmd = pinned(cpu, bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--repo"])
        .arg(repo)
        .args(["--commit", commit, "--state-dir"])
        .arg(state)
        // The replay's connections all come from 127.0.0.1.
        .args(["--max-connections-per-ip", "4096"])
        .args(["--max-connections-per-net", "4096"])
        .args(extra);
    let mut srv = ServerProcess::spawn(&mut cmd, Duration::from_secs(60))?;
    srv.wait_ready(Duration::from_secs(120))?;
    let pid = srv.pid().context("server exited")?;
    let addr = srv.addr;
    Ok(Running {
        pid,
        h1: addr,
        h2: Some(addr),
        _proc: Guard::Server(srv),
    })
}

/// `pid` and its descendants (through `/proc/PID/task/*/children`).
pub fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < 1024 {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                out.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<u32>().ok()),
                );
            }
        }
        i += 1;
    }
    out
}

/// CPU seconds (user + system) of a process tree so far.
pub fn tree_cpu(pid: u32) -> f64 {
    tree(pid)
        .into_iter()
        .filter_map(super::super::cpu_seconds)
        .map(|(own, _)| own)
        .sum()
}

/// Peak resident memory (`VmHWM`) of a process tree, in bytes.
pub fn tree_peak_rss(pid: u32) -> u64 {
    tree(pid)
        .into_iter()
        .filter_map(|p| {
            let s = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .sum()
}

/// Where the servers' scratch files go.
pub fn work_dir(base: &Path) -> Result<PathBuf> {
    let d = base.join("serve-work");
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}
