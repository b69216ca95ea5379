//! Bounded child processes and bounded waits: every wait has a deadline and
//! every read a size limit.

mod child;

pub use child::{run_logged, tail, Stopper};

use anyhow::{bail, ensure, Context, Result};
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Bound on bytes read from one HTTP response or one child's output.
pub const MAX_READ: usize = 256 << 20;

/// Removes proxy settings so that nothing but 127.0.0.1 is ever contacted.
pub fn local_only(cmd: &mut Command) -> &mut Command {
    for v in [
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("no_proxy", "*")
        .env("NO_PROXY", "*")
        .env("LC_ALL", "C.UTF-8")
}

/// Reads at most `max` bytes of `r` on a thread of its own, then drains the
/// rest so the child never blocks on a full pipe.
fn drain<R: Read + Send + 'static>(mut r: R, max: u64) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut r).take(max).read_to_end(&mut buf);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
        buf
    })
}

/// Runs `cmd` to completion within `timeout`; kills it and fails after.
/// Keeps at most [`MAX_READ`] bytes of stdout and of stderr.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    run_capped(cmd, timeout, MAX_READ as u64, MAX_READ as u64)
}

/// Runs `cmd` to completion within `timeout`, keeping at most `max_stdout`
/// bytes of its stdout and `max_stderr` of its stderr (the rest is read and
/// dropped); kills it and fails after the timeout, with what it printed.
pub fn run_capped(
    cmd: &mut Command,
    timeout: Duration,
    max_stdout: u64,
    max_stderr: u64,
) -> Result<Output> {
    let (mut child, what) = spawn_piped(cmd)?;
    let out = drain(child.stdout.take().context("piped stdout")?, max_stdout);
    let err = drain(child.stderr.take().context("piped stderr")?, max_stderr);
    let status = poll(timeout, || child.try_wait())?;
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "{what} did not finish within {timeout:?}; killed.\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Output of a command that must succeed; the error carries its stderr.
pub fn check_output(cmd: &mut Command, timeout: Duration) -> Result<String> {
    let what = format!("{cmd:?}");
    let o = run_bounded(cmd, timeout)?;
    ensure!(
        o.status.success(),
        "{what} failed ({}):\nstderr:\n{}\nstdout:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Strips ANSI colour escapes from log text.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `f` every 10 ms until it returns `Some`: bounded in time and in
/// the number of polls.
pub fn poll<T, E>(
    timeout: Duration,
    mut f: impl FnMut() -> std::result::Result<Option<T>, E>,
) -> std::result::Result<Option<T>, E> {
    let interval = Duration::from_millis(10);
    let deadline = Instant::now() + timeout;
    let max_polls = timeout.as_millis() / interval.as_millis() + 2;
    for _ in 0..max_polls {
        if let Some(v) = f()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(interval);
    }
    f()
}

/// Polls `f` every `interval` until it returns `Some`, at most `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    interval: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let max_polls = (timeout.as_millis() / interval.as_millis().max(1)) as usize + 2;
    for _ in 0..max_polls {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(interval);
    }
    None
}

/// Spawns `cmd` with no stdin and both outputs piped; returns the child and
/// the command's description for error messages.
pub fn spawn_piped(cmd: &mut Command) -> Result<(std::process::Child, String)> {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {what}"))?;
    Ok((child, what))
}
