//! The body of a `.filez` (raw deflate), inflated to exactly the size its
//! header declared and hashed to exactly the checksum it was asked for.
//! The declared size has been checked against the free space and the
//! commit's own size list before the first byte is written, so the stream
//! must neither stop short of it nor go on past it: a body that inflates
//! to more, carries compressed bytes after the deflate stream, or hashes
//! to another checksum is refused before libostree sees its last bytes
//! (and so before it links the object), instead of being silently cut at
//! the size.
//!
//! The checksum is ours to check: the object is handed to libostree as
//! trusted, because libostree 2022.7 hashes with GLib's portable SHA-256,
//! which took a quarter of a pull's CPU; `sha2` uses the CPU's SHA
//! instructions where it has them.

use oscontent_format::Checksum;
use sha2::{Digest, Sha256};
use std::io::{self, BufRead, Read};
use std::sync::{Arc, OnceLock};

/// A reader of exactly `declared` inflated bytes whose content checksum
/// is `want`; any other length or checksum is an `InvalidData` error,
/// raised no later than the read that returns the last declared byte.
#[derive(Debug)]
pub struct ExactInflate<R: BufRead> {
    dec: flate2::bufread::DeflateDecoder<R>,
    declared: u64,
    remaining: u64,
    /// The content checksum so far: the content-stream prefix (length,
    /// padding, file header), then every byte handed on.
    hasher: Sha256,
    want: Checksum,
    /// Whether the end has been checked (once, at the declared size).
    ended: bool,
    /// Why the body was refused: libostree (through gio) reports a read
    /// error by its kind only, so the caller reads the reason here.
    refusal: Arc<OnceLock<String>>,
}

fn refuse(refusal: &OnceLock<String>, why: String) -> io::Error {
    let _ = refusal.set(why.clone());
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// The decoder's own errors (a stream cut short, not deflate) are the
/// body's fault: refused, so that they are not taken for a failure of the
/// repo. A network break also surfaces here, but the fetcher knows the
/// body broke and retries it first.
fn bad_body(refusal: &OnceLock<String>, e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => {
            refuse(
                refusal,
                format!("the body is not a whole deflate stream: {e}"),
            )
        }
        _ => e,
    }
}

