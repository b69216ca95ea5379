//! An isolated scratch filesystem for benchmarks: XFS on a loop device
//! with direct-io (so the loop device's counters are what the filesystem
//! really wrote, and the host's page cache does not absorb it twice),
//! backed by a sparse file, mounted on a fresh directory.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use xtask::bench::scratch::ScratchFs;
//! let fs = ScratchFs::create(2 << 30)?; // 2 GiB
//! let before = fs.stats()?;
//! std::fs::write(fs.path().join("x"), b"hello")?;
//! fs.syncfs()?;
//! let written = fs.stats()?.since(&before).written_bytes();
//! # let _ = written; Ok(()) }
//! // dropping `fs` unmounts, detaches and deletes everything
//! ```
//!
//! Cleanup is robust to partial failure: `Drop` undoes exactly the steps
//! that succeeded. A process killed with SIGKILL cannot clean up, so
//! [`reap_stale`] (called by [`ScratchFs::create`]) removes what dead
//! benchmark processes left behind: their directories are named
//! `oscontent-scratch-<pid>-*`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Prefix of every scratch directory; the owner's pid follows.
const PREFIX: &str = "oscontent-scratch-";
/// The backing file inside the scratch directory.
const IMAGE: &str = "fs.img";
/// The mount point inside the scratch directory.
const MNT: &str = "mnt";
/// Where [`ScratchFs::mount_ram`] mounts its tmpfs, beside [`MNT`].
const RAM: &str = "ram";
/// XFS refuses filesystems smaller than 300 MiB.
pub const MIN_SIZE: u64 = 512 << 20;

/// Options for [`ScratchFs::create_with`].
#[derive(Debug, Clone)]
pub struct ScratchOptions {
    /// Size of the filesystem (rounded up to MiB; at least [`MIN_SIZE`]).
    pub size: u64,
    /// Where the scratch directory (backing file and mount point) goes;
    /// default `target/bench/scratch`. It must be on a real disk.
    pub parent: Option<PathBuf>,
    /// Extra `mkfs.xfs` arguments (e.g. `-l size=...`).
    pub mkfs_args: Vec<String>,
    /// `mount -o` options, if any (e.g. `noatime`).
    pub mount_options: Option<String>,
    /// Start from a copy of this filesystem image (one that
    /// [`ScratchFs::into_image`] saved) instead of a fresh `mkfs.xfs`; the
    /// copy keeps the image's holes. `size` and `mkfs_args` are then
    /// ignored, and the mount adds `nouuid` (every copy shares the UUID).
    pub template: Option<PathBuf>,
}

impl ScratchOptions {
    pub fn new(size: u64) -> Self {
        ScratchOptions {
            size,
            parent: None,
            mkfs_args: Vec::new(),
            mount_options: None,
            template: None,
        }
    }
}

/// A mounted XFS filesystem on a direct-io loop device; unmounted,
/// detached and deleted on drop.
#[derive(Debug)]
pub struct ScratchFs {
    dir: Option<tempfile::TempDir>,
    mountpoint: PathBuf,
    /// `/dev/loopN`, once attached.
    device: Option<PathBuf>,
    mounted: bool,
    /// The tmpfs of [`ScratchFs::mount_ram`], once mounted.
    ram: Option<PathBuf>,
    size: u64,
    direct_io: bool,
}

impl ScratchFs {
    /// A fresh filesystem of `size` bytes with default options.
    pub fn create(size: u64) -> Result<ScratchFs> {
        ScratchFs::create_with(&ScratchOptions::new(size))
    }

