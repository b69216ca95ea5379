//! What one listener admits: the connection caps and timeouts, the
//! admission decision (pure, so it is table-tested), and the process's
//! open-file limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Caps and timeouts of the HTTP listener (`serve`'s flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once, all clients together.
    pub max_connections: usize,
    /// Connections served at once from one client address.
    pub max_per_ip: usize,
    /// Connections beyond `max_connections` kept for `/healthz`, `/readyz`
    /// and `/metrics` only, so probes and scrapes still get an answer when
    /// the cap is full.
    pub probe_reserve: usize,
    /// Of the probe reserve, how many one client address may hold.
    pub probe_reserve_per_ip: usize,
    /// A connection that sends nothing for this long after it was accepted
    /// is closed (hyper's HTTP/1-or-2 detection would wait forever).
    pub first_byte_timeout: Duration,
    /// An HTTP/1.1 request head must arrive whole within this (slowloris);
    /// also how long an HTTP/1.1 keep-alive connection may wait for its next
    /// request, since hyper times the wait for a head from its start.
    pub header_read_timeout: Duration,
    /// A connection on which no request arrived and no response moved for
    /// this long is closed: idle HTTP/2 connections, and readers that
    /// stopped reading.
    pub idle_timeout: Duration,
    /// HTTP/2 PING interval; a peer that does not answer within the same
    /// time is dropped.
    pub h2_keepalive: Duration,
    /// HTTP/2 streams one connection may have open.
    pub h2_max_streams: u32,
    /// Response bytes hyper buffers per HTTP/2 stream for a peer that does
    /// not read (its default, ~400 KiB, times 200 streams pinned ~90 MB per
    /// connection).
    pub h2_send_buffer: usize,
    /// Files streamed at once (objects and delta parts too big to be served
    /// from memory), all clients together; each holds a descriptor and a
    /// chunk in flight (`served::streams`).
    pub max_streamed_files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_per_ip: 64,
            probe_reserve: 32,
            probe_reserve_per_ip: 2,
            first_byte_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            h2_keepalive: Duration::from_secs(30),
            h2_max_streams: 16,
            h2_send_buffer: 32 * 1024,
            max_streamed_files: 1024,
        }
    }
}

/// How a new connection is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Served normally.
    Normal,
    /// Over the cap, inside the probe reserve: only `/healthz`, `/readyz`
    /// and `/metrics` are answered, one request a connection.
    ProbeOnly,
    /// Closed at once.
    Refused(Refusal),
}

/// Why a connection was refused (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` plus the probe reserve are in use.
    Total,
    /// The client already holds its share.
    PerIp,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Total => "total",
            Refusal::PerIp => "per_ip",
        }
    }
}

/// Open connections, in all and by client address.
#[derive(Debug, Default)]
struct Counts {
    normal: usize,
    reserve: usize,
    normal_by_ip: HashMap<IpAddr, usize>,
    reserve_by_ip: HashMap<IpAddr, usize>,
}

/// The admission decision for one more connection from `ip`. Past either
/// cap, the probe reserve: a kubelet probes from its node's address, which
/// the node's own processes (its update among them) share, so a full
/// per-address share must not fail the probes any more than a full server.
fn decide(l: &Limits, c: &Counts, ip: IpAddr) -> Admission {
    let by_ip = |m: &HashMap<IpAddr, usize>| m.get(&ip).copied().unwrap_or(0);
    let total_full = c.normal >= l.max_connections;
    if !total_full && by_ip(&c.normal_by_ip) < l.max_per_ip {
        return Admission::Normal;
    }
    let over = if total_full {
        Refusal::Total
    } else {
        Refusal::PerIp
    };
    if c.reserve >= l.probe_reserve {
        return Admission::Refused(over);
    }
    if by_ip(&c.reserve_by_ip) >= l.probe_reserve_per_ip {
        return Admission::Refused(Refusal::PerIp);
    }
    Admission::ProbeOnly
}

/// Counts open connections and decides on new ones.
#[derive(Debug, Clone)]
pub struct Tracker {
    limits: Arc<Limits>,
    counts: Arc<Mutex<Counts>>,
}

