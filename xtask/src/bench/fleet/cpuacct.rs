//! CPU time of a server's process tree, to the nanosecond: the processes
//! are moved into a cgroup v1 cpuacct group of their own for the
//! measurement and `cpuacct.usage` is read. /proc's utime + stime count in
//! clock ticks (10 ms), coarser than what a small wave costs a server.
//! Without a writable cpuacct hierarchy the ticks are the fallback, and the
//! meter says which it used.

use crate::bench::{children, tree_cpu_seconds};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where cgroup v1 mounts the cpuacct controller.
const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

/// How a [`CpuMeter`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuSource {
    /// `cpuacct.usage` of a cgroup holding the tree (ns).
    Cgroup,
    /// utime + stime of the tree's processes from /proc (clock ticks).
    Ticks,
}

/// Measures the CPU a process tree uses from its creation on. Processes
/// the tree forks later are counted too (children start in their parent's
/// cgroup). On drop the processes still alive go back to the cgroup they
/// came from and the group is removed.
#[derive(Debug)]
pub struct CpuMeter {
    how: How,
}

#[derive(Debug)]
enum How {
    Cgroup {
        dir: PathBuf,
        /// The cpuacct group the processes were in, to move them back.
        home: PathBuf,
    },
    Ticks {
        pid: u32,
        start: f64,
    },
}

impl CpuMeter {
    /// Starts measuring `pid` and its live children.
    pub fn start(pid: u32) -> Result<Self> {
        match Self::cgroup(pid) {
            Ok(m) => Ok(m),
            Err(e) => {
                eprintln!("cpu meter: no cpuacct cgroup ({e:#}); counting /proc clock ticks");
                Ok(Self {
                    how: How::Ticks {
                        pid,
                        start: tree_cpu_seconds(pid)?,
                    },
                })
            }
        }
    }

    fn cgroup(pid: u32) -> Result<Self> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "oscontent-bench-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = Path::new(CPUACCT).join(name);
        let home = Path::new(CPUACCT).join(home_of(pid)?.trim_start_matches('/'));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let meter = Self {
            how: How::Cgroup {
                dir: dir.clone(),
                home,
            },
        };
        // The meter now owns the group: an error below removes it on drop.
        for p in std::iter::once(pid).chain(children(pid)) {
            move_to(&dir, p)?;
        }
        Ok(meter)
    }

    /// Which counter this meter reads.
    pub fn source(&self) -> CpuSource {
        match self.how {
            How::Cgroup { .. } => CpuSource::Cgroup,
            How::Ticks { .. } => CpuSource::Ticks,
        }
    }

    /// CPU-seconds used since [`CpuMeter::start`].
    pub fn seconds(&self) -> Result<f64> {
        match &self.how {
            How::Cgroup { dir, .. } => {
                let f = dir.join("cpuacct.usage");
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?;
                let ns: u64 = text
                    .trim()
                    .parse()
                    .with_context(|| format!("{} holds {text:?}", f.display()))?;
                Ok(ns as f64 / 1e9)
            }
            How::Ticks { pid, start } => Ok(tree_cpu_seconds(*pid)? - start),
        }
    }
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        let How::Cgroup { dir, home } = &self.how else {
            return;
        };
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let _ = move_to(home, p);
        }
        if let Err(e) = std::fs::remove_dir(dir) {
            eprintln!("cpu meter: removing {}: {e}", dir.display());
        }
    }
}

/// Moves process `pid` (all its threads) into the cgroup `dir`.
fn move_to(dir: &Path, pid: u32) -> Result<()> {
    let f = dir.join("cgroup.procs");
    std::fs::write(&f, format!("{pid}\n"))
        .with_context(|| format!("moving {pid} into {}", f.display()))
}

/// The cpuacct cgroup `pid` is in, from /proc/PID/cgroup.
fn home_of(pid: u32) -> Result<String> {
    let f = format!("/proc/{pid}/cgroup");
    let text = std::fs::read_to_string(&f).with_context(|| format!("reading {f}"))?;
    cpuacct_path(&text).with_context(|| format!("no cpuacct line in {f}"))
}

/// The cpuacct hierarchy's path in the text of a /proc/PID/cgroup
/// (`ID:controllers:path` lines, controllers comma-separated).
fn cpuacct_path(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',')
            .any(|c| c == "cpuacct")
            .then(|| path.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuacct_lines() {
        let cases = [
            ("4:cpuacct:/\n3:cpu:/x\n", Some("/")),
            (
                "5:cpu,cpuacct:/user.slice\n0::/init.scope\n",
                Some("/user.slice"),
            ),
            ("3:cpuacct:/a:b\n", Some("/a:b")),
            ("2:cpu:/\n0::/\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(cpuacct_path(text).as_deref(), want, "{text:?}");
        }
    }
}
