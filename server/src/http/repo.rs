//! Repo paths: an immutable object from the object cache or its file, and
//! everything else (refs, summaries, config, deltas) resolved in the
//! generation; a file to be streamed first takes its place among those
//! streamed at once.

use super::respond::{respond_bytes, respond_file};
use super::{classify, AppError, AppState, IMMUTABLE};
use crate::cache::{CachedObject, Prepared};
use crate::conditional::Validators;
use crate::fsutil;
use crate::served::body;
use crate::served::metadata::{self, digest_etag, MetadataError};
use crate::served::objects::Loaded;
use crate::served::streams::StreamPermit;
use crate::served::{Generation, Layer, Resolved};
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{HeaderMap, HeaderValue};
use http::Method;
use oscontent_format::{ObjectName, RepoPath};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// How a representation may be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CachePolicy {
    Immutable,
    ShortLived,
}

fn policy(p: &RepoPath) -> CachePolicy {
    match p {
        RepoPath::Object(o) if o.kind.is_immutable() => CachePolicy::Immutable,
        _ => CachePolicy::ShortLived,
    }
}

/// Serves one repo path. GET and HEAD only. Takes the request whole: the
/// `HeaderMap` extractor would copy the headers.
pub(super) async fn repo(State(st): State<AppState>, req: Request) -> Response {
    // In-process tests call the router without a connection.
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    let asked = Asked {
        method: req.method(),
        headers: req.headers(),
        client,
    };
    match serve_repo(&st, &asked, req.uri().path()).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// What a repo request asks for, and who asks.
struct Asked<'a> {
    method: &'a Method,
    headers: &'a HeaderMap,
    client: IpAddr,
}

impl Asked<'_> {
    fn head(&self) -> bool {
        self.method == Method::HEAD
    }
}

