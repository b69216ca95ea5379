//! One `oscontent-server serve` under test, and its lifecycle.

use anyhow::{anyhow, bail, ensure, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::access_log::{read_access_log, AccessEntry};
use crate::http::{fetch, http1, raw_request, HttpResponse, RawResponse};
use crate::metrics::Metrics;
use crate::process::poll;

pub mod builder;
pub mod launch;

use launch::ServerProcess;

/// How long a server may take to print its address and become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Several times the server's access log linger (5 ms between batches).
const LOG_SETTLE: Duration = Duration::from_millis(25);

/// One `oscontent-server serve` under test: own state dir and access log,
/// stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Server {
    /// Declared first so the process stops before `_tmp` is removed.
    proc: ServerProcess,
    status: Option<ExitStatus>,
    pub url: String,
    pub addr: SocketAddr,
    pub state_dir: PathBuf,
    pub access_log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// `url` + `path`.
    pub fn url_for(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// What the server wrote to stderr so far (colours stripped).
    pub fn stderr(&self) -> String {
        self.proc.stderr()
    }

    /// Waits until `/readyz` answers 200, at most `timeout`; fails if the
    /// server exits first.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        self.proc.wait_ready(timeout)
    }

    fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let s = self.proc.try_wait()?;
        self.status = s;
        Ok(s)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.try_status(), Ok(None))
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn sigterm(&mut self) -> Result<()> {
        self.signal(rustix::process::Signal::TERM)
    }

    /// Sends SIGHUP (check the source now).
    pub fn sighup(&mut self) -> Result<()> {
        self.signal(rustix::process::Signal::HUP)
    }

    /// SIGKILL (no cleanup at all), then reaps the process.
    pub fn sigkill(&mut self) -> Result<ExitStatus> {
        self.signal(rustix::process::Signal::KILL)?;
        self.wait_exit(Duration::from_secs(10))?
            .ok_or_else(|| anyhow!("server still running 10 s after SIGKILL"))
    }

    /// Lines of stderr (colours stripped) that contain `needle`.
    pub fn stderr_lines(&self, needle: &str) -> Vec<String> {
        self.stderr()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until stderr has at least `n` lines containing `needle`,
    /// polling every 10 ms for at most `timeout`; returns those lines.
    /// Fails if the server exits first.
    pub fn wait_stderr_lines(
        &mut self,
        needle: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let found = poll(timeout, || -> Result<Option<Vec<String>>> {
            let lines = self.stderr_lines(needle);
            if lines.len() >= n {
                return Ok(Some(lines));
            }
            if let Some(s) = self.try_status()? {
                bail!(
                    "server exited ({s}) before logging {n} line(s) with {needle:?}.\nstderr:\n{}",
                    self.stderr()
                );
            }
            Ok(None)
        })?;
        found.ok_or_else(|| {
            anyhow!(
                "no {n} line(s) with {needle:?} on stderr within {timeout:?}.\nstderr:\n{}",
                self.stderr()
            )
        })
    }

    fn signal(&mut self, sig: rustix::process::Signal) -> Result<()> {
        if self.try_status()?.is_some() {
            return Ok(());
        }
        self.proc.signal(sig)
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        poll(timeout, || self.try_status())
    }

    /// SIGTERM, then the exit status (SIGKILL and an error after `timeout`).
    pub fn stop(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.sigterm()?;
        if let Some(s) = self.wait_exit(timeout)? {
            return Ok(s);
        }
        self.signal(rustix::process::Signal::KILL)?;
        let _ = self.wait_exit(Duration::from_secs(10));
        bail!(
            "server did not exit within {timeout:?} of SIGTERM; killed.\nstderr:\n{}",
            self.stderr()
        )
    }

    /// Every access-log line so far. A trailing partial line is left out.
    /// The server writes its log in batches a few milliseconds apart
    /// (`server/src/listen/access_log.rs`), so this first waits until the
    /// file stopped growing for [`LOG_SETTLE`]: the lines of requests
    /// answered before the call are then in it.
    pub fn access_log(&self) -> Result<Vec<AccessEntry>> {
        let len = || std::fs::metadata(&self.access_log).map(|m| m.len()).ok();
        let mut last = len();
        // Bounded: a server still busy gets ~2 s, then is read as it is.
        for _ in 0..80 {
            std::thread::sleep(LOG_SETTLE);
            let now = len();
            if now == last {
                break;
            }
            last = now;
        }
        read_access_log(&self.access_log)
    }

    /// `GET /metrics`, parsed.
    pub fn metrics(&self) -> Result<Metrics> {
        let r = http1().get(self.url_for("/metrics")).send()?;
        ensure!(r.status() == 200, "/metrics: HTTP {}", r.status());
        Metrics::parse(&r.text()?)
    }

    /// Polls `/metrics` (every 10 ms, at most `timeout`) until the series
    /// `name` with `labels` is at least `want`; its value then.
    pub fn wait_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        want: f64,
        timeout: Duration,
    ) -> Result<f64> {
        let got = poll(timeout, || {
            let v = self.metrics()?.get(name, labels);
            anyhow::Ok(v.filter(|v| *v >= want))
        })?;
        got.ok_or_else(|| {
            anyhow!(
                "{name}{labels:?} did not reach {want} within {timeout:?}\nserver stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// GET over HTTP/1.1: status, headers and body.
    pub fn get(&self, path: &str) -> Result<HttpResponse> {
        fetch(&http1(), &self.url_for(path), &[])
    }

    /// GET with extra request headers.
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
        fetch(&http1(), &self.url_for(path), headers)
    }

    /// A raw HTTP/1.1 request (nothing normalises the target).
    pub fn raw(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> Result<RawResponse> {
        raw_request(self.addr, method, target, headers)
    }

    /// The served summary's bytes (must be 200).
    pub fn summary_bytes(&self) -> Result<Vec<u8>> {
        let r = self.get("/summary")?;
        ensure!(r.status == 200, "/summary: HTTP {}", r.status);
        Ok(r.body)
    }

    /// The served summary, parsed.
    #[cfg(feature = "format")]
    pub fn summary(&self) -> Result<oscontent_format::Summary> {
        Ok(oscontent_format::parse_summary(&self.summary_bytes()?)?)
    }
}

/// A fresh bare-user repo with the server as remote `os`; pulls `r` (a
/// ref bound into the commit), checks it resolves to `commit`, and fscks.
pub fn pull_and_fsck(
    server: &Server,
    r: &str,
    commit: &str,
) -> (tempfile::TempDir, crate::ostree::Ostree) {
    let tmp = crate::tools::tempdir();
    let repo = crate::ostree::Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    repo.pull(&["os", r]).unwrap_or_else(|e| {
        panic!(
            "stock ostree pull of {r}: {e:#}\nserver stderr:\n{}",
            server.stderr()
        )
    });
    assert_eq!(
        repo.rev_parse(&format!("os:{r}")).unwrap(),
        commit,
        "os:{r} points at the image's commit"
    );
    repo.fsck().unwrap();
    (tmp, repo)
}
