//! The one place that starts an `oscontent-server` process and reads the
//! `listening on http://ADDR` line it prints first on stdout: the test
//! harness, the demo, the benchmarks and the network-namespace suites all
//! go through [`ServerProcess`], so the line's format has a single parser.

use anyhow::{anyhow, bail, Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::http1;
use crate::process::{poll, strip_ansi, MAX_READ};

/// What the server prints, alone on its first stdout line, once it listens.
const LISTENING: &str = "listening on ";

/// How long a stopped server may take to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A spawned `oscontent-server` that announced its address: its child, its
/// stderr (kept in memory, at most [`MAX_READ`] bytes) and the URL it
/// printed. Stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// `http://ADDR`, as printed.
    pub url: String,
    pub addr: SocketAddr,
}

/// The URL and address in a `listening on http://ADDR` line, if it is one.
pub fn parse_listening(line: &str) -> Option<(String, SocketAddr)> {
    let url = line.trim().strip_prefix(LISTENING)?.trim();
    let addr = url.strip_prefix("http://")?.parse().ok()?;
    Some((url.to_owned(), addr))
}

/// Whether a server's stdout says it started listening (for tests that
/// expect it to refuse to start).
pub fn announced_listening(stdout: &[u8]) -> bool {
    String::from_utf8_lossy(stdout).contains(LISTENING.trim_end())
}

impl ServerProcess {
    /// Spawns `cmd` (the server, or a wrapper such as `ip netns exec` or
    /// `nice` that runs it), and waits at most `timeout` for its
    /// `listening on` line. Fails, with the server's stderr, if the line
    /// does not come or is not an address; the process is then stopped.
    pub fn spawn(cmd: &mut Command, timeout: Duration) -> Result<Self> {
        Self::spawn_with_log(cmd, timeout, None)
    }

    /// [`ServerProcess::spawn`], also copying the server's stderr into `log`
    /// as it comes (for a human to read later).
    pub fn spawn_with_log(cmd: &mut Command, timeout: Duration, log: Option<File>) -> Result<Self> {
        let (mut child, what) = crate::process::spawn_piped(cmd)?;
        let stderr = keep_stderr(&mut child, log)?;
        let first_line = first_stdout_line(&mut child)?;
        let mut proc = ServerProcess {
            child: Some(child),
            stderr,
            url: String::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let Ok(line) = first_line.recv_timeout(timeout) else {
            let status = poll(Duration::from_secs(2), || proc.try_wait())
                .ok()
                .flatten();
            bail!(
                "{what} did not print its address within {timeout:?} (exit: {status:?}).\nstderr:\n{}",
                proc.stderr()
            );
        };
        if !line.starts_with(LISTENING) {
            bail!(
                "unexpected first stdout line {line:?}; stderr:\n{}",
                proc.stderr()
            );
        }
        let (url, addr) = parse_listening(&line)
            .ok_or_else(|| anyhow!("cannot parse the address in {line:?}"))?;
        proc.url = url;
        proc.addr = addr;
        Ok(proc)
    }

    /// The process id, until the process is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the server wrote to stderr so far (colours stripped).
    pub fn stderr(&self) -> String {
        let bytes = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        strip_ansi(&String::from_utf8_lossy(&bytes))
    }

    /// Waits until `/readyz` answers 200, at most `timeout`; fails if the
    /// server exits first.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let client = http1();
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        for _ in 0..10_000 {
            if let Some(s) = self.try_wait()? {
                bail!(
                    "server exited ({s}) before becoming ready.\nstderr:\n{}",
                    self.stderr()
                );
            }
            match client
                .get(format!("{}/readyz", self.url))
                .timeout(Duration::from_secs(5))
                .send()
            {
                Ok(r) if r.status() == 200 => return Ok(()),
                Ok(r) => last = format!("HTTP {}", r.status()),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "server not ready within {timeout:?} (last /readyz: {last}).\nstderr:\n{}",
            self.stderr()
        )
    }

    /// The exit status, if the process has exited (`None` while it runs or
    /// after [`ServerProcess::stop`]).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => Ok(None),
        }
    }

    /// Blocks until the process exits (for a server meant to run until
    /// Ctrl-C).
    pub fn wait(&mut self) -> Result<ExitStatus> {
        let child = self.child.as_mut().context("already stopped")?;
        Ok(child.wait()?)
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: rustix::process::Signal) -> Result<()> {
        let pid = self.pid().context("already stopped")?;
        let pid =
            rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| anyhow!("bad pid {pid}"))?;
        rustix::process::kill_process(pid, sig).with_context(|| format!("signalling {pid:?}"))?;
        Ok(())
    }

    /// Waits at most `timeout` until stderr has a line containing all of
    /// `needles`; returns that line.
    pub fn wait_stderr(&self, needles: &[&str], timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let stderr = self.stderr();
            if let Some(l) = stderr
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return Ok(l.to_owned());
            }
            if Instant::now() >= deadline {
                bail!("no stderr line with {needles:?} within {timeout:?}; stderr:\n{stderr}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within a grace period;
    /// reaps the process. Does nothing the second time.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let exited = poll(STOP_GRACE, || child.try_wait());
            if !matches!(exited, Ok(Some(_))) {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Collects the child's stderr in memory (bounded) and, if given, in `log`,
/// on a thread of its own so the server never blocks on a full pipe.
fn keep_stderr(child: &mut Child, mut log: Option<File>) -> Result<Arc<Mutex<Vec<u8>>>> {
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let sink = stderr.clone();
    let mut err = child.stderr.take().context("the server's stderr")?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match err.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some(f) = log.as_mut() {
                        let _ = f.write_all(&buf[..n]);
                    }
                    let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                    if s.len() < MAX_READ {
                        s.extend_from_slice(&buf[..n]);
                    }
                }
            }
        }
    });
    Ok(stderr)
}

/// The child's first stdout line, sent when it comes; the rest of stdout is
/// drained so the server never blocks on it.
fn first_stdout_line(child: &mut Child) -> Result<mpsc::Receiver<String>> {
    let (tx, rx) = mpsc::channel::<String>();
    let out = child.stdout.take().context("the server's stdout")?;
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        if let Some(Ok(first)) = lines.next() {
            let _ = tx.send(first);
        }
        for _ in lines.by_ref() {}
    });
    Ok(rx)
}
