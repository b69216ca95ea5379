//! The etcd-like neighbour: 2300-byte sequential writes, each followed by
//! `fdatasync`, on the filesystem the update writes to.
//!
//! # Why not fio itself
//!
//! The issue names `fio --rw=write --ioengine=sync --fdatasync=1 --bs=2300`,
//! and that is what this thread does, op for op. But fio cannot say *when*
//! each fdatasync happened: its per-I/O logs (`--write_lat_log` with
//! `--log_avg_msec=0`) record only reads, writes and trims, never the
//! sync ops (fio 3.33 accounts them in `add_sync_clat_sample`, which feeds
//! the `sync` histogram of `--output-format=json+` and no log), and the
//! json+ histogram has no timestamps. Windowing by the update needs both,
//! so the measuring neighbour is this loop, which records every op's start
//! time, write latency and fdatasync latency. fio stays as the cross-check:
//! [`fio_alone`] runs the real fio job with the same parameters, and the
//! benchmark reports both side by side (calibration) so that anyone can
//! see the two neighbours agree.
//!
//! Like fio with `fallocate=native`, the file is preallocated with
//! `fallocate(2)` (unwritten extents on XFS, as etcd's WAL segments are),
//! so every fdatasync also commits the unwritten-to-written conversion
//! through the XFS log: the neighbour feels the journal, as etcd does.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// etcd's typical WAL entry size, and the issue's `--bs`.
pub const BLOCK: usize = 2300;
/// Ops recorded at most (a bound on memory: 16 bytes each).
const MAX_OPS: usize = 20_000_000;

/// One write + fdatasync, on the neighbour's clock (nanoseconds since
/// the epoch it was given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub start_ns: u64,
    pub write_ns: u32,
    pub sync_ns: u32,
}

impl Op {
    /// When the fdatasync returned.
    pub fn end_ns(&self) -> u64 {
        self.start_ns + u64::from(self.write_ns) + u64::from(self.sync_ns)
    }
}

/// What a finished neighbour recorded.
#[derive(Debug, Clone, Default)]
pub struct NeighbourLog {
    pub ops: Vec<Op>,
    /// Times the file was filled and writing wrapped to offset 0.
    pub wraps: u32,
    /// The etcd neighbour's puts (`--etcd`), on the same clock.
    pub etcd_ops: Vec<Op>,
}

/// Creates the neighbour's file and preallocates `bytes` (do it before the
/// caches are dropped, so the allocation is not in the measured window).
pub fn prepare(path: &Path, bytes: u64) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, bytes)
        .with_context(|| format!("fallocate {} bytes for {}", bytes, path.display()))?;
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))?;
    Ok(())
}

/// A running neighbour thread; stopped and joined on drop.
#[derive(Debug)]
pub struct Neighbour {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<NeighbourLog>>>,
}

