//! What a pull is asked to do ([`PullOptions`], [`Source`]), and what its
//! steps share once the source is resolved ([`PullRequest`], [`Remote`],
//! [`Trust`]). A leaf: the steps in the sibling modules take these types,
//! and `mod.rs` runs the steps.

use super::error::{PullResult, Tag};
use super::report::{Output, Reporter};
use super::store::Store;
use super::verify::Keyring;
use crate::governor::{Governor, IoMode};
use oscontent_format::Checksum;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where to pull from.
#[derive(Debug, Clone)]
pub enum Source {
    Url(String),
    /// A remote configured in the repo (`ostree remote add`).
    Remote(String),
}

#[derive(Debug, Clone)]
pub struct PullOptions {
    pub repo: PathBuf,
    pub source: Source,
    pub ref_name: Option<String>,
    pub commit: Option<Checksum>,
    pub trusted_keys: Option<PathBuf>,
    pub allow_downgrade: bool,
    /// `--max-future-skew`, seconds.
    pub max_future_skew: u64,
    pub io_mode: IoMode,
    pub io_latency_target: Duration,
    /// `--io-max-rate`, bytes (of cost) per second.
    pub io_max_rate: Option<u64>,
    pub concurrency: usize,
    /// Fetching (everything before the barrier) must end within this.
    pub timeout: Duration,
    pub http1_only: bool,
    pub output: Output,
}

/// What verification is required, and against which keys.
#[derive(Debug, Clone)]
pub struct Trust {
    pub keyring: Option<Keyring>,
    pub commits: bool,
    pub summary: bool,
}

impl Trust {
    /// The keys to verify against; only called when `commits` or `summary`
    /// is set, which `remote::resolve_source` never sets without a
    /// keyring.
    pub fn keyring(&self) -> &Keyring {
        self.keyring.as_ref().expect("verification has a keyring")
    }
}

/// `--url` or `--remote`, resolved: where to fetch, the remote's name in
/// the repo (if configured there), and what it must prove.
#[derive(Debug, Clone)]
pub struct Remote {
    pub url: String,
    /// Where objects and deltas come from when not from `url`: a
    /// configured remote's `contenturl` (an HTTP cache in front of the
    /// server, say). Metadata that decides or proves the target (config,
    /// summary and its signature, refs, `.commitmeta`) always comes from
    /// `url`, as stock ostree fetches it.
    pub content_url: Option<String>,
    /// `Some` for `--remote`: the ref is then written as `NAME:REF`.
    pub name: Option<String>,
    pub trust: Trust,
    /// The collection the remote is configured with (`collection-id` of
    /// a configured remote), which bound commits must name.
    pub collection_id: Option<String>,
}

/// A pull whose repo, remote and I/O governor are ready: what every step
/// of the pull shares.
#[derive(Debug)]
pub struct PullRequest<'a> {
    pub opts: &'a PullOptions,
    pub store: Store,
    pub remote: Remote,
    pub governor: Arc<Governor>,
    /// Shared with the caller, which reports the final error through it.
    pub reporter: Arc<Reporter>,
}

impl PullRequest<'_> {
    /// The local ref to move: `REMOTE:REF` for a configured remote, else
    /// `REF`; `None` when only `--commit` was given.
    pub fn refspec(&self) -> Option<String> {
        self.opts
            .ref_name
            .as_ref()
            .map(|r| match &self.remote.name {
                Some(rm) => format!("{rm}:{r}"),
                None => r.clone(),
            })
    }

    /// The commit the local ref points at now, if any.
    pub fn current(&self) -> PullResult<Option<Checksum>> {
        match self.refspec() {
            Some(r) => self.store.resolve(&r).local(),
            None => Ok(None),
        }
    }
}
