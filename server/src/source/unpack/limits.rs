//! The stream-level limits of a layer: decompressed size and compression
//! ratio (while decompressing), tar entry count, and extension header size.
//! Path length and depth are checked per entry by the decoder.

use crate::source::{Limits, SourceError, Subject};
use std::io::{self, Read};

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

/// Refuses an extension header (`what`: PAX, GNU long name, ...) of
/// `size` bytes over the limit, before it is read into memory.
pub(super) fn check_extension(
    size: u64,
    what: &str,
    limits: &Limits,
    subject: &Subject,
) -> Result<(), SourceError> {
    if size > limits.max_extension_bytes {
        return Err(SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: "tar extension header",
            detail: format!(
                "a {what} header of {size} bytes (limit {})",
                limits.max_extension_bytes
            ),
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
    fn entries_and_extensions() {
        let (l, s) = (limits(), Subject::new("img", "layer 1/1"));
        let mut n = 0;
        count_entry(&mut n, &l, &s).unwrap();
        count_entry(&mut n, &l, &s).unwrap();
        let e = count_entry(&mut n, &l, &s).unwrap_err().to_string();
        assert!(
            e.contains("tar entries limit exceeded: more than 2 entries"),
            "{e}"
        );
        check_extension(50, "PAX", &l, &s).unwrap();
        let e = check_extension(51, "PAX", &l, &s).unwrap_err().to_string();
        assert!(e.contains("a PAX header of 51 bytes (limit 50)"), "{e}");
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
}
