//! The stream-level limits of a layer: decompressed size and compression
//! ratio (while decompressing), tar entry count, and extension header size.
//! Path length and depth are checked per entry by the decoder.

use crate::source::{Limits, SourceError, Subject};
use std::io::{self, Read};
use std::os::fd::BorrowedFd;

/// Decompressed bytes, counted against the size and ratio limits.
pub(super) struct Counted<'a, R, C> {
    pub inner: R,
    /// The compressed bytes read so far.
    pub compressed: C,
    /// Decompressed bytes of this layer.
    pub layer: u64,
    /// Decompressed bytes of all layers.
    pub total: &'a mut u64,
    pub limits: &'a Limits,
    pub subject: &'a Subject,
    /// The limit hit: the tar reader only sees an `io::Error`, and the
    /// caller reports this instead.
    pub failure: &'a mut Option<SourceError>,
}

impl<R: Read, C: Fn() -> u64> Counted<'_, R, C> {
    /// The limit the bytes decompressed so far exceed, if any.
    fn exceeded(&self) -> Option<SourceError> {
        if *self.total > self.limits.max_decompressed_bytes {
            return Some(SourceError::LimitExceeded {
                subject: self.subject.clone(),
                limit: "decompressed size",
                detail: format!(
                    "more than {} bytes decompressed",
                    self.limits.max_decompressed_bytes
                ),
            });
        }
        let compressed = (self.compressed)();
        if self.layer > self.limits.ratio_grace_bytes
            && self.layer > self.limits.max_ratio.saturating_mul(compressed.max(1))
        {
            return Some(SourceError::LimitExceeded {
                subject: self.subject.clone(),
                limit: "compression ratio",
                detail: format!(
                    "{} bytes decompressed from {compressed} compressed, over the {}:1 limit",
                    self.layer, self.limits.max_ratio
                ),
            });
        }
        None
    }
}

impl<R: Read, C: Fn() -> u64> Read for Counted<'_, R, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.layer += n as u64;
        *self.total += n as u64;
        if let Some(e) = self.exceeded() {
            let msg = e.to_string();
            self.failure.get_or_insert(e);
            return Err(io::Error::other(msg));
        }
        Ok(n)
    }
}

/// What the unpacker leaves free on the state volume, where the generation
/// being served, the access log and the next refresh live: this much, or
/// 1/20 of the volume if that is less (small test volumes).
pub(super) const SPACE_RESERVE_BYTES: u64 = 256 << 20;
/// Inodes it leaves free, likewise capped at 1/20 of the volume's.
pub(super) const SPACE_RESERVE_INODES: u64 = 1024;

/// A filesystem's space, from `statvfs`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Space {
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub free_inodes: u64,
    pub total_inodes: u64,
}

impl Space {
    /// Free and total bytes and inodes of the filesystem holding `fd`
    /// (free for an unprivileged writer, as `df` shows them).
    pub(super) fn of(fd: BorrowedFd<'_>) -> io::Result<Space> {
        let v = rustix::fs::fstatvfs(fd)?;
        Ok(Space {
            free_bytes: v.f_bavail.saturating_mul(v.f_frsize),
            total_bytes: v.f_blocks.saturating_mul(v.f_frsize),
            free_inodes: v.f_favail,
            total_inodes: v.f_files,
        })
    }
}

/// The check every layer entry passes before it is written, legacy
/// (`srv/repo` files) or native (objects): `size` bytes and an inode must
/// fit on the staging filesystem (`staging`, a directory fd on it) and
/// leave the reserve. Looked up before each entry, not once per image:
/// the volume is shared with what is being served.
pub(in crate::source) fn check_room(
    staging: BorrowedFd<'_>,
    path: &str,
    size: u64,
    subject: &Subject,
) -> Result<(), SourceError> {
    let space = Space::of(staging)
        .map_err(|err| SourceError::from_io(subject, "the staging directory", err))?;
    check_space(path, size, space, subject)
}

/// Refuses the file `path` of `size` bytes when writing it would leave
/// less than the reserve free: a disk-full error (retried later), before
/// the write rather than half-way through it.
pub(super) fn check_space(
    path: &str,
    size: u64,
    s: Space,
    subject: &Subject,
) -> Result<(), SourceError> {
    let bytes_kept = SPACE_RESERVE_BYTES.min(s.total_bytes / 20);
    let inodes_kept = SPACE_RESERVE_INODES.min(s.total_inodes / 20);
    // Filesystems without inode accounting report 0 inodes in total.
    let inodes_short = s.total_inodes > 0 && s.free_inodes < inodes_kept.saturating_add(1);
    if size.saturating_add(bytes_kept) > s.free_bytes || inodes_short {
        return Err(SourceError::DiskFull {
            subject: subject.clone(),
            path: format!(
                "{path} ({size} bytes, with {} bytes and {} inodes free; {bytes_kept} bytes and {inodes_kept} inodes are kept in reserve)",
                s.free_bytes, s.free_inodes
            ),
        });
    }
    Ok(())
}

/// Entries plus the parent directories they created, against the entry
/// limit: inodes are what runs out first on a small state volume.
pub(super) fn count_dirs(
    entries: u64,
    implicit_dirs: u64,
    limits: &Limits,
    subject: &Subject,
) -> Result<(), SourceError> {
    if entries.saturating_add(implicit_dirs) > limits.max_entries {
        return Err(SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: "tar entries",
            detail: format!(
                "more than {} entries and directories ({entries} entries, {implicit_dirs} parent directories created for them)",
                limits.max_entries
            ),
        });
    }
    Ok(())
}

