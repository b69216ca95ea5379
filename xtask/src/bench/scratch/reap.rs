//! What a benchmark killed before its drop ran leaves behind (loop
//! devices, mounts, directories), found by the owner's pid in the
//! directory's name, and the mount table it is found in.

use super::{detach, unmount, PREFIX, RAM};
use std::path::{Path, PathBuf};

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

pub(super) fn mount_points() -> Vec<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scratch::run;
    use std::process::Command;

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
