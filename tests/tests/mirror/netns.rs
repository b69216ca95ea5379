//! The suite's network namespaces (the testkit's `netns`, with this suite's
//! prefix and curl probes) and the processes it runs inside them, stopped
//! on drop.

use anyhow::{bail, Context, Result};
pub use oscontent_testkit::netns::{link, NetNs};
use oscontent_testkit::*;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every namespace this suite creates starts with this.
const PREFIX: &str = "oscm-";
/// How long a stopped process gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What this suite does inside a namespace: HTTP through curl.
pub trait SuiteNs: Sized {
    fn http_get(&self, url: &str) -> Result<Vec<u8>>;
    fn wait_http(&self, url: &str, timeout: Duration) -> Result<()>;
}

/// Creates one of this suite's namespaces. Fails the test, saying why, if
/// that is not possible (it needs root): this suite never skips.
pub fn suite_ns(tag: &str) -> NetNs {
    NetNs::create(PREFIX, tag).unwrap_or_else(|e| panic!("{e:#} (this suite does not skip)"))
}

impl SuiteNs for NetNs {
    /// `curl` inside the namespace: the body, or an error with curl's.
    fn http_get(&self, url: &str) -> Result<Vec<u8>> {
        let o = run_bounded(
            self.exec("curl")
                .args(["-sS", "--fail", "--max-time", "10", url]),
            Duration::from_secs(20),
        )?;
        if !o.status.success() {
            bail!(
                "GET {url} from {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Ok(o.stdout)
    }

    /// Polls `url` until it answers 2xx.
    fn wait_http(&self, url: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            match self.http_get(url) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("{url} did not answer within {timeout:?}: {last:?}")
    }
}

/// A long-running process in a namespace: stderr collected, stdout lines
/// available, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Proc {
    pub what: String,
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Result<Proc> {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1")
            .spawn()
            .with_context(|| format!("spawning {what}"))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = sink.lock().unwrap();
                if s.len() < MAX_READ {
                    s.extend_from_slice(&buf[..n]);
                }
            }
        });
        let out = child.stdout.take().expect("piped");
        // Drained so the child never blocks on a full pipe.
        std::thread::spawn(
            move || {
                for _ in BufReader::new(out).lines().map_while(|l| l.ok()) {}
            },
        );
        Ok(Proc {
            what,
            child: Some(child),
            stderr,
        })
    }

    pub fn stderr(&self) -> String {
        strip_ansi(&String::from_utf8_lossy(&self.stderr.lock().unwrap()))
    }

    /// Waits until stderr has a line containing all of `needles`.
    pub fn wait_stderr(&self, needles: &[&str], timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self
                .stderr()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return Ok(l.to_owned());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{}: no stderr line with {needles:?} within {timeout:?}; stderr:\n{}",
                    self.what,
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, sig: rustix::process::Signal) -> Result<()> {
        let pid = self.child.as_ref().context("already stopped")?.id();
        let pid = rustix::process::Pid::from_raw(pid as i32).context("pid")?;
        rustix::process::kill_process(pid, sig).context("signalling")?;
        Ok(())
    }

    /// SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if poll(STOP_GRACE, || child.try_wait())
            .ok()
            .flatten()
            .is_none()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}
