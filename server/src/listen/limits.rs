//! What one listener admits: the connection caps and timeouts, the
//! admission decision (pure, so it is table-tested), the closing of the
//! longest idle connection when the cap is full, and the process's
//! open-file limit.
//!
//! The per-client caps are sized for a fleet, where every node has an
//! address of its own, so a load generator on one host meets them first:
//! past `--max-connections-per-ip` its connections are reset at accept,
//! and an HTTP/2 client opening more than `--h2-max-streams` streams before
//! it read the server's SETTINGS (`h2load -m 100` does) has the rest
//! refused with `REFUSED_STREAM`. `cargo xtask bench serve` raises the
//! per-address and per-network caps, and opens no more streams than that.
//! The stream limit stays low by default because every stream a client
//! stops reading pins its send buffer, times every connection it may open.
//! A proxy in front must drop its idle upstream connections before
//! `--header-read-timeout` does, as `deploy/object-cache/objects.conf`
//! does, or it may send a request on a connection the server is closing.

use super::idle::ConnIdle;
use crate::clients::network;
use crate::http::saturation::Saturation;
use crate::served::objects::FANOUT_FDS;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Caps and timeouts of the HTTP listener (`serve`'s flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once, all clients together.
    pub max_connections: usize,
    /// Connections served at once from one client address.
    pub max_per_ip: usize,
    /// Connections served at once from one network (/24, /64), all its
    /// addresses together.
    pub max_per_net: usize,
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
            max_per_net: 1024,
            probe_reserve: 32,
            probe_reserve_per_ip: 2,
            first_byte_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            h2_keepalive: Duration::from_secs(30),
            h2_max_streams: 16,
            h2_send_buffer: 32 * 1024,
            max_streamed_files: crate::http::DEFAULT_MAX_STREAMED_FILES,
        }
    }
}

/// How a connection was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Served normally.
    Normal,
    /// Over a cap, inside the probe reserve: only `/healthz`, `/readyz`
    /// and `/metrics` are answered, one request a connection.
    ProbeOnly,
}

/// Why a connection was not served normally (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` are in use, none of them idle.
    Total,
    /// The client already holds its share.
    PerIp,
    /// The client's network (/24, /64) already holds its share.
    PerNet,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Total => "total",
            Refusal::PerIp => "per_ip",
            Refusal::PerNet => "per_net",
        }
    }

    pub const ALL: [Refusal; 3] = [Refusal::Total, Refusal::PerIp, Refusal::PerNet];
}

/// What to do with one more connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Normal,
    /// Only the total cap stands in the way: close the longest idle
    /// connection and serve this one in its place.
    MakeRoom,
    /// Over a cap: the probe reserve, for this reason.
    Reserve(Refusal),
    Refuse(Refusal),
}

/// Open connections, in all, by client address and by network; the
/// normal ones' idleness, to find the longest idle.
#[derive(Debug, Default)]
struct Counts {
    normal: usize,
    reserve: usize,
    normal_by_ip: HashMap<IpAddr, usize>,
    normal_by_net: HashMap<IpAddr, usize>,
    reserve_by_ip: HashMap<IpAddr, usize>,
    /// The normal connections, by id: their address and idleness.
    conns: HashMap<u64, (IpAddr, Arc<ConnIdle>)>,
    next_id: u64,
}

/// The admission decision for one more connection from `ip`; `room`:
/// whether an idle connection could be closed for it. Past a cap, the
/// probe reserve: a kubelet probes from its node's address, which the
/// node's own processes (its update among them) share, so a full
/// per-address share must not fail the probes any more than a full server.
fn decide(l: &Limits, c: &Counts, ip: IpAddr, room: bool) -> Decision {
    let get = |m: &HashMap<IpAddr, usize>, k: IpAddr| m.get(&k).copied().unwrap_or(0);
    let own = if get(&c.normal_by_ip, ip) >= l.max_per_ip {
        Some(Refusal::PerIp)
    } else if get(&c.normal_by_net, network(ip)) >= l.max_per_net {
        Some(Refusal::PerNet)
    } else {
        None
    };
    let total_full = c.normal >= l.max_connections;
    let over = match (own, total_full) {
        (None, false) => return Decision::Normal,
        (None, true) if room => return Decision::MakeRoom,
        (_, true) => Refusal::Total,
        (Some(own), false) => own,
    };
    if c.reserve >= l.probe_reserve {
        return Decision::Refuse(over);
    }
    if get(&c.reserve_by_ip, ip) >= l.probe_reserve_per_ip {
        return Decision::Refuse(Refusal::PerIp);
    }
    Decision::Reserve(over)
}

/// Decrements `key`'s count, forgetting it at zero, so the maps hold only
/// clients with open connections (they cannot grow with every address
/// seen).
fn release(m: &mut HashMap<IpAddr, usize>, key: IpAddr) {
    if let Some(n) = m.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            m.remove(&key);
        }
    }
}

impl Counts {
    fn add_normal(&mut self, ip: IpAddr, idle: Arc<ConnIdle>) -> u64 {
        self.normal += 1;
        *self.normal_by_ip.entry(ip).or_default() += 1;
        *self.normal_by_net.entry(network(ip)).or_default() += 1;
        let id = self.next_id;
        self.next_id += 1;
        self.conns.insert(id, (ip, idle));
        id
    }

