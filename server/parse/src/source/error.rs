//! The one error type of `source`.
//!
//! Every message names the image (as the user wrote it, plus the mirror it
//! came through, if any), the object concerned (manifest, config or layer,
//! with its digest) and the reason, so that one log line is enough to act on.

use std::fmt;
use std::io;

/// What a [`SourceError`] is about: the image and the object within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The image as given (`docker://…`, `oci:…`, `oci-archive:…`), and the
    /// mirror or registry endpoint actually used, if different.
    pub image: String,
    /// The object: `manifest latest`, `config sha256:…`,
    /// `layer 2/3 sha256:…`, `index.json`, … Empty for the image as a whole.
    pub object: String,
}

impl Subject {
    pub fn new(image: impl Into<String>, object: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            object: object.into(),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.object.is_empty() {
            write!(f, "{}", self.image)
        } else {
            write!(f, "{}: {}", self.image, self.object)
        }
    }
}

/// Why fetching an image failed. Whatever the variant, the staging directory
/// has been removed by the time the caller sees it.
///
/// Callers branch on [`SourceError::is_retryable`]: a retryable error may go
/// away by itself (network, registry hiccup, rotated credentials, a mirror
/// catching up, space freed); the others mean the image or the configuration
/// is wrong, and retrying the same thing soon is pointless.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("invalid image reference {input:?}: {reason}")]
    InvalidReference { input: String, reason: String },
    #[error("{subject}: configuration error: {reason}")]
    Config { subject: Subject, reason: String },
    #[error("{subject}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        subject: Subject,
        expected: String,
        actual: String,
    },
    #[error("{subject}: size mismatch: the descriptor says {expected} bytes, but more than that arrived ({actual} so far)")]
    SizeMismatch {
        subject: Subject,
        expected: u64,
        actual: u64,
    },
    #[error("{subject}: truncated: the stream ended after {got} of {expected} bytes")]
    Truncated {
        subject: Subject,
        expected: u64,
        got: u64,
    },
    #[error("{subject}: unsafe tar entry {path:?}: {why}")]
    UnsafeEntry {
        subject: Subject,
        path: String,
        why: String,
    },
    #[error("{subject}: {limit} limit exceeded: {detail}")]
    LimitExceeded {
        subject: Subject,
        limit: &'static str,
        detail: String,
    },
    #[error("{subject}: label {label:?}: {reason}")]
    Label {
        subject: Subject,
        label: String,
        reason: String,
    },
    #[error("{subject}: authentication to {registry} failed: {reason}")]
    Auth {
        subject: Subject,
        registry: String,
        reason: String,
    },
    #[error("{subject}: {url}: {reason}")]
    Network {
        subject: Subject,
        url: String,
        reason: String,
    },
    #[error("{subject}: {url}: unexpected HTTP status {status}{detail}")]
    Http {
        subject: Subject,
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{subject}: not found: {reason}")]
    NotFound { subject: Subject, reason: String },
    #[error("{subject}: no manifest for platform {platform} (available: {available})")]
    NoPlatform {
        subject: Subject,
        platform: String,
        available: String,
    },
    #[error("{subject}: invalid: {reason}")]
    Invalid { subject: Subject, reason: String },
    #[error("{subject}: unsupported: {reason}")]
    Unsupported { subject: Subject, reason: String },
    #[error("{subject}: disk full while writing {path}")]
    DiskFull { subject: Subject, path: String },
    #[error("{subject}: {path}: {source}")]
    Io {
        subject: Subject,
        path: String,
        #[source]
        source: io::Error,
    },
    /// An ostree object in a native image that is not what its name says,
    /// or is missing from the commit's closure.
    #[error("{subject}: ostree object {object}: {reason}")]
    BadObject {
        subject: Subject,
        object: String,
        reason: String,
    },
    /// A layer whose decompressed stream is not what the config's
    /// `rootfs.diff_ids` says (its compressed digest matched the manifest).
    #[error("{subject}: its uncompressed content hashes to {actual}, not to {expected}, its entry in the config's rootfs.diff_ids: the config does not describe this layer")]
    DiffIdMismatch {
        subject: Subject,
        expected: String,
        actual: String,
    },
    /// Layers after `ostree.final-diffid`: what the image runs is not the
    /// commit it carries.
    #[error("{subject}: {count} derived layer(s) after the ostree layers (label ostree.final-diffid): the image runs content that is not in its ostree commit {commit}, so serving that commit would not serve what the image runs; pass --serve-base-commit to serve the base commit anyway")]
    DerivedLayers {
        subject: Subject,
        count: usize,
        commit: String,
    },
    #[error("{subject}: cancelled")]
    Cancelled { subject: Subject },
    #[error("{subject}: the fetch took longer than {after:?}")]
    TimedOut {
        subject: Subject,
        after: std::time::Duration,
    },
    /// Every endpoint (mirrors, then the primary) failed; `last` is the
    /// primary's (or the last endpoint's) error, and decides retryability.
    #[error("{image}: every source failed: {}; last: {last}", attempts.join("; "))]
    AllSourcesFailed {
        image: String,
        attempts: Vec<String>,
        last: Box<SourceError>,
    },
}

