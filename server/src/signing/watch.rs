//! When to publish again for signature reasons.

use super::bundle::bundle_identity;
use crate::served::Generation;
use oscontent_format::Checksum;
use std::path::Path;

/// When to publish again for signature reasons, between publications: the
/// bundle directory holds something new, or (unless the server signs) the
/// summary a generation serves is no longer the one its publication
/// verified (a `--repo` that other tools changed). With `--sign-key` a
/// changed summary is never a reason: what a repo's writer changes must
/// not get anything signed (ARCHITECTURE.md, "Trust model"). A bundle that
/// was refused is not retried until it changes again. The checks read
/// files: call from blocking code.
#[derive(Debug, Default, Clone)]
pub struct SignatureWatch {
    /// Identity of the last bundle a publication refused.
    refused: Option<Option<[u8; 32]>>,
}

impl SignatureWatch {
    /// Whether to publish again. `current` is the generation served, if any;
    /// with none, a refused publication waits and is retried at each call.
    /// `follow_summary`: whether a summary that moved counts (not when the
    /// server signs).
    pub fn should_republish(
        &self,
        bundle_dir: Option<&Path>,
        current: Option<&Generation>,
        follow_summary: bool,
    ) -> bool {
        let Some(g) = current else {
            return true;
        };
        let moved = follow_summary
            && g.served_summary()
                .ok()
                .is_some_and(|b| Some(Checksum::digest(&b)) != g.signatures.summary_digest);
        if moved {
            return true;
        }
        let Some(dir) = bundle_dir else {
            return false;
        };
        let identity = bundle_identity(dir);
        identity != g.signatures.bundle_identity && self.refused != Some(identity)
    }

    /// Records that publication with the bundle as it is now was refused.
    pub fn refused(&mut self, bundle_dir: Option<&Path>) {
        self.refused = Some(bundle_dir.and_then(bundle_identity));
    }

    /// Records a successful publication.
    pub fn published(&mut self) {
        self.refused = None;
    }
}
