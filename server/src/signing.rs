//! Signatures on the server side (DESIGN.md, "Trust model").
//!
//! Three roles share this module:
//! - the **signer** (`oscontent-server sign`, run where the private key
//!   lives) publishes the sources exactly as `serve` would, into a scratch
//!   state dir, and signs the exact commit objects and the exact summary
//!   bytes that publication produces, writing a [`Bundle`];
//! - the **server** (`serve --signatures DIR`) installs a bundle's
//!   signatures into each generation it publishes, next to what the source
//!   repo already carries, and serves a bundle's `summary.sig` only when it
//!   signs the very summary the server generated (by SHA-256). It never
//!   needs a private key;
//! - the **gate** (`serve --trusted-keys FILE`) verifies every published
//!   commit and the summary before a generation becomes visible, and
//!   refuses it otherwise, naming the ref, the commit and the reason.
//!
//! `serve --sign-key FILE` is the trusted control-plane mode: the server
//! signs at publish time, into its state dir only.
//!
//! Agreement on bytes rests on one fact: the summary is a pure function of
//! the published refs, their commits, the deltas and the collection ID
//! (`served.rs`), and publication is deterministic (`publish.rs`). Both
//! sides run that same code on the same sources.

use crate::fsutil;
use crate::served::{summary_sig_path, Generation, MAX_METADATA_FILE};
use anyhow::{bail, Context, Result};
use oscontent_format::openpgp::{self, Cert, VerifiedSig};
use oscontent_format::{
    self as format, build_gpgsigs, merge_gpgsigs, parse_gpgsigs, Checksum, ObjectKind, ObjectName,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The bundle's index: which commits, which summary, which key.
pub const BUNDLE_MANIFEST: &str = "manifest.json";
/// The bundle's signature over the summary (an `a{sv}` with `ostree.gpgsigs`).
pub const BUNDLE_SUMMARY_SIG: &str = "summary.sig";
/// Suffix of a bundle's per-commit detached metadata: `<checksum>.commitmeta`.
pub const COMMITMETA_SUFFIX: &str = ".commitmeta";
/// Bundle format written and understood.
pub const BUNDLE_FORMAT: u32 = 1;
/// What `format` names, so a stray JSON file is not taken for a bundle.
pub const BUNDLE_KIND: &str = "oscontent-signature-bundle";
/// Kubernetes' atomic-writer layout (ConfigMap, Secret, projected volumes):
/// `DIR/..data` links to a sibling `..<timestamp>` directory holding the
/// files, and each `DIR/<key>` links to `..data/<key>`. The swap of
/// `..data` is the atomic update.
pub const KUBE_DATA_LINK: &str = "..data";
/// A manifest lists a few commits; anything larger is not ours.
const MAX_MANIFEST: u64 = 1 << 20;
/// Commits beyond this count in one bundle are refused.
pub const MAX_BUNDLE_COMMITS: usize = 4096;
/// Files in a bundle directory beyond this count are refused unread.
const MAX_BUNDLE_ENTRIES: usize = 2 * MAX_BUNDLE_COMMITS + 16;
/// Bundle bytes hashed to notice a change, at most (a ConfigMap holds 1 MiB).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;
/// Armored secret keys are a few KiB; an environment variable or file far
/// larger than this is not one.
const MAX_KEY_SIZE: usize = 1 << 20;
/// Refusal reasons listed in one error before "and N more".
const MAX_REASONS_LISTED: usize = 20;

// ---------------------------------------------------------------------------
// Errors callers branch on
// ---------------------------------------------------------------------------

/// Why a generation was not published for signature reasons. These wait
/// for new signatures (the bundle directory changing) rather than for a
/// retry of the same inputs.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// `--trusted-keys` is set and something published does not verify.
    #[error("refusing to publish unverified content ({} problem{}):\n  {}", reasons.len(), if reasons.len() == 1 { "" } else { "s" }, list_reasons(reasons))]
    Unverified { reasons: Vec<String> },
    /// The `--signatures` directory holds something that is not a bundle.
    #[error("signature bundle {}: {reason}", dir.display())]
    BadBundle { dir: PathBuf, reason: String },
}

fn list_reasons(reasons: &[String]) -> String {
    let mut shown: Vec<&str> = reasons
        .iter()
        .take(MAX_REASONS_LISTED)
        .map(String::as_str)
        .collect();
    let more;
    if reasons.len() > MAX_REASONS_LISTED {
        more = format!("... and {} more", reasons.len() - MAX_REASONS_LISTED);
        shown.push(&more);
    }
    shown.join("\n  ")
}

/// Whether `e` is a signature refusal (wait for new signatures) rather than
/// a broken source.
pub fn is_signature_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<SignatureError>())
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

/// Reads a secret key (armored TSK) that can sign now.
pub fn load_secret_key_file(path: &Path) -> Result<Cert> {
    let bytes = read_bounded(path, MAX_KEY_SIZE)
        .with_context(|| format!("reading secret key {}", path.display()))?;
    openpgp::load_tsk(&bytes).with_context(|| format!("secret key {}", path.display()))
}

