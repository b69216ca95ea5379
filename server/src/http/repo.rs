//! Repo paths: an immutable object from the object cache or its file, and
//! everything else (refs, summaries, config, deltas) resolved in the
//! generation; a file to be streamed is held open if a place in the
//! streamed-file budget is free for its client, else opened again for
//! each read.

use super::respond::{respond_bytes, respond_file};
use super::sendfile::{CanSendFile, SendFile};
use super::{classify, AppError, AppState, IMMUTABLE};
use crate::cache::CachedObject;
use crate::prepared::Prepared;
use crate::served::body::{self, Reopened};
use crate::served::memory::Charge;
use crate::served::metadata::{self, MetadataError};
use crate::served::objects::Loaded;
use crate::served::{Generation, Layer, Located};
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{HeaderMap, HeaderValue};
use http::Method;
use oscontent_format::{ObjectName, RepoPath};
use oscontent_parse::conditional::Validators;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Objects at least this large are sent from their file on a connection
/// that can (`super::sendfile`), whether the object cache holds them or
/// not; smaller ones are read whole and kept. Copying a large object into
/// the socket cost more than opening it and letting the kernel send its
/// pages (`cargo xtask bench serve` at d6e75ec).
pub(super) const SENDFILE_FROM: u64 = 16 * 1024;

/// A file's ETag: which file (inode), its length and modification time,
/// and whether the overlay holds it, as `"{ino:x}-{len:x}-{mtime:x}.
/// {mtime_nsec:x}-{0|1}"` (a negative time as its two's complement).
/// Written without the formatter: every delta request makes one.
fn file_etag(meta: &std::fs::Metadata, layer: Layer) -> String {
    let mut etag = String::with_capacity(64);
    etag.push('"');
    for (n, sep) in [
        (meta.ino(), '-'),
        (meta.len(), '-'),
        (meta.mtime() as u64, '.'),
        (meta.mtime_nsec() as u64, '-'),
    ] {
        crate::prepared::push_hex(&mut etag, n);
        etag.push(sep);
    }
    etag.push(if layer == Layer::Overlay { '1' } else { '0' });
    etag.push('"');
    etag
}

/// A streamed file's validators (deltas, and what detached metadata's
/// kind names): exact dates, since its name does not fix its bytes.
pub(super) fn file_prepared(meta: &std::fs::Metadata, layer: Layer) -> Prepared {
    Prepared::new(Validators {
        etag: file_etag(meta, layer),
        last_modified: meta.modified().ok(),
        exact_date: true,
    })
}

/// How a representation may be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CachePolicy {
    Immutable,
    ShortLived,
}

pub(super) fn policy(p: &RepoPath) -> CachePolicy {
    match p {
        RepoPath::Object(o) if o.kind.is_immutable() => CachePolicy::Immutable,
        // Named by the digest of its bytes, like an object.
        RepoPath::Blob(_) => CachePolicy::Immutable,
        _ => CachePolicy::ShortLived,
    }
}

/// The `Cache-Control` of what is not an object: an image blob, named by
/// its digest, is cached forever; the rest briefly.
pub(super) fn cache_control(st: &AppState, p: &RepoPath) -> HeaderValue {
    match policy(p) {
        CachePolicy::Immutable => HeaderValue::from_static(IMMUTABLE),
        CachePolicy::ShortLived => st.short_lived.clone(),
    }
}

/// Serves one repo path. GET and HEAD only. Takes the request whole: the
/// `HeaderMap` extractor would copy the headers.
pub(super) async fn repo(State(st): State<AppState>, req: Request) -> Response {
    let parsed = super::repo_path(req.uri().path());
    repo_parsed(st, req, parsed).await
}

/// [`repo`], for a request whose path is already parsed.
pub(super) async fn repo_parsed(st: AppState, req: Request, parsed: Option<RepoPath>) -> Response {
    // In-process tests call the router without a connection.
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    let asked = Asked {
        method: req.method(),
        headers: req.headers(),
        client,
        sendfile: req.extensions().get::<CanSendFile>().is_some(),
    };
    match serve_repo(&st, &asked, req.uri().path(), parsed).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// What a repo request asks for, and who asks.
struct Asked<'a> {
    method: &'a Method,
    headers: &'a HeaderMap,
    client: IpAddr,
    /// The connection sends file bodies itself (`super::sendfile`).
    sendfile: bool,
}

impl Asked<'_> {
    fn head(&self) -> bool {
        self.method == Method::HEAD
    }
}

