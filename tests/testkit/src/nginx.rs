//! A real nginx, on loopback or in a network namespace, as an HTTP cache or a plain file server in
//! front of (or beside) oscontent: a peer the suites and benchmarks measure
//! against. Each instance has its own prefix (config, pid, temp dirs, logs),
//! runs in the foreground under a [`Stopper`], and logs one line per request
//! in a format [`Nginx::requests`] reads back.

use crate::http::free_port;
use crate::netns::NetNs;
use crate::process::{run_bounded, spawn_piped, wait_for, Stopper};
use anyhow::{bail, ensure, Context, Result};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long nginx may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The `log_format` every instance writes: client address, request URI,
/// status, bytes sent and the cache's verdict (`-` outside a cache).
const LOG_FORMAT: &str = "log_format oscontent_test \
     '$remote_addr $request_uri $status $body_bytes_sent $upstream_cache_status';";

/// One request nginx answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NginxRequest {
    pub client: String,
    pub path: String,
    pub status: u16,
    pub bytes: u64,
    /// `HIT`, `MISS`, `EXPIRED`... or `-`.
    pub cache: String,
}

/// A running nginx, stopped on drop.
#[derive(Debug)]
pub struct Nginx {
    pub addr: SocketAddr,
    pub url: String,
    access_log: PathBuf,
    child: Stopper,
}

impl Nginx {
    /// Starts nginx on loopback with `http_block` inside its `http {}`.
    /// `http_block` must `listen` on `127.0.0.1:PORT` (PORT is replaced by a
    /// free port) and may use `PREFIX` for paths of its own (replaced by
    /// `dir`).
    pub fn start(dir: &Path, http_block: &str) -> Result<Nginx> {
        ensure!(
            http_block.contains("listen 127.0.0.1:PORT"),
            "the nginx config must listen on 127.0.0.1:PORT"
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let block = http_block.replace("PORT", &addr.port().to_string());
        Self::launch(dir, &block, 1, Command::new("nginx"), addr, || {
            TcpStream::connect(addr).is_ok()
        })
    }

    /// Starts nginx inside `ns` with `workers` worker processes, listening
    /// on `addr` (an address of `ns`) as `http_block` says (`PREFIX` as in
    /// [`Nginx::start`]). Ready once a request from inside `ns` is answered.
    pub fn start_in(
        ns: &NetNs,
        dir: &Path,
        http_block: &str,
        addr: SocketAddr,
        workers: u32,
    ) -> Result<Nginx> {
        let url = format!("http://{addr}/");
        Self::launch(dir, http_block, workers, ns.exec("nginx"), addr, || {
            let mut curl = ns.exec("curl");
            curl.args(["-s", "-o", "/dev/null", "--max-time", "1", &url]);
            run_bounded(&mut curl, Duration::from_secs(5)).is_ok_and(|o| o.status.success())
        })
    }

    fn launch(
        dir: &Path,
        http_block: &str,
        workers: u32,
        mut cmd: Command,
        addr: SocketAddr,
        mut ready: impl FnMut() -> bool,
    ) -> Result<Nginx> {
        std::fs::create_dir_all(dir.join("tmp"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let prefix = dir
            .to_str()
            .with_context(|| format!("{} is not UTF-8", dir.display()))?;
        let access_log = dir.join("access.log");
        let conf = format!(
            "daemon off;\nworker_processes {workers};\npid {prefix}/nginx.pid;\n\
             error_log {prefix}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n{LOG_FORMAT}\naccess_log {prefix}/access.log oscontent_test;\n\
             client_body_temp_path {prefix}/tmp/body;\nproxy_temp_path {prefix}/tmp/proxy;\n\
             fastcgi_temp_path {prefix}/tmp/fastcgi;\nuwsgi_temp_path {prefix}/tmp/uwsgi;\n\
             scgi_temp_path {prefix}/tmp/scgi;\n{}\n}}\n",
            http_block.replace("PREFIX", prefix)
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)
            .with_context(|| format!("writing {}", conf_path.display()))?;
        cmd.arg("-p").arg(dir).arg("-c").arg(&conf_path);
        let (child, what) = spawn_piped(&mut cmd)
            .context("starting nginx (Debian package `nginx`, see xtask/src/deps.rs)")?;
        let mut child = Stopper::new(child, &what);
        let up = wait_for(START_TIMEOUT, Duration::from_millis(50), || {
            ready().then_some(())
        });
        if up.is_none() {
            let status = child.try_wait()?;
            let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
            bail!("nginx did not answer on {addr} within {START_TIMEOUT:?} (exit: {status:?}):\n{log}");
        }
        Ok(Nginx {
            addr,
            url: format!("http://{addr}"),
            access_log,
            child,
        })
    }

    /// The master's pid (its workers are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every request logged so far, in order.
    pub fn requests(&self) -> Result<Vec<NginxRequest>> {
        let text = std::fs::read_to_string(&self.access_log)
            .with_context(|| format!("reading {}", self.access_log.display()))?;
        text.lines().map(parse_line).collect()
    }
}

fn parse_line(line: &str) -> Result<NginxRequest> {
    let f: Vec<&str> = line.split(' ').collect();
    let [client, path, status, bytes, cache] = f.as_slice() else {
        bail!("not a line of the test log format: {line:?}");
    };
    Ok(NginxRequest {
        client: (*client).to_owned(),
        path: (*path).to_owned(),
        status: status
            .parse()
            .with_context(|| format!("status in {line:?}"))?,
        bytes: bytes
            .parse()
            .with_context(|| format!("bytes in {line:?}"))?,
        cache: (*cache).to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines() {
        let ok = parse_line("10.0.0.2 /objects/ab/cd.filez 200 512 HIT").unwrap();
        assert_eq!(
            ok,
            NginxRequest {
                client: "10.0.0.2".into(),
                path: "/objects/ab/cd.filez".into(),
                status: 200,
                bytes: 512,
                cache: "HIT".into()
            }
        );
        assert_eq!(parse_line("::1 /config 404 0 -").unwrap().cache, "-");
        for bad in [
            "",
            "/x 200 1 -",
            "c /x two 1 -",
            "c /x 200 -1 -",
            "c /x 200 1 - extra",
        ] {
            assert!(parse_line(bad).is_err(), "{bad:?}");
        }
    }
}
