//! `cargo xtask bench ...`: benchmarks that need root and real tools.
//!
//! The pieces every benchmark shares live here and in the submodules, so
//! that `bench io` (issue 5) can reuse them:
//!
//! - [`scratch::ScratchFs`]: an isolated XFS filesystem on a direct-io loop
//!   device, with the device's write counters from `/proc/diskstats`;
//! - [`registry::Registry`]: a real `docker-registry` on 127.0.0.1, and
//!   `skopeo` pushes into it;
//! - process helpers with time bounds ([`run_bounded`], [`Stopper`]);
//! - Ctrl-C handling ([`interrupt`]): signals become a flag that every
//!   wait loop polls, so the `Drop`s that unmount, detach and kill run;
//! - preconditions ([`require`]), cold caches ([`drop_caches`]), summary
//!   statistics ([`Summary`]) and where results go ([`results_path`]).

pub mod io;
pub mod registry;
pub mod scratch;
pub mod startup;

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{cargo, deps};

// ---------------------------------------------------------------------------
// Interruption
// ---------------------------------------------------------------------------

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Turns SIGINT, SIGTERM and SIGHUP into a flag that [`check_interrupted`]
/// reports, instead of killing the process before its `Drop`s run (which
/// would leave mounts and loop devices behind). A second signal while the
/// first is being handled exits at once (status 1), for a stuck cleanup.
/// Idempotent.
pub fn interrupt() -> Result<()> {
    if INTERRUPTED.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        // Order matters: the conditional shutdown sees the flag as the
        // previous signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&flag))
            .context("installing a signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&flag))
            .context("installing a signal handler")?;
    }
    let _ = INTERRUPTED.set(flag);
    Ok(())
}

/// Whether a signal arrived since [`interrupt`].
pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// An error if a signal arrived: call it in every wait loop.
pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted; cleaning up");
    }
    Ok(())
}

/// Sleeps `d` in short steps, returning early with an error on a signal.
pub fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        check_interrupted()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

// ---------------------------------------------------------------------------
// Preconditions
// ---------------------------------------------------------------------------

/// One thing a benchmark needs: a command on PATH (and the Debian package
/// that ships it).
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    pub command: &'static str,
    pub package: &'static str,
}

pub const MKFS_XFS: Tool = Tool {
    command: "mkfs.xfs",
    package: "xfsprogs",
};
pub const LOSETUP: Tool = Tool {
    command: "losetup",
    package: "mount",
};
pub const MOUNT: Tool = Tool {
    command: "mount",
    package: "mount",
};
pub const UMOUNT: Tool = Tool {
    command: "umount",
    package: "mount",
};
pub const DOCKER_REGISTRY: Tool = Tool {
    command: "docker-registry",
    package: "docker-registry",
};
pub const SKOPEO: Tool = Tool {
    command: "skopeo",
    package: "skopeo",
};
pub const UMOCI: Tool = Tool {
    command: "umoci",
    package: "umoci",
};

/// Tools a [`scratch::ScratchFs`] needs.
pub const SCRATCH_TOOLS: &[Tool] = &[MKFS_XFS, LOSETUP, MOUNT, UMOUNT];