    pub fn create_with(opts: &ScratchOptions) -> Result<ScratchFs> {
        super::require(super::SCRATCH_TOOLS)?;
        let parent = match &opts.parent {
            Some(p) => p.clone(),
            None => super::bench_dir()?.join("scratch"),
        };
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        reap_stale(&parent);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(&parent)
            .with_context(|| format!("creating a scratch dir in {}", parent.display()))?;
        let size = opts.size.max(MIN_SIZE).div_ceil(1 << 20) << 20;
        let mountpoint = dir.path().join(MNT);
        let image = dir.path().join(IMAGE);
        // From here on, Drop undoes whatever has been done.
        let mut fs = ScratchFs {
            dir: Some(dir),
            mountpoint,
            device: None,
            mounted: false,
            ram: None,
            size,
            direct_io: false,
        };
        std::fs::create_dir(&fs.mountpoint)
            .with_context(|| format!("creating {}", fs.mountpoint.display()))?;
        match &opts.template {
            Some(template) => {
                // cp keeps holes (SEEK_DATA/SEEK_HOLE); std::fs::copy
                // would fill them with zeros.
                run(Command::new("cp")
                    .arg("--sparse=always")
                    .arg(template)
                    .arg(&image))?;
                fs.size = std::fs::metadata(&image)
                    .with_context(|| format!("stat {}", image.display()))?
                    .len();
            }
            None => std::fs::File::create(&image)
                .and_then(|f| f.set_len(size))
                .with_context(|| format!("creating the sparse file {}", image.display()))?,
        }

        let out = run(Command::new("losetup")
            .args(["--direct-io=on", "--find", "--show"])
            .arg(&image))?;
        let device = PathBuf::from(out.trim());
        if !device.starts_with("/dev") {
            bail!("losetup printed {out:?}, not a device");
        }
        fs.device = Some(device);
        fs.direct_io = std::fs::read_to_string(format!("/sys/block/{}/loop/dio", fs.name()))
            .is_ok_and(|s| s.trim() == "1");
        if !fs.direct_io {
            eprintln!(
                "xtask: WARNING: {} is not in direct-io mode (the filesystem holding {} may not support O_DIRECT); its writes also go through the host page cache",
                fs.name(),
                image.display()
            );
        }

        let mut options: Vec<&str> = opts.mount_options.iter().map(String::as_str).collect();
        if opts.template.is_some() {
            options.push("nouuid");
        } else {
            run(Command::new("mkfs.xfs")
                .arg("-q")
                .args(&opts.mkfs_args)
                .arg(fs.device()))?;
        }
        let mut mount = Command::new("mount");
        mount.args(["-t", "xfs"]);
        if !options.is_empty() {
            mount.args(["-o", &options.join(",")]);
        }
        run(mount.arg(fs.device()).arg(&fs.mountpoint))?;
        fs.mounted = true;
        Ok(fs)
    }

    /// The mount point: the root of the filesystem.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// `/dev/loopN`.
    pub fn device(&self) -> &Path {
        self.device.as_deref().unwrap_or(Path::new(""))
    }

    /// `loopN`: the device's name in `/proc/diskstats` and `/sys/block`.
    pub fn name(&self) -> &str {
        self.device()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
    }

    /// The filesystem's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The filesystem's block size (what file sizes are rounded up to).
    pub fn block_size(&self) -> Result<u64> {
        let st = rustix::fs::statvfs(&self.mountpoint)
            .with_context(|| format!("statvfs {}", self.mountpoint.display()))?;
        Ok(st.f_bsize)
    }

    /// Whether the loop device really does direct I/O to its backing file.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// The loop device's counters now.
    pub fn stats(&self) -> Result<DiskStats> {
        DiskStats::read(self.name())
    }

    /// Sectors written to the device so far (since it was attached,
    /// mkfs included) × 512. Subtract a reading taken before the workload.
    pub fn device_written_bytes(&self) -> Result<u64> {
        Ok(self.stats()?.written_bytes())
    }

    /// `syncfs(2)` on this filesystem only: every dirty page and the
    /// journal reach the device. Returns how long it took.
    pub fn syncfs(&self) -> Result<Duration> {
        let t = Instant::now();
        let dir = std::fs::File::open(&self.mountpoint)
            .with_context(|| format!("opening {}", self.mountpoint.display()))?;
        rustix::fs::syncfs(&dir)
            .with_context(|| format!("syncfs {}", self.mountpoint.display()))?;
        Ok(t.elapsed())
    }
}

