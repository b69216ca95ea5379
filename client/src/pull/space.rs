//! Free space on the repo's filesystem. libostree keeps its
//! `min-free-space-percent` / `min-free-space-size` reserve only inside a
//! transaction, and a pull writes outside one (`store.rs`, "Writing
//! objects"), so the reserve is kept here, for the whole pull: before an
//! object is written, the space it declares, plus what the objects still
//! being written declared, must fit above the reserve. A hostile server
//! that declares more than fits is refused before a byte is written.

use anyhow::{anyhow, bail, Context, Result};
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How often a reservation that waits for others re-reads the filesystem.
const RECHECK: Duration = Duration::from_millis(100);

/// libostree's default when the repo sets neither key.
pub const DEFAULT_MIN_FREE_PERCENT: u32 = 3;

/// The reserve a repo's config asks for (libostree's rules and syntax).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinFree {
    /// `core.min-free-space-percent`: of the filesystem's size, 0 to 99.
    Percent(u32),
    /// `core.min-free-space-size`: `NMB`, `NGB` or `NTB` (binary units).
    Bytes(u64),
}

impl MinFree {
    /// From the two keys as written in `config` (`None`: absent). As in
    /// libostree, they are exclusive, and a repo with neither keeps 3%.
    pub fn parse(size: Option<&str>, percent: Option<&str>) -> Result<Self> {
        match (size, percent) {
            (Some(_), Some(_)) => {
                bail!("min-free-space-percent and min-free-space-size are mutually exclusive")
            }
            (Some(s), None) => parse_size(s.trim())
                .map(MinFree::Bytes)
                .ok_or_else(|| anyhow!("invalid min-free-space-size {s:?}: want e.g. 500MB, 2GB")),
            (None, Some(p)) => match p.trim().parse::<u32>() {
                Ok(n) if n <= 99 => Ok(MinFree::Percent(n)),
                _ => bail!("invalid min-free-space-percent {p:?}: want 0 to 99"),
            },
            (None, None) => Ok(MinFree::Percent(DEFAULT_MIN_FREE_PERCENT)),
        }
    }

    /// The bytes to keep free on a filesystem of `fs_bytes`.
    pub fn reserve(self, fs_bytes: u64) -> u64 {
        match self {
            MinFree::Percent(p) => fs_bytes / 100 * u64::from(p),
            MinFree::Bytes(b) => b,
        }
    }

    pub fn describe(self) -> String {
        match self {
            MinFree::Percent(p) => format!("min-free-space-percent={p}"),
            MinFree::Bytes(b) => format!("min-free-space-size={} MiB", b >> 20),
        }
    }
}

/// `^[0-9]+[MGT]B$`, in MiB, GiB or TiB as libostree reads it; `None`
/// when malformed or too large for 64 bits.
fn parse_size(s: &str) -> Option<u64> {
    let num = s.strip_suffix('B')?;
    let (digits, shift) = match num.as_bytes().last()? {
        b'M' => (&num[..num.len() - 1], 20),
        b'G' => (&num[..num.len() - 1], 30),
        b'T' => (&num[..num.len() - 1], 40),
        _ => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(1u64 << shift)
}

/// What a filesystem reports, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// Size of the filesystem.
    pub total: u64,
    /// Free to unprivileged writers (`f_bavail`).
    pub available: u64,
    pub block: u64,
}

/// Whether `need` more bytes, with `in_flight` already promised, fit above
/// `reserve` on `fs`; the refusal says why, with the numbers.
pub fn check_fit(fs: FsSpace, reserve: u64, in_flight: u64, need: u64) -> Result<(), String> {
    let wanted = in_flight.saturating_add(need).saturating_add(reserve);
    if wanted <= fs.available {
        return Ok(());
    }
    Err(format!(
        "needs {need} bytes, {in_flight} more are being written, and {reserve} must stay free; \
         only {} of {} bytes are free",
        fs.available, fs.total
    ))
}

/// Bytes an object of `len` stream bytes may take on disk: whole blocks,
/// one more for its inode and directory entry, and room for recompression
/// in an archive repo (deflate can grow incompressible data slightly).
pub fn on_disk(len: u64, block: u64) -> u64 {
    let block = block.max(512);
    let grown = len.saturating_add(len / 1024);
    grown
        .div_ceil(block)
        .saturating_add(1)
        .saturating_mul(block)
}

/// The repo's free-space guard, shared by every writer of one pull.
#[derive(Debug)]
pub struct SpaceGuard {
    dir: File,
    shown: String,
    min_free: MinFree,
    /// Bytes promised to objects being written now.
    in_flight: Mutex<u64>,
    /// Signalled when promises are given back.
    given_back: Condvar,
    /// Whether the filesystem allocates a file's length up front.
    fallocates: bool,
}

/// Space promised to one object; given back when dropped (the object is
/// then on disk, or gone).
#[derive(Debug)]
pub struct Reservation {
    guard: Arc<SpaceGuard>,
    bytes: u64,
}

