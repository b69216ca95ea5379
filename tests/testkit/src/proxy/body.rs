//! Response bodies: forwarded (streamed, through the byte budget, maybe
//! cut) and generated.

use super::{Shared, MIN_CUT, STALL_LIMIT};
use axum::body::Body;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Chunk size of generated bodies.
const CHUNK: usize = 64 << 10;
/// Largest request body forwarded (requests here are small or empty).
const MAX_REQUEST_BODY: usize = 16 << 20;
/// Headers that describe one hop, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

type Chunks = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// Forwards `req` to `base` and streams the answer back, headers and all;
/// with `cut`, the body stops half-way and the connection is dropped.
pub(super) async fn forward(
    shared: &Arc<Shared>,
    base: &str,
    req: hyper::Request<Incoming>,
    cut: bool,
) -> hyper::Response<Body> {
    let url = format!(
        "{base}{}",
        req.uri().path_and_query().map_or("/", |p| p.as_str())
    );
    let head = req.method() == hyper::Method::HEAD;
    let mut out = shared.client.request(req.method().clone(), &url);
    for (name, value) in req.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            out = out.header(name, value);
        }
    }
    let body = match axum::body::to_bytes(Body::new(req.into_body()), MAX_REQUEST_BODY).await {
        Ok(b) => b,
        Err(_) => return super::status(413),
    };
    if !body.is_empty() {
        out = out.body(body);
    }
    let Ok(resp) = out.send().await else {
        return super::status(502);
    };
    let mut r = hyper::Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            r = r.header(name, value);
        }
    }
    let len = resp.content_length();
    let chunks: Chunks = Box::pin(
        resp.bytes_stream()
            .map(|c| c.map_err(std::io::Error::other)),
    );
    let body = if head {
        Body::empty()
    } else {
        let chunks = match len.filter(|&l| cut && l >= MIN_CUT) {
            Some(l) => cut_at(chunks, l / 2, shared.clone()),
            None => chunks,
        };
        Body::from_stream(through_gate(chunks, shared.clone()))
    };
    r.body(body).unwrap_or_else(|_| super::status(502))
}

/// `chunks` up to `at` bytes, then an error, which makes hyper drop the
/// connection (HTTP/1.1) or reset the stream (HTTP/2) mid-body.
fn cut_at(chunks: Chunks, at: u64, shared: Arc<Shared>) -> Chunks {
    Box::pin(futures_util::stream::unfold(
        (chunks, 0u64, false),
        move |(mut chunks, sent, done)| {
            let shared = shared.clone();
            async move {
                if done {
                    return None;
                }
                if sent >= at {
                    shared.counters.cuts.fetch_add(1, Ordering::SeqCst);
                    let err = std::io::Error::other("cut by the test proxy");
                    return Some((Err(err), (chunks, sent, true)));
                }
                match chunks.next().await? {
                    Ok(mut c) => {
                        let room = at - sent;
                        if c.len() as u64 > room {
                            c.truncate(room as usize);
                        }
                        let n = c.len() as u64;
                        Some((Ok(c), (chunks, sent + n, false)))
                    }
                    Err(e) => Some((Err(e), (chunks, sent, true))),
                }
            }
        },
    ))
}

/// `chunks`, each byte counted against the proxy's budget; once it is
/// spent the stream holds (polling, bounded by [`STALL_LIMIT`]) until the
/// budget is raised or the proxy stops.
fn through_gate(chunks: Chunks, shared: Arc<Shared>) -> Chunks {
    Box::pin(futures_util::stream::unfold(
        (chunks, None::<Bytes>),
        move |(mut chunks, pending)| {
            let shared = shared.clone();
            async move {
                let mut chunk = match pending {
                    Some(c) => c,
                    None => match chunks.next().await? {
                        Ok(c) => c,
                        Err(e) => return Some((Err(e), (chunks, None))),
                    },
                };
                let room = match wait_for_room(&shared).await {
                    Ok(room) => room,
                    Err(e) => return Some((Err(e), (chunks, None))),
                };
                let rest = (chunk.len() as u64 > room).then(|| chunk.split_off(room as usize));
                shared
                    .gate
                    .sent
                    .fetch_add(chunk.len() as u64, Ordering::SeqCst);
                Some((Ok(chunk), (chunks, rest)))
            }
        },
    ))
}

/// Bytes the budget still allows, once there are any.
async fn wait_for_room(shared: &Shared) -> std::io::Result<u64> {
    let deadline = Instant::now() + STALL_LIMIT;
    loop {
        let gate = &shared.gate;
        let room = gate
            .limit
            .load(Ordering::SeqCst)
            .saturating_sub(gate.sent.load(Ordering::SeqCst));
        if room > 0 {
            return Ok(room);
        }
        gate.stalled.store(true, Ordering::SeqCst);
        if shared.stop.load(Ordering::SeqCst) || Instant::now() > deadline {
            return Err(std::io::Error::other(
                "the test proxy stopped while stalled",
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The file under `root` that a clean request path names, read whole (repo
/// files here are small); 404 for anything else.
pub(super) async fn file(
    root: &std::path::Path,
    req: &hyper::Request<Incoming>,
) -> hyper::Response<Body> {
    use std::path::Component;
    let rel = std::path::Path::new(req.uri().path().trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return super::status(404);
    }
    let Ok(bytes) = tokio::fs::read(root.join(rel)).await else {
        return super::status(404);
    };
    let len = bytes.len() as u64;
    let body = if req.method() == hyper::Method::HEAD {
        Body::empty()
    } else {
        Body::from(bytes)
    };
    let mut r = hyper::Response::new(body);
    r.headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, len.into());
    r
}

/// 200 announcing `len` bytes, then one byte every `every`: a server that
/// never quite stops answering.
pub(super) fn drip(shared: &Arc<Shared>, len: u64, every: Duration) -> hyper::Response<Body> {
    let shared = shared.clone();
    let chunks = futures_util::stream::unfold(0u64, move |sent| {
        let shared = shared.clone();
        async move {
            if sent >= len || shared.stop.load(Ordering::SeqCst) {
                return None;
            }
            tokio::time::sleep(every).await;
            shared.counters.dripped.fetch_add(1, Ordering::Relaxed);
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), sent + 1))
        }
    });
    let mut r = hyper::Response::new(Body::from_stream(chunks));
    r.headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, len.into());
    r
}

/// 200 with generated bytes, not zeros (a compressor or a sparse read must
/// not make them cheap for the client).
pub(super) fn garbage(
    shared: &Arc<Shared>,
    announce: Option<u64>,
    cap: u64,
) -> hyper::Response<Body> {
    let limit = announce.map_or(cap, |a| a.min(cap));
    let shared = shared.clone();
    let chunks = futures_util::stream::unfold(0u64, move |sent| {
        let shared = shared.clone();
        async move {
            if sent >= limit {
                return None;
            }
            let n = (limit - sent).min(CHUNK as u64) as usize;
            let chunk: Vec<u8> = (0..n)
                .map(|i| ((sent as usize + i) as u8).wrapping_mul(167) ^ 0x5a)
                .collect();
            shared
                .counters
                .garbage
                .fetch_add(n as u64, Ordering::Relaxed);
            Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), sent + n as u64))
        }
    });
    let mut r = hyper::Response::new(Body::from_stream(chunks));
    if let Some(a) = announce {
        r.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, a.into());
    }
    r
}