/// One admitted connection; its count is released when this is dropped.
#[derive(Debug)]
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
    pub admission: Admission,
}

impl Tracker {
    pub fn new(limits: Arc<Limits>) -> Self {
        Self {
            limits,
            counts: Arc::default(),
        }
    }

    /// Admits a connection from `ip`, or says why not.
    pub fn admit(&self, ip: IpAddr) -> Result<Slot, Refusal> {
        // A panic elsewhere cannot leave the counts half-updated: every
        // update below is a single step.
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let admission = decide(&self.limits, &c, ip);
        match admission {
            Admission::Normal => {
                c.normal += 1;
                *c.normal_by_ip.entry(ip).or_default() += 1;
            }
            Admission::ProbeOnly => {
                c.reserve += 1;
                *c.reserve_by_ip.entry(ip).or_default() += 1;
            }
            Admission::Refused(r) => return Err(r),
        }
        Ok(Slot {
            counts: self.counts.clone(),
            ip,
            admission,
        })
    }

    /// Connections open now (normal, probe reserve).
    pub fn open(&self) -> (usize, usize) {
        let c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        (c.normal, c.reserve)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let c = &mut *c;
        let (total, by_ip) = match self.admission {
            Admission::ProbeOnly => (&mut c.reserve, &mut c.reserve_by_ip),
            _ => (&mut c.normal, &mut c.normal_by_ip),
        };
        *total = total.saturating_sub(1);
        // Entries go when they reach zero, so the map holds only clients
        // with open connections (it cannot grow with every address seen).
        if let Some(n) = by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&self.ip);
            }
        }
    }
}

/// File descriptors a listener needs beyond its connections and streamed
/// files: the state dir, logs, the blocking pool's opens, publication.
pub const FD_HEADROOM: u64 = 512;
/// The most object fan-out directories held open across generations
/// (`served::objects`: 256 a root): one generation of a few roots, and
/// the next while it takes over. Past the budget, objects are opened by
/// their whole path.
pub const FANOUT_FDS: u64 = 1024;

/// The fan-out directories' share of `nofile`: [`FANOUT_FDS`], or an
/// eighth of what the headroom leaves when the limit is low.
pub fn fanout_fds(nofile: u64) -> u64 {
    FANOUT_FDS.min(nofile.saturating_sub(FD_HEADROOM) / 8)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the default soft
/// limit, often 1024, is what let 1,100 half-sent requests stop the server
/// answering at all), then returns the limit in force.
pub fn raise_nofile() -> std::io::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        setrlimit(Resource::Nofile, lim)?;
    }
    // `None` is "unlimited"; the kernel's nr_open still applies, so treat
    // it as large rather than infinite.
    Ok(getrlimit(Resource::Nofile).current.unwrap_or(1 << 20))
}

