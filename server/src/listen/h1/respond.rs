//! Writing one response: a `SendFile` body by `sendfile(2)`, any other
//! from the router's body frames.

use super::head::{tokens, write_head, write_head_with};
use crate::http::direct::{Direct, Payload};
use crate::http::sendfile::SendFile;
use crate::listen::watch::{Activity, Watched};
use axum::body::Body;
use bytes::{Buf, Bytes};
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use std::io;
use std::os::fd::AsFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Body bytes written behind the head in one write; a larger first frame
/// goes in the same vectored write instead of being copied.
const INLINE_BODY: usize = 16 * 1024;

/// Writes one response; true if the connection is to close after it.
pub(super) async fn respond(
    io: &mut Watched<TcpStream>,
    act: &Activity,
    resp: Response<Body>,
    head: bool,
    stop: bool,
    out: &mut Vec<u8>,
) -> io::Result<bool> {
    let (mut parts, mut body) = resp.into_parts();
    let close = stop
        || parts
            .headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|v| tokens(v.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close")));
    let bodiless = head
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    out.clear();
    if let Some(send) = parts.extensions.remove::<SendFile>().filter(|_| !bodiless) {
        write_head(out, parts.status, &parts.headers, close);
        send_file(io, act, out, &send).await?;
        // The body (empty) records what was sent when dropped.
        drop(body);
        return Ok(close);
    }
    if bodiless {
        write_head(out, parts.status, &parts.headers, close);
        io.write_all(out).await?;
        drop(body);
        return Ok(close);
    }
    // The router's repo answers all carry a length; anything else is read
    // whole first to get one.
    if !parts.headers.contains_key(header::CONTENT_LENGTH) {
        let whole = body.collect().await.map_err(io::Error::other)?.to_bytes();
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
        write_head(out, parts.status, &parts.headers, close);
        write_with_head(io, out, whole).await?;
        return Ok(close);
    }
    write_head(out, parts.status, &parts.headers, close);
    let mut head_sent = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if head_sent {
            io.write_all(&data).await?;
        } else {
            write_with_head(io, out, data).await?;
            head_sent = true;
        }
    }
    if !head_sent {
        io.write_all(out).await?;
    }
    Ok(close)
}

/// Writes an answer made past the router (`http::direct`); true if the
/// connection is to close after it. Its record is made when the caller
/// drops it, after this.
pub(super) async fn respond_direct(
    io: &mut Watched<TcpStream>,
    act: &Activity,
    answer: &Direct,
    close: bool,
    out: &mut Vec<u8>,
) -> io::Result<bool> {
    out.clear();
    write_head_with(
        out,
        answer.status(),
        |out| answer.write_headers(out),
        true,
        close,
    );
    match answer.payload() {
        Payload::None => io.write_all(out).await?,
        Payload::Memory(bytes) => write_with_head(io, out, bytes.clone()).await?,
        Payload::File(send) => send_file(io, act, out, send).await?,
    }
    Ok(close)
}

/// The head and the first of the body in one write: copied behind the
/// head when small, else side by side.
async fn write_with_head(
    io: &mut Watched<TcpStream>,
    out: &mut Vec<u8>,
    data: Bytes,
) -> io::Result<()> {
    if data.len() <= INLINE_BODY {
        out.extend_from_slice(&data);
        return io.write_all(out).await;
    }
    let mut both = Buf::chain(&out[..], data);
    io.write_all_buf(&mut both).await
}

/// The head, held back (`MSG_MORE`) so that it leaves with the file's
/// first bytes, then the file's range from the page cache.
async fn send_file(
    io: &mut Watched<TcpStream>,
    act: &Activity,
    out: &[u8],
    send: &SendFile,
) -> io::Result<()> {
    let sock = io.get_ref();
    let mut done = 0;
    while done < out.len() {
        let n = sock
            .async_io(Interest::WRITABLE, || {
                rustix::net::send(sock.as_fd(), &out[done..], rustix::net::SendFlags::MORE)
                    .map_err(io::Error::from)
            })
            .await?;
        done += n;
    }
    act.moved(out.len());
    let (start, count) = send.range();
    let (mut offset, end) = (start, start + count);
    while offset < end {
        let want = usize::try_from(end - offset).unwrap_or(usize::MAX);
        let n = sock
            .async_io(Interest::WRITABLE, || {
                let mut at = offset;
                rustix::fs::sendfile(sock.as_fd(), send.file().as_fd(), Some(&mut at), want)
                    .map_err(io::Error::from)
            })
            .await?;
        if n == 0 {
            // The file is shorter than it was: the length promised cannot
            // be kept, so the connection ends (the client sees it short).
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank",
            ));
        }
        offset += n as u64;
        send.note_sent(n as u64);
        act.moved(n);
    }
    Ok(())
}
