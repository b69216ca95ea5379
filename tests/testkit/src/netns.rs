//! Network namespaces a test or benchmark creates, joined by veth pairs or
//! through a bridge, with optional `tc netem` shaping, and the commands it
//! runs inside them (`ip netns exec`). Everything is removed on drop,
//! panics included; namespaces a killed run left behind are removed the
//! next time (their names carry the creating process's pid).

use crate::process::{check_output, local_only};
use anyhow::{Context, Result};
use std::ffi::OsStr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Bound on one `ip` or `tc` invocation.
const IP_TIMEOUT: Duration = Duration::from_secs(20);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// `ip ARGS`, bounded; its stdout.
pub fn ip(args: &[&str]) -> Result<String> {
    check_output(Command::new("ip").args(args), IP_TIMEOUT)
}

/// Removes namespaces (and what runs in them) starting with `prefix` whose
/// creating process is gone.
fn remove_stale(prefix: &str) {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(prefix) else {
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

/// SIGKILLs every process in a namespace.
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

/// One network namespace, with its loopback up; deleted on drop, with
/// every process still in it.
#[derive(Debug)]
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates `PREFIX<pid>-<n>-<tag>`, first removing namespaces of this
    /// prefix that dead runs left. Needs root (or CAP_SYS_ADMIN and
    /// CAP_NET_ADMIN), and says so when it fails.
    pub fn create(prefix: &str, tag: &str) -> Result<NetNs> {
        static CLEANED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        {
            let mut cleaned = CLEANED.lock().unwrap_or_else(|e| e.into_inner());
            if !cleaned.iter().any(|p| p == prefix) {
                remove_stale(prefix);
                cleaned.push(prefix.to_owned());
            }
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}{}-{n}-{tag}", std::process::id());
        ip(&["netns", "add", &name]).with_context(|| {
            format!("cannot create network namespace {name} (needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)")
        })?;
        let ns = NetNs { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])
            .with_context(|| format!("bringing up lo in {}", ns.name))?;
        Ok(ns)
    }

    /// `ip netns exec NAME PROGRAM`, with no proxy in the environment.
    pub fn exec(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        local_only(&mut c);
        c
    }

    /// `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Adds a bridge `dev`, up, for [`attach`] to plug into.
    pub fn add_bridge(&self, dev: &str) -> Result<()> {
        self.ip(&["link", "add", dev, "type", "bridge"])?;
        self.ip(&["link", "set", dev, "up"])?;
        Ok(())
    }

    /// Shapes what `dev` sends inside this namespace: at most `rate` (tc
    /// syntax, e.g. `100mbit`) through a token bucket, and, if asked, a
    /// one-way `delay`, which needs `tc netem` (the `sch_netem` module,
    /// which some kernels lack: the error then says so).
    pub fn shape(&self, dev: &str, rate: Option<&str>, delay: Option<Duration>) -> Result<()> {
        let delay = delay
            .filter(|d| !d.is_zero())
            .map(|d| format!("{}us", d.as_micros()));
        let mut args = vec!["qdisc", "replace", "dev", dev, "root"];
        match (&delay, rate) {
            (None, None) => return Ok(()),
            (None, Some(r)) => {
                args.extend(["tbf", "rate", r, "burst", "256kb", "latency", "100ms"])
            }
            (Some(d), r) => {
                args.extend(["netem", "limit", "100000", "delay", d]);
                if let Some(r) = r {
                    args.extend(["rate", r]);
                }
            }
        }
        check_output(self.exec("tc").args(&args), IP_TIMEOUT).with_context(|| {
            let netem = if delay.is_some() {
                " (a delay needs tc netem: is the sch_netem module in this kernel?)"
            } else {
                ""
            };
            format!("shaping {dev} in {}{netem}", self.name)
        })?;
        Ok(())
    }

    /// Bytes sent and received by `dev`, from this namespace's
    /// `/proc/net/dev`.
    pub fn counters(&self, dev: &str) -> Result<(u64, u64)> {
        let text = check_output(self.exec("cat").arg("/proc/net/dev"), IP_TIMEOUT)?;
        parse_net_dev(&text, dev)
            .with_context(|| format!("no {dev} in {}'s /proc/net/dev", self.name))
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

/// (transmitted, received) bytes of `dev` in a `/proc/net/dev` listing.
pub fn parse_net_dev(text: &str, dev: &str) -> Option<(u64, u64)> {
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != dev {
            return None;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        // Receive: bytes packets errs drop fifo frame compressed multicast;
        // then transmit: bytes ...
        Some((*f.get(8)?, *f.first()?))
    })
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
        ns.ip(&["addr", "add", addr, "dev", dev])?;
        ns.ip(&["link", "set", dev, "up"])?;
    }
    Ok(())
}

/// Plugs `member` into `bridge` of `hub` through a veth pair: `port` is the
/// hub-side name (unique in the hub, at most 15 bytes), `dev` the name in
/// `member`, `addr` its `ADDR/PREFIX`.
pub fn attach(
    hub: &NetNs,
    bridge: &str,
    port: &str,
    member: &NetNs,
    dev: &str,
    addr: &str,
) -> Result<()> {
    ip(&[
        "link",
        "add",
        port,
        "netns",
        &hub.name,
        "type",
        "veth",
        "peer",
        "name",
        dev,
        "netns",
        &member.name,
    ])?;
    hub.ip(&["link", "set", port, "master", bridge])?;
    hub.ip(&["link", "set", port, "up"])?;
    member.ip(&["addr", "add", addr, "dev", dev])?;
    member.ip(&["link", "set", dev, "up"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_net_dev;

    #[test]
    fn net_dev_counters() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
 lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  \
 eth0: 5000 40 0 0 0 0 0 0 777000 600 0 0 0 0 0 0\n";
        assert_eq!(parse_net_dev(text, "eth0"), Some((777000, 5000)));
        assert_eq!(parse_net_dev(text, "lo"), Some((1000, 1000)));
        assert_eq!(parse_net_dev(text, "eth1"), None);
        assert_eq!(parse_net_dev("eth0: 1 2", "eth0"), None);
    }
}
