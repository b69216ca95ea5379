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

    /// A remote's `gpgkeypath` entries, each a key file or a directory
    /// of them, all of which must parse.
    pub fn load_all(paths: &[PathBuf]) -> PullResult<Self> {
        let mut certs = Vec::new();
        for p in paths {
            for f in key_files(p)? {
                certs.extend(Self::load(&f)?.certs);
            }
        }
        let source = paths
            .first()
            .cloned()
            .ok_or_else(|| PullError::Usage(anyhow!("no keyring files")))?;
        if certs.is_empty() {
            return Err(PullError::Usage(anyhow!(
                "gpgkeypath {} holds no keys",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(";")
            )));
        }
        Ok(Self { certs, source })
    }
}

/// The key files of one `gpgkeypath` entry, as stock ostree reads it
/// (`_ostree_gpg_verifier_add_keyfile_path`): a directory stands for the
/// regular files one level below it (symlinks and subdirectories are
/// skipped), in name order; anything else is a key file itself.
fn key_files(path: &Path) -> PullResult<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        // Not a directory, or missing: the read of the file says which.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotADirectory | std::io::ErrorKind::NotFound
            ) =>
        {
            return Ok(vec![path.to_owned()])
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("reading trusted keys directory {}", path.display()))
                .usage()
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry
            .with_context(|| format!("reading trusted keys directory {}", path.display()))
            .usage()?;
        let regular = entry
            .file_type()
            .with_context(|| format!("reading {}", entry.path().display()))
            .usage()?
            .is_file();
        if regular {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
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

/// Stock ostree's rule for collections (`_ostree_repo_verify_bindings`):
/// from a remote configured with a `collection-id`, a commit must carry
/// a ref binding and a collection binding naming that collection; from
/// any remote, a commit bound to a collection is refused if the remote is
/// known (configured, or a verified summary) to be another one.
pub fn check_collection(
    commit: &Commit,
    configured: Option<&str>,
    declared: Option<&str>,
) -> PullResult<()> {
    let bound = commit.collection_binding();
    let has_ref_binding = commit.ref_binding().is_some();
    match collection_problem(bound.as_deref(), has_ref_binding, configured, declared) {
        Some(why) => Err(PullError::Verification(anyhow!(
            "commit {}: {why}",
            commit.checksum
        ))),
        None => Ok(()),
    }
}

/// Why a commit (its collection binding, whether it has a ref binding)
/// may not come from a remote with `configured` collection-id whose
/// verified summary `declared` one, if it may not (pure).
pub fn collection_problem(
    bound: Option<&str>,
    has_ref_binding: bool,
    configured: Option<&str>,
    declared: Option<&str>,
) -> Option<String> {
    if let Some(r) = configured {
        if !has_ref_binding {
            return Some(format!(
                "it has no ref binding (ostree.ref-binding), which the remote's \
                 collection-id {r:?} requires"
            ));
        }
        if bound.is_none() {
            return Some(format!(
                "it has no collection binding (ostree.collection-binding), which the \
                 remote's collection-id {r:?} requires"
            ));
        }
    }
    match (bound, configured.or(declared)) {
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
        const OS: Option<&str> = Some("org.example.Os");
        const OTHER: Option<&str> = Some("org.example.Other");
        // (binding, has a ref binding, configured, declared by a verified
        // summary, what the refusal says; "" accepted)
        let cases = [
            (None, false, None, None, ""),
            (None, true, None, None, ""),
            (OS, true, None, None, ""),
            (None, true, None, OS, ""),
            (OS, true, OS, None, ""),
            (OS, true, None, OS, ""),
            (OS, true, OTHER, None, "but the remote's collection is"),
            (OS, true, None, OTHER, "but the remote's collection is"),
            (OS, true, Some("org.example.os"), None, "but the remote's"),
            (Some(""), true, OS, None, "but the remote's"),
            // Stock ostree: a collection-id remote requires both bindings.
            (None, false, OS, None, "no ref binding"),
            (OS, false, OS, None, "no ref binding"),
            (None, true, OS, None, "no collection binding"),
            (None, true, OS, OTHER, "no collection binding"),
        ];
        for (bound, refb, configured, declared, says) in cases {
            let got = collection_problem(bound, refb, configured, declared);
            let what = format!("{bound:?} (ref binding {refb}) from {configured:?}/{declared:?}");
            match got {
                None => assert_eq!(says, "", "{what}: accepted"),
                Some(why) => {
                    assert!(!says.is_empty(), "{what}: refused: {why}");
                    assert!(why.contains(says), "{what}: {why}");
                    let remote = configured.or(declared).unwrap();
                    assert!(why.contains(remote), "{why} names the remote's collection");
                }
            }
        }
    }

    #[test]
    fn gpgkeypath_entries_as_stock_ostree_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for f in ["b.gpg", "a.asc", "sub/c.asc"] {
            std::fs::write(dir.join(f), "k").unwrap();
        }
        std::os::unix::fs::symlink(dir.join("a.asc"), dir.join("link.asc")).unwrap();
        let file = dir.join("a.asc");
        let missing = tmp.path().join("none.asc");
        // (entry, the files it stands for)
        let cases = [
            (dir.clone(), vec![dir.join("a.asc"), dir.join("b.gpg")]),
            (file.clone(), vec![file.clone()]),
            (missing.clone(), vec![missing.clone()]),
        ];
        for (entry, want) in cases {
            assert_eq!(key_files(&entry).unwrap(), want, "{}", entry.display());
        }
        // An empty directory: no keys is a usage error, not a silent pass.
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let e = Keyring::load_all(&[empty]).unwrap_err();
        assert!(matches!(e, PullError::Usage(_)), "{e}");
        assert!(e.to_string().contains("holds no keys"), "{e}");
    }
}