/// Reads a secret key (armored TSK) from an environment variable, so it can
/// come from a Kubernetes Secret without touching a disk.
pub fn load_secret_key_env(var: &str) -> Result<Cert> {
    let v =
        std::env::var_os(var).with_context(|| format!("environment variable {var} is not set"))?;
    let bytes = v.as_encoded_bytes();
    anyhow::ensure!(!bytes.is_empty(), "environment variable {var} is empty");
    anyhow::ensure!(
        bytes.len() <= MAX_KEY_SIZE,
        "environment variable {var} is {} bytes, over the {MAX_KEY_SIZE} byte limit for a key",
        bytes.len()
    );
    openpgp::load_tsk(bytes).with_context(|| format!("secret key in ${var}"))
}

/// Reads a keyring of trusted public certificates (armored or binary).
pub fn load_trusted_keys(path: &Path) -> Result<Vec<Cert>> {
    let bytes = read_bounded(path, openpgp::MAX_KEYRING_SIZE)
        .with_context(|| format!("reading trusted keys {}", path.display()))?;
    openpgp::load_certs(&bytes).with_context(|| format!("trusted keys {}", path.display()))
}

fn read_bounded(path: &Path, max: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut buf)?;
    anyhow::ensure!(buf.len() <= max, "over the {max} byte limit");
    Ok(buf)
}

/// Options of `keygen`.
#[derive(Debug, Clone)]
pub struct KeygenRequest {
    pub user_id: String,
    pub algo: openpgp::KeyAlgo,
    pub validity: Option<Duration>,
    pub out_secret: PathBuf,
    pub out_public: PathBuf,
    /// Where to put the revocation certificate, if anywhere.
    pub out_revocation: Option<PathBuf>,
}

/// Makes a v4 key GnuPG 2.2 accepts and writes it: the secret key mode
/// 0600, never over an existing file. On error, files this call created
/// are removed. Returns the fingerprint.
pub fn keygen(req: &KeygenRequest) -> Result<openpgp::Fingerprint> {
    let outputs: Vec<&PathBuf> = [Some(&req.out_secret), Some(&req.out_public)]
        .into_iter()
        .chain([req.out_revocation.as_ref()])
        .flatten()
        .collect();
    for (i, p) in outputs.iter().enumerate() {
        if p.symlink_metadata().is_ok() {
            bail!("{} already exists; refusing to overwrite it", p.display());
        }
        if outputs[..i].contains(p) {
            bail!("{} is named twice", p.display());
        }
    }
    let (cert, _) = openpgp::generate_cert(
        &req.user_id,
        &openpgp::KeyOptions {
            algo: req.algo,
            validity: req.validity,
            ..Default::default()
        },
    )?;
    let secret = openpgp::armor_tsk(&cert)?;
    let public = openpgp::armor_public(&cert)?;
    let mut created: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<()> {
        write_new(&req.out_secret, secret.as_bytes(), 0o600)?;
        created.push(req.out_secret.clone());
        write_new(&req.out_public, public.as_bytes(), 0o644)?;
        created.push(req.out_public.clone());
        if let Some(p) = &req.out_revocation {
            // Importing this (gpg --import, or appending it to a
            // --trusted-keys file) revokes the key everywhere.
            let revoked =
                openpgp::revoke_at(&cert, openpgp::ReasonForRevocation::Unspecified, None)
                    .context("making the revocation certificate")?;
            let armored = openpgp::armor_public(&revoked)?;
            write_new(p, armored.as_bytes(), 0o600)?;
            created.push(p.clone());
        }
        Ok(())
    })();
    if let Err(e) = result {
        for p in created {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    Ok(cert.fingerprint())
}

/// Creates `path` with `mode` and writes `bytes`, refusing to replace
/// anything. The mode applies from creation: a secret is never readable by
/// others, not even for an instant.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::anyhow!(
                    "{} already exists; refusing to overwrite it",
                    path.display()
                )
            } else {
                anyhow::Error::new(e).context(format!("creating {}", path.display()))
            }
        })?;
    let written = f
        .write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", path.display()));
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Parses a key lifetime: a number with a unit, `s`, `min`, `h`, `d`, `w`
/// or `y` (365 days), possibly several (`1y30d`), or `never`.
pub fn parse_validity(s: &str) -> Result<Option<Duration>> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    const UNITS: &[(&str, u64)] = &[
        ("min", 60),
        ("s", 1),
        ("h", 3600),
        ("d", 86_400),
        ("w", 7 * 86_400),
        ("y", 365 * 86_400),
    ];
    let bad =
        || anyhow::anyhow!("invalid duration {s:?}: want e.g. 2y, 365d, 12w, 36h, 90min or never");
    let mut rest = s;
    let mut total: u64 = 0;
    anyhow::ensure!(!rest.is_empty(), bad());
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        anyhow::ensure!(digits > 0, bad());
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, mult) = UNITS
            .iter()
            .find(|(u, _)| rest.starts_with(u))
            .ok_or_else(bad)?;
        rest = &rest[unit.len()..];
        total = n
            .checked_mul(*mult)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    anyhow::ensure!(total > 0, "duration {s:?} is zero; use never for no expiry");
    Ok(Some(Duration::from_secs(total)))
}

