//! A small tmpfs of a test's own, for running out of space (or inodes) on
//! purpose: the node repo of the disk-fill suite, the server's state dir.
//! The suites run as root; mounting fails, saying so, otherwise.

use crate::process::run_bounded;
use crate::tools::tempdir;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A tmpfs mounted on a fresh directory; unmounted (lazily, so a failed
/// test cannot leave it busy) when dropped.
#[derive(Debug)]
pub struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    /// A tmpfs of `bytes`.
    pub fn mount(bytes: u64) -> SmallFs {
        Self::mount_with(&format!("size={bytes}"))
    }

    /// A tmpfs with these mount options (`size=…,nr_inodes=…`).
    pub fn mount_with(options: &str) -> SmallFs {
        let dir = tempdir();
        let out = run_bounded(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", options, "tmpfs"])
                .arg(dir.path()),
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(
            out.status.success(),
            "mounting a tmpfs (the disk tests run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes free to unprivileged writers.
    pub fn free(&self) -> u64 {
        let st = rustix::fs::statvfs(self.path()).unwrap();
        st.f_bavail * st.f_frsize
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = run_bounded(
            Command::new("umount").arg("-l").arg(self.dir.path()),
            Duration::from_secs(30),
        );
    }
}
