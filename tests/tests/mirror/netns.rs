//! Network namespaces the test creates, joined by veth pairs, and the
//! processes it runs inside them (`ip netns exec`). Everything is removed
//! on drop, panics included; namespaces a killed test run left behind are
//! removed the next time (their names carry the creating process's pid).

use anyhow::{bail, Context, Result};
use oscontent_testkit::*;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every namespace this suite creates starts with this.
const PREFIX: &str = "oscm-";
/// Bound on one `ip` invocation.
const IP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a stopped process gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Result<String> {
    check_output(Command::new("ip").args(args), IP_TIMEOUT)
}

/// Removes namespaces (and what runs in them) that earlier runs of this
/// suite left: those whose creating process is gone.
fn remove_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("removing network namespace {name} left by an earlier run");
            kill_all_in(name);
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// SIGKILLs every process in a namespace this suite made.
fn kill_all_in(name: &str) {
    if let Ok(pids) = ip(&["netns", "pids", name]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
}

/// One network namespace, with its loopback up.
#[derive(Debug)]
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates a namespace. Fails the test, saying why, if that is not
    /// possible (it needs root): this suite never skips.
    pub fn create(tag: &str) -> NetNs {
        static CLEANED: std::sync::Once = std::sync::Once::new();
        CLEANED.call_once(remove_stale);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}-{tag}", std::process::id());
        if let Err(e) = ip(&["netns", "add", &name]) {
            panic!(
                "cannot create network namespace {name} (this suite needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN; it does not skip): {e:#}"
            );
        }
        let ns = NetNs { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])
            .unwrap_or_else(|e| panic!("bringing up lo in {}: {e:#}", ns.name));
        ns
    }

    /// `ip netns exec NAME PROGRAM`, with no proxy in the environment.
    pub fn exec(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        local_only(&mut c);
        c
    }

    /// `curl` inside the namespace: the body, or an error with curl's.
    pub fn http_get(&self, url: &str) -> Result<Vec<u8>> {
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
    pub fn wait_http(&self, url: &str, timeout: Duration) -> Result<()> {
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

impl Drop for NetNs {
    fn drop(&mut self) {
        kill_all_in(&self.name);
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("removing network namespace {}: {e:#}", self.name);
        }
    }
}

/// Joins two namespaces with a veth pair: `a_addr` and `b_addr` are
/// `ADDR/PREFIX`. The pair goes away with the namespaces.
pub fn link(a: &NetNs, a_addr: &str, b: &NetNs, b_addr: &str) -> Result<()> {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Interface names are at most 15 bytes.
    let (ia, ib) = (
        format!("om{:x}x{n}a", std::process::id()),
        format!("om{:x}x{n}b", std::process::id()),
    );
    ip(&[
        "link", "add", &ia, "netns", &a.name, "type", "veth", "peer", "name", &ib, "netns", &b.name,
    ])?;
    for (ns, dev, addr) in [(a, &ia, a_addr), (b, &ib, b_addr)] {
        ip(&["-n", &ns.name, "addr", "add", addr, "dev", dev])?;
        ip(&["-n", &ns.name, "link", "set", dev, "up"])?;
    }
    Ok(())
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
