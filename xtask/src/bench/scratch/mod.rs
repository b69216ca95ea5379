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

mod reap;
mod stats;

pub use reap::reap_stale;
pub use stats::{usage, DiskStats, Usage};

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
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
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

#[cfg(test)]
mod tests {
    use super::reap::mount_points;
    use super::*;

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
}
