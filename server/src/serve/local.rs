//! The `--oscontainer` and `--repo` publisher (an ostree-native image
//! root is converted first: `source::native::root`).

use crate::images::announce;
use crate::refresh::{Checked, Publisher};
use crate::request::PublishRequest;
use crate::served::Generation;
use crate::signing::{self, SignatureOptions};
use crate::source::native::root::{self, NativeRoots};
use crate::state::StateDir;
use crate::verify::{ObjectGate, Root, VerdictCache, VerifyOptions};
use anyhow::{Context, Result};
use std::sync::{Arc, Mutex};

/// Publishes a local source (again) at each check: at start, at SIGHUP (a
/// remounted image volume, refs added to a repo) and, with signatures,
/// when new ones arrive or the served summary moved.
#[derive(Debug)]
pub(super) struct LocalPublisher {
    pub req: Arc<PublishRequest>,
    pub state_dir: Arc<StateDir>,
    pub sigs: SignatureOptions,
    /// What the last publication verified, by file identity: a refresh
    /// hashes only objects that are new or changed.
    pub verdicts: Arc<VerdictCache>,
    /// The conversion of a native root, reused while its commit is served.
    pub native: Arc<Mutex<NativeRoots>>,
}

impl LocalPublisher {
    /// Publishes the source on the blocking pool.
    async fn publish(&self) -> Result<Generation> {
        let (r, sd, s) = (self.req.clone(), self.state_dir.clone(), self.sigs.clone());
        let (v, native) = (self.verdicts.clone(), self.native.clone());
        tokio::task::spawn_blocking(move || {
            crate::publish::local::publish_local(&r, &sd, &s, &native, Some(v))
        })
        .await
        .context("publish task")?
        .with_context(|| format!("publishing {}", self.req.source.given().display()))
    }
}

impl Publisher for LocalPublisher {
    async fn check(&mut self, _force: bool) -> Result<Checked> {
        match self.publish().await {
            Ok(generation) => {
                announce(&generation);
                Ok(Checked::New(Box::new(generation)))
            }
            Err(e) if signing::is_signature_error(&e) => Ok(Checked::Refused(e)),
            Err(e) => Err(e),
        }
    }

    fn what(&self) -> &str {
        "the source"
    }

    /// The generation serves the source's own files in place, so a
    /// corrupt file in the source may be one it serves: its objects are
    /// checked again (only changed files are hashed), and any that no
    /// longer verifies discredits it. A native root's converted copy is
    /// the server's own, written as it verified, and is trusted as such.
    async fn discredits(&self, e: &anyhow::Error, current: Arc<Generation>) -> bool {
        if !crate::verify::is_corruption(e) {
            return false;
        }
        let ObjectGate::Only(set) = &current.gate else {
            return false;
        };
        let set = set.clone();
        let converted = self.state_dir.path().join(root::ROOTS_DIR);
        let roots: Vec<Root> = current
            .sources
            .iter()
            .map(|p| Root {
                path: p.clone(),
                preverified: p.starts_with(&converted),
            })
            .collect();
        let opts = VerifyOptions {
            jobs: 0,
            cache: Some(self.verdicts.clone()),
        };
        let r = tokio::task::spawn_blocking(move || crate::verify::recheck(&roots, &set, &opts))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("recheck task: {e}")));
        match r {
            Ok(()) => false,
            Err(e) => {
                tracing::error!("what is served no longer verifies: {e:#}");
                true
            }
        }
    }
}
