//! What `stage --follow` is asked to do ([`FollowOptions`]), and the check
//! it starts with: that what it follows is verified against keys. A leaf.

use super::wire;
use crate::pull::error::{PullError, PullResult, Tag};
use crate::pull::store::Store;
use crate::pull::Source;
use crate::stage::StageOptions;
use anyhow::anyhow;
use std::net::SocketAddr;
use std::time::Duration;

/// The shortest and longest `--poll-interval`.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub struct FollowOptions {
    /// Each round's stage: `target` is the ref followed.
    pub stage: StageOptions,
    /// The ref followed (also `stage.target`).
    pub ref_name: String,
    pub node: String,
    pub pool: String,
    pub control_plane: bool,
    pub poll_interval: Duration,
    pub metrics_listen: Option<SocketAddr>,
    /// Stage without a slot when the server hands out none.
    pub without_slots: bool,
}

impl FollowOptions {
    /// The names and the interval, as the contract and the flags bound them.
    pub fn check(&self) -> PullResult<()> {
        wire::check_node(&self.node).usage()?;
        wire::check_pool(&self.pool).usage()?;
        if !(MIN_POLL_INTERVAL..=MAX_POLL_INTERVAL).contains(&self.poll_interval) {
            return Err(PullError::Usage(anyhow!(
                "--poll-interval must be {} s to {} s, not {:.3} s",
                MIN_POLL_INTERVAL.as_secs(),
                MAX_POLL_INTERVAL.as_secs(),
                self.poll_interval.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// Following a ref lets the server name the digest, so the digest is no
/// trust root any more: a hostile server could index an image whose
/// manifest maps a genuine layer digest to objects of its own, and the
/// importer would later trust that layer ref. The summary that carries the
/// index, and the commit, must therefore verify against keys: given by
/// `--trusted-keys`, or a configured remote's with both `gpg-verify` and
/// `gpg-verify-summary` on.
pub fn require_verified(opts: &StageOptions, store: &Store) -> PullResult<()> {
    if opts.trusted_keys.is_some() {
        return Ok(());
    }
    let name = match &opts.source {
        Source::Url(_) => {
            return Err(PullError::Usage(anyhow!(
                "--follow needs --trusted-keys FILE (or --remote NAME configured with \
                 gpg-verify=true and gpg-verify-summary=true): the server names the image \
                 it stages, so its summary and commit must verify against keys"
            )))
        }
        Source::Remote(name) => name,
    };
    let (commits, summary) = store.remote_gpg_verify(name).usage()?;
    if !(commits && summary) {
        return Err(PullError::Usage(anyhow!(
            "--follow with --remote {name}: the remote must have gpg-verify=true and \
             gpg-verify-summary=true (it has {commits} and {summary}), or pass --trusted-keys \
             FILE: the server names the image it stages, so its summary and commit must \
             verify against keys"
        )));
    }
    Ok(())
}