async fn serve_repo(
    st: &AppState,
    asked: &Asked<'_>,
    path: &str,
    parsed: Option<RepoPath>,
) -> Result<Response, AppError> {
    let Some(rp) = parsed else {
        return Err(AppError::NotFound);
    };
    if asked.method != Method::GET && asked.method != Method::HEAD {
        return Err(AppError::MethodNotAllowed);
    }
    let Some(generation) = st.sink.current() else {
        return Err(AppError::Unavailable);
    };
    if let RepoPath::Object(name) = rp {
        if policy(&rp) == CachePolicy::Immutable {
            return serve_object(st, &generation, asked, name).await;
        }
    }
    let cache = cache_control(st, &rp);
    let cap = metadata::cap(&rp);
    // Found and read on this thread when the kernel has the lookup and the
    // bytes cached; else in one trip to the blocking pool.
    let found = match find(&generation, &rp, cap, true) {
        Ok(Found::WouldBlock) => {
            let g = generation.clone();
            let asked_path = rp.clone();
            tokio::task::spawn_blocking(move || find(&g, &asked_path, cap, false))
                .await
                .map_err(|e| anyhow::anyhow!("resolver task: {e}"))?
        }
        other => other,
    };
    match found {
        Ok(Found::Missing) => Err(AppError::NotFound),
        Ok(Found::Bytes(bytes, prepared)) => Ok(respond_bytes(
            asked.headers,
            bytes,
            &prepared,
            cache,
            asked.head(),
        )),
        Ok(Found::File(file, meta, layer)) => {
            let v = file_prepared(&meta, layer);
            let g = generation.clone();
            let reopen: body::Reopen =
                Arc::new(move |nonblocking| match find(&g, &rp, None, nonblocking) {
                    Ok(Found::File(f, _, _)) => Ok(Reopened::File(f)),
                    Ok(Found::WouldBlock) => Ok(Reopened::WouldBlock),
                    Ok(_) => Ok(Reopened::Gone),
                    Err(Refused::Other(e)) => Err(std::io::Error::other(e)),
                    Err(Refused::Metadata(e)) => Err(std::io::Error::other(e)),
                });
            Ok(respond_streamed(
                st,
                asked,
                (file, &meta),
                reopen,
                &v,
                cache,
            ))
        }
        Err(Refused::Metadata(e @ MetadataError::TooLarge { .. })) => {
            st.metrics
                .oversized_metadata
                .with_label_values(&[classify(path)])
                .inc();
            Err(anyhow::Error::from(e).into())
        }
        Err(Refused::Metadata(e)) => Err(anyhow::Error::from(e).into()),
        Ok(Found::WouldBlock) => Err(anyhow::anyhow!("a blocking lookup would block").into()),
        Err(Refused::Other(e)) => Err(e.context(format!("serving {path}")).into()),
    }
}

/// `file`'s representation, its body sent by the connection itself when
/// it can (`sendfile`), else streamed: held open with a place in the
/// budget if one is free for this client, else opened again (`reopen`)
/// for each read, so that no request waits or fails for a place and the
/// descriptors held stay within the budget.
fn respond_streamed(
    st: &AppState,
    asked: &Asked<'_>,
    (file, meta): (std::fs::File, &std::fs::Metadata),
    reopen: body::Reopen,
    v: &Prepared,
    cache: HeaderValue,
) -> Response {
    let respond = |stream: &mut dyn FnMut(u64, u64) -> axum::body::Body| {
        respond_file(
            asked.headers,
            meta.len(),
            v,
            cache.clone(),
            asked.head(),
            stream,
        )
    };
    if asked.head() {
        return respond(&mut |_, _| axum::body::Body::empty());
    }
    let charge = || Charge::new(st.memory.clone(), asked.client);
    let Some(permit) = st.streams.try_take(asked.client) else {
        return respond(&mut |start, count| {
            st.metrics.connections.streams_reopened.inc();
            body::reopening_body(reopen.clone(), meta, (start, count), charge())
        });
    };
    if asked.sendfile {
        let range = std::cell::Cell::new(None);
        let mut r = respond(&mut |start, count| {
            range.set(Some((start, count)));
            axum::body::Body::empty()
        });
        // Not asked for (a 304, a 412, an unsatisfiable range): the file
        // and its place go now.
        if let Some((start, count)) = range.get() {
            let send = SendFile::new(file, start, count, permit);
            r.extensions_mut().insert(send);
        }
        return r;
    }
    let mut held = Some((file, permit));
    respond(&mut |start, count| match held.take() {
        Some((file, permit)) => body::file_body(file, start, count, Some(permit), charge()),
        None => axum::body::Body::empty(),
    })
}

/// What a path other than an immutable object resolved to.
pub(super) enum Found {
    Missing,
    /// Served whole: generated, or a metadata file (cached per version),
    /// with its validators and their header values.
    Bytes(bytes::Bytes, Arc<Prepared>),
    /// Streamed (deltas, and objects named by detached metadata's kind).
    File(std::fs::File, std::fs::Metadata, Layer),
    /// Asked not to wait, it would have.
    WouldBlock,
}

pub(super) enum Refused {
    Metadata(MetadataError),
    Other(anyhow::Error),
}