impl Reservation {
    /// `n` of the promised bytes are written, so the filesystem's free
    /// space counts them now: promising them as well would count a big
    /// object twice while it is written, and refuse small ones beside it
    /// that fit.
    pub fn written(&mut self, n: u64) {
        let n = n.min(self.bytes);
        if n == 0 {
            return;
        }
        self.bytes -= n;
        self.guard.give_back(n);
    }

    /// `r`, whose reader writes out what it reads before it reads more;
    /// the promise is given back as the filesystem counts those bytes. If
    /// the reader `preallocates` (libostree `fallocate`s a bare repo's
    /// content object to its whole length before it reads a byte of it),
    /// that is all of it at the first read, where the filesystem can
    /// allocate ahead; otherwise as it is read.
    pub fn meter<R>(self, r: R, preallocates: bool) -> Metered<R> {
        let at_once = preallocates && self.guard.fallocates;
        Metered {
            inner: r,
            room: self,
            at_once,
        }
    }
}

/// A reader that gives its reservation back as it is read.
#[derive(Debug)]
pub struct Metered<R> {
    inner: R,
    room: Reservation,
    at_once: bool,
}

impl<R: std::io::Read> std::io::Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let counted = if self.at_once { u64::MAX } else { n as u64 };
        self.room.written(counted);
        Ok(n)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.guard.give_back(self.bytes);
    }
}

/// Whether the filesystem under `dir` allocates ahead of writes
/// (`fallocate` on an unnamed file there, gone when closed). Where it
/// cannot, libostree writes without allocating first, and a promise is
/// given back only as the bytes land.
fn fallocates(dir: &File) -> bool {
    use rustix::fs::{fallocate, openat, FallocateFlags, Mode, OFlags};
    openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .and_then(|f| fallocate(&f, FallocateFlags::empty(), 0, 4096))
    .is_ok()
}

impl SpaceGuard {
    pub fn new(dir: File, shown: String, min_free: MinFree) -> Self {
        let fallocates = fallocates(&dir);
        Self {
            dir,
            shown,
            min_free,
            in_flight: Mutex::new(0),
            given_back: Condvar::new(),
            fallocates,
        }
    }

    fn stat(&self) -> Result<FsSpace> {
        let st = rustix::fs::fstatvfs(self.dir.as_fd())
            .with_context(|| format!("statvfs {}", self.shown))?;
        let block = st.f_frsize.max(1);
        Ok(FsSpace {
            total: st.f_blocks.saturating_mul(block),
            available: st.f_bavail.saturating_mul(block),
            block,
        })
    }