/// The caps that fit `nofile` open files, each connection and each
/// streamed file holding one: a configured cap that cannot be met is
/// lowered (and said so) rather than failing at accept or at open.
/// Streamed files get at most a quarter of what there is.
pub fn fit_to_nofile(mut l: Limits, nofile: u64) -> Limits {
    let usable = nofile.saturating_sub(FD_HEADROOM + fanout_fds(nofile));
    let usable = usize::try_from(usable).unwrap_or(usize::MAX);
    if l.max_connections + l.probe_reserve + l.max_streamed_files > usable {
        let files = l.max_streamed_files.min(usable / 4).max(1);
        let left = usable.saturating_sub(files);
        let reserve = l.probe_reserve.min(left / 8);
        let max = l.max_connections.min(left.saturating_sub(reserve)).max(1);
        tracing::warn!(
            nofile,
            requested_connections = l.max_connections,
            max_connections = max,
            requested_streamed_files = l.max_streamed_files,
            max_streamed_files = files,
            "lowering --max-connections and --max-streamed-files to fit the open-file limit"
        );
        l.max_connections = max;
        l.probe_reserve = reserve;
        l.max_streamed_files = files;
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_ip: usize, reserve: usize, reserve_per_ip: usize) -> Limits {
        Limits {
            max_connections: max,
            max_per_ip: per_ip,
            probe_reserve: reserve,
            probe_reserve_per_ip: reserve_per_ip,
            ..Limits::default()
        }
    }

    #[test]
    fn admission_table() {
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let counts = |normal: usize, a_normal: usize, reserve: usize, a_reserve: usize| Counts {
            normal,
            reserve,
            normal_by_ip: [(a, a_normal), (b, normal - a_normal)].into(),
            reserve_by_ip: [(a, a_reserve), (b, reserve - a_reserve)].into(),
        };
        use Admission::*;
        #[rustfmt::skip]
        let cases = [
            // limits(max, per ip, reserve, reserve per ip), counts(normal, of them a's, reserve, of them a's), for a
            ("empty", limits(4, 2, 2, 1), counts(0, 0, 0, 0), Normal),
            ("under both caps", limits(4, 2, 2, 1), counts(3, 1, 0, 0), Normal),
            ("a at its share: probes only", limits(4, 2, 2, 1), counts(2, 2, 0, 0), ProbeOnly),
            ("a at its share, holds its reserve share", limits(4, 2, 2, 1), counts(2, 2, 1, 1), Refused(Refusal::PerIp)),
            ("a at its share, reserve full", limits(4, 2, 2, 1), counts(2, 2, 2, 0), Refused(Refusal::PerIp)),
            ("full: probes only", limits(4, 2, 2, 1), counts(4, 0, 0, 0), ProbeOnly),
            ("full, a holds its reserve share", limits(4, 2, 2, 1), counts(4, 0, 1, 1), Refused(Refusal::PerIp)),
            ("full, reserve full", limits(4, 2, 2, 1), counts(4, 0, 2, 0), Refused(Refusal::Total)),
            ("no reserve", limits(4, 4, 0, 1), counts(4, 4, 0, 0), Refused(Refusal::Total)),
        ];
        for (what, l, c, want) in cases {
            assert_eq!(decide(&l, &c, a), want, "{what}");
        }
    }

    #[test]
    fn slots_release_their_counts_and_forget_idle_clients() {
        let t = Tracker::new(Arc::new(limits(2, 1, 1, 1)));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let s1 = t.admit(a).unwrap();
        // a's share is full: its next one is the reserve's.
        let probe = t.admit(a).unwrap();
        assert_eq!(probe.admission, Admission::ProbeOnly);
        assert_eq!(t.admit(a).unwrap_err(), Refusal::PerIp);
        let s2 = t.admit(b).unwrap();
        assert_eq!(s2.admission, Admission::Normal);
        assert_eq!(t.admit(b).unwrap_err(), Refusal::Total);
        assert_eq!(t.open(), (2, 1));
        drop((s1, s2, probe));
        assert_eq!(t.open(), (0, 0));
        let c = t.counts.lock().unwrap();
        assert!(c.normal_by_ip.is_empty() && c.reserve_by_ip.is_empty());
    }

    #[test]
    fn caps_are_lowered_to_fit_the_open_file_limit() {
        #[rustfmt::skip]
        let cases = [
            // (max connections, reserve, streamed files), nofile, what fits
            // 512 for the headroom, 64 for fan-out directories.
            ((4096, 32, 1024), 1024, (304, 32, 112)),
            // The F2 finding's 20,000: 4,096 connections, 16 streams each,
            // had run out of descriptors at 1,250 connections.
            ((4096, 32, 1024), 20_000, (4096, 32, 1024)),
            ((4096, 32, 1024), 5_000, (2914, 32, 981)),
            ((100, 8, 16), 1 << 20, (100, 8, 16)),
            ((4096, 32, 1024), 512, (1, 0, 1)),
        ];
        for ((max, reserve, files), nofile, want) in cases {
            let l = fit_to_nofile(
                Limits {
                    max_streamed_files: files,
                    ..limits(max, 8, reserve, 2)
                },
                nofile,
            );
            let got = (l.max_connections, l.probe_reserve, l.max_streamed_files);
            assert_eq!(got, want, "nofile {nofile}");
            let usable = nofile.saturating_sub(FD_HEADROOM + fanout_fds(nofile));
            assert!(
                usable == 0 || got.0 + got.1 + got.2 <= usable as usize,
                "nofile {nofile}: {got:?} do not fit"
            );
        }
    }
}