/// Finds `rp` and, for metadata with a `cap`, reads it whole; anything
/// else is left open. With `nonblocking`, [`Found::WouldBlock`] rather
/// than wait on the disk.
pub(super) fn find(
    g: &Generation,
    rp: &RepoPath,
    cap: Option<u64>,
    nonblocking: bool,
) -> Result<Found, Refused> {
    match g.locate(rp, nonblocking).map_err(Refused::Other)? {
        Located::Missing => Ok(Found::Missing),
        Located::WouldBlock => Ok(Found::WouldBlock),
        Located::Generated(gen) => Ok(Found::Bytes(gen.bytes, gen.prepared)),
        Located::File {
            layer,
            root,
            rel,
            file,
            meta,
        } => match cap {
            Some(cap) => match g.read_located((&root, &rel), (&file, &meta), cap, nonblocking) {
                Ok(Some(f)) => Ok(Found::Bytes(f.bytes, f.prepared)),
                Ok(None) => Ok(Found::WouldBlock),
                Err(e) => Err(Refused::Metadata(e)),
            },
            None => Ok(Found::File(file, meta, layer)),
        },
    }
}

/// `name` from the object cache, if it answers there: a connection that
/// sends files itself gets larger objects from the page cache without a
/// copy (`SENDFILE_FROM`), even those held here.
pub(super) fn cache_hit(
    st: &AppState,
    key: u64,
    name: &ObjectName,
    sendfile: bool,
) -> Option<Arc<CachedObject>> {
    st.cache
        .get(key, name)
        .filter(|hit| !sendfile || (hit.bytes.len() as u64) < SENDFILE_FROM)
}

/// An immutable object: from the object cache when it is there (no
/// syscall, no handoff); else found and, if small, read whole on this
/// thread when the kernel has it cached, or in one trip to the blocking
/// pool when it does not; kept in the cache if it fits.
async fn serve_object(
    st: &AppState,
    generation: &Arc<Generation>,
    asked: &Asked<'_>,
    name: ObjectName,
) -> Result<Response, AppError> {
    let immutable = HeaderValue::from_static(IMMUTABLE);
    let key = generation.cache_key;
    if let Some(hit) = cache_hit(st, key, &name, asked.sendfile) {
        return Ok(respond_bytes(
            asked.headers,
            hit.bytes.clone(),
            &hit.prepared,
            immutable,
            asked.head(),
        ));
    }
    // Read whole only what the cache keeps (below `SENDFILE_FROM`, and no
    // larger than its entries), so that every copy is the cache's, shared by the requests
    // that ask for it: read whole for each request, the 16 KiB-1 MiB
    // objects of 64 HTTP/2 connections x 16 streams that never read pinned
    // a gigabyte. The rest is streamed, in chunks charged to the client.
    // On a connection that sends files itself, an object's first request
    // is answered from its file; the cache takes it at the next (`again`).
    let whole_upto = if !asked.sendfile {
        (SENDFILE_FROM - 1).min(st.cache.max_entry() as u64)
    } else if st.cache.again(key, &name) {
        SENDFILE_FROM
    } else {
        0
    };
    let loaded = match generation.load_object(&name, whole_upto, true) {
        Ok(Loaded::WouldBlock) => {
            let g = generation.clone();
            tokio::task::spawn_blocking(move || g.load_object(&name, whole_upto, false))
                .await
                .map_err(|e| anyhow::anyhow!("object task: {e}"))?
        }
        other => other,
    }
    .map_err(|e| anyhow::anyhow!("reading {}: {e}", name.path()))?;
    match loaded {
        Loaded::Missing => Err(AppError::NotFound),
        Loaded::Whole(bytes, meta) => {
            let v = Prepared::for_object(&name, bytes.len() as u64, &meta);
            let obj = CachedObject::new(bytes, v);
            // A large object read for a connection that cannot sendfile
            // is not kept: each object of a pull is asked once, so it
            // would only push out the small ones that every connection
            // answers from here. Publication warms the large ones a fleet
            // update asks for.
            if (obj.bytes.len() as u64) < SENDFILE_FROM {
                st.cache.insert(key, name, obj.clone());
            }
            Ok(respond_bytes(
                asked.headers,
                obj.bytes.clone(),
                &obj.prepared,
                immutable,
                asked.head(),
            ))
        }
        Loaded::Open(file, meta) => {
            let v = Prepared::for_object(&name, meta.len(), &meta);
            let g = generation.clone();
            // Opened as the request opened it: through the gate, never
            // read whole.
            let reopen: body::Reopen =
                Arc::new(
                    move |nonblocking| match g.load_object(&name, 0, nonblocking)? {
                        Loaded::Open(f, _) => Ok(Reopened::File(f)),
                        Loaded::WouldBlock => Ok(Reopened::WouldBlock),
                        Loaded::Missing | Loaded::Whole(..) => Ok(Reopened::Gone),
                    },
                );
            Ok(respond_streamed(
                st,
                asked,
                (file, &meta),
                reopen,
                &v,
                immutable,
            ))
        }
        Loaded::WouldBlock => Err(anyhow::anyhow!("a blocking load would block").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_etag_is_what_it_always_was() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b"part").unwrap();
        let meta = std::fs::metadata(f.path()).unwrap();
        for layer in [Layer::Source, Layer::Overlay] {
            let want = format!(
                "\"{:x}-{:x}-{:x}.{:x}-{}\"",
                meta.ino(),
                meta.len(),
                meta.mtime(),
                meta.mtime_nsec(),
                u8::from(layer == Layer::Overlay)
            );
            assert_eq!(file_etag(&meta, layer), want);
        }
    }
}