// ---------------------------------------------------------------------------
// Bundles
// ---------------------------------------------------------------------------

/// `manifest.json` of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    /// Always [`BUNDLE_KIND`].
    pub kind: String,
    /// [`BUNDLE_FORMAT`].
    pub format: u32,
    /// Fingerprint of the signing certificate (primary key), hex.
    pub signer: String,
    /// SHA-256 (hex) of the exact summary the server will publish; its
    /// `summary.sig` is served only next to that summary.
    pub summary_sha256: String,
    /// Every signed commit (hex); each has `<commit>.commitmeta`.
    pub commits: Vec<String>,
    /// The refs publication derived, name to commit, for people reading it.
    pub refs: BTreeMap<String, String>,
}

/// A signature bundle in memory.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub manifest: BundleManifest,
    /// Each commit's full detached metadata (source's merged with ours).
    pub commitmeta: BTreeMap<Checksum, Vec<u8>>,
    /// An `a{sv}` with `ostree.gpgsigs` over the summary.
    pub summary_sig: Vec<u8>,
}

impl Bundle {
    fn summary_sha256(&self) -> &str {
        &self.manifest.summary_sha256
    }
}

/// Signs what `generation` publishes: every commit its refs point at, and
/// its summary. Existing detached metadata is kept and our signature added.
pub fn sign_generation(generation: &Generation, tsk: &Cert) -> Result<Bundle> {
    let refs = published_refs(generation)?;
    let mut commitmeta = BTreeMap::new();
    for commit in refs.values() {
        if commitmeta.contains_key(commit) {
            continue;
        }
        let bytes = generation.commit_bytes(commit)?;
        let sig = openpgp::sign_detached(tsk, &bytes)
            .with_context(|| format!("signing commit {commit}"))?;
        let existing = generation.source_commitmeta(commit)?;
        let merged = merge_gpgsigs(existing.as_deref(), &[sig])
            .with_context(|| format!("merging into commit {commit}'s detached metadata"))?;
        commitmeta.insert(*commit, merged);
    }
    anyhow::ensure!(
        commitmeta.len() <= MAX_BUNDLE_COMMITS,
        "{} commits to sign, over the {MAX_BUNDLE_COMMITS} limit of one bundle",
        commitmeta.len()
    );
    let summary = generation.served_summary()?;
    let summary_sig =
        build_gpgsigs(&[openpgp::sign_detached(tsk, &summary).context("signing the summary")?])?;
    Ok(Bundle {
        manifest: BundleManifest {
            kind: BUNDLE_KIND.into(),
            format: BUNDLE_FORMAT,
            signer: tsk.fingerprint().to_hex(),
            summary_sha256: Checksum::digest(&summary).to_hex(),
            commits: commitmeta.keys().map(Checksum::to_hex).collect(),
            refs: refs.iter().map(|(n, c)| (n.clone(), c.to_hex())).collect(),
        },
        commitmeta,
        summary_sig,
    })
}

/// Every ref the generation serves (heads and mirrors), name to commit.
fn published_refs(generation: &Generation) -> Result<BTreeMap<String, Checksum>> {
    Ok(generation
        .refs()?
        .into_iter()
        .map(|r| {
            let name = match r.namespace {
                format::RefNamespace::Heads => r.name,
                format::RefNamespace::Mirrors => format!("(mirror) {}", r.name),
            };
            (name, r.commit)
        })
        .collect())
}

/// Writes `bundle` as the directory `out`: into a sibling temporary
/// directory first, renamed into place only when complete. `out` must not
/// exist, or be an empty directory.
pub fn write_bundle(bundle: &Bundle, out: &Path) -> Result<()> {
    if let Ok(mut rd) = std::fs::read_dir(out) {
        anyhow::ensure!(
            rd.next().is_none(),
            "{} exists and is not empty; refusing to overwrite it",
            out.display()
        );
    } else if out.symlink_metadata().is_ok() {
        bail!("{} exists and is not a directory", out.display());
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".oscontent-bundle-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
    let mut manifest = serde_json::to_vec_pretty(&bundle.manifest).context("manifest")?;
    manifest.push(b'\n');
    write_new(&tmp.path().join(BUNDLE_MANIFEST), &manifest, 0o644)?;
    write_new(
        &tmp.path().join(BUNDLE_SUMMARY_SIG),
        &bundle.summary_sig,
        0o644,
    )?;
    for (c, meta) in &bundle.commitmeta {
        write_new(
            &tmp.path().join(format!("{c}{COMMITMETA_SUFFIX}")),
            meta,
            0o644,
        )?;
    }
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .context("setting bundle permissions")?;
    if out.exists() {
        std::fs::remove_dir(out).with_context(|| format!("replacing empty {}", out.display()))?;
    }
    let tmp = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp, out) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e).with_context(|| format!("renaming the bundle into {}", out.display()));
    }
    Ok(())
}

