//! A local source's publication (`--oscontainer`, `--repo`, and `sign`
//! of them): an ostree-native image root is converted first
//! (`source::native::root`), the rest published as it stands.

use crate::request::PublishRequest;
use crate::served::Generation;
use crate::signing::SignatureOptions;
use crate::source::native::root::NativeRoots;
use crate::state::StateDir;
use crate::verify::VerdictCache;
use anyhow::Result;
use std::sync::{Arc, Mutex};

/// Publishes `req` as [`super::publish_verified`] does (with `cache`,
/// the verdicts of earlier publications); a native root is converted first
/// (or its conversion reused), and the generation keeps the conversion
/// alive.
pub fn publish_local(
    req: &PublishRequest,
    state: &StateDir,
    sigs: &SignatureOptions,
    roots: &Mutex<NativeRoots>,
    cache: Option<Arc<VerdictCache>>,
) -> Result<Generation> {
    let prepared = roots
        .lock()
        .map_err(|_| anyhow::anyhow!("a previous conversion panicked"))?
        .prepare(req, state)?;
    match prepared {
        None => super::publish_verified(req, state, sigs, cache),
        Some((converted_req, keep)) => {
            let mut g = super::publish_verified(&converted_req, state, sigs, cache)?;
            g.keepalive.push(Box::new(keep));
            Ok(g)
        }
    }
}
