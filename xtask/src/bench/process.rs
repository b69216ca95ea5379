//! Child processes for benchmarks: the testkit's bounded [`Stopper`] and
//! [`oscontent_testkit::process::run_logged`], wired to
//! [`mod@super::interrupt`]'s flag, so a failed or interrupted benchmark leaves
//! no process behind; and the server binary a benchmark measures.

use super::interrupt::interrupted;
use crate::cargo;
use anyhow::{Context, Result};
use oscontent_testkit::process::{run_logged, Stopper};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

pub use oscontent_testkit::process::tail;

/// Runs `cmd` to completion with stdout and stderr appended to `log`;
/// a `timeout` or Ctrl-C kills it. Returns how long it ran; fails (quoting
/// the log's tail) on a non-zero exit.
pub fn run_bounded(cmd: &mut Command, log: &Path, timeout: Duration) -> Result<Duration> {
    run_logged(cmd, log, timeout, interrupted)
}

/// `child`, stopped on drop or on Ctrl-C.
pub fn stopper(child: Child, what: &str) -> Stopper {
    Stopper::new(child, what).abort_when(interrupted)
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
