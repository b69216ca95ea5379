//! A file body the connection sends itself. hyper writes every body from
//! memory, so each byte is copied from the page cache into a buffer and
//! from it into the socket; our HTTP/1.1 connections (`listen::h1`) say
//! they can do better with [`CanSendFile`], and the repo handler then
//! answers with an empty body and a [`SendFile`] extension naming the
//! file's range, which the connection sends with `sendfile(2)`. Every other
//! connection (HTTP/2, and HTTP/1.1 requests handed to hyper) gets the
//! usual streamed body.

use crate::served::streams::StreamPermit;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// On a request: its connection sends [`SendFile`] bodies.
#[derive(Debug, Clone, Copy)]
pub struct CanSendFile;

/// On a response: its body is `count` bytes of `file` from `start`; the
/// response's own body is empty.
#[derive(Debug, Clone)]
pub struct SendFile(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    file: File,
    start: u64,
    count: u64,
    /// What the connection sent, for the metrics and the access log.
    sent: AtomicU64,
    /// The file's place in the streamed-file budget, until the last
    /// handle goes (the connection's, when it has sent or given up).
    _permit: StreamPermit,
}

impl SendFile {
    pub fn new(file: File, start: u64, count: u64, permit: StreamPermit) -> Self {
        Self(Arc::new(Inner {
            file,
            start,
            count,
            sent: AtomicU64::new(0),
            _permit: permit,
        }))
    }

    pub fn file(&self) -> &File {
        &self.0.file
    }

    /// The range to send: (start, count).
    pub fn range(&self) -> (u64, u64) {
        (self.0.start, self.0.count)
    }

    /// Adds `n` bytes handed to the socket.
    pub fn note_sent(&self, n: u64) {
        self.0.sent.fetch_add(n, Ordering::Relaxed);
    }

    pub fn sent(&self) -> u64 {
        self.0.sent.load(Ordering::Relaxed)
    }
}
