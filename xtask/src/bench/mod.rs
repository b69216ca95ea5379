//! `cargo xtask bench ...`: benchmarks that need root and real tools.
//!
//! The pieces every benchmark shares live here and in the submodules, so
//! that `bench io` can reuse them:
//!
//! - [`scratch::ScratchFs`]: an isolated XFS filesystem on a direct-io loop
//!   device, with the device's write counters from `/proc/diskstats`;
//! - process helpers with time bounds ([`run_bounded`], [`Stopper`]);
//! - Ctrl-C handling ([`interrupt()`]): signals become a flag that every
//!   wait loop polls, so the `Drop`s that unmount, detach and kill run;
//! - preconditions ([`require`]), cold caches ([`drop_caches`]), summary
//!   statistics ([`Summary`]) and the report plumbing every benchmark
//!   shares ([`report`]: where results go, the git revision, the machine);
//! - CPU time from /proc ([`tree_cpu_seconds`]; `fleet::cpuacct` counts
//!   in nanoseconds through a cgroup).

pub mod fleet;
pub mod interrupt;
pub mod io;
pub mod new_objects;
pub mod process;
pub mod report;
pub mod scratch;
pub mod serve;
pub mod startup;
pub mod update_bytes;

pub use interrupt::{check_interrupted, interrupt, interrupted, sleep};
pub use oscontent_testkit::process::Stopper;
pub use process::{http_status, run_bounded, server_binary, stopper, tail};
pub use report::{bench_dir, git_state, load, mib, results_path, utc_stamp, Summary};

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::deps;

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

/// CPU seconds (user + system) a process has used, and those of its
/// children it has waited for, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    cpu_seconds_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// [`cpu_seconds`] from the text of a `/proc/.../stat` (a thread's too).
pub fn cpu_seconds_of(stat: &str) -> Option<(f64, f64)> {
    static TICKS: OnceLock<f64> = OnceLock::new();
    let ticks = *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
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

/// The live children of `pid` (one level: nginx's workers), from /proc.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.get(s.rfind(')')? + 1..)?.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// CPU seconds `pid` and its live children have used (a server that forks
/// workers is measured whole).
pub fn tree_cpu_seconds(pid: u32) -> Result<f64> {
    let (own, _) = cpu_seconds(pid).with_context(|| format!("reading /proc/{pid}/stat"))?;
    Ok(own
        + children(pid)
            .into_iter()
            .filter_map(cpu_seconds)
            .map(|(c, _)| c)
            .sum::<f64>())
}

/// Resident KiB of `pid` and its live children now (0 if gone).
pub fn tree_rss_kib(pid: u32) -> u64 {
    let rss = |p: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{p}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    };
    rss(pid) + children(pid).into_iter().map(rss).sum::<u64>()
}
