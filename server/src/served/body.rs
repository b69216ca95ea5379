//! A file streamed as a response body in large reads: each chunk is read
//! on the runtime's thread when it is in the page cache (`preadv2` with
//! `RWF_NOWAIT`), and from the blocking pool only when it is not. Memory
//! per response is one chunk, whatever the file's size. A body that holds
//! its file open holds its [`StreamPermit`] too, until it is done or
//! dropped; past the budget a body opens its file again for each (smaller)
//! read and holds no descriptor in between. Each chunk is read with a
//! place in the memory budget of its client (`memory.rs`), which its bytes
//! hold until the connection drops them.

use super::memory::{Charge, Chunk};
use super::streams::StreamPermit;
use crate::fsutil;
use axum::body::Body;
use bytes::Bytes;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// One read. Large enough that a 200 KiB object is one or two reads;
/// small enough that a slow reader pins little (HTTP/2 send buffers are
/// bounded separately).
pub const CHUNK: usize = 64 * 1024;
/// One read of a body that opens its file each time: past the budget, a
/// reader that stops pins this much rather than a descriptor and a
/// [`CHUNK`].
pub const REOPENED_CHUNK: usize = 8 * 1024;

/// Opens a streamed body's file again, from the generation that served it
/// (so only what it verified). With `true`, without waiting on the disk.
pub type Reopen = Arc<dyn Fn(bool) -> io::Result<Reopened> + Send + Sync>;

/// What opening a file again found.
#[derive(Debug)]
pub enum Reopened {
    File(File),
    Gone,
    /// Asked not to wait, it would have: ask again from the blocking pool.
    WouldBlock,
}

/// Where a body's bytes come from.
enum Source {
    Held {
        file: Arc<File>,
        /// Held, never read, until the body is done or dropped.
        _permit: Option<StreamPermit>,
    },
    /// The file's `(dev, ino)`: a file replaced between two reads ends the
    /// body with an error rather than splicing two files.
    Reopened(Reopen, (u64, u64)),
}

/// `count` bytes of `file` from `start`, the file held open (with
/// `permit`). A file that shrinks underneath ends the body early with an
/// error (the client sees a short response), and one that grows is cut at
/// `count`: Content-Length is what was promised.
pub fn file_body(
    file: File,
    start: u64,
    count: u64,
    permit: Option<StreamPermit>,
    charge: Charge,
) -> Body {
    let source = Source::Held {
        file: Arc::new(file),
        _permit: permit,
    };
    body(source, charge, (start, count), CHUNK)
}

/// As [`file_body`], the file (`meta`'s) opened again for each read.
pub fn reopening_body(
    reopen: Reopen,
    meta: &std::fs::Metadata,
    (start, count): (u64, u64),
    charge: Charge,
) -> Body {
    let id = (meta.dev(), meta.ino());
    body(
        Source::Reopened(reopen, id),
        charge,
        (start, count),
        REOPENED_CHUNK,
    )
}

fn body(source: Source, charge: Charge, (start, count): (u64, u64), chunk: usize) -> Body {
    let state = (source, charge, start, count);
    let stream =
        futures_util::stream::unfold(state, move |(source, charge, offset, left)| async move {
            if left == 0 {
                return None;
            }
            let want = usize::try_from(left.min(chunk as u64)).unwrap_or(chunk);
            // The place first: without one, nothing is allocated yet.
            let (want, hold) = charge.reserve(want).await;
            match source.read(offset, want).await {
                Ok(b) if b.is_empty() => {
                    let e = io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank");
                    Some((Err(e), (source, charge, offset, 0)))
                }
                Ok(buf) => {
                    let n = buf.len() as u64;
                    let b = Bytes::from_owner(Chunk { buf, hold });
                    Some((Ok(b), (source, charge, offset + n, left - n)))
                }
                Err(e) => Some((Err(e), (source, charge, offset, 0))),
            }
        });
    Body::from_stream(stream)
}

impl Source {
    async fn read(&self, offset: u64, want: usize) -> io::Result<Vec<u8>> {
        match self {
            Source::Held { file, .. } => read_chunk(file, offset, want).await,
            Source::Reopened(reopen, id) => {
                // On this thread when the lookup and the bytes are cached,
                // as a held file is read: thousands of stalled bodies must
                // not each take a blocking thread for their first read.
                let mut buf = vec![0u8; want];
                if let Reopened::File(f) = reopen(true)? {
                    same_file(&f, *id)?;
                    if let Some(n) = fsutil::read_cached(&f, &mut buf, offset)? {
                        buf.truncate(n);
                        return Ok(buf);
                    }
                }
                let (reopen, id) = (reopen.clone(), *id);
                tokio::task::spawn_blocking(move || {
                    let Reopened::File(f) = reopen(false)? else {
                        return Err(io::Error::new(io::ErrorKind::NotFound, "the file went"));
                    };
                    same_file(&f, id)?;
                    let n = fsutil::read_at(&f, &mut buf, offset)?;
                    buf.truncate(n);
                    Ok(buf)
                })
                .await
                .map_err(io::Error::other)?
            }
        }
    }
}

fn same_file(f: &File, id: (u64, u64)) -> io::Result<()> {
    let m = f.metadata()?;
    if (m.dev(), m.ino()) == id {
        Ok(())
    } else {
        Err(io::Error::other("the file was replaced"))
    }
}

