//! Publication: install bundle and `--sign-key` signatures into a
//! generation's overlay, then, with trusted keys, verify what it serves.

use super::bundle::{
    bundle_identity, load_bundle, published_refs, SignatureBundle, BUNDLE_MANIFEST,
};
use super::error::SignatureError;
use super::pin::{decide, Named, Signer};
use crate::fsutil;
use crate::served::{summary_sig_path, Generation, SignatureReport, MAX_METADATA_FILE};
use anyhow::{Context, Result};
use oscontent_format::openpgp::{self, Cert, VerifiedSig};
use oscontent_format::{merge_gpgsigs, parse_gpgsigs, Checksum, ObjectKind, ObjectName};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

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
    /// With `--sign-key` on an `--oscontainer` or `--repo`: the commits it
    /// may sign (`--commit`), besides those already carrying a signature
    /// `trusted` verifies; a publication that would serve any other is
    /// refused ([`super::pin::decide`]). `None`: the source was pinned as
    /// a whole when the server started (images by digest).
    pub sign_pins: Option<Arc<BTreeSet<Checksum>>>,
}

impl SignatureOptions {
    /// Whether publication has anything to do with signatures.
    pub fn is_active(&self) -> bool {
        self.bundle_dir.is_some() || self.trusted.is_some() || self.sign_key.is_some()
    }
}

/// Installs signatures into the overlay of `generation` (being built, not
/// yet visible): bundle and `--sign-key` signatures merged with what the
/// source carries, then, with trusted keys, verifies every ref's commit and
/// the summary. Writes only into the overlay.
pub fn apply(
    generation: &Generation,
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
            load_configured_bundle(dir)?
        }
        None => None,
    };
    if let (Some(_), Some(pins)) = (&opts.sign_key, &opts.sign_pins) {
        let trusted = opts
            .trusted
            .as_deref()
            .map(|k| (k.as_slice(), bundle.as_ref()));
        refuse_unpinned(generation, Signer::SignKey, pins, trusted, now)?;
    }
    let refs = published_refs(generation)?;
    install_commit_signatures(generation, &refs, bundle.as_ref(), opts.sign_key.as_deref())?;
    let summary = generation.served_summary()?;
    let digest = Checksum::digest(&summary);
    report.summary_digest = Some(digest);
    install_summary_signature(generation, &summary, &digest, bundle.as_ref(), opts)?;
    if let Some(trusted) = &opts.trusted {
        verify_generation(generation, &refs, &summary, trusted, now, &mut report)?;
    }
    report.summary_signed = served_summary_sig(generation, &digest)?.is_some();
    Ok(report)
}

