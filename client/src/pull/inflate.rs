//! The body of a `.filez` (raw deflate), inflated to exactly the size its
//! header declared. The declared size has been checked against the free
//! space and the commit's own size list before the first byte is written,
//! so the stream must neither stop short of it nor go on past it: a body
//! that inflates to more, or carries compressed bytes after the deflate
//! stream, is refused before libostree sees its last bytes (and so before
//! it links the object), instead of being silently cut at the size.

use std::io::{self, BufRead, Read};
use std::sync::{Arc, OnceLock};

/// A reader of exactly `declared` inflated bytes; any other length is an
/// `InvalidData` error, raised no later than the read that returns the
/// last declared byte.
#[derive(Debug)]
pub struct ExactInflate<R: BufRead> {
    dec: flate2::bufread::DeflateDecoder<R>,
    declared: u64,
    remaining: u64,
    /// Whether the end has been checked (once, at the declared size).
    ended: bool,
    /// Why the body was refused: libostree (through gio) reports a read
    /// error by its kind only, so the caller reads the reason here.
    refusal: Arc<OnceLock<String>>,
}

impl<R: BufRead> ExactInflate<R> {
    pub fn new(compressed: R, declared: u64) -> Self {
        Self {
            dec: flate2::bufread::DeflateDecoder::new(compressed),
            declared,
            remaining: declared,
            ended: false,
            refusal: Arc::default(),
        }
    }

    /// Where the reason for a refusal will be, once there is one.
    pub fn refusal(&self) -> Arc<OnceLock<String>> {
        self.refusal.clone()
    }

    fn refuse(&self, why: String) -> io::Error {
        let _ = self.refusal.set(why.clone());
        io::Error::new(io::ErrorKind::InvalidData, why)
    }

    /// Checks the end of a body that declares nothing (an empty file, a
    /// symlink), which its reader may never read: libostree knows the
    /// length and asks for no bytes.
    pub fn check_empty(&mut self) -> io::Result<()> {
        if self.remaining == 0 {
            self.check_end()?;
        }
        Ok(())
    }

    /// After the last declared byte: nothing more may inflate, and nothing
    /// may follow the deflate stream.
    fn check_end(&mut self) -> io::Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        // An empty file may have no deflate stream at all: libostree never
        // reads one, and repos written by other tools leave it out.
        if self.declared == 0
            && self.dec.total_in() == 0
            && self.dec.get_mut().fill_buf()?.is_empty()
        {
            return Ok(());
        }
        let mut probe = [0u8; 1];
        if self.dec.read(&mut probe)? != 0 {
            return Err(self.refuse(format!(
                "the body inflates to more than the {} bytes its header declares",
                self.declared
            )));
        }
        if !self.dec.get_mut().fill_buf()?.is_empty() {
            return Err(
                self.refuse("the body has bytes after the end of its deflate stream".into())
            );
        }
        Ok(())
    }
}

impl<R: BufRead> Read for ExactInflate<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            self.check_end()?;
            return Ok(0);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let want = usize::try_from(self.remaining).map_or(buf.len(), |r| r.min(buf.len()));
        let n = self.dec.read(&mut buf[..want])?;
        if n == 0 {
            return Err(self.refuse(format!(
                "the body inflates to {} bytes, its header declares {}",
                self.declared - self.remaining,
                self.declared
            )));
        }
        self.remaining -= n as u64;
        if self.remaining == 0 {
            self.check_end()?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn read_all(body: Vec<u8>, declared: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        // Small reads, as libostree's splice does in chunks.
        let mut r = ExactInflate::new(io::BufReader::with_capacity(7, &body[..]), declared);
        let mut buf = [0u8; 5];
        loop {
            match r.read(&mut buf)? {
                0 => return Ok(out),
                n => out.extend_from_slice(&buf[..n]),
            }
        }
    }

    #[test]
    fn exactly_the_declared_size() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut trailing = deflate(&data);
        trailing.extend_from_slice(b"junk");
        // (what, body, declared, accepted)
        let cases: Vec<(&str, Vec<u8>, u64, bool)> = vec![
            ("exact", deflate(&data), 10_000, true),
            ("empty", deflate(b""), 0, true),
            ("empty declared, more sent", deflate(b"x"), 0, false),
            ("empty, no stream at all", Vec::new(), 0, true),
            ("no stream at all", Vec::new(), 1, false),
            ("more than declared", deflate(&data), 9_999, false),
            (
                "much more than declared",
                deflate(&vec![0; 1 << 20]),
                10,
                false,
            ),
            ("less than declared", deflate(&data), 10_001, false),
            ("bytes after the stream", trailing, 10_000, false),
            (
                "not deflate",
                b"\xff\xff\xff\xff garbage".to_vec(),
                10,
                false,
            ),
        ];
        for (what, body, declared, ok) in cases {
            let got = read_all(body, declared);
            assert_eq!(got.is_ok(), ok, "{what}: {got:?}");
            if let Ok(out) = got {
                assert_eq!(out.len() as u64, declared, "{what}");
            }
        }
    }

    #[test]
    fn an_empty_body_is_checked_without_a_read() {
        // (body, accepted)
        let cases = [
            (deflate(b""), true),
            (Vec::new(), true),
            (deflate(b"surplus"), false),
            (b"junk".to_vec(), false),
        ];
        for (body, ok) in cases {
            let mut r = ExactInflate::new(&body[..], 0);
            assert_eq!(r.check_empty().is_ok(), ok, "{body:?}");
        }
    }

    #[test]
    fn refuses_before_the_last_byte_is_handed_on() {
        // A reader that stops at the declared size (as libostree may, given
        // the length) still sees the error: it comes with the last bytes.
        let body = deflate(&[7u8; 100]);
        let mut r = ExactInflate::new(&body[..], 50);
        let mut buf = [0u8; 50];
        let refusal = r.refusal();
        let mut handed_on = 0;
        let err = loop {
            match r.read(&mut buf[handed_on..]) {
                Ok(0) => panic!("accepted after {handed_on} bytes"),
                Ok(n) => handed_on += n,
                Err(e) => break e,
            }
        };
        assert!(handed_on < 50, "{handed_on}");
        assert!(err.to_string().contains("more than the 50 bytes"), "{err}");
        assert_eq!(refusal.get(), Some(&err.to_string()));
    }
}
