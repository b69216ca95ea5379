//! A file streamed as a response body in large reads: each chunk is read
//! on the runtime's thread when it is in the page cache (`preadv2` with
//! `RWF_NOWAIT`), and from the blocking pool only when it is not. Memory
//! per response is one chunk, whatever the file's size. The body holds its
//! [`StreamPermit`] until it is done or dropped.

use super::streams::StreamPermit;
use crate::fsutil;
use axum::body::Body;
use bytes::Bytes;
use std::fs::File;
use std::io;
use std::sync::Arc;

/// One read. Large enough that a 200 KiB object is one or two reads;
/// small enough that a slow reader pins little (HTTP/2 send buffers are
/// bounded separately).
pub const CHUNK: usize = 64 * 1024;

/// `count` bytes of `file` from `start`. A file that shrinks underneath
/// ends the body early with an error (the client sees a short response),
/// and one that grows is cut at `count`: Content-Length is what was
/// promised.
pub fn file_body(file: File, start: u64, count: u64, permit: Option<StreamPermit>) -> Body {
    let state = (Arc::new(file), start, count, permit);
    let stream = futures_util::stream::unfold(state, |(file, offset, left, permit)| async move {
        if left == 0 {
            return None;
        }
        let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
        match read_chunk(&file, offset, want).await {
            Ok(b) if b.is_empty() => {
                let e = io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank");
                Some((Err(e), (file, offset, 0, permit)))
            }
            Ok(b) => {
                let n = b.len() as u64;
                Some((Ok(b), (file, offset + n, left - n, permit)))
            }
            Err(e) => Some((Err(e), (file, offset, 0, permit))),
        }
    });
    Body::from_stream(stream)
}

async fn read_chunk(file: &Arc<File>, offset: u64, want: usize) -> io::Result<Bytes> {
    let mut buf = vec![0u8; want];
    if let Some(n) = fsutil::read_cached(file, &mut buf, offset)? {
        buf.truncate(n);
        return Ok(Bytes::from(buf));
    }
    let file = file.clone();
    tokio::task::spawn_blocking(move || {
        let n = fsutil::read_at(&file, &mut buf, offset)?;
        buf.truncate(n);
        Ok(Bytes::from(buf))
    })
    .await
    .map_err(io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let got = axum::body::to_bytes(file_body(f, start, count, None), usize::MAX)
                .await
                .unwrap();
            let (s, c) = (start as usize, count as usize);
            assert_eq!(&got[..], &data[s..s + c], "{start}+{count}");
        }
        // Asked for more than the file holds: an error, not a short 200.
        let f = File::open(&p).unwrap();
        let r =
            axum::body::to_bytes(file_body(f, 0, data.len() as u64 + 1, None), usize::MAX).await;
        assert!(r.is_err());
    }

    #[tokio::test]
    async fn the_permit_goes_when_the_body_is_done_or_dropped() {
        use crate::served::streams::StreamBudget;
        use futures_util::StreamExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; CHUNK * 3]).unwrap();
        let budget = StreamBudget::new(4, std::time::Duration::from_secs(1));
        let ip = std::net::IpAddr::from([10, 0, 0, 1]);
        let body = |b: &std::sync::Arc<StreamBudget>| {
            let permit = b.try_take(ip).unwrap();
            file_body(File::open(&p).unwrap(), 0, (CHUNK * 3) as u64, Some(permit))
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
}