    fn remove_normal(&mut self, id: u64) {
        if let Some((ip, _)) = self.conns.remove(&id) {
            self.normal = self.normal.saturating_sub(1);
            release(&mut self.normal_by_ip, ip);
            release(&mut self.normal_by_net, network(ip));
        }
    }

    /// The normal connection idle the longest, if any is.
    fn longest_idle(&self) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, (_, c))| !c.is_evicted())
            .filter_map(|(id, (_, c))| Some((c.idle_since()?, *id)))
            .min()
            .map(|(_, id)| id)
    }
}

/// Counts open connections and decides on new ones.
#[derive(Debug, Clone)]
pub struct Tracker {
    limits: Arc<Limits>,
    counts: Arc<Mutex<Counts>>,
    saturation: Arc<Saturation>,
    epoch: Instant,
}

/// One admitted connection; its count is released when this is dropped
/// (or when it is closed to make room, at once).
#[derive(Debug)]
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
    /// Its entry among the normal connections.
    id: Option<u64>,
    pub admission: Admission,
    /// The connection's idleness, which the tracker may close it for.
    pub idle: Arc<ConnIdle>,
    /// Over the total, the longest idle connection was closed for it.
    pub made_room: bool,
    /// Why it is in the probe reserve.
    pub over: Option<Refusal>,
}

impl Tracker {
    /// `saturation` hears of every normal client refused because every
    /// connection was in use, and of every one that found room.
    pub fn new(limits: Arc<Limits>, saturation: Arc<Saturation>) -> Self {
        Self {
            limits,
            counts: Arc::default(),
            saturation,
            epoch: Instant::now(),
        }
    }

    /// Admits a connection from `ip`, or says why not.
    pub fn admit(&self, ip: IpAddr) -> Result<Slot, Refusal> {
        // A panic elsewhere cannot leave the counts half-updated: every
        // update below is a single step.
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = ConnIdle::new(self.epoch);
        let mut decision = decide(&self.limits, &c, ip, true);
        let mut made_room = false;
        if decision == Decision::MakeRoom {
            match c.longest_idle() {
                Some(victim) => {
                    // Its place is this one's from now: it closes at its
                    // next look (`ConnIdle::evicted`), and its slot then
                    // releases nothing.
                    if let Some((_, v)) = c.conns.get(&victim) {
                        v.evict();
                    }
                    c.remove_normal(victim);
                    made_room = true;
                    decision = Decision::Normal;
                }
                None => decision = decide(&self.limits, &c, ip, false),
            }
        }
        let (admission, id, over) = match decision {
            Decision::Normal | Decision::MakeRoom => {
                self.saturation.room();
                let id = c.add_normal(ip, idle.clone());
                (Admission::Normal, Some(id), None)
            }
            Decision::Reserve(over) => {
                if over == Refusal::Total {
                    self.saturation.refused();
                }
                c.reserve += 1;
                *c.reserve_by_ip.entry(ip).or_default() += 1;
                (Admission::ProbeOnly, None, Some(over))
            }
            Decision::Refuse(r) => {
                if r == Refusal::Total {
                    self.saturation.refused();
                }
                return Err(r);
            }
        };
        Ok(Slot {
            counts: self.counts.clone(),
            ip,
            id,
            admission,
            idle,
            made_room,
            over,
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
        match self.id {
            // Gone already if it was closed to make room.
            Some(id) => c.remove_normal(id),
            None => {
                c.reserve = c.reserve.saturating_sub(1);
                release(&mut c.reserve_by_ip, self.ip);
            }
        }
    }
}

/// File descriptors a listener needs beyond its connections and streamed
/// files: the state dir, logs, the blocking pool's opens, publication.
pub const FD_HEADROOM: u64 = 512;

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

    fn counts(entries: &[(IpAddr, usize)], reserve: &[(IpAddr, usize)]) -> Counts {
        let mut c = Counts::default();
        for &(ip, n) in entries {
            for _ in 0..n {
                c.add_normal(ip, ConnIdle::new(Instant::now()));
            }
        }
        for &(ip, n) in reserve {
            c.reserve += n;
            *c.reserve_by_ip.entry(ip).or_default() += n;
        }
        c
    }

    #[test]
    fn admission_table() {
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let other_net: IpAddr = [10, 0, 9, 2].into();
        let l = |max, per_ip, per_net, reserve| Limits {
            max_per_net: per_net,
            ..limits(max, per_ip, reserve, 1)
        };
        use Decision::*;
        #[rustfmt::skip]
        let cases = [
            // (limits(max, per ip, per net, reserve), a's, b's, the other net's, reserve held (a's, b's), room to make, for a)
            ("empty", l(4, 2, 4, 2), (0, 0, 0), (0, 0), false, Normal),
            ("under every cap", l(4, 2, 4, 2), (1, 2, 0), (0, 0), false, Normal),
            ("a at its share: probes only", l(4, 2, 4, 2), (2, 0, 0), (0, 0), false, Reserve(Refusal::PerIp)),
            ("a at its share, holds its reserve share", l(4, 2, 4, 2), (2, 0, 0), (1, 0), false, Refuse(Refusal::PerIp)),
            ("a at its share, reserve full", l(4, 2, 4, 2), (2, 0, 0), (0, 2), false, Refuse(Refusal::PerIp)),
            ("a's /24 at its share", l(8, 2, 3, 2), (1, 2, 0), (0, 0), false, Reserve(Refusal::PerNet)),
            ("a's /24 at its share, room to make", l(3, 2, 3, 2), (1, 2, 0), (0, 0), true, Reserve(Refusal::Total)),
            ("another /24 full is not a's", l(8, 2, 2, 2), (0, 0, 2), (0, 0), false, Normal),
            ("full: probes only", l(4, 4, 4, 2), (0, 2, 2), (0, 0), false, Reserve(Refusal::Total)),
            ("full, an idle one to close", l(4, 4, 4, 2), (0, 2, 2), (0, 0), true, MakeRoom),
            ("full, a at its share too", l(4, 2, 4, 2), (2, 0, 2), (0, 0), true, Reserve(Refusal::Total)),
            ("full, a holds its reserve share", l(4, 4, 4, 2), (0, 2, 2), (1, 0), false, Refuse(Refusal::PerIp)),
            ("full, reserve full", l(4, 4, 4, 2), (0, 2, 2), (0, 2), false, Refuse(Refusal::Total)),
            ("no reserve", l(4, 4, 4, 0), (4, 0, 0), (0, 0), false, Refuse(Refusal::Total)),
        ];
        for (what, limits, (na, nb, no), (ra, rb), room, want) in cases {
            let c = counts(&[(a, na), (b, nb), (other_net, no)], &[(a, ra), (b, rb)]);
            assert_eq!(decide(&limits, &c, a, room), want, "{what}");
        }
    }

    fn tracker(l: Limits) -> (Tracker, Arc<Saturation>) {
        let sat = Arc::new(Saturation::new(Duration::ZERO));
        (Tracker::new(Arc::new(l), sat.clone()), sat)
    }

    #[test]
    fn slots_release_their_counts_and_forget_idle_clients() {
        let (t, _) = tracker(limits(2, 1, 1, 1));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 1, 2].into();
        let s1 = t.admit(a).unwrap();
        // a's share is full: its next one is the reserve's.
        let probe = t.admit(a).unwrap();
        assert_eq!(probe.admission, Admission::ProbeOnly);
        assert_eq!(probe.over, Some(Refusal::PerIp));
        assert_eq!(t.admit(a).unwrap_err(), Refusal::PerIp);
        let s2 = t.admit(b).unwrap();
        assert_eq!(s2.admission, Admission::Normal);
        // Full, and nobody idle.
        assert_eq!(t.admit(b).unwrap_err(), Refusal::Total);
        assert_eq!(t.open(), (2, 1));
        drop((s1, s2, probe));
        assert_eq!(t.open(), (0, 0));
        let c = t.counts.lock().unwrap();
        assert!(c.normal_by_ip.is_empty() && c.reserve_by_ip.is_empty());
        assert!(c.normal_by_net.is_empty() && c.conns.is_empty());
    }