/// Where a bundle's files are: `dir` itself, or what its Kubernetes
/// `..data` link points at. Only that one link is followed, and only to a
/// sibling `..<name>` directory; symlinks anywhere else are not.
pub fn bundle_root(dir: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("signature directory {} is not accessible", dir.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "signature directory {} is not a directory",
        dir.display()
    );
    let link = dir.join(KUBE_DATA_LINK);
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            let target =
                std::fs::read_link(&link).with_context(|| format!("reading {}", link.display()))?;
            let mut comps = target.components();
            match (comps.next(), comps.next()) {
                (Some(Component::Normal(name)), None)
                    if name.as_encoded_bytes().starts_with(b"..") =>
                {
                    Ok(dir.join(name))
                }
                _ => bail!(
                    "{} points at {}; want a sibling `..<timestamp>` directory (the Kubernetes volume layout)",
                    link.display(),
                    target.display()
                ),
            }
        }
        Ok(_) => bail!(
            "{} is not a symlink; want the Kubernetes volume layout or plain files",
            link.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(dir.to_owned()),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", link.display())),
    }
}

/// What a bundle directory holds right now, for noticing a change: the
/// resolved root and a hash of every file's name and bytes. `None` when the
/// directory cannot be read (that is reported when loading).
pub fn bundle_identity(dir: &Path) -> Option<[u8; 32]> {
    let root = bundle_root(dir).ok()?;
    let entries = fsutil::list_dir(&root, "", MAX_BUNDLE_ENTRIES).ok()??;
    let mut h = Sha256::new();
    h.update(root.as_os_str().as_encoded_bytes());
    let mut budget = MAX_BUNDLE_BYTES;
    for e in entries.iter().filter(|e| e.is_file) {
        let (bytes, _) = fsutil::read_file(&root, &e.name, budget).ok()??;
        budget = budget.saturating_sub(bytes.len() as u64);
        h.update((e.name.len() as u64).to_le_bytes());
        h.update(e.name.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Some(h.finalize().into())
}

/// Loads the bundle in `dir`. `Ok(None)` if the directory has no
/// manifest yet (an empty or optional ConfigMap); anything malformed is a
/// [`SignatureError::BadBundle`] naming the file and what is wrong with it.
pub fn load_bundle(dir: &Path) -> Result<Option<Bundle>> {
    let bad = |reason: String| SignatureError::BadBundle {
        dir: dir.to_owned(),
        reason,
    };
    let root = bundle_root(dir).map_err(|e| bad(format!("{e:#}")))?;
    let read = |name: &str, max: u64| -> Result<Option<Vec<u8>>, SignatureError> {
        match fsutil::read_file(&root, name, max) {
            Ok(Some((b, _))) => Ok(Some(b)),
            Ok(None) => {
                // Say why a file that is there is not read.
                if root.join(name).symlink_metadata().is_ok() {
                    return Err(bad(format!(
                        "{name} is not a regular file (symlinks are followed only through the Kubernetes ..data layout)"
                    )));
                }
                Ok(None)
            }
            Err(e) => Err(bad(format!("reading {name}: {e}"))),
        }
    };
    let Some(manifest) = read(BUNDLE_MANIFEST, MAX_MANIFEST)? else {
        return Ok(None);
    };
    let manifest: BundleManifest = serde_json::from_slice(&manifest)
        .map_err(|e| bad(format!("{BUNDLE_MANIFEST} is not a bundle manifest: {e}")))?;
    if manifest.kind != BUNDLE_KIND {
        return Err(bad(format!(
            "{BUNDLE_MANIFEST} has kind {:?}, want {BUNDLE_KIND:?}",
            manifest.kind
        ))
        .into());
    }
    if manifest.format != BUNDLE_FORMAT {
        return Err(bad(format!(
            "{BUNDLE_MANIFEST} has format {}, this server understands {BUNDLE_FORMAT}",
            manifest.format
        ))
        .into());
    }
    Checksum::from_hex(&manifest.summary_sha256)
        .map_err(|e| bad(format!("{BUNDLE_MANIFEST}: summary_sha256: {e}")))?;
    if manifest.commits.len() > MAX_BUNDLE_COMMITS {
        return Err(bad(format!(
            "{} commits, over the {MAX_BUNDLE_COMMITS} limit",
            manifest.commits.len()
        ))
        .into());
    }
    let mut commitmeta = BTreeMap::new();
    for hex in &manifest.commits {
        let c =
            Checksum::from_hex(hex).map_err(|e| bad(format!("{BUNDLE_MANIFEST}: commits: {e}")))?;
        let name = format!("{c}{COMMITMETA_SUFFIX}");
        let meta = read(&name, MAX_METADATA_FILE)?.ok_or_else(|| {
            bad(format!(
                "{BUNDLE_MANIFEST} lists commit {c} but {name} is missing"
            ))
        })?;
        let sigs = parse_gpgsigs(&meta).map_err(|e| bad(format!("{name}: {e}")))?;
        if sigs.is_empty() {
            return Err(bad(format!("{name} holds no ostree.gpgsigs")).into());
        }
        commitmeta.insert(c, meta);
    }
    let summary_sig = read(BUNDLE_SUMMARY_SIG, MAX_METADATA_FILE)?
        .ok_or_else(|| bad(format!("{BUNDLE_SUMMARY_SIG} is missing")))?;
    if parse_gpgsigs(&summary_sig)
        .map_err(|e| bad(format!("{BUNDLE_SUMMARY_SIG}: {e}")))?
        .is_empty()
    {
        return Err(bad(format!("{BUNDLE_SUMMARY_SIG} holds no ostree.gpgsigs")).into());
    }
    Ok(Some(Bundle {
        manifest,
        commitmeta,
        summary_sig,
    }))
}

// ---------------------------------------------------------------------------
// Publication: install signatures, sign, verify
// ---------------------------------------------------------------------------

/// How a server handles signatures. The default does nothing: detached
/// metadata in the source is served as it is.
#[derive(Debug, Clone, Default)]
pub struct SignatureOptions {
    /// `--signatures DIR`: a read-only bundle directory.
    pub bundle_dir: Option<PathBuf>,
    /// `--trusted-keys FILE`: refuse to publish what these do not sign.
    pub trusted: Option<Arc<Vec<Cert>>>,
    /// `--sign-key`: sign at publish time (trusted control-plane mode).
    pub sign_key: Option<Arc<Cert>>,
}

impl SignatureOptions {
    /// Whether publication has anything to do with signatures.
    pub fn is_active(&self) -> bool {
        self.bundle_dir.is_some() || self.trusted.is_some() || self.sign_key.is_some()
    }
}

/// What publication did with signatures, for logs.
#[derive(Debug, Clone, Default)]
pub struct SignatureReport {
    /// Bundle identity at load time ([`bundle_identity`]).
    pub bundle_identity: Option<[u8; 32]>,
    /// SHA-256 of the summary the generation serves.
    pub summary_digest: Option<Checksum>,
    /// Whether a signature over that summary is installed.
    pub summary_signed: bool,
    /// With `--trusted-keys`: each ref's verified signature.
    pub verified_refs: Vec<(String, Checksum, VerifiedSig)>,
    /// With `--trusted-keys`: the summary's verified signature.
    pub verified_summary: Option<VerifiedSig>,
}

/// Installs signatures into `probe`'s overlay (a generation being built,
/// not yet visible): bundle and `--sign-key` signatures merged with what the
/// source carries, then, with trusted keys, verifies every ref's commit and
/// the summary. Writes only into the overlay.
pub fn apply(
    probe: &Generation,
    opts: &SignatureOptions,
    now: SystemTime,
) -> Result<SignatureReport> {
    let mut report = SignatureReport::default();
    if !opts.is_active() {
        return Ok(report);
    }
    let bundle = match &opts.bundle_dir {
        Some(dir) => {
            report.bundle_identity = bundle_identity(dir);
            let b = load_bundle(dir)?;
            if b.is_none() {
                tracing::warn!(dir = %dir.display(), "no {BUNDLE_MANIFEST} in the signature directory (yet); serving without its signatures");
            }
            b
        }
        None => None,
    };
    let refs = published_refs(probe)?;

    // Commits: bundle metadata (already a superset of the source's when it
    // was signed) merged with whatever the source carries now, plus ours.
    let mut installed = std::collections::BTreeSet::new();
    for commit in refs.values() {
        if !installed.insert(*commit) {
            continue;
        }
        let from_bundle = bundle.as_ref().and_then(|b| b.commitmeta.get(commit));
        let mut add = Vec::new();
        if let Some(tsk) = &opts.sign_key {
            let bytes = probe.commit_bytes(commit)?;
            add.push(
                openpgp::sign_detached(tsk, &bytes)
                    .with_context(|| format!("signing commit {commit}"))?,
            );
        }
        if from_bundle.is_none() && add.is_empty() {
            continue;
        }
        let source = probe.source_commitmeta(commit)?;
        let mut merged = match from_bundle {
            Some(b) => {
                let source_sigs = match &source {
                    Some(s) => parse_gpgsigs(s).unwrap_or_else(|e| {
                        tracing::warn!(%commit, "ignoring the source's unreadable detached metadata: {e}");
                        Vec::new()
                    }),
                    None => Vec::new(),
                };
                merge_gpgsigs(Some(b), &source_sigs)?
            }
            None => source.unwrap_or_default(),
        };
        merged = merge_gpgsigs(Some(&merged), &add)
            .with_context(|| format!("merging signatures for commit {commit}"))?;
        let rel = ObjectName::new(*commit, ObjectKind::CommitMeta).path();
        write_overlay(&probe.overlay, &rel, &merged)?;
    }
    if let Some(b) = &bundle {
        for c in b.commitmeta.keys().filter(|c| !installed.contains(c)) {
            tracing::debug!(commit = %c, "the bundle signs a commit this generation does not publish");
        }
    }

    // The summary: a bundle's signature only if it signs these exact bytes.
    let summary = probe.served_summary()?;
    let digest = Checksum::digest(&summary);
    report.summary_digest = Some(digest);
    let mut sigs = Vec::new();
    if let Some(b) = &bundle {
        if b.summary_sha256() == digest.to_hex() {
            sigs.extend(parse_gpgsigs(&b.summary_sig)?);
        } else {
            tracing::warn!(
                bundle = %opts.bundle_dir.as_deref().unwrap_or(Path::new("")).display(),
                bundle_summary = b.summary_sha256(),
                served_summary = %digest,
                "not serving the bundle's summary.sig: it signs a different summary than the one this server publishes (was the bundle made with `sign` for exactly these sources, --commit and --ref?)"
            );
        }
    }
    if let Some(tsk) = &opts.sign_key {
        sigs.push(openpgp::sign_detached(tsk, &summary).context("signing the summary")?);
    }
    if !sigs.is_empty() {
        // Kept alongside: the source's own summary.sig, which signs the same
        // summary when the source's summary is the one served.
        let existing = source_summary_sig(probe)?.filter(|b| match parse_gpgsigs(b) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("ignoring the source's unreadable summary.sig: {e}");
                false
            }
        });
        let merged = merge_gpgsigs(existing.as_deref(), &sigs)?;
        write_overlay(&probe.overlay, &summary_sig_path(&digest), &merged)?;
    }

    if let Some(trusted) = &opts.trusted {
        verify_generation(probe, &refs, &summary, trusted, now, &mut report)?;
    }
    report.summary_signed = served_summary_sig(probe, &digest)?.is_some();
    Ok(report)
}