async fn serve_repo(st: &AppState, asked: &Asked<'_>, path: &str) -> Result<Response, AppError> {
    let Some(rp) = path.strip_prefix('/').and_then(RepoPath::parse) else {
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
    let cache = st.short_lived.clone();
    let cap = metadata::cap(&rp);
    let mut permit = None;
    loop {
        // One trip to the blocking pool resolves the path and reads (or
        // opens) what it names.
        let g = generation.clone();
        let rp = rp.clone();
        let found = tokio::task::spawn_blocking(move || find(&g, &rp, cap))
            .await
            .map_err(|e| anyhow::anyhow!("resolver task: {e}"))?;
        return match found {
            Ok(Found::Missing) => Err(AppError::NotFound),
            Ok(Found::Bytes(bytes, v)) => Ok(respond_bytes(
                asked.headers,
                bytes,
                &Prepared::new(v),
                cache,
                asked.head(),
            )),
            Ok(Found::File(file, meta, layer)) => {
                let Some(permit) = streaming_permit(st, asked, file, &mut permit).await? else {
                    continue;
                };
                let v = Validators {
                    etag: format!(
                        "\"{:x}-{:x}-{:x}.{:x}-{}\"",
                        meta.ino(),
                        meta.len(),
                        meta.mtime(),
                        meta.mtime_nsec(),
                        u8::from(layer == Layer::Overlay)
                    ),
                    last_modified: meta.modified().ok(),
                };
                let (file, permit) = permit;
                Ok(respond_file(
                    asked.headers,
                    file,
                    meta.len(),
                    &Prepared::new(v),
                    cache,
                    asked.head(),
                    permit,
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
            Err(Refused::Other(e)) => Err(e.context(format!("serving {path}")).into()),
        };
    }
}

/// A file about to be streamed keeps its descriptor only with a place in
/// [`StreamBudget`] (a HEAD needs none). `Some((file, permit))` when it
/// may go on; `None` when the file was closed to wait for a place, which
/// `held` now has: open it again (it may have changed meanwhile).
async fn streaming_permit(
    st: &AppState,
    asked: &Asked<'_>,
    file: std::fs::File,
    held: &mut Option<StreamPermit>,
) -> Result<Option<(std::fs::File, Option<StreamPermit>)>, AppError> {
    if asked.head() {
        return Ok(Some((file, None)));
    }
    if let Some(p) = held.take().or_else(|| st.streams.try_take(asked.client)) {
        return Ok(Some((file, Some(p))));
    }
    drop(file);
    let waits = &st.metrics.connections.stream_waits;
    match st.streams.take(asked.client).await {
        Ok(p) => {
            waits.with_label_values(&["served"]).inc();
            *held = Some(p);
            Ok(None)
        }
        Err(e) => {
            waits.with_label_values(&["refused"]).inc();
            Err(AppError::Busy(e))
        }
    }
}

/// What a path other than an immutable object resolved to.
enum Found {
    Missing,
    /// Served whole: generated, or a metadata file (cached per version).
    Bytes(bytes::Bytes, Validators),
    /// Streamed (deltas, and objects named by detached metadata's kind).
    File(std::fs::File, std::fs::Metadata, Layer),
}

enum Refused {
    Metadata(MetadataError),
    Other(anyhow::Error),
}

/// Resolves and reads `rp` (blocking): metadata with a `cap` read whole,
/// anything else opened.
fn find(g: &Generation, rp: &RepoPath, cap: Option<u64>) -> Result<Found, Refused> {
    match g.resolve(rp).map_err(Refused::Other)? {
        Resolved::Missing => Ok(Found::Missing),
        Resolved::Generated(gen) => {
            let v = Validators {
                etag: digest_etag(&gen.bytes),
                last_modified: Some(gen.produced),
            };
            Ok(Found::Bytes(gen.bytes, v))
        }
        Resolved::File { layer, root, rel } => match cap {
            // Gone between resolve and read (a tool replacing it): 404,
            // and the client retries.
            Some(cap) => match g.read_metadata(&root, &rel, cap) {
                Ok(Some(f)) => Ok(Found::Bytes(
                    f.bytes,
                    Validators {
                        etag: f.etag,
                        last_modified: f.modified,
                    },
                )),
                Ok(None) => Ok(Found::Missing),
                Err(e) => Err(Refused::Metadata(e)),
            },
            None => match fsutil::open_file(&root, &rel) {
                Ok(Some((f, m))) => Ok(Found::File(f, m, layer)),
                Ok(None) => Ok(Found::Missing),
                Err(e) => Err(Refused::Other(anyhow::anyhow!("opening {rel}: {e}"))),
            },
        },
    }
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
    if let Some(hit) = st.cache.get(key, &name) {
        return Ok(respond_bytes(
            asked.headers,
            hit.bytes.clone(),
            &hit.prepared,
            immutable,
            asked.head(),
        ));
    }
    let whole_upto = st.cache.max_entry().max(body::CHUNK) as u64;
    let mut permit = None;
    loop {
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
        return match loaded {
            Loaded::Missing => Err(AppError::NotFound),
            Loaded::Whole(bytes, meta) => {
                let v = Prepared::for_object(&name, bytes.len() as u64, &meta);
                let obj = CachedObject::new(bytes, v);
                st.cache.insert(key, name, obj.clone());
                Ok(respond_bytes(
                    asked.headers,
                    obj.bytes.clone(),
                    &obj.prepared,
                    immutable,
                    asked.head(),
                ))
            }
            Loaded::Open(file, meta) => {
                let Some((file, permit)) = streaming_permit(st, asked, file, &mut permit).await?
                else {
                    continue;
                };
                let v = Prepared::for_object(&name, meta.len(), &meta);
                Ok(respond_file(
                    asked.headers,
                    file,
                    meta.len(),
                    &v,
                    immutable,
                    asked.head(),
                    permit,
                ))
            }
            Loaded::WouldBlock => Err(anyhow::anyhow!("a blocking load would block").into()),
        };
    }
}
