//! Repo requests answered past the router's types: most of what a pull
//! asks for is a repo path by its plain name (an object, the summary, a
//! delta part), with nothing to evaluate (no precondition, no range), and
//! the answer is a 200 whose headers were made when the file was found.
//! Our HTTP/1.1 loop (`listen::h1`) asks here first, and writes the head
//! and body itself; building the request's and the response's header
//! maps, the boxed futures around them and the moves of those futures
//! were a third of the server's user time in `bench serve`'s replay.
//!
//! Only what is answered at once is answered here: from the object cache
//! or the metadata cache, from a file the kernel has looked up before, or
//! an empty 404 for a path the kernel knows is not there (a commit's
//! `.commitmeta` when it has no signatures: every pull asks). Anything
//! else (a miss that would wait on the disk, no generation yet, a header
//! this does not know) is the router's, and nothing done here changes the
//! router's answer. The answer is the router's too, header for header
//! (tested), and counted and logged as `observe` does.

use super::observe::{self, Done};
use super::repo::{self, CachePolicy, Found as RepoFound, SENDFILE_FROM};
use super::sendfile::SendFile;
use super::{AppState, IMMUTABLE, NO_STORE};
use crate::cache::CachedObject;
use crate::prepared::Prepared;
use crate::served::metadata;
use crate::served::objects::Loaded;
use crate::served::Generation;
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use oscontent_format::{ObjectName, RepoPath};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

/// Request headers that leave a repo path's answer as it is; a request with
/// any other (a precondition, a range, `Expect`, ...) goes to the router.
/// What stock ostree (libcurl), our client, the usual load tools and a
/// proxy or cache in front send.
const INERT: [&str; 16] = [
    "accept",
    "accept-encoding",
    "accept-language",
    "cache-control",
    "connection",
    "forwarded",
    "http2-settings",
    "keep-alive",
    "pragma",
    "upgrade",
    "user-agent",
    "via",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
];

/// What the connection read: a GET or HEAD of `path` over HTTP/1.1.
#[derive(Debug)]
pub struct Ask<'a> {
    pub head: bool,
    /// The request target as sent.
    pub path: &'a str,
    pub headers: &'a [httparse::Header<'a>],
    pub client: IpAddr,
}

/// The repo path asked for, if `ask` is one this module answers: a target
/// of plain characters that `RepoPath` parses (so the router's `Uri` would
/// take it and its path is the target), exactly one `Host` (else the
/// router answers 400), and only [`INERT`] headers besides.
fn repo_asked(ask: &Ask<'_>) -> Option<RepoPath> {
    let rel = ask.path.strip_prefix('/')?;
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-._~/+".contains(&b);
    if !rel.bytes().all(plain) {
        return None;
    }
    let rp = RepoPath::parse(rel)?;
    let mut hosts = 0;
    for h in ask.headers {
        if h.name.eq_ignore_ascii_case("host") {
            hosts += 1;
        } else if !INERT.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            return None;
        }
    }
    (hosts == 1).then_some(rp)
}