/// When to publish again for signature reasons, between publications: the
/// bundle directory holds something new, or the summary a generation serves
/// is no longer the one its publication signed and verified (a `--repo`
/// that other tools changed). A bundle that was refused is not retried
/// until it changes again. The checks read files: call from blocking code.
#[derive(Debug, Default, Clone)]
pub struct SignatureWatch {
    /// Identity of the last bundle a publication refused.
    refused: Option<Option<[u8; 32]>>,
}

impl SignatureWatch {
    /// Whether to publish again. `current` is the generation served, if any;
    /// with none, a refused publication waits and is retried at each call.
    pub fn should_republish(
        &self,
        bundle_dir: Option<&Path>,
        current: Option<&Generation>,
    ) -> bool {
        let Some(g) = current else {
            return true;
        };
        let moved = g
            .served_summary()
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

/// The source's `summary.sig`, when the source's own summary is served.
fn source_summary_sig(probe: &Generation) -> Result<Option<Vec<u8>>> {
    let [source] = probe.sources.as_slice() else {
        return Ok(None);
    };
    if fsutil::open_file(source, "summary")?.is_none() {
        return Ok(None);
    }
    Ok(fsutil::read_file(source, "summary.sig", MAX_METADATA_FILE)
        .context("reading the source summary.sig")?
        .map(|(b, _)| b))
}

/// The summary.sig the generation will serve, by the same rule as
/// `Generation::resolve`.
fn served_summary_sig(probe: &Generation, digest: &Checksum) -> Result<Option<Vec<u8>>> {
    if let Some((b, _)) =
        fsutil::read_file(&probe.overlay, &summary_sig_path(digest), MAX_METADATA_FILE)?
    {
        return Ok(Some(b));
    }
    source_summary_sig(probe)
}

fn write_overlay(overlay: &Path, rel: &str, bytes: &[u8]) -> Result<()> {
    let path = overlay.join(rel);
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Verifies every ref's commit and the summary as they will be served.
fn verify_generation(
    probe: &Generation,
    refs: &BTreeMap<String, Checksum>,
    summary: &[u8],
    trusted: &[Cert],
    now: SystemTime,
    report: &mut SignatureReport,
) -> Result<()> {
    let mut reasons = Vec::new();
    let mut by_commit: BTreeMap<Checksum, Result<VerifiedSig, String>> = BTreeMap::new();
    for (name, commit) in refs {
        let outcome = by_commit
            .entry(*commit)
            .or_insert_with(|| verify_commit(probe, commit, trusted, now));
        match outcome {
            Ok(v) => report
                .verified_refs
                .push((name.clone(), *commit, v.clone())),
            Err(why) => reasons.push(format!("ref {name} (commit {commit}): {why}")),
        }
    }
    let digest = Checksum::digest(summary);
    let summary_sigs = match served_summary_sig(probe, &digest)? {
        Some(b) => parse_gpgsigs(&b).map_err(|e| format!("summary.sig is malformed: {e}")),
        None => Ok(Vec::new()),
    };
    match summary_sigs.and_then(|sigs| {
        openpgp::verify_detached(trusted, summary, &sigs, now)
            .map_err(|e| format!("{e}"))
    }) {
        Ok(v) => report.verified_summary = Some(v),
        Err(why) => reasons.push(format!(
            "summary (sha256 {digest}): {why}{}",
            if why.contains("no signatures") {
                " (no summary.sig signs this summary: give --signatures a bundle made by `oscontent-server sign` for these sources, or --sign-key)"
            } else {
                ""
            }
        )),
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(SignatureError::Unverified { reasons }.into())
    }
}

fn verify_commit(
    probe: &Generation,
    commit: &Checksum,
    trusted: &[Cert],
    now: SystemTime,
) -> Result<VerifiedSig, String> {
    let bytes = probe.commit_bytes(commit).map_err(|e| format!("{e:#}"))?;
    let sigs = match probe
        .served_commitmeta(commit)
        .map_err(|e| format!("{e:#}"))?
    {
        Some(meta) => {
            parse_gpgsigs(&meta).map_err(|e| format!("detached metadata is malformed: {e}"))?
        }
        None => Vec::new(),
    };
    openpgp::verify_detached(trusted, &bytes, &sigs, now).map_err(|e| match e {
        openpgp::VerifyError::NoSignatures => {
            "no signatures (neither the source's detached metadata nor a signature bundle signs it)"
                .to_owned()
        }
        e => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_parsing() {
        let cases: &[(&str, Option<Option<u64>>)] = &[
            ("never", Some(None)),
            ("2y", Some(Some(2 * 365 * 86_400))),
            ("1y30d", Some(Some(395 * 86_400))),
            ("36h", Some(Some(36 * 3600))),
            ("90min", Some(Some(90 * 60))),
            ("12w", Some(Some(84 * 86_400))),
            ("10s", Some(Some(10))),
            ("", None),
            ("0d", None),
            ("5", None),
            ("d", None),
            ("3 months", None),
            ("99999999999999999999y", None),
        ];
        for (s, want) in cases {
            let got = parse_validity(s).ok().map(|d| d.map(|d| d.as_secs()));
            assert_eq!(got, *want, "{s:?}");
        }
    }

    #[test]
    fn bundle_root_layouts() {
        let t = tempfile::tempdir().unwrap();
        let plain = t.path().join("plain");
        std::fs::create_dir(&plain).unwrap();
        assert_eq!(bundle_root(&plain).unwrap(), plain);

        // What kubelet's atomic writer leaves for a ConfigMap volume.
        let kube = t.path().join("kube");
        std::fs::create_dir_all(kube.join("..2025_01_01_00_00_00.000000001")).unwrap();
        std::os::unix::fs::symlink("..2025_01_01_00_00_00.000000001", kube.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/manifest.json", kube.join("manifest.json")).unwrap();
        assert_eq!(
            bundle_root(&kube).unwrap(),
            kube.join("..2025_01_01_00_00_00.000000001")
        );

        let escaping = t.path().join("escaping");
        std::fs::create_dir(&escaping).unwrap();
        std::os::unix::fs::symlink("/etc", escaping.join("..data")).unwrap();
        let nested = t.path().join("nested");
        std::fs::create_dir(&nested).unwrap();
        std::os::unix::fs::symlink("..x/../..", nested.join("..data")).unwrap();
        let not_link = t.path().join("notlink");
        std::fs::create_dir_all(not_link.join("..data")).unwrap();
        for d in [&escaping, &nested, &not_link, &t.path().join("missing")] {
            assert!(bundle_root(d).is_err(), "{}", d.display());
        }
    }

    fn fake_bundle() -> Bundle {
        let c = Checksum::digest(b"a commit");
        Bundle {
            manifest: BundleManifest {
                kind: BUNDLE_KIND.into(),
                format: BUNDLE_FORMAT,
                signer: "AB".repeat(20),
                summary_sha256: Checksum::digest(b"a summary").to_hex(),
                commits: vec![c.to_hex()],
                refs: BTreeMap::from([("os/stable".to_owned(), c.to_hex())]),
            },
            commitmeta: BTreeMap::from([(c, build_gpgsigs(&[vec![1, 2, 3]]).unwrap())]),
            summary_sig: build_gpgsigs(&[vec![4, 5, 6]]).unwrap(),
        }
    }

    #[test]
    fn bundles_roundtrip_and_never_overwrite() {
        let t = tempfile::tempdir().unwrap();
        let b = fake_bundle();
        let out = t.path().join("bundle");
        write_bundle(&b, &out).unwrap();
        let loaded = load_bundle(&out).unwrap().unwrap();
        assert_eq!(loaded.manifest, b.manifest);
        assert_eq!(loaded.commitmeta, b.commitmeta);
        assert_eq!(loaded.summary_sig, b.summary_sig);
        let err = write_bundle(&b, &out).unwrap_err();
        assert!(format!("{err:#}").contains("not empty"), "{err:#}");
        // An empty directory (a fresh mount point) is fine to fill.
        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        write_bundle(&b, &empty).unwrap();
        // No temporary directories are left behind.
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".oscontent-bundle-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // A missing directory is an error; an empty one is "no bundle
        // yet" (an optional ConfigMap).
        assert!(load_bundle(&t.path().join("missing")).is_err());
        let nothing = t.path().join("nothing");
        std::fs::create_dir(&nothing).unwrap();
        assert!(load_bundle(&nothing).unwrap().is_none());
    }

    #[test]
    fn malformed_bundles_are_refused_by_name() {
        let b = fake_bundle();
        let c = b.manifest.commits[0].clone();
        type Edit = Box<dyn Fn(&Path)>;
        let manifest_with = |f: fn(&mut serde_json::Value)| -> Edit {
            Box::new(move |d: &Path| {
                let p = d.join(BUNDLE_MANIFEST);
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                f(&mut v);
                std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
            })
        };
        let c2 = c.clone();
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "not json",
                Box::new(|d: &Path| std::fs::write(d.join(BUNDLE_MANIFEST), "{").unwrap()),
                "not a bundle manifest",
            ),
            (
                "wrong kind",
                manifest_with(|v| v["kind"] = "other".into()),
                "has kind",
            ),
            (
                "future format",
                manifest_with(|v| v["format"] = 2.into()),
                "has format 2",
            ),
            (
                "unknown field",
                manifest_with(|v| v["extra"] = 1.into()),
                "unknown field",
            ),
            (
                "bad summary digest",
                manifest_with(|v| v["summary_sha256"] = "xyz".into()),
                "summary_sha256",
            ),
            (
                "bad commit",
                manifest_with(|v| v["commits"] = serde_json::json!(["nothex"])),
                "commits",
            ),
            (
                "missing commitmeta",
                Box::new(move |d: &Path| {
                    std::fs::remove_file(d.join(format!("{c}{COMMITMETA_SUFFIX}"))).unwrap()
                }),
                "is missing",
            ),
            (
                "commitmeta without signatures",
                Box::new(move |d: &Path| {
                    std::fs::write(
                        d.join(format!("{c2}{COMMITMETA_SUFFIX}")),
                        merge_gpgsigs(None, &[]).unwrap(),
                    )
                    .unwrap()
                }),
                "holds no ostree.gpgsigs",
            ),
            (
                "missing summary.sig",
                Box::new(|d: &Path| std::fs::remove_file(d.join(BUNDLE_SUMMARY_SIG)).unwrap()),
                "summary.sig is missing",
            ),
            (
                "symlinked manifest outside the kube layout",
                Box::new(|d: &Path| {
                    let real = d.with_extension("real");
                    std::fs::rename(d.join(BUNDLE_MANIFEST), &real).unwrap();
                    std::os::unix::fs::symlink(&real, d.join(BUNDLE_MANIFEST)).unwrap();
                }),
                "not a regular file",
            ),
        ];
        let t = tempfile::tempdir().unwrap();
        for (i, (name, edit, phrase)) in cases.into_iter().enumerate() {
            let d = t.path().join(format!("b{i}"));
            write_bundle(&b, &d).unwrap();
            edit(&d);
            let err = load_bundle(&d).expect_err(name);
            assert!(
                err.chain().any(|e| e.is::<SignatureError>()),
                "{name}: not a SignatureError: {err:#}"
            );
            let msg = format!("{err:#}");
            assert!(
                msg.contains(phrase) && msg.contains(&d.display().to_string()),
                "{name}: {msg}"
            );
        }
    }

    #[test]
    fn keygen_refuses_to_overwrite_or_alias() {
        let t = tempfile::tempdir().unwrap();
        let existing = t.path().join("existing");
        std::fs::write(&existing, "keep").unwrap();
        let req = |secret: &Path, public: &Path| KeygenRequest {
            user_id: "t <t@example.com>".into(),
            algo: openpgp::KeyAlgo::Ed25519,
            validity: None,
            out_secret: secret.to_owned(),
            out_public: public.to_owned(),
            out_revocation: None,
        };
        let fresh = t.path().join("fresh");
        for (secret, public, phrase) in [
            (&existing, &fresh, "refusing to overwrite"),
            (&fresh, &existing, "refusing to overwrite"),
            (&fresh, &fresh, "named twice"),
        ] {
            let err = keygen(&req(secret, public)).unwrap_err();
            assert!(format!("{err:#}").contains(phrase), "{err:#}");
        }
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep");
        assert!(!fresh.exists(), "nothing half-written");
    }

    #[test]
    fn refusal_lists_are_bounded() {
        let reasons: Vec<String> = (0..50).map(|i| format!("ref r{i}: bad")).collect();
        let msg = SignatureError::Unverified { reasons }.to_string();
        assert!(msg.contains("50 problems"), "{msg}");
        assert!(msg.contains("ref r19: bad") && !msg.contains("ref r20: bad"));
        assert!(msg.contains("and 30 more"), "{msg}");
    }
}
