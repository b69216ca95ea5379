//! Signature checks: commits (`.commitmeta`'s `ostree.gpgsigs` over the
//! exact commit bytes), the summary (`summary.sig` over the exact summary
//! bytes), and the ref binding. Pure apart from reading the keyring file.

use super::error::{PullError, PullResult, Tag};
use anyhow::{anyhow, Context};
use oscontent_format::openpgp::{self, Cert, VerifiedSig};
use oscontent_format::{parse_gpgsigs, Commit};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Trusted certificates and where they came from.
#[derive(Debug, Clone)]
pub struct Keyring {
    pub certs: Vec<Cert>,
    pub source: PathBuf,
}

impl Keyring {
    pub fn load(path: &Path) -> PullResult<Self> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading trusted keys {}", path.display()))
            .usage()?;
        let certs = openpgp::load_certs(&bytes)
            .with_context(|| format!("trusted keys {}", path.display()))
            .usage()?;
        Ok(Self {
            certs,
            source: path.to_path_buf(),
        })
    }

    /// Several files (a remote's `gpgkeypath`, or its imported keyring),
    /// all of which must parse.
    pub fn load_all(paths: &[PathBuf]) -> PullResult<Self> {
        let mut certs = Vec::new();
        for p in paths {
            certs.extend(Self::load(p)?.certs);
        }
        let source = paths
            .first()
            .cloned()
            .ok_or_else(|| PullError::Usage(anyhow!("no keyring files")))?;
        Ok(Self { certs, source })
    }
}

pub fn describe(v: &VerifiedSig) -> Value {
    json!({
        "key": v.key_fingerprint.to_hex(),
        "cert": v.cert_fingerprint.to_hex(),
        "user_id": v.user_id,
        "created": v.created.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    })
}

/// Verifies a commit's detached signatures. `commitmeta` is `None` when
/// the remote has no `.commitmeta` for it.
pub fn verify_commit(
    keyring: &Keyring,
    commit_bytes: &[u8],
    commitmeta: Option<&[u8]>,
    what: &str,
) -> PullResult<VerifiedSig> {
    let sigs = match commitmeta {
        Some(b) => parse_gpgsigs(b)
            .with_context(|| format!("detached metadata of {what}"))
            .verification()?,
        // Said plainly: a hidden `.commitmeta` must read as the missing
        // signature it is, not as a key problem.
        None => {
            return Err(PullError::Verification(anyhow!(
                "{what} has no detached metadata (no .commitmeta, so no signature), and \
                 signatures are required"
            )))
        }
    };
    openpgp::verify_detached(&keyring.certs, commit_bytes, &sigs, SystemTime::now())
        .map_err(|e| PullError::Verification(anyhow!("signature of {what}: {e}")))
}

/// Verifies `summary.sig` over the summary bytes.
pub fn verify_summary(
    keyring: &Keyring,
    summary: &[u8],
    sig: Option<&[u8]>,
) -> PullResult<VerifiedSig> {
    let sigs = match sig {
        Some(b) => parse_gpgsigs(b).context("summary.sig").verification()?,
        None => {
            return Err(PullError::Verification(anyhow!(
                "the remote's summary is not signed (no summary.sig), and signatures are required"
            )))
        }
    };
    openpgp::verify_detached(&keyring.certs, summary, &sigs, SystemTime::now())
        .map_err(|e| PullError::Verification(anyhow!("summary signature: {e}")))
}

/// Stock ostree's rule for collections: a commit bound to a collection
/// (`ostree.collection-binding`) is pulled only from a remote of that
/// collection. Checked when both are known.
pub fn check_collection(commit: &Commit, remote: Option<&str>) -> PullResult<()> {
    let bound = commit.collection_binding();
    match collection_mismatch(bound.as_deref(), remote) {
        Some(why) => Err(PullError::Verification(anyhow!(
            "commit {}: {why}",
            commit.checksum
        ))),
        None => Ok(()),
    }
}

/// Why a commit bound to `bound` may not come from a remote of collection
/// `remote`, if it may not.
pub fn collection_mismatch(bound: Option<&str>, remote: Option<&str>) -> Option<String> {
    match (bound, remote) {
        (Some(b), Some(r)) if b != r => Some(format!(
            "bound to collection {b:?} (ostree.collection-binding), but the remote's \
             collection is {r:?}"
        )),
        _ => None,
    }
}

/// Stock ostree's rule: a commit that carries `ostree.ref-binding` may be
/// pulled only under one of the refs it names.
pub fn check_binding(commit: &Commit, ref_name: &str) -> PullResult<()> {
    match commit.ref_binding() {
        Some(bound) if !bound.iter().any(|b| b == ref_name) => {
            Err(PullError::Verification(anyhow!(
                "commit {} is bound to {:?}, not to the requested ref {ref_name:?}",
                commit.checksum,
                bound
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_bindings() {
        // (commit's binding, remote's collection, refused)
        let cases = [
            (None, None, false),
            (Some("org.example.Os"), None, false),
            (None, Some("org.example.Os"), false),
            (Some("org.example.Os"), Some("org.example.Os"), false),
            (Some("org.example.Os"), Some("org.example.Other"), true),
            (Some("org.example.Os"), Some("org.example.os"), true),
            (Some(""), Some("org.example.Os"), true),
        ];
        for (bound, remote, refused) in cases {
            let got = collection_mismatch(bound, remote);
            assert_eq!(got.is_some(), refused, "{bound:?} from {remote:?}: {got:?}");
            if let Some(why) = got {
                assert!(why.contains(remote.unwrap()), "{why}");
            }
        }
    }
}
