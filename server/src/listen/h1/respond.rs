//! Writing one answer: its head, then its body from memory, by
//! `sendfile(2)` from its file, or from its stream's frames.

use crate::http::answer::{Answer, FileRange, Payload, Value};
use crate::http::log_date;
use crate::listen::watch::{Activity, Watched};
use bytes::{Buf, Bytes};
use http::{header, StatusCode};
use http_body_util::BodyExt;
use oscontent_format::digits::decimal;
use std::io;
use std::os::fd::AsFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Body bytes written behind the head in one write; a larger first frame
/// goes in the same vectored write instead of being copied.
const INLINE_BODY: usize = 16 * 1024;

/// Writes `answer`, counting what of its body was handed to the socket.
pub(super) async fn respond(
    io: &mut Watched<TcpStream>,
    act: &Activity,
    answer: &mut Answer,
    close: bool,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    out.clear();
    write_head(out, answer, close);
    match answer.take_body() {
        Payload::Empty => io.write_all(out).await,
        Payload::Bytes(b) => {
            answer.sent(b.len() as u64);
            write_with_head(io, out, b).await
        }
        Payload::File(f) => send_file(io, act, out, &f, answer).await,
        Payload::Stream(mut body) => {
            let mut head_sent = false;
            while let Some(frame) = body.frame().await {
                let Ok(data) = frame.map_err(io::Error::other)?.into_data() else {
                    continue;
                };
                answer.sent(data.len() as u64);
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
            Ok(())
        }
    }
}

/// The status line, the answer's fields, `Date`, and `Connection: close`
/// when closing. A 304 goes without the 200's Content-Length, as hyper
/// and nginx send it.
fn write_head(out: &mut Vec<u8>, answer: &Answer, close: bool) {
    let status = answer.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut digits = [0u8; 20];
    answer.fields(|name, value| {
        if status == StatusCode::NOT_MODIFIED && name == header::CONTENT_LENGTH {
            return;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        match value {
            Value::Header(v) => out.extend_from_slice(v.as_bytes()),
            Value::Text(t) => out.extend_from_slice(t.as_bytes()),
            Value::Number(n) => out.extend_from_slice(decimal(&mut digits, n).as_bytes()),
            Value::Range(start, end, len) => {
                out.extend_from_slice(b"bytes ");
                out.extend_from_slice(decimal(&mut digits, start).as_bytes());
                out.push(b'-');
                out.extend_from_slice(decimal(&mut digits, end).as_bytes());
                out.push(b'/');
                out.extend_from_slice(decimal(&mut digits, len).as_bytes());
            }
        }
        out.extend_from_slice(b"\r\n");
    });
    out.extend_from_slice(b"date: ");
    log_date::with_now(|d| out.extend_from_slice(d.as_bytes()));
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
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
    send: &FileRange,
    answer: &mut Answer,
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
    let (mut offset, end) = (send.start, send.start + send.count);
    while offset < end {
        let want = usize::try_from(end - offset).unwrap_or(usize::MAX);
        let n = sock
            .async_io(Interest::WRITABLE, || {
                let mut at = offset;
                rustix::fs::sendfile(sock.as_fd(), send.file.as_fd(), Some(&mut at), want)
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
        answer.sent(n as u64);
        act.moved(n);
    }
    Ok(())
}