impl Neighbour {
    /// Starts writing to `path` (made by [`prepare`]) at once. Times are
    /// measured from `epoch`. It stops by itself after `limit` (a bound
    /// for every exit path), or when [`Neighbour::finish`] is called.
    pub fn start(path: &Path, epoch: Instant, limit: Duration) -> Result<Neighbour> {
        let file = File::options()
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("stat {}", path.display()))?
            .len();
        // fallocate mode 0 sets the size: a short file was not prepared.
        anyhow::ensure!(
            len >= BLOCK as u64,
            "{} is not preallocated (size {len})",
            path.display()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let path: PathBuf = path.to_owned();
        let handle = std::thread::Builder::new()
            .name("neighbour".into())
            .spawn(move || run(&file, len, epoch, limit, &flag).context(path.display().to_string()))
            .context("spawning the neighbour thread")?;
        Ok(Neighbour {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops it (after the op in progress) and returns what it recorded.
    pub fn finish(mut self) -> Result<NeighbourLog> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take() {
            Some(h) => match h.join() {
                Ok(r) => r,
                Err(_) => bail!("the neighbour thread panicked"),
            },
            None => bail!("neighbour already finished"),
        }
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(
    file: &File,
    len: u64,
    epoch: Instant,
    limit: Duration,
    stop: &AtomicBool,
) -> Result<NeighbourLog> {
    let started = Instant::now();
    let buf = [0x5au8; BLOCK];
    let mut log = NeighbourLog {
        ops: Vec::with_capacity(1 << 16),
        wraps: 0,
        etcd_ops: Vec::new(),
    };
    let mut offset = 0u64;
    let ns = |d: Duration| u32::try_from(d.as_nanos()).unwrap_or(u32::MAX);
    while !stop.load(Ordering::Relaxed)
        && started.elapsed() < limit
        && log.ops.len() < MAX_OPS
        && !crate::bench::interrupted()
    {
        if offset + BLOCK as u64 > len {
            offset = 0;
            log.wraps += 1;
        }
        let t0 = Instant::now();
        file.write_all_at(&buf, offset).context("write")?;
        let t1 = Instant::now();
        file.sync_data().context("fdatasync")?;
        let t2 = Instant::now();
        offset += BLOCK as u64;
        log.ops.push(Op {
            start_ns: u64::try_from(t0.saturating_duration_since(epoch).as_nanos())
                .unwrap_or(u64::MAX),
            write_ns: ns(t1 - t0),
            sync_ns: ns(t2 - t1),
        });
    }
    Ok(log)
}

/// Bytes to preallocate so that `seconds` of writing at up to `max_iops`
/// never wraps (wrapping would turn unwritten-extent conversions into
/// plain overwrites halfway through a trial).
pub fn file_bytes(seconds: f64, max_iops: f64) -> u64 {
    let ops = (seconds * max_iops).ceil().max(1.0);
    ((ops * BLOCK as f64) as u64).div_ceil(1 << 20) << 20
}

/// Writes the ops as CSV (seconds since the epoch, write µs, fdatasync µs),
/// for plotting or re-analysis outside the benchmark.
pub fn write_csv(path: &Path, ops: &[Op]) -> Result<()> {
    use std::io::Write;
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    writeln!(w, "start_s,write_us,fdatasync_us")?;
    for o in ops {
        writeln!(
            w,
            "{:.6},{:.1},{:.1}",
            o.start_ns as f64 / 1e9,
            f64::from(o.write_ns) / 1e3,
            f64::from(o.sync_ns) / 1e3
        )?;
    }
    w.flush()
        .with_context(|| format!("writing {}", path.display()))
}

// ---------------------------------------------------------------------------
// fio, the cross-check
// ---------------------------------------------------------------------------

/// The fdatasync figures of one fio run, from `--output-format=json+`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FioSync {
    pub seconds: f64,
    pub ops: u64,
    pub iops: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// The fio job of the issue, alone, for `seconds`, in `dir`; returns its
/// fdatasync latency distribution.
pub fn fio_alone(dir: &Path, seconds: u64, size: u64, log: &Path) -> Result<FioSync> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = dir.join("fio.json");
    super::super::run_bounded(
        std::process::Command::new("fio")
            .args([
                "--name=neighbour",
                "--rw=write",
                "--ioengine=sync",
                "--fdatasync=1",
                &format!("--bs={BLOCK}"),
                &format!("--size={size}"),
                "--time_based",
                &format!("--runtime={seconds}"),
                "--output-format=json+",
                "--percentile_list=50:99:99.9",
            ])
            .arg(format!("--directory={}", dir.display()))
            .arg(format!("--output={}", out.display())),
        log,
        Duration::from_secs(seconds + 120),
    )?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    // Keep fio's report next to the log (`dir` goes with its filesystem).
    let _ = std::fs::write(log.with_extension("json"), &text);
    parse_fio(&text).with_context(|| format!("parsing {}", out.display()))
}

/// The `sync` section of fio's json+ output (fio 3.x: `jobs[0].sync`,
/// latencies in ns; percentiles keyed `"99.000000"`), and the write count
/// and run time for the rate.
pub fn parse_fio(text: &str) -> Result<FioSync> {
    // fio may print notices before the JSON document.
    let start = text.find('{').context("no JSON in fio's output")?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).context("fio JSON")?;
    let job = &v["jobs"][0];
    let lat = &job["sync"]["lat_ns"];
    anyhow::ensure!(
        lat.is_object(),
        "no jobs[0].sync.lat_ns (is fio 3.x running with --fdatasync?)"
    );
    let pct = |k: &str| {
        lat["percentile"][k]
            .as_f64()
            .map_or(f64::NAN, |ns| ns / 1e6)
    };
    let ms = |k: &str| lat[k].as_f64().map_or(f64::NAN, |ns| ns / 1e6);
    // fio 3.33 leaves sync.total_ios at 0; the histogram's N is the count.
    let ops = job["sync"]["total_ios"]
        .as_u64()
        .filter(|n| *n > 0)
        .or_else(|| lat["N"].as_u64())
        .unwrap_or(0);
    let seconds = job["write"]["runtime"].as_f64().unwrap_or(f64::NAN) / 1e3;
    Ok(FioSync {
        seconds,
        ops,
        iops: ops as f64 / seconds,
        p50_ms: pct("50.000000"),
        p99_ms: pct("99.000000"),
        p999_ms: pct("99.900000"),
        max_ms: ms("max"),
        mean_ms: ms("mean"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_plus_sync_section() {
        let text = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [ {
      "jobname" : "neighbour",
      "write" : { "io_bytes" : 2300000, "runtime" : 2000, "iops" : 500.0 },
      "sync" : {
        "total_ios" : 0,
        "lat_ns" : { "min" : 100000, "max" : 9000000, "mean" : 500000.0, "N" : 1000,
          "percentile" : { "50.000000" : 400000, "99.000000" : 2000000, "99.900000" : 8000000 },
          "bins" : { "400000" : 10 } }
      }
  } ]
}"#;
        let s = parse_fio(text).unwrap();
        assert_eq!(s.ops, 1000);
        assert_eq!(
            (s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms),
            (0.4, 2.0, 8.0, 9.0)
        );
        assert!((s.iops - 500.0).abs() < 1e-9);
        assert!(parse_fio(r#"{"jobs":[{"write":{}}]}"#).is_err());
        assert!(parse_fio("fio: no such file").is_err());
    }

    #[test]
    fn preallocation_covers_the_run() {
        let b = file_bytes(10.0, 1000.0);
        assert!(b >= 10_000 * BLOCK as u64);
        assert_eq!(b % (1 << 20), 0);
    }

    #[test]
    fn neighbour_records_ops_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        prepare(&path, 1 << 20).unwrap();
        let epoch = Instant::now();
        let n = Neighbour::start(&path, epoch, Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let log = n.finish().unwrap();
        assert!(!log.ops.is_empty());
        assert!(log.ops.windows(2).all(|w| w[0].end_ns() <= w[1].start_ns));
        assert!(log.ops.last().unwrap().end_ns() <= epoch.elapsed().as_nanos() as u64);
    }
}