/// A repo path's 200 or empty 404, for the connection to write.
pub struct Direct {
    found: Found,
    /// `Cache-Control`: immutable, or the short-lived one.
    cache: HeaderValue,
    head: bool,
    done: Option<Done>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct")
            .field("content_length", &self.content_length())
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

enum Found {
    Cached(Arc<CachedObject>),
    /// Metadata read whole (or generated), as the metadata cache has it.
    Bytes(Bytes, Arc<Prepared>),
    File(Prepared, SendFile),
    /// A HEAD of what is left in its file.
    Stat(Prepared, u64),
    /// Not there: the router's empty 404.
    Missing,
}

impl Found {
    fn status(&self) -> StatusCode {
        match self {
            Found::Missing => StatusCode::NOT_FOUND,
            _ => StatusCode::OK,
        }
    }
}

/// What follows the head.
#[derive(Debug)]
pub enum Payload<'a> {
    None,
    Memory(&'a Bytes),
    File(&'a SendFile),
}

impl Direct {
    fn prepared(&self) -> Option<&Prepared> {
        match &self.found {
            Found::Cached(c) => Some(&c.prepared),
            Found::Bytes(_, p) => Some(p),
            Found::File(p, _) | Found::Stat(p, _) => Some(p),
            Found::Missing => None,
        }
    }

    fn content_length(&self) -> u64 {
        match &self.found {
            Found::Cached(c) => c.bytes.len() as u64,
            Found::Bytes(b, _) => b.len() as u64,
            Found::File(_, s) => s.range().1,
            Found::Stat(_, len) => *len,
            Found::Missing => 0,
        }
    }

    pub fn status(&self) -> StatusCode {
        self.found.status()
    }

    pub fn payload(&self) -> Payload<'_> {
        match &self.found {
            _ if self.head => Payload::None,
            Found::Cached(c) => Payload::Memory(&c.bytes),
            Found::Bytes(b, _) => Payload::Memory(b),
            Found::File(_, s) => Payload::File(s),
            Found::Stat(..) | Found::Missing => Payload::None,
        }
    }

    /// Writes the headers the router gives this answer, in its order: a
    /// 200's from its representation, a 404's as `AppError` and `observe`
    /// make them.
    pub fn write_headers(&self, out: &mut Vec<u8>) {
        match self.prepared() {
            Some(v) => super::respond::write_headers(out, v, &self.cache, self.content_length()),
            None => {
                super::header_line(out, &header::CONTENT_LENGTH, b"0");
                super::header_line(out, &header::CACHE_CONTROL, NO_STORE.as_bytes());
            }
        }
    }
}

/// Recorded when the connection is done with it, as `observe`'s body
/// records: what was handed to the socket, the whole of a body from memory.
impl Drop for Direct {
    fn drop(&mut self) {
        let Some(done) = self.done.take() else {
            return;
        };
        let sent = match self.payload() {
            Payload::None => 0,
            Payload::Memory(b) => b.len() as u64,
            Payload::File(s) => s.sent(),
        };
        done.finish(sent);
    }
}

/// `ask`'s answer if it can be made now and is a 200 or a 404; `None` for
/// the router to answer, with nothing done that would change its answer.
/// Mirrors `repo::serve_repo` on a connection that sends files itself.
pub fn answer(st: &AppState, ask: &Ask<'_>) -> Option<Direct> {
    // What the router takes pays no clock read here.
    let rp = repo_asked(ask)?;
    let start = Instant::now();
    let generation = st.sink.current()?;
    let (found, cache) = match rp {
        RepoPath::Object(name) if repo::policy(&rp) == CachePolicy::Immutable => {
            let found = object(st, &generation, name, ask)?;
            (found, HeaderValue::from_static(IMMUTABLE))
        }
        _ => (
            other(st, &generation, &rp, ask)?,
            repo::cache_control(st, &rp),
        ),
    };
    let status = found.status().as_u16();
    let done = observe::answered(st, ask.path, &rp, ask.head, status, ask.client, start);
    Some(Direct {
        found,
        cache,
        head: ask.head,
        done: Some(done),
    })
}

/// An immutable object: `repo::serve_object`'s steps.
fn object(
    st: &AppState,
    generation: &Generation,
    name: ObjectName,
    ask: &Ask<'_>,
) -> Option<Found> {
    let key = generation.cache_key;
    if let Some(hit) = repo::cache_hit(st, key, &name, true) {
        return Some(Found::Cached(hit));
    }
    // Opened only (on this thread if the kernel has its lookup), and read
    // whole below if small and asked for before, as the router would have
    // read it.
    let (file, meta) = match generation.load_object(&name, 0, true) {
        Ok(Loaded::Open(file, meta)) => (file, meta),
        Ok(Loaded::Missing) => return Some(Found::Missing),
        _ => return None,
    };
    let len = meta.len();
    let v = Prepared::for_object(&name, len, &meta);
    // Not in the page cache whole: sent from its file this time (the
    // router would have read it on the blocking pool), and read at a later
    // request. A failed read is the router's to report.
    let whole = if len < SENDFILE_FROM && st.cache.again(key, &name) {
        crate::served::objects::read_whole(&file, len, true).ok()?
    } else {
        None
    };
    if let Some(bytes) = whole {
        let obj = CachedObject::new(bytes, v);
        st.cache.insert(key, name, obj.clone());
        return Some(Found::Cached(obj));
    }
    file_answer(st, file, v, len, ask)
}

/// Anything else: metadata from its cache (checked against its file) or
/// generated, a delta's file. `repo::serve_repo`'s steps.
fn other(st: &AppState, generation: &Generation, rp: &RepoPath, ask: &Ask<'_>) -> Option<Found> {
    match repo::find(generation, rp, metadata::cap(rp), true).ok()? {
        RepoFound::Bytes(bytes, prepared) => Some(Found::Bytes(bytes, prepared)),
        RepoFound::File(file, meta, layer) => {
            let v = repo::file_prepared(&meta, layer);
            file_answer(st, file, v, meta.len(), ask)
        }
        RepoFound::Missing => Some(Found::Missing),
        RepoFound::WouldBlock => None,
    }
}

/// A file sent by the connection; without a place in the streamed-file
/// budget, the router's (it streams the file, opened again for each read).
fn file_answer(
    st: &AppState,
    file: std::fs::File,
    v: Prepared,
    len: u64,
    ask: &Ask<'_>,
) -> Option<Found> {
    if ask.head {
        return Some(Found::Stat(v, len));
    }
    let permit = st.streams.try_take(ask.client)?;
    Some(Found::File(v, SendFile::new(file, 0, len, permit)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oscontent_format::{Checksum, ObjectKind};
    use std::net::Ipv4Addr;

    /// A request target, its headers, and whether it is taken.
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, bool);

    #[test]
    fn only_plain_repo_requests_are_taken() {
        let name = ObjectName::new(Checksum::digest(b"x"), ObjectKind::DirTree);
        let path = format!("/{}", name.path());
        let upper = path.to_uppercase().replace("/OBJECTS/", "/objects/");
        let meta = format!(
            "/objects/{}.commitmeta",
            &name.path()[8..name.path().len() - 8]
        );
        let query = format!("{path}?x=1");
        let absolute = format!("http://h{path}");
        let delta = "/deltas/CB/JwLbDJRD8IC56bcaPan6EVZQ6lM+9BsHdBUsFMKsQ-KhV23_i++i2HRDzRH3XoUt_aR9Y4mG7MZuPMFZHI480/0";
        let host = ("Host", "h");
        let ua = ("User-Agent", "libostree/2022.7");
        #[rustfmt::skip]
        let cases: Vec<Case<'_>> = vec![
            (&path, vec![host, ua, ("Accept", "*/*")], true),
            (&path, vec![("HOST", "h"), ("connection", "close")], true),
            // What curl sends with its first request: an h2c upgrade.
            (&path, vec![host, ("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"), ("HTTP2-Settings", "AAMAAABkAAQCAAAAAAIAAAAA")], true),
            (&path, vec![host, ("Via", "1.1 cache"), ("X-Forwarded-For", "10.0.0.1")], true),
            (&meta, vec![host], true),
            ("/config", vec![host, ua], true),
            ("/summary.sig", vec![host], true),
            ("/refs/heads/fedora/x86_64/coreos/stable", vec![host], true),
            (delta, vec![host], true),
            // The router's: 400 without exactly one Host.
            (&path, vec![ua], false),
            (&path, vec![host, host], false),
            // Preconditions and ranges are evaluated there.
            (&path, vec![host, ("If-None-Match", "\"e\"")], false),
            (&path, vec![host, ("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], false),
            (&path, vec![host, ("Range", "bytes=0-0")], false),
            (&path, vec![host, ("If-Range", "\"e\"")], false),
            (&path, vec![host, ("X-Unknown", "1")], false),
            // Not a repo path's plain spelling: `Uri` would decide.
            (&upper, vec![host], false),
            (&query, vec![host], false),
            (&absolute, vec![host], false),
            ("/refs/heads/a%2Fb", vec![host], false),
            ("/refs/heads/a|b", vec![host], false),
            ("/objects/ab", vec![host], false),
            ("/", vec![host], false),
            ("/healthz", vec![host], false),
        ];
        for (path, headers, taken) in cases {
            let headers: Vec<httparse::Header<'_>> = headers
                .iter()
                .map(|(name, value)| httparse::Header {
                    name,
                    value: value.as_bytes(),
                })
                .collect();
            let ask = Ask {
                head: false,
                path,
                headers: &headers,
                client: IpAddr::V4(Ipv4Addr::LOCALHOST),
            };
            let got = repo_asked(&ask);
            assert_eq!(got.is_some(), taken, "{path} {headers:?}");
            if taken {
                assert_eq!(got, RepoPath::parse(&path[1..]), "{path}");
            }
        }
    }
}