impl ScratchFs {
    /// A tmpfs of at most `size` bytes beside the filesystem (not in it,
    /// so that unmounting either never finds the other busy), unmounted
    /// first on drop; returns its mount point. For a workload that must
    /// run as it would on the filesystem without writing to it.
    pub fn mount_ram(&mut self, size: u64) -> Result<PathBuf> {
        anyhow::ensure!(self.ram.is_none(), "the tmpfs is already mounted");
        let dir = self.dir.as_ref().context("scratch dir already gone")?;
        let mnt = dir.path().join(RAM);
        std::fs::create_dir(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0755"))
            .arg("tmpfs")
            .arg(&mnt))?;
        self.ram = Some(mnt.clone());
        Ok(mnt)
    }

    /// Unmounts and detaches the filesystem, then moves its backing file
    /// to `dest` (on the same filesystem as the scratch directory), for
    /// [`ScratchOptions::template`]. The rest goes as on drop.
    pub fn into_image(mut self, dest: &Path) -> Result<()> {
        if let Some(ram) = self.ram.take() {
            anyhow::ensure!(unmount(&ram), "could not unmount {}", ram.display());
        }
        if self.mounted {
            anyhow::ensure!(
                unmount(&self.mountpoint),
                "could not unmount {}",
                self.mountpoint.display()
            );
            self.mounted = false;
        }
        if let Some(dev) = self.device.take() {
            anyhow::ensure!(detach(&dev), "could not detach {}", dev.display());
        }
        let image = self
            .dir
            .as_ref()
            .context("scratch dir already gone")?
            .path()
            .join(IMAGE);
        std::fs::rename(&image, dest)
            .with_context(|| format!("moving {} to {}", image.display(), dest.display()))
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        let mut clean = true;
        if let Some(ram) = self.ram.take() {
            clean &= unmount(&ram);
        }
        if self.mounted {
            clean &= unmount(&self.mountpoint);
            self.mounted = false;
        }
        if let Some(dev) = self.device.take() {
            clean &= detach(&dev);
        }
        if let Some(dir) = self.dir.take() {
            if clean {
                if let Err(e) = dir.close() {
                    eprintln!("xtask: removing a scratch dir: {e}");
                }
            } else {
                // Removing it recursively could reach into a filesystem
                // that is still mounted: keep it, and say so.
                let kept = dir.keep();
                eprintln!(
                    "xtask: WARNING: left {} behind (see the errors above); `cargo xtask bench` removes it on its next run, once this process is gone",
                    kept.display()
                );
            }
        }
    }
}