/// Fails, listing everything that is missing at once (root, tools, kernel
/// interfaces), if the benchmark cannot run here.
pub fn require(tools: &[Tool]) -> Result<()> {
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push(
            "root: run as root (loop devices, mount, drop_caches), e.g. `sudo -E cargo xtask bench ...`"
                .to_owned(),
        );
    }
    let mut packages = Vec::new();
    for t in tools {
        if deps::which(t.command).is_none() {
            missing.push(format!(
                "`{}` on PATH (Debian package {})",
                t.command, t.package
            ));
            if !packages.contains(&t.package) {
                packages.push(t.package);
            }
        }
    }
    for (path, what) in [
        ("/proc/diskstats", "/proc/diskstats (device write counters)"),
        ("/dev/loop-control", "/dev/loop-control (the loop driver)"),
        ("/proc/sys/vm/drop_caches", "/proc/sys/vm/drop_caches"),
    ] {
        if !Path::new(path).exists() {
            missing.push(what.to_owned());
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut msg = String::from("this benchmark cannot run here; missing:\n");
    for m in &missing {
        msg += &format!("  - {m}\n");
    }
    if !packages.is_empty() {
        msg += &format!("install with: apt-get install -y {}\n", packages.join(" "));
    }
    bail!("{}", msg.trim_end())
}

/// `sync`, then drops the page cache, dentries and inodes, so the next
/// step reads cold (from the registry's disk, say).
pub fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").context("writing /proc/sys/vm/drop_caches")
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// Runs `cmd` to completion with stdout and stderr appended to `log`,
/// polling so that a `timeout` or a signal kills it. Returns how long it
/// ran; fails (quoting the log's tail) on a non-zero exit.
pub fn run_bounded(cmd: &mut Command, log: &Path, timeout: Duration) -> Result<Duration> {
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
    let mut child = Stopper::new(child, &what);
    let status = child.wait_bounded(timeout)?;
    let took = start.elapsed();
    if !status.success() {
        check_interrupted()?;
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
pub struct Stopper {
    child: Option<Child>,
    what: String,
    /// How long it may take to exit after SIGTERM.
    pub grace: Duration,
}

impl Stopper {
    pub fn new(child: Child, what: &str) -> Self {
        Stopper {
            child: Some(child),
            what: what.to_owned(),
            grace: Duration::from_secs(30),
        }
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
            if interrupted() {
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
            "xtask: {} ignored SIGTERM for {:?}; killing it",
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

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(values: &[f64]) -> Summary {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                n: 0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        }
    }
}

/// `target/bench`, created.
pub fn bench_dir() -> Result<PathBuf> {
    let dir = cargo::target_dir().join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `target/bench/<name>-<UTC timestamp of started>.json`.
pub fn results_path(name: &str, started: SystemTime) -> Result<PathBuf> {
    Ok(bench_dir()?.join(format!("{name}-{}.json", utc_stamp(started))))
}

/// `YYYYMMDDTHHMMSSZ` for a time (UTC; civil-from-days, no time crate).
pub fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The workspace's git commit and whether the tree is dirty, for the
/// record (best effort).
pub fn git_state() -> Option<String> {
    let root = crate::fixtures::workspace_root();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(&root)
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// The 1-minute load average and CPU count (how busy the machine was).
pub fn load() -> (f64, usize) {
    let la = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    (la, cpus)
}

/// CPU seconds (user + system) a process has used, and those of its
/// children it has waited for, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    static TICKS: OnceLock<f64> = OnceLock::new();
    let ticks = *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is [0],
    // utime [11], stime [12], cutime [13], cstime [14].
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    Some((
        (f.get(11)? + f.get(12)?) / ticks,
        (f.get(13)? + f.get(14)?) / ticks,
    ))
}

/// Sum of the sizes of the regular files under `dir`, each rounded up to
/// `block` bytes: the least a one-file-per-object copy of it occupies on a
/// filesystem with that block size (no inline data, no tail packing).
pub fn rounded_size(dir: &Path, block: u64) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let md = e.metadata()?;
            if md.is_dir() {
                stack.push(e.path());
            } else if md.is_file() {
                total += md.len().div_ceil(block) * block;
            }
        }
    }
    Ok(total)
}

/// `12.3 MiB`.
pub fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_736_899_200 + 3_723);
        assert_eq!(utc_stamp(t), "20250115T010203Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(utc_stamp(leap), "20000229T000000Z");
    }

    #[test]
    fn summary() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Summary::of(&[4.0, 1.0]).median, 2.5);
        assert!(Summary::of(&[]).median.is_nan());
    }
}