impl SourceError {
    /// True if the same fetch may succeed later without anyone changing the
    /// image or the configuration: network and registry-side failures
    /// (connection, timeout, 5xx, 429, a truncated or corrupted transfer,
    /// a tag not (yet) there), authentication (pull secrets rotate), and a
    /// full disk (space gets freed). False for what is wrong with the image
    /// itself (unsafe entries, limits, labels, unsupported or invalid
    /// content) or with the configuration.
    pub fn is_retryable(&self) -> bool {
        match self {
            SourceError::Network { .. }
            | SourceError::Truncated { .. }
            | SourceError::DigestMismatch { .. }
            | SourceError::SizeMismatch { .. }
            | SourceError::NotFound { .. }
            | SourceError::Auth { .. }
            | SourceError::DiskFull { .. }
            | SourceError::Io { .. }
            | SourceError::TimedOut { .. } => true,
            SourceError::Http { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            SourceError::AllSourcesFailed { last, .. } => last.is_retryable(),
            SourceError::InvalidReference { .. }
            | SourceError::Config { .. }
            | SourceError::UnsafeEntry { .. }
            | SourceError::LimitExceeded { .. }
            | SourceError::Label { .. }
            | SourceError::NoPlatform { .. }
            | SourceError::Invalid { .. }
            | SourceError::Unsupported { .. }
            | SourceError::BadObject { .. }
            | SourceError::DiffIdMismatch { .. }
            | SourceError::DerivedLayers { .. }
            | SourceError::Cancelled { .. } => false,
        }
    }

    /// The subject, if the error has one.
    pub fn subject(&self) -> Option<&Subject> {
        match self {
            SourceError::Config { subject, .. }
            | SourceError::DigestMismatch { subject, .. }
            | SourceError::SizeMismatch { subject, .. }
            | SourceError::Truncated { subject, .. }
            | SourceError::UnsafeEntry { subject, .. }
            | SourceError::LimitExceeded { subject, .. }
            | SourceError::Label { subject, .. }
            | SourceError::Auth { subject, .. }
            | SourceError::Network { subject, .. }
            | SourceError::Http { subject, .. }
            | SourceError::NotFound { subject, .. }
            | SourceError::NoPlatform { subject, .. }
            | SourceError::Invalid { subject, .. }
            | SourceError::Unsupported { subject, .. }
            | SourceError::DiskFull { subject, .. }
            | SourceError::Io { subject, .. }
            | SourceError::BadObject { subject, .. }
            | SourceError::DiffIdMismatch { subject, .. }
            | SourceError::DerivedLayers { subject, .. }
            | SourceError::Cancelled { subject }
            | SourceError::TimedOut { subject, .. } => Some(subject),
            SourceError::AllSourcesFailed { last, .. } => last.subject(),
            SourceError::InvalidReference { .. } => None,
        }
    }

    /// Maps a filesystem error while writing the staging tree: ENOSPC and
    /// EDQUOT become [`SourceError::DiskFull`].
    pub fn from_io(subject: &Subject, path: impl Into<String>, e: io::Error) -> Self {
        let path = path.into();
        let full = matches!(e.raw_os_error(), Some(c) if c == rustix::io::Errno::NOSPC.raw_os_error() || c == rustix::io::Errno::DQUOT.raw_os_error())
            || e.kind() == io::ErrorKind::StorageFull;
        if full {
            SourceError::DiskFull {
                subject: subject.clone(),
                path,
            }
        } else {
            SourceError::Io {
                subject: subject.clone(),
                path,
                source: e,
            }
        }
    }
}