/// Counts one more tar entry (all layers) against the entry limit.
pub(super) fn count_entry(
    entries: &mut u64,
    limits: &Limits,
    subject: &Subject,
) -> Result<(), SourceError> {
    *entries += 1;
    if *entries > limits.max_entries {
        return Err(SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: "tar entries",
            detail: format!("more than {} entries", limits.max_entries),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_decompressed_bytes: 1000,
            max_ratio: 10,
            ratio_grace_bytes: 100,
            max_entries: 2,
            max_extension_bytes: 50,
            ..Limits::default()
        }
    }

    /// Reads `data` through a [`Counted`] as if `compressed` bytes had
    /// produced it, after `before` bytes of earlier layers.
    fn read_all(data: usize, compressed: u64, before: u64) -> Result<u64, String> {
        let limits = limits();
        let subject = Subject::new("img", "layer 1/1");
        let mut total = before;
        let mut failure = None;
        let mut r = Counted {
            inner: &vec![0u8; data][..],
            compressed: || compressed,
            layer: 0,
            total: &mut total,
            limits: &limits,
            subject: &subject,
            failure: &mut failure,
        };
        let read = io::copy(&mut r, &mut io::sink());
        match (read, failure) {
            (Ok(n), None) => Ok(n),
            (Err(e), Some(f)) => {
                assert_eq!(e.to_string(), f.to_string());
                Err(f.to_string())
            }
            (r, f) => panic!("{r:?} with {f:?}"),
        }
    }

    #[test]
    fn decompressed_size_and_ratio() {
        let cases: &[(usize, u64, u64, Option<&str>)] = &[
            (100, 1, 0, None),
            (500, 50, 0, None),
            (500, 10, 0, Some("compression ratio limit exceeded: 500 bytes decompressed from 10 compressed, over the 10:1 limit")),
            (900, 900, 200, Some("decompressed size limit exceeded: more than 1000 bytes decompressed")),
            (1000, 1000, 0, None),
        ];
        for (data, compressed, before, want) in cases {
            let got = read_all(*data, *compressed, *before);
            match want {
                None => assert_eq!(got, Ok(*data as u64)),
                Some(w) => assert!(got.as_ref().unwrap_err().contains(w), "{got:?}"),
            }
        }
    }

    #[test]
    fn entries() {
        let (l, s) = (limits(), Subject::new("img", "layer 1/1"));
        let mut n = 0;
        count_entry(&mut n, &l, &s).unwrap();
        count_entry(&mut n, &l, &s).unwrap();
        let e = count_entry(&mut n, &l, &s).unwrap_err().to_string();
        assert!(
            e.contains("tar entries limit exceeded: more than 2 entries"),
            "{e}"
        );
    }

    #[test]
    fn created_parents_count_as_entries() {
        // (entries, implicit directories, refused) against max_entries = 2.
        let cases = [
            (1, 0, false),
            (2, 0, false),
            (1, 1, false),
            (1, 2, true),
            (0, 3, true),
            (u64::MAX, u64::MAX, true),
        ];
        let subject = Subject::new("img", "layer 1/1");
        for (entries, dirs, refused) in cases {
            let got = count_dirs(entries, dirs, &limits(), &subject);
            assert_eq!(got.is_err(), refused, "{entries} + {dirs}");
            if let Err(e) = got {
                assert!(e.to_string().contains("parent directories"), "{e}");
            }
        }
    }

    #[test]
    fn files_leave_the_reserve_free() {
        let (r, i) = (SPACE_RESERVE_BYTES, SPACE_RESERVE_INODES);
        let big = |free_bytes, free_inodes| Space {
            free_bytes,
            total_bytes: 1 << 40,
            free_inodes,
            total_inodes: 1 << 30,
        };
        // A 2 MiB tmpfs with 1 MiB free keeps 1/20 of it (104857 bytes).
        let small = Space {
            free_bytes: 1 << 20,
            total_bytes: 2 << 20,
            free_inodes: 500,
            total_inodes: 1000,
        };
        let no_inodes = Space {
            total_inodes: 0,
            free_inodes: 0,
            ..big(r + 10, 0)
        };
        let cases = [
            (0, big(r, i + 1), false),
            (100, big(r + 100, i + 1), false),
            (101, big(r + 100, i + 1), true),
            (0, big(r - 1, 1 << 20), true),
            (0, big(u64::MAX, i), true),
            (u64::MAX, big(u64::MAX - 1, u64::MAX), true),
            (1 << 20, small, true),
            ((1 << 20) - 104_857, small, false),
            ((1 << 20) - 104_856, small, true),
            (10, no_inodes, false),
        ];
        let subject = Subject::new("img", "layer 1/1");
        for (size, space, refused) in cases {
            let got = check_space("srv/repo/f", size, space, &subject);
            assert_eq!(got.is_err(), refused, "{size} {space:?}");
            if let Err(e) = got {
                assert!(
                    e.to_string().contains("disk full while writing srv/repo/f"),
                    "{e}"
                );
                assert!(e.is_retryable());
            }
        }
    }
}
