//! Long-lived children: a [`Stopper`] ends its child on drop (SIGTERM, a
//! bounded grace, SIGKILL), and [`run_logged`] runs a command into a log
//! file. Every wait polls a deadline and an abort hook, so a failed or
//! interrupted run (xtask's Ctrl-C flag) leaves no process behind.

use anyhow::{bail, ensure, Context, Result};
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion with stdout and stderr appended to `log`,
/// polling so that a `timeout`, or `abort` returning true (a benchmark's
/// Ctrl-C flag), kills it. Returns how long it
/// ran; fails (quoting the log's tail) on a non-zero exit.
pub fn run_logged(
    cmd: &mut Command,
    log: &Path,
    timeout: Duration,
    abort: fn() -> bool,
) -> Result<Duration> {
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
    let mut child = Stopper::new(child, &what).abort_when(abort);
    let status = child.wait_bounded(timeout)?;
    let took = start.elapsed();
    if !status.success() {
        ensure!(!abort(), "interrupted while running {what}");
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
    /// Polled while waiting: true stops the child and the wait fails.
    abort: fn() -> bool,
}

impl Stopper {
    pub fn new(child: Child, what: &str) -> Self {
        Stopper {
            child: Some(child),
            what: what.to_owned(),
            grace: Duration::from_secs(30),
            abort: || false,
        }
    }

    /// Also stop waiting (and stop the child) once `abort` returns true.
    pub fn abort_when(mut self, abort: fn() -> bool) -> Self {
        self.abort = abort;
        self
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
            if (self.abort)() {
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
            "{} ignored SIGTERM for {:?}; killing it",
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