/// Refuses, before anything is signed, a generation that would serve a
/// commit the operator did not pin: one a ref names, or one the served
/// summary lists (a `--repo`'s own summary may list more). A commit is
/// pinned by `--commit` (`pins`), or, for `--sign-key` with `trusted`, by a
/// signature those keys verify among the ones it carries already (the
/// source's detached metadata, the bundle's). `sign` and `serve` both ask.
pub fn refuse_unpinned(
    generation: &Generation,
    signer: Signer,
    pins: &BTreeSet<Checksum>,
    trusted: Option<(&[Cert], Option<&SignatureBundle>)>,
    now: SystemTime,
) -> Result<()> {
    let summary = generation.served_summary()?;
    let listed = oscontent_format::parse_summary(&summary).context("parsing the served summary")?;
    let mut named: BTreeMap<Checksum, String> = BTreeMap::new();
    let in_summary = listed
        .refs
        .iter()
        .chain(listed.collection_map.values().flatten());
    for r in in_summary {
        named
            .entry(r.commit)
            .or_insert_with(|| format!("summary ref {}", r.name));
    }
    for r in generation.refs()? {
        named.insert(r.commit, format!("ref {}", r.name));
    }
    let mut reasons = Vec::new();
    for (commit, what) in &named {
        let trusted_signature = !pins.contains(commit)
            && trusted.is_some_and(|(keys, bundle)| {
                carries_trusted_signature(generation, commit, bundle, keys, now)
            });
        let named = Named::Commit {
            commit,
            pins,
            trusted_signature,
        };
        if let Err(e) = decide(signer, named) {
            reasons.push(format!("{what}: {e}"));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(SignatureError::Unpinned { reasons }.into())
    }
}

/// Whether the signatures `commit` carries before this server signs it
/// (the source's and the bundle's) include one `trusted` verifies.
fn carries_trusted_signature(
    generation: &Generation,
    commit: &Checksum,
    bundle: Option<&SignatureBundle>,
    trusted: &[Cert],
    now: SystemTime,
) -> bool {
    let from_bundle = bundle.and_then(|b| b.commitmeta.get(commit));
    let check = || -> Result<bool> {
        let meta = merged_commitmeta(generation, commit, from_bundle, &[])?;
        let sigs = parse_gpgsigs(&meta)?;
        let bytes = generation.commit_bytes(commit)?;
        Ok(openpgp::verify_detached(trusted, &bytes, &sigs, now).is_ok())
    };
    check().unwrap_or_else(|e| {
        tracing::debug!(%commit, "no trusted signature: {e:#}");
        false
    })
}

/// The `--signatures` bundle. A directory with no manifest yet (an empty or
/// optional ConfigMap) is not an error: the generation is served without it.
fn load_configured_bundle(dir: &Path) -> Result<Option<SignatureBundle>> {
    let b = load_bundle(dir)?;
    if b.is_none() {
        tracing::warn!(dir = %dir.display(), "no {BUNDLE_MANIFEST} in the signature directory (yet); serving without its signatures");
    }
    Ok(b)
}

/// Writes each published commit's detached metadata into the overlay: the
/// bundle's (already a superset of the source's when it was signed) merged
/// with whatever the source carries now, plus a `--sign-key` signature.
/// A commit neither signs keeps the source's, unwritten.
fn install_commit_signatures(
    generation: &Generation,
    refs: &BTreeMap<String, Checksum>,
    bundle: Option<&SignatureBundle>,
    sign_key: Option<&Cert>,
) -> Result<()> {
    let mut installed = BTreeSet::new();
    for commit in refs.values() {
        if !installed.insert(*commit) {
            continue;
        }
        let from_bundle = bundle.and_then(|b| b.commitmeta.get(commit));
        let mut add = Vec::new();
        if let Some(tsk) = sign_key {
            let bytes = generation.commit_bytes(commit)?;
            add.push(
                openpgp::sign_detached(tsk, &bytes)
                    .with_context(|| format!("signing commit {commit}"))?,
            );
        }
        if from_bundle.is_none() && add.is_empty() {
            continue;
        }
        let merged = merged_commitmeta(generation, commit, from_bundle, &add)?;
        let rel = ObjectName::new(*commit, ObjectKind::CommitMeta).path();
        write_overlay(&generation.overlay, &rel, &merged)?;
    }
    if let Some(b) = bundle {
        for c in b.commitmeta.keys().filter(|c| !installed.contains(c)) {
            tracing::debug!(commit = %c, "the bundle signs a commit this generation does not publish");
        }
    }
    Ok(())
}

/// One commit's detached metadata as it will be served: the bundle's with
/// the source's signatures merged in (or the source's alone), plus `add`.
fn merged_commitmeta(
    generation: &Generation,
    commit: &Checksum,
    from_bundle: Option<&Vec<u8>>,
    add: &[Vec<u8>],
) -> Result<Vec<u8>> {
    let source = generation.source_commitmeta(commit)?;
    let merged = match from_bundle {
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
    merge_gpgsigs(Some(&merged), add)
        .with_context(|| format!("merging signatures for commit {commit}"))
}

/// Writes the summary's signatures into the overlay, keyed by `digest`: a
/// bundle's only if it signs these exact bytes, plus a `--sign-key` one,
/// kept alongside the source's own `summary.sig` (which signs the same
/// summary when the source's summary is the one served).
fn install_summary_signature(
    generation: &Generation,
    summary: &[u8],
    digest: &Checksum,
    bundle: Option<&SignatureBundle>,
    opts: &SignatureOptions,
) -> Result<()> {
    let mut sigs = Vec::new();
    if let Some(b) = bundle {
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
        sigs.push(openpgp::sign_detached(tsk, summary).context("signing the summary")?);
    }
    if sigs.is_empty() {
        return Ok(());
    }
    let existing = source_summary_sig(generation)?.filter(|b| match parse_gpgsigs(b) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("ignoring the source's unreadable summary.sig: {e}");
            false
        }
    });
    let merged = merge_gpgsigs(existing.as_deref(), &sigs)?;
    write_overlay(&generation.overlay, &summary_sig_path(digest), &merged)
}

/// The source's `summary.sig`, when the source's own summary is served.
fn source_summary_sig(generation: &Generation) -> Result<Option<Vec<u8>>> {
    let [source] = generation.sources.as_slice() else {
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
fn served_summary_sig(generation: &Generation, digest: &Checksum) -> Result<Option<Vec<u8>>> {
    if let Some((b, _)) = fsutil::read_file(
        &generation.overlay,
        &summary_sig_path(digest),
        MAX_METADATA_FILE,
    )? {
        return Ok(Some(b));
    }
    source_summary_sig(generation)
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
    generation: &Generation,
    refs: &BTreeMap<String, Checksum>,
    summary: &[u8],
    trusted: &[Cert],
    now: SystemTime,
    report: &mut SignatureReport,
) -> Result<()> {
    let mut reasons = Vec::new();
    let mut by_commit: BTreeMap<Checksum, Result<VerifiedSig, String>> = BTreeMap::new();
    for (name, commit) in refs {
        // A layer ref names the image's commit, verified under the
        // image's own refs, or an object-set commit the server built from
        // verified objects, which the staging index in the (verified)
        // summary vouches for: no upstream key ever signed one.
        if oscontent_format::staging::layer_digest(name).is_some() {
            continue;
        }
        let outcome = by_commit
            .entry(*commit)
            .or_insert_with(|| verify_commit(generation, commit, trusted, now));
        match outcome {
            Ok(v) => report
                .verified_refs
                .push((name.clone(), *commit, v.clone())),
            Err(why) => reasons.push(format!("ref {name} (commit {commit}): {why}")),
        }
    }
    let digest = Checksum::digest(summary);
    let summary_sigs = match served_summary_sig(generation, &digest)? {
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
    generation: &Generation,
    commit: &Checksum,
    trusted: &[Cert],
    now: SystemTime,
) -> Result<VerifiedSig, String> {
    let bytes = generation
        .commit_bytes(commit)
        .map_err(|e| format!("{e:#}"))?;
    let sigs = match generation
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
