//! Child processes with time bounds: every wait polls for a timeout and
//! for [`super::interrupt`]'s flag, and a [`Stopper`] ends its child on
//! drop, so a failed or interrupted benchmark leaves no process behind.

use super::interrupt::{check_interrupted, interrupted};
use crate::cargo;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion with stdout and stderr appended to `log`,
/// polling so that a `timeout` or a signal kills it. Returns how long it
/// ran; fails (quoting the log's tail) on a non-zero exit.
pub fn run_bounded(cmd: &mut Command, log: &Path, timeout: Duration) -> Result<Duration> {
    let what = format!("{cmd:?}");
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let start = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("spawning {what}"))?;
    let mut child = Stopper::new(child, &what);
    let status = child.wait_bounded(timeout)?;
    let took = start.elapsed();
    if !status.success() {
        check_interrupted()?;
        bail!(
            "{what} failed ({status}); last lines of {}:\n{}",
            log.display(),
            tail(log, 20)
        );
    }
    Ok(took)
}

/// The last `n` lines of a text file (for error messages).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A child process that is stopped on drop: SIGTERM, a bounded wait, then
/// SIGKILL.
#[derive(Debug)]
pub struct Stopper {
    child: Option<Child>,
    what: String,
    /// How long it may take to exit after SIGTERM.
    pub grace: Duration,
}

impl Stopper {
    pub fn new(child: Child, what: &str) -> Self {
        Stopper {
            child: Some(child),
            what: what.to_owned(),
            grace: Duration::from_secs(30),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("child present until drop")
    }

    /// `Some(status)` once it has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let child = self.child.as_mut().expect("child present until drop");
        child
            .try_wait()
            .with_context(|| format!("waiting for {}", self.what))
    }

    /// Waits for it to exit by itself, for at most `timeout` (killing it
    /// then, or on a signal, with an error).
    pub fn wait_bounded(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let mut step = Duration::from_millis(1);
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if interrupted() {
                self.stop();
                bail!("interrupted while waiting for {}", self.what);
            }
            if Instant::now() >= deadline {
                self.stop();
                bail!("{} did not finish within {timeout:?}; killed it", self.what);
            }
            std::thread::sleep(step);
            step = (step * 2).min(Duration::from_millis(20));
        }
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Returns the status if
    /// it exited on its own after SIGTERM.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        let pid = rustix::process::Pid::from_child(child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "xtask: {} ignored SIGTERM for {:?}; killing it",
            self.what, self.grace
        );
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Builds `oscontent-server` with the release profile and returns its
/// path. If the release build fails, warns loudly and falls back to a debug
/// build (whose timings mean little).
pub fn server_binary() -> Result<(PathBuf, &'static str)> {
    match cargo::cargo(&["build", "--release", "--quiet", "-p", "oscontent-server"]) {
        Ok(()) => Ok((
            cargo::target_dir().join("release/oscontent-server"),
            "release",
        )),
        Err(e) => {
            let banner = "!".repeat(78);
            eprintln!("{banner}\n!! WARNING: the release build of oscontent-server failed:\n!!   {e:#}\n!! Falling back to a DEBUG build: its timings are NOT representative.\n{banner}");
            cargo::cargo(&["build", "--quiet", "-p", "oscontent-server"])
                .context("the debug build of oscontent-server failed too")?;
            Ok((cargo::bin_dir().join("oscontent-server"), "debug"))
        }
    }
}

/// The status code of `GET path` (HTTP/1.1, plain), or None on any error.
/// Loopback only; bounded by its timeouts and a 256-byte read.
pub fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let t = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&addr, t).ok()?;
    s.set_read_timeout(Some(t)).ok()?;
    s.set_write_timeout(Some(t)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < 256 {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}