impl<R: BufRead> ExactInflate<R> {
    /// `prefix` is the content-stream prefix libostree is given before
    /// these bytes, which the checksum covers too.
    pub fn new(compressed: R, declared: u64, prefix: &[u8], want: Checksum) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(prefix);
        Self {
            dec: flate2::bufread::DeflateDecoder::new(compressed),
            declared,
            remaining: declared,
            hasher,
            want,
            ended: false,
            refusal: Arc::default(),
        }
    }

    /// Where the reason for a refusal will be, once there is one.
    pub fn refusal(&self) -> Arc<OnceLock<String>> {
        self.refusal.clone()
    }

    fn refuse(&self, why: String) -> io::Error {
        refuse(&self.refusal, why)
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

    /// After the last declared byte: nothing more may inflate, nothing may
    /// follow the deflate stream, and what was handed on hashes to `want`.
    fn check_end(&mut self) -> io::Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        let refusal = self.refusal.clone();
        // An empty file may have no deflate stream at all: libostree never
        // reads one, and repos written by other tools leave it out.
        if !(self.declared == 0
            && self.dec.total_in() == 0
            && self
                .dec
                .get_mut()
                .fill_buf()
                .map_err(|e| bad_body(&refusal, e))?
                .is_empty())
        {
            self.check_stream_end()?;
        }
        let got = Checksum::from(<[u8; 32]>::from(
            std::mem::take(&mut self.hasher).finalize(),
        ));
        if got != self.want {
            return Err(self.refuse(format!("checksum mismatch: the content hashes to {got}")));
        }
        Ok(())
    }

    fn check_stream_end(&mut self) -> io::Result<()> {
        let refusal = self.refusal.clone();
        let mut probe = [0u8; 1];
        if self
            .dec
            .read(&mut probe)
            .map_err(|e| bad_body(&refusal, e))?
            != 0
        {
            return Err(self.refuse(format!(
                "the body inflates to more than the {} bytes its header declares",
                self.declared
            )));
        }
        let rest = self
            .dec
            .get_mut()
            .fill_buf()
            .map_err(|e| bad_body(&refusal, e))?;
        if !rest.is_empty() {
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
        let n = self
            .dec
            .read(&mut buf[..want])
            .map_err(|e| bad_body(&self.refusal, e))?;
        if n == 0 {
            return Err(self.refuse(format!(
                "the body inflates to {} bytes, its header declares {}",
                self.declared - self.remaining,
                self.declared
            )));
        }
        self.hasher.update(&buf[..n]);
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

    /// Stands for the length-prefixed file header the checksum starts with.
    const PREFIX: &[u8] = b"\0\0\0\x04\0\0\0\0head";

    fn sum(prefix: &[u8], content: &[u8]) -> Checksum {
        let mut h = Sha256::new();
        h.update(prefix);
        h.update(content);
        Checksum::from(<[u8; 32]>::from(h.finalize()))
    }

    /// The checksum of what `body` honestly carries, up to `declared`.
    fn honest(body: &[u8], declared: u64) -> Checksum {
        let mut content = Vec::new();
        let _ = flate2::read::DeflateDecoder::new(body).read_to_end(&mut content);
        content.truncate(declared as usize);
        sum(PREFIX, &content)
    }

    fn read_all(body: Vec<u8>, declared: u64, want: Checksum) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        // Small reads, as libostree's splice does in chunks.
        let compressed = io::BufReader::with_capacity(7, &body[..]);
        let mut r = ExactInflate::new(compressed, declared, PREFIX, want);
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
            let want = honest(&body, declared);
            let got = read_all(body, declared, want);
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
            let mut r = ExactInflate::new(&body[..], 0, PREFIX, sum(PREFIX, b""));
            assert_eq!(r.check_empty().is_ok(), ok, "{body:?}");
        }
    }

    #[test]
    fn another_checksum_is_refused_with_the_last_bytes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 13) as u8).collect();
        let mut flipped = data.clone();
        flipped[9_999] ^= 1;
        // (what, body, checksum asked for, accepted)
        let cases: Vec<(&str, Vec<u8>, Checksum, bool)> = vec![
            ("as asked", deflate(&data), sum(PREFIX, &data), true),
            (
                "last byte differs",
                deflate(&flipped),
                sum(PREFIX, &data),
                false,
            ),
            (
                "another header",
                deflate(&data),
                sum(b"\0\0\0\x04\0\0\0\0HEAD", &data),
                false,
            ),
            ("content alone", deflate(&data), sum(b"", &data), false),
        ];
        for (what, body, want, ok) in cases {
            let mut r = ExactInflate::new(&body[..], 10_000, PREFIX, want);
            let refusal = r.refusal();
            let mut buf = vec![0u8; 10_000];
            let mut handed_on = 0;
            let got = loop {
                match r.read(&mut buf[handed_on..]) {
                    Ok(0) => break Ok(handed_on),
                    Ok(n) => handed_on += n,
                    Err(e) => break Err(e),
                }
            };
            match got {
                Ok(n) => {
                    assert!(ok, "{what}: accepted");
                    assert_eq!(n, 10_000, "{what}");
                }
                Err(e) => {
                    assert!(!ok, "{what}: {e}");
                    assert!(handed_on < 10_000, "{what}: {handed_on} bytes handed on");
                    assert!(e.to_string().contains("checksum mismatch"), "{what}: {e}");
                    assert_eq!(refusal.get(), Some(&e.to_string()), "{what}");
                }
            }
        }
    }

    #[test]
    fn an_empty_body_is_hashed_without_a_read() {
        // A symlink or an empty file: the header is all there is to hash.
        // (checksum asked for, accepted)
        let cases = [
            (sum(PREFIX, b""), true),
            (sum(b"\0\0\0\x04\0\0\0\0link", b""), false),
        ];
        for (want, ok) in cases {
            let mut r = ExactInflate::new(&[][..], 0, PREFIX, want);
            let got = r.check_empty();
            assert_eq!(got.is_ok(), ok, "{want}: {got:?}");
        }
    }

    #[test]
    fn refuses_before_the_last_byte_is_handed_on() {
        // A reader that stops at the declared size (as libostree may, given
        // the length) still sees the error: it comes with the last bytes.
        let body = deflate(&[7u8; 100]);
        let mut r = ExactInflate::new(&body[..], 50, PREFIX, sum(PREFIX, &[7u8; 50]));
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

    /// A body whose deflate stream stops short (the server sent a whole,
    /// honestly sized HTTP body of a truncated object) is refused as bad
    /// data, not left as an I/O error libostree reports as its own.
    #[test]
    fn a_deflate_stream_cut_short_is_refused() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut body = deflate(&data);
        body.truncate(body.len() / 2);
        let mut r = ExactInflate::new(&body[..], 50_000, PREFIX, sum(PREFIX, &data));
        let refusal = r.refusal();
        let mut out = Vec::new();
        let err = r.read_to_end(&mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert_eq!(refusal.get(), Some(&err.to_string()));
    }
}