    /// The cap full: a new client takes the place of the connection idle
    /// the longest, which is told to close and whose slot then releases
    /// nothing; with none idle, it goes to the probe reserve, and that is
    /// what `/readyz` hears of.
    #[test]
    fn when_full_the_longest_idle_connection_makes_room() {
        let (t, sat) = tracker(Limits {
            max_per_net: 8,
            ..limits(3, 8, 1, 1)
        });
        let ip = |n: u8| IpAddr::from([10, 0, n, 1]);
        let busy = t.admit(ip(1)).unwrap();
        let older = t.admit(ip(2)).unwrap();
        let newer = t.admit(ip(3)).unwrap();
        older.idle.idle();
        std::thread::sleep(Duration::from_millis(5));
        newer.idle.idle();
        let first = t.admit(ip(4)).unwrap();
        assert_eq!(
            (first.admission, first.made_room),
            (Admission::Normal, true)
        );
        assert!(older.idle.is_evicted() && !newer.idle.is_evicted());
        assert!(!older.idle.busy(), "the evicted one is to close");
        assert_eq!(t.open(), (3, 0));
        assert_eq!(sat.refusing(), None);
        // Its slot, dropped when the connection closes, releases nothing.
        drop(older);
        assert_eq!(t.open(), (3, 0));
        // A connection that became busy again is not a candidate.
        assert!(newer.idle.busy());
        let reserve = t.admit(ip(5)).unwrap();
        assert_eq!(reserve.admission, Admission::ProbeOnly);
        assert_eq!(reserve.over, Some(Refusal::Total));
        assert!(sat.refusing().is_some(), "refusing for lack of room");
        newer.idle.idle();
        assert!(t.admit(ip(6)).unwrap().made_room);
        assert_eq!(sat.refusing(), None, "room again");
        drop((busy, newer, first, reserve));
        assert_eq!(t.open(), (0, 0));
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