/// Unmounts, retrying while busy, then lazily. True if it is gone.
fn unmount(mnt: &Path) -> bool {
    for attempt in 0..20 {
        match run(Command::new("umount").arg(mnt)) {
            Ok(_) => return true,
            Err(e) if attempt == 19 => eprintln!("xtask: {e:#}"),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
    // Detached from the tree now; the device is released when its last
    // user goes.
    match run(Command::new("umount").arg("--lazy").arg(mnt)) {
        Ok(_) => {
            eprintln!("xtask: {} was busy; unmounted it lazily", mnt.display());
            true
        }
        Err(e) => {
            eprintln!("xtask: {e:#}");
            false
        }
    }
}

/// Detaches a loop device, retrying while busy. True if detached (or
/// marked to detach when its last user goes).
fn detach(dev: &Path) -> bool {
    for attempt in 0..20 {
        match run(Command::new("losetup").arg("--detach").arg(dev)) {
            Ok(_) => return true,
            Err(e) if attempt == 19 => eprintln!("xtask: {e:#}"),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
    false
}

/// Runs a short system command, returning its stdout; the error quotes
/// its stderr.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes what dead benchmark processes left under `parent`: mounts and
/// loop devices whose backing file is in an `oscontent-scratch-<pid>-*`
/// directory of a pid that no longer runs, then the directories. Best
/// effort; reports what it did.
pub fn reap_stale(parent: &Path) {
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    let owner = |dir_name: &str| -> Option<u32> {
        dir_name
            .strip_prefix(PREFIX)?
            .split('-')
            .next()?
            .parse()
            .ok()
    };
    // Loop devices first (wherever their directory is).
    let Ok(blocks) = std::fs::read_dir("/sys/block") else {
        return;
    };
    for entry in blocks.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim().trim_end_matches(" (deleted)");
        let dir_name = Path::new(backing)
            .parent()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(pid) = owner(&dir_name) else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        let dev = PathBuf::from(format!("/dev/{name}"));
        eprintln!(
            "xtask: cleaning up {} (left by dead pid {pid})",
            dev.display()
        );
        for mnt in mounts_of(&dev) {
            unmount(&mnt);
        }
        detach(&dev);
    }
    // Then the directories under `parent`, if nothing is mounted in them.
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner(&name) else { continue };
        let path = entry.path();
        if alive(pid) {
            continue;
        }
        // Its tmpfs has no device to find it by: unmount it by place.
        let ram = path.join(RAM);
        if mount_points().contains(&ram) {
            eprintln!(
                "xtask: cleaning up {} (left by dead pid {pid})",
                ram.display()
            );
            unmount(&ram);
        }
        if mount_points().iter().any(|m| m.starts_with(&path)) {
            continue;
        }
        eprintln!("xtask: removing stale {}", path.display());
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// Mount points whose source is `dev`, from /proc/self/mountinfo.
fn mounts_of(dev: &Path) -> Vec<PathBuf> {
    mountinfo()
        .into_iter()
        .filter(|(_, src)| Path::new(src) == dev)
        .map(|(mnt, _)| mnt)
        .collect()
}

fn mount_points() -> Vec<PathBuf> {
    mountinfo().into_iter().map(|(mnt, _)| mnt).collect()
}

/// (mount point, source) pairs. Octal escapes (`\040`) are decoded.
fn mountinfo() -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some((
                PathBuf::from(unescape(f.get(4)?)),
                unescape(f.get(sep + 2)?),
            ))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

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

    /// Needs root, loop devices and xfsprogs, as every benchmark does.
    #[test]
    fn a_tmpfs_beside_the_filesystem_is_not_on_its_device_and_goes_with_it() {
        let parent = tempfile::tempdir().unwrap();
        let mut fs = ScratchFs::create_with(&ScratchOptions {
            parent: Some(parent.path().to_owned()),
            ..ScratchOptions::new(MIN_SIZE)
        })
        .unwrap();
        let ram = fs.mount_ram(64 << 20).unwrap();
        assert!(!ram.starts_with(fs.path()), "{}", ram.display());
        assert!(fs.mount_ram(1 << 20).is_err(), "mounted twice");
        fs.syncfs().unwrap();
        let before = fs.stats().unwrap();
        std::fs::write(ram.join("x"), vec![7u8; 8 << 20]).unwrap();
        fs.syncfs().unwrap();
        // Nothing of the 8 MiB reached the loop device (XFS may log a
        // few blocks of its own).
        assert!(fs.stats().unwrap().since(&before).written_bytes() < 1 << 20);
        drop(fs);
        assert!(
            !mount_points().contains(&ram),
            "{} still mounted",
            ram.display()
        );
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    /// A tmpfs left by a process killed before its drop ran is unmounted
    /// and its directory removed by the next benchmark.
    #[test]
    fn a_dead_owners_tmpfs_is_reaped() {
        let parent = tempfile::tempdir().unwrap();
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let dir = parent.path().join(format!("{PREFIX}{dead}-x"));
        let ram = dir.join(RAM);
        std::fs::create_dir_all(&ram).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&ram))
        .unwrap();
        std::fs::write(ram.join("x"), b"left behind").unwrap();
        // A live owner's is left alone.
        let live = parent
            .path()
            .join(format!("{PREFIX}{}-y", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        reap_stale(parent.path());
        assert!(
            !mount_points().contains(&ram),
            "{} still mounted",
            ram.display()
        );
        assert!(!dir.exists());
        assert!(live.exists());
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/x\04"), r"/x\04");
    }
}