    fn give_back(&self, n: u64) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        *in_flight = in_flight.saturating_sub(n);
        self.given_back.notify_all();
    }

    /// Promises room for `what`, whose stream is `len` bytes, or says why
    /// it does not fit (naming `what` and the numbers).
    ///
    /// While other objects are being written, a misfit waits for them
    /// instead: between a writer's allocation and its metering, the
    /// filesystem and the promise may both count the same bytes, so only
    /// a check with nothing in flight is a verdict.
    pub fn reserve(self: &Arc<Self>, what: &str, len: u64) -> Result<Reservation> {
        loop {
            let fs = self.stat()?;
            let need = on_disk(len, fs.block);
            let reserve = self.min_free.reserve(fs.total);
            // Under the lock, so that two writers cannot both take the last room.
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            match check_fit(fs, reserve, *in_flight, need) {
                Ok(()) => {
                    *in_flight += need;
                    return Ok(Reservation {
                        guard: self.clone(),
                        bytes: need,
                    });
                }
                Err(why) if *in_flight == 0 => {
                    bail!(
                        "{what} ({len} bytes declared) does not fit on {} while keeping the \
                         repo's {}: it {why}",
                        self.shown,
                        self.min_free.describe()
                    )
                }
                // The timeout re-reads the filesystem, which other
                // processes may have freed meanwhile.
                Err(_) => drop(
                    self.given_back
                        .wait_timeout(in_flight, RECHECK)
                        .unwrap_or_else(|e| e.into_inner()),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_free_settings() {
        // (min-free-space-size, min-free-space-percent, parsed)
        let cases: &[(Option<&str>, Option<&str>, Option<MinFree>)] = &[
            (None, None, Some(MinFree::Percent(3))),
            (None, Some("0"), Some(MinFree::Percent(0))),
            (None, Some("99"), Some(MinFree::Percent(99))),
            (None, Some(" 10 "), Some(MinFree::Percent(10))),
            (None, Some("100"), None),
            (None, Some("-1"), None),
            (None, Some("5%"), None),
            (Some("500MB"), None, Some(MinFree::Bytes(500 << 20))),
            (Some("2GB"), None, Some(MinFree::Bytes(2 << 30))),
            (Some("1TB"), None, Some(MinFree::Bytes(1 << 40))),
            (Some("0MB"), None, Some(MinFree::Bytes(0))),
            (Some("500"), None, None),
            (Some("500KB"), None, None),
            (Some("MB"), None, None),
            (Some("1.5GB"), None, None),
            (Some("-1GB"), None, None),
            (Some("99999999999TB"), None, None),
            (Some("1GB"), Some("3"), None),
        ];
        for (size, pct, want) in cases {
            let got = MinFree::parse(*size, *pct).ok();
            assert_eq!(got, *want, "size {size:?} percent {pct:?}");
        }
        assert_eq!(MinFree::Percent(3).reserve(1000), 30);
        assert_eq!(MinFree::Percent(0).reserve(1 << 40), 0);
        assert_eq!(MinFree::Percent(99).reserve(u64::MAX), u64::MAX / 100 * 99);
        assert_eq!(MinFree::Bytes(7).reserve(1), 7);
    }

    #[test]
    fn fitting() {
        let fs = FsSpace {
            total: 1000,
            available: 500,
            block: 1,
        };
        // (reserve, in flight, need, fits)
        let cases = [
            (0, 0, 500, true),
            (0, 0, 501, false),
            (30, 0, 470, true),
            (30, 0, 471, false),
            (30, 400, 70, true),
            (30, 400, 71, false),
            (0, u64::MAX, 1, false),
            (u64::MAX, 0, 0, false),
            (0, 0, u64::MAX, false),
        ];
        for (reserve, in_flight, need, fits) in cases {
            let got = check_fit(fs, reserve, in_flight, need);
            assert_eq!(got.is_ok(), fits, "{reserve} {in_flight} {need}: {got:?}");
            if let Err(why) = got {
                assert!(
                    why.contains(&need.to_string()) && why.contains("500"),
                    "{why}"
                );
            }
        }
    }

    #[test]
    fn disk_footprint() {
        // (stream bytes, block, at least, at most)
        let cases = [
            (0, 4096, 4096, 4096),
            (1, 4096, 8192, 8192),
            (4096, 4096, 8192, 12288),
            (1 << 30, 4096, (1 << 30) + 4096, (1 << 30) + (1 << 21)),
            (u64::MAX, 4096, u64::MAX - 4096, u64::MAX),
            (100, 0, 1024, 1024),
        ];
        for (len, block, lo, hi) in cases {
            let got = on_disk(len, block);
            assert!(
                (lo..=hi).contains(&got),
                "{len} in blocks of {block}: {got}"
            );
        }
    }

    #[test]
    fn a_reservation_shrinks_as_it_is_written() {
        use std::io::Read;
        let g = Arc::new(SpaceGuard::new(
            File::open("/").unwrap(),
            "/".into(),
            MinFree::Percent(0),
        ));
        let free = g.stat().unwrap().available;
        let mut room = g.reserve("big", free / 2).unwrap();
        let promised = *g.in_flight.lock().unwrap();
        room.written(free / 4);
        assert_eq!(*g.in_flight.lock().unwrap(), promised - free / 4);
        let mut r = room.meter(std::io::repeat(0).take(1000), false);
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        assert_eq!(*g.in_flight.lock().unwrap(), promised - free / 4 - 1000);
        drop(r);
        assert_eq!(*g.in_flight.lock().unwrap(), 0);
    }

    /// A preallocating writer has taken the whole object by its first
    /// read (where the filesystem can), so the promise goes at once.
    #[test]
    fn a_preallocated_reservation_is_given_back_at_the_first_read() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let g = Arc::new(SpaceGuard::new(
            File::open(dir.path()).unwrap(),
            "t".into(),
            MinFree::Percent(0),
        ));
        assert!(g.fallocates, "a tmpfs or disk filesystem allocates ahead");
        let promised = on_disk(1 << 20, g.stat().unwrap().block);
        let room = g.reserve("big", 1 << 20).unwrap();
        let mut r = room.meter(std::io::repeat(0).take(1 << 20), true);
        r.read_exact(&mut [0; 4096]).unwrap();
        assert_eq!(*g.in_flight.lock().unwrap(), 0, "of {promised}");
    }

    /// A misfit is refused when nothing else is in flight, and waits for
    /// what is (it may be counted twice meanwhile).
    #[test]
    fn a_misfit_waits_for_what_is_in_flight_then_is_judged() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::open(dir.path()).unwrap();
        let g = Arc::new(SpaceGuard::new(f, "t".into(), MinFree::Percent(0)));
        let free = g.stat().unwrap().available;
        let e = g.reserve("huge", free.saturating_mul(2)).unwrap_err();
        assert!(format!("{e:#}").contains("huge ("), "{e:#}");
        let a = g.reserve("a", free / 2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let g2 = g.clone();
        let waiter = std::thread::spawn(move || {
            let b = g2.reserve("b", free / 2 + free / 8).map(drop);
            tx.send(()).unwrap();
            b
        });
        // The second half does not fit beside the first: it waits...
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        // ...until the first is given back.
        drop(a);
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        waiter.join().unwrap().unwrap();
        assert_eq!(*g.in_flight.lock().unwrap(), 0);
    }
}
