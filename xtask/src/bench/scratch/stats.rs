//! The loop device's I/O counters and the space a tree takes.

use anyhow::{Context, Result};
use std::path::Path;

/// One line of `/proc/diskstats` (see the kernel's
/// Documentation/admin-guide/iostats.rst). Fields a kernel lacks are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskStats {
    pub reads: u64,
    pub reads_merged: u64,
    pub sectors_read: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub writes_merged: u64,
    pub sectors_written: u64,
    pub write_ms: u64,
    pub in_flight: u64,
    pub io_ms: u64,
    pub weighted_io_ms: u64,
    pub discards: u64,
    pub discards_merged: u64,
    pub sectors_discarded: u64,
    pub discard_ms: u64,
    pub flushes: u64,
    pub flush_ms: u64,
}

impl DiskStats {
    /// The counters of device `name` (e.g. `loop3`).
    pub fn read(name: &str) -> Result<DiskStats> {
        let text = std::fs::read_to_string("/proc/diskstats").context("reading /proc/diskstats")?;
        Self::parse(&text, name).with_context(|| format!("no device {name:?} in /proc/diskstats"))
    }

    fn parse(text: &str, name: &str) -> Option<DiskStats> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(3)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let g = |i: usize| v.get(i).copied().unwrap_or(0);
        Some(DiskStats {
            reads: g(0),
            reads_merged: g(1),
            sectors_read: g(2),
            read_ms: g(3),
            writes: g(4),
            writes_merged: g(5),
            sectors_written: g(6),
            write_ms: g(7),
            in_flight: g(8),
            io_ms: g(9),
            weighted_io_ms: g(10),
            discards: g(11),
            discards_merged: g(12),
            sectors_discarded: g(13),
            discard_ms: g(14),
            flushes: g(15),
            flush_ms: g(16),
        })
    }

    /// Counter increments from `earlier` to `self` (`in_flight` is kept as
    /// is: it is a gauge).
    pub fn since(&self, earlier: &DiskStats) -> DiskStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        DiskStats {
            reads: d(self.reads, earlier.reads),
            reads_merged: d(self.reads_merged, earlier.reads_merged),
            sectors_read: d(self.sectors_read, earlier.sectors_read),
            read_ms: d(self.read_ms, earlier.read_ms),
            writes: d(self.writes, earlier.writes),
            writes_merged: d(self.writes_merged, earlier.writes_merged),
            sectors_written: d(self.sectors_written, earlier.sectors_written),
            write_ms: d(self.write_ms, earlier.write_ms),
            in_flight: self.in_flight,
            io_ms: d(self.io_ms, earlier.io_ms),
            weighted_io_ms: d(self.weighted_io_ms, earlier.weighted_io_ms),
            discards: d(self.discards, earlier.discards),
            discards_merged: d(self.discards_merged, earlier.discards_merged),
            sectors_discarded: d(self.sectors_discarded, earlier.sectors_discarded),
            discard_ms: d(self.discard_ms, earlier.discard_ms),
            flushes: d(self.flushes, earlier.flushes),
            flush_ms: d(self.flush_ms, earlier.flush_ms),
        }
    }

    /// Sectors written × 512 (diskstats sectors are always 512 bytes).
    pub fn written_bytes(&self) -> u64 {
        self.sectors_written * 512
    }

    pub fn read_bytes(&self) -> u64 {
        self.sectors_read * 512
    }
}

/// Space used by a tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Regular files.
    pub files: u64,
    /// Directories (the root included).
    pub dirs: u64,
    /// Symlinks and anything else.
    pub other: u64,
    /// Sum of regular files' sizes.
    pub apparent_bytes: u64,
    /// Sum of blocks allocated (st_blocks × 512) for every inode; hard
    /// links counted once.
    pub allocated_bytes: u64,
}

/// Apparent and allocated bytes and inode counts under `dir`, walked
/// without following symlinks (bounded by the tree: one we created).
pub fn usage(dir: &Path) -> Result<Usage> {
    use std::os::unix::fs::MetadataExt;
    let mut u = Usage::default();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let md = std::fs::symlink_metadata(&d).with_context(|| format!("stat {}", d.display()))?;
        u.dirs += 1;
        u.allocated_bytes += md.blocks() * 512;
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let md = e.metadata()?;
            let ft = md.file_type();
            if ft.is_dir() {
                stack.push(e.path());
                continue;
            }
            if md.nlink() > 1 && !seen.insert((md.dev(), md.ino())) {
                continue;
            }
            if ft.is_file() {
                u.files += 1;
                u.apparent_bytes += md.len();
            } else {
                u.other += 1;
            }
            u.allocated_bytes += md.blocks() * 512;
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats_line() {
        let text = "   7       0 loop0 10 0 80 1 0 0 0 0 0 1 1 0 0 0 0\n   7       1 loop1 4 1 40 2 50 3 8000 90 0 100 120 1 0 8 1 6 2\n";
        let s = DiskStats::parse(text, "loop1").unwrap();
        assert_eq!(s.written_bytes(), 8000 * 512);
        assert_eq!((s.writes, s.flushes, s.flush_ms), (50, 6, 2));
        assert!(DiskStats::parse(text, "loop10").is_none());
        let later = DiskStats {
            sectors_written: 9000,
            ..s
        };
        assert_eq!(later.since(&s).written_bytes(), 1000 * 512);
    }
}