async fn read_chunk(file: &Arc<File>, offset: u64, want: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; want];
    if let Some(n) = fsutil::read_cached(file, &mut buf, offset)? {
        buf.truncate(n);
        return Ok(buf);
    }
    let file = file.clone();
    tokio::task::spawn_blocking(move || {
        let n = fsutil::read_at(&file, &mut buf, offset)?;
        buf.truncate(n);
        Ok(buf)
    })
    .await
    .map_err(io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::served::memory::BodyMemory;

    fn charge() -> Charge {
        Charge::new(BodyMemory::new(1 << 30), [10, 0, 0, 1].into())
    }

    #[tokio::test]
    async fn streams_the_range_in_chunks_and_stops_at_count() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..(CHUNK * 2 + 100)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let cases = [
            (0u64, data.len() as u64),
            (5, CHUNK as u64),
            (CHUNK as u64 + 1, 10),
        ];
        for (start, count) in cases {
            let f = File::open(&p).unwrap();
            let got = axum::body::to_bytes(file_body(f, start, count, None, charge()), usize::MAX)
                .await
                .unwrap();
            let (s, c) = (start as usize, count as usize);
            assert_eq!(&got[..], &data[s..s + c], "{start}+{count}");
        }
        // Asked for more than the file holds: an error, not a short 200.
        let f = File::open(&p).unwrap();
        let r = axum::body::to_bytes(
            file_body(f, 0, data.len() as u64 + 1, None, charge()),
            usize::MAX,
        )
        .await;
        assert!(r.is_err());
    }

    #[tokio::test]
    async fn the_permit_goes_when_the_body_is_done_or_dropped() {
        use crate::served::streams::StreamBudget;
        use futures_util::StreamExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; CHUNK * 3]).unwrap();
        let budget = StreamBudget::new(4);
        let ip = std::net::IpAddr::from([10, 0, 0, 1]);
        let body = |b: &std::sync::Arc<StreamBudget>| {
            let permit = b.try_take(ip).unwrap();
            file_body(
                File::open(&p).unwrap(),
                0,
                (CHUNK * 3) as u64,
                Some(permit),
                charge(),
            )
        };
        let whole = body(&budget);
        assert_eq!(budget.in_use(), 1);
        axum::body::to_bytes(whole, usize::MAX).await.unwrap();
        assert_eq!(budget.in_use(), 0, "read to its end");
        // A client gone after one chunk: hyper drops the body.
        let mut partial = body(&budget).into_data_stream();
        partial.next().await.unwrap().unwrap();
        assert_eq!(budget.in_use(), 1);
        drop(partial);
        assert_eq!(budget.in_use(), 0, "dropped half read");
    }

    #[tokio::test]
    async fn a_reopening_body_reads_the_same_bytes_and_notices_a_replaced_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..(REOPENED_CHUNK * 3 + 7))
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&p, &data).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        let path = p.clone();
        let reopen: Reopen = Arc::new(move |_| match File::open(&path) {
            Ok(f) => Ok(Reopened::File(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Reopened::Gone),
            Err(e) => Err(e),
        });
        for (start, count) in [(0u64, data.len() as u64), (REOPENED_CHUNK as u64 - 1, 20)] {
            let b = reopening_body(reopen.clone(), &meta, (start, count), charge());
            let got = axum::body::to_bytes(b, usize::MAX).await.unwrap();
            let (s, c) = (start as usize, count as usize);
            assert_eq!(&got[..], &data[s..s + c], "{start}+{count}");
        }
        // Replaced between two reads (a new inode): an error, not a splice.
        use futures_util::StreamExt;
        let mut b = reopening_body(reopen.clone(), &meta, (0, data.len() as u64), charge())
            .into_data_stream();
        b.next().await.unwrap().unwrap();
        let new = d.path().join("new");
        std::fs::write(&new, &data).unwrap();
        std::fs::rename(&new, &p).unwrap();
        assert!(b.next().await.unwrap().is_err());
        // Gone: an error too.
        let mut b =
            reopening_body(reopen, &meta, (0, data.len() as u64), charge()).into_data_stream();
        std::fs::remove_file(&p).unwrap();
        assert!(b.next().await.unwrap().is_err());
    }

    /// A body's chunks are charged to its client while anything holds
    /// them, and past the client's share it reads small chunks, one at a
    /// time, rather than stop.
    #[tokio::test]
    async fn chunks_are_charged_to_the_client_until_dropped() {
        use crate::served::memory::LONE_CHUNK;
        use futures_util::StreamExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..CHUNK * 3).map(|i| (i % 249) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        // An address's share: two chunks.
        let memory = BodyMemory::new(CHUNK * 32);
        let ip = std::net::IpAddr::from([10, 0, 0, 1]);
        let body = || {
            let f = File::open(&p).unwrap();
            let c = Charge::new(memory.clone(), ip);
            file_body(f, 0, data.len() as u64, None, c).into_data_stream()
        };
        let mut b = body();
        let first = b.next().await.unwrap().unwrap();
        let second = b.next().await.unwrap().unwrap();
        assert_eq!((first.len(), second.len()), (CHUNK, CHUNK));
        assert_eq!(memory.in_use(), 2 * CHUNK, "both held");
        // Its share is spent: the next read is a lone chunk, uncharged.
        let lone = b.next().await.unwrap().unwrap();
        assert_eq!(lone.len(), LONE_CHUNK);
        assert_eq!(memory.in_use(), 2 * CHUNK);
        let mut got = [first, second, lone].concat();
        // Released: full chunks again, to the end, the same bytes.
        while let Some(c) = b.next().await {
            got.extend_from_slice(&c.unwrap());
            assert!(memory.in_use() <= CHUNK);
        }
        assert_eq!(got, data);
        assert_eq!(memory.in_use(), 0);
        // Dropped half read (the client went): nothing stays charged.
        let mut b = body();
        let held = b.next().await.unwrap().unwrap();
        drop(b);
        assert_eq!(memory.in_use(), CHUNK, "the chunk the connection holds");
        drop(held);
        assert_eq!(memory.in_use(), 0);
    }
}
