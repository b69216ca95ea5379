//! Verification while the bytes go by: every blob is read through a
//! [`VerifyingReader`], which hashes it, counts it against the descriptor's
//! size (one byte too many is an error at once), and only reports a clean end
//! of stream once the sha256 matched.

use super::error::{SourceError, Subject};
use sha2::{Digest as _, Sha256};
use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A byte rate a fetch keeps to (a mirror's `--max-rate` over a thin
/// link): told of every read, it sleeps as long as the rate requires.
pub trait Pace: Send + Sync + std::fmt::Debug {
    fn take(&self, bytes: u64);
}

/// When to stop reading: the caller went away, or the whole fetch has
/// taken too long; and how fast to read.
#[derive(Debug, Clone)]
pub struct Stop {
    pub cancel: Arc<AtomicBool>,
    pub deadline: Option<(Instant, Duration)>,
    pub pace: Option<Arc<dyn Pace>>,
}

impl Stop {
    pub fn check(&self, subject: &Subject) -> Result<(), SourceError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(SourceError::Cancelled {
                subject: subject.clone(),
            });
        }
        if let Some((at, total)) = self.deadline {
            if Instant::now() >= at {
                return Err(SourceError::TimedOut {
                    subject: subject.clone(),
                    after: total,
                });
            }
        }
        Ok(())
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Wraps a blob's byte stream (network body or file). Errors it detects
/// are kept in `failure` (the root cause, whatever the decompressor or tar
/// reader made of the `io::Error` it was handed).
#[derive(Debug)]
pub struct VerifyingReader<R> {
    inner: R,
    subject: Subject,
    /// Where the bytes come from (a URL or a file), for error messages.
    origin: String,
    expected_digest: String,
    expected_size: u64,
    hasher: Sha256,
    count: Rc<Cell<u64>>,
    verified: bool,
    pub failure: Option<SourceError>,
    stop: Option<Stop>,
}

impl<R: Read> VerifyingReader<R> {
    pub fn new(
        inner: R,
        subject: Subject,
        origin: String,
        expected_digest: &str,
        expected_size: u64,
        stop: Option<Stop>,
    ) -> Self {
        Self {
            inner,
            subject,
            origin,
            expected_digest: expected_digest.to_owned(),
            expected_size,
            hasher: Sha256::new(),
            count: Rc::new(Cell::new(0)),
            verified: false,
            failure: None,
            stop,
        }
    }

    /// Bytes read so far (compressed, as stored).
    pub fn count(&self) -> u64 {
        self.count.get()
    }

    /// A live view of [`Self::count`] for whoever reads through us (the
    /// compression-ratio check).
    pub fn count_handle(&self) -> Rc<Cell<u64>> {
        self.count.clone()
    }

    fn fail(&mut self, e: SourceError) -> io::Error {
        let msg = e.to_string();
        if self.failure.is_none() {
            self.failure = Some(e);
        }
        io::Error::other(msg)
    }

    /// Reads whatever is left, so that the digest covers the whole blob
    /// (tar stops at its end-of-archive marker, gzip before its trailer).
    /// Returns the first failure, if any.
    pub fn finish(&mut self) -> Result<(), SourceError> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        if let Err(e) = io::copy(self, &mut io::sink()) {
            return Err(self.failure.take().unwrap_or_else(|| SourceError::Network {
                subject: self.subject.clone(),
                url: self.origin.clone(),
                reason: e.to_string(),
            }));
        }
        debug_assert!(self.verified);
        Ok(())
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = &self.failure {
            return Err(io::Error::other(e.to_string()));
        }
        if self.verified || buf.is_empty() {
            return Ok(0);
        }
        if let Some(Err(e)) = self.stop.as_ref().map(|st| st.check(&self.subject)) {
            return Err(self.fail(e));
        }
        // Ask for at most one byte past the expected end: enough to notice
        // an overlong stream without reading it.
        let room = self
            .expected_size
            .saturating_sub(self.count.get())
            .saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = match self.inner.read(&mut buf[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                let e = SourceError::Network {
                    subject: self.subject.clone(),
                    url: self.origin.clone(),
                    reason: format!(
                        "reading failed after {} of {} bytes: {e}",
                        self.count.get(),
                        self.expected_size
                    ),
                };
                return Err(self.fail(e));
            }
        };
        if let Some(p) = self.stop.as_ref().and_then(|st| st.pace.as_ref()) {
            p.take(n as u64);
        }
        if n == 0 {
            if self.count.get() < self.expected_size {
                let e = SourceError::Truncated {
                    subject: self.subject.clone(),
                    expected: self.expected_size,
                    got: self.count.get(),
                };
                return Err(self.fail(e));
            }
            let actual = format!(
                "sha256:{}",
                hex::encode(std::mem::take(&mut self.hasher).finalize())
            );
            if actual != self.expected_digest {
                let e = SourceError::DigestMismatch {
                    subject: self.subject.clone(),
                    expected: self.expected_digest.clone(),
                    actual,
                };
                return Err(self.fail(e));
            }
            self.verified = true;
            return Ok(0);
        }
        self.count.set(self.count.get() + n as u64);
        if self.count.get() > self.expected_size {
            let e = SourceError::SizeMismatch {
                subject: self.subject.clone(),
                expected: self.expected_size,
                actual: self.count.get(),
            };
            return Err(self.fail(e));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Reads a small JSON blob (config, manifest, index) completely and
/// verifies it; `max` bounds it whatever the descriptor says.
pub fn read_small<R: Read>(
    inner: R,
    subject: &Subject,
    origin: &str,
    digest: &str,
    size: u64,
    max: u64,
    limit_name: &'static str,
) -> Result<Vec<u8>, SourceError> {
    if size > max {
        return Err(SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: limit_name,
            detail: format!("the descriptor says {size} bytes, the limit is {max}"),
        });
    }
    let mut r = VerifyingReader::new(
        inner,
        subject.clone(),
        origin.to_owned(),
        digest,
        size,
        None,
    );
    let mut buf = Vec::with_capacity(size as usize);
    if let Err(e) = r.read_to_end(&mut buf) {
        return Err(r.failure.take().unwrap_or_else(|| SourceError::Network {
            subject: subject.clone(),
            url: origin.to_owned(),
            reason: e.to_string(),
        }));
    }
    r.finish()?;
    Ok(buf)
}

/// Reads at most `max` bytes of a stream whose digest is not known in
/// advance (a manifest by tag); more is an error.
pub fn read_bounded<R: Read>(
    inner: R,
    subject: &Subject,
    origin: &str,
    max: u64,
    limit_name: &'static str,
) -> Result<Vec<u8>, SourceError> {
    let mut buf = Vec::new();
    inner
        .take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| SourceError::Network {
            subject: subject.clone(),
            url: origin.to_owned(),
            reason: e.to_string(),
        })?;
    if buf.len() as u64 > max {
        return Err(SourceError::LimitExceeded {
            subject: subject.clone(),
            limit: limit_name,
            detail: format!("more than {max} bytes"),
        });
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> Subject {
        Subject::new("img", "layer")
    }

    fn reader<'a>(data: &'a [u8], digest: &str, size: u64) -> VerifyingReader<&'a [u8]> {
        VerifyingReader::new(data, subject(), "mem".into(), digest, size, None)
    }

    /// Counts what it is told of.
    #[derive(Debug, Default)]
    struct Tally(std::sync::atomic::AtomicU64);

    impl Pace for Tally {
        fn take(&self, bytes: u64) {
            self.0.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    #[test]
    fn every_byte_read_is_paced() {
        let data = vec![7u8; 100_000];
        let d = sha256_digest(&data);
        let tally = Arc::new(Tally::default());
        let stop = Stop {
            cancel: Arc::new(AtomicBool::new(false)),
            deadline: None,
            pace: Some(tally.clone()),
        };
        let mut r =
            VerifyingReader::new(&data[..], subject(), "mem".into(), &d, 100_000, Some(stop));
        // Small reads, then what the consumer left, drained by finish().
        let mut some = [0u8; 3000];
        r.read_exact(&mut some).unwrap();
        r.finish().unwrap();
        assert_eq!(tally.0.load(Ordering::Relaxed), 100_000);
    }

    #[test]
    fn verifies_digest_and_size() {
        let data = b"hello world";
        let d = sha256_digest(data);
        let mut r = reader(data, &d, 11);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        r.finish().unwrap();

        // finish() drains what the consumer left.
        let mut r = reader(data, &d, 11);
        let mut two = [0u8; 2];
        r.read_exact(&mut two).unwrap();
        r.finish().unwrap();
        assert_eq!(r.count(), 11);

        let mut r = reader(data, &sha256_digest(b"other"), 11);
        assert!(matches!(
            r.finish(),
            Err(SourceError::DigestMismatch { .. })
        ));
        let mut r = reader(data, &d, 12);
        assert!(matches!(
            r.finish(),
            Err(SourceError::Truncated {
                expected: 12,
                got: 11,
                ..
            })
        ));
        let mut r = reader(data, &d, 10);
        assert!(matches!(
            r.finish(),
            Err(SourceError::SizeMismatch {
                expected: 10,
                actual: 11,
                ..
            })
        ));
    }

    #[test]
    fn small_reads_are_bounded() {
        let data = b"{}";
        let d = sha256_digest(data);
        assert_eq!(
            read_small(&data[..], &subject(), "m", &d, 2, 10, "x").unwrap(),
            data
        );
        assert!(matches!(
            read_small(&data[..], &subject(), "m", &d, 20, 10, "x"),
            Err(SourceError::LimitExceeded { .. })
        ));
        assert!(matches!(
            read_bounded(&[0u8; 11][..], &subject(), "m", 10, "x"),
            Err(SourceError::LimitExceeded { .. })
        ));
        assert_eq!(
            read_bounded(&[0u8; 10][..], &subject(), "m", 10, "x")
                .unwrap()
                .len(),
            10
        );
    }
}
