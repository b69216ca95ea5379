//! Offline mirrors and chained servers: carry a release across an air gap
//! (or down a chain of servers) and serve it there, verified end to end
//! against the original signer.
//!
//! `oscontent-server mirror SRC DEST`:
//! - SRC is an image (`docker://`, `oci:`, `oci-archive:`, as `--image`)
//!   or an upstream oscontent server (`http(s)://`).
//! - DEST `oci:DIR[:TAG]`: a verified OCI layout copy, digests preserved
//!   ([`oci`]; images only).
//! - DEST `bundle:DIR`: a self-contained served remote ([`bundle`]): what
//!   the source publishes (summary and signatures byte for byte), copied
//!   through the verified walk ([`sync`]) into an archive layout with a
//!   manifest of checksums, incrementally and resumably.
//!
//! `serve --upstream URL` and `serve --bundle DIR` ([`upstream`]) keep a
//! site server's own store in step with such a source and republish it.
//!
//! Module map: [`remote`] (where bytes come from: HTTP, a bundle, a
//! generation), [`store`] (where they go: verified, atomic), [`sync`] (the
//! walk), [`bundle`] (manifest, marker, pruning), [`image`] (an image
//! published as `serve --image` would, then walked), [`oci`], [`upstream`].

pub mod bundle;
pub mod image;
pub mod oci;
pub mod remote;
pub mod store;
pub mod sync;
pub mod upstream;

use crate::publish::Release;
use crate::redact::RedactedUrl;
use crate::served::Generation;
use crate::source::{FetchOptions, ImageRef};
use crate::state::StateDir;
use anyhow::{bail, Context, Result};
use bundle::{Destination, Pruned, ReleaseEntry};
use oscontent_format::openpgp::Cert;
use remote::{HttpRemote, RateLimit};
use serde::Serialize;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use sync::SyncOptions;

/// What to mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorSource {
    Image(ImageRef),
    /// An oscontent server (or any archive remote, or a bundle on a web
    /// server).
    Upstream(RedactedUrl),
}

impl FromStr for MirrorSource {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(MirrorSource::Upstream(RedactedUrl::new(s)));
        }
        s.parse::<ImageRef>()
            .map(MirrorSource::Image)
            .map_err(|e| anyhow::anyhow!("{e} (or an http(s):// URL of an oscontent server)"))
    }
}

impl std::fmt::Display for MirrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MirrorSource::Image(i) => write!(f, "{i}"),
            MirrorSource::Upstream(u) => write!(f, "{u}"),
        }
    }
}

/// Where to mirror to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorDest {
    /// `oci:DIR[:TAG]`.
    Oci { dir: PathBuf, tag: Option<String> },
    /// `bundle:DIR`.
    Bundle(PathBuf),
}

impl FromStr for MirrorDest {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        if let Some(dir) = s.strip_prefix("bundle:") {
            anyhow::ensure!(!dir.is_empty(), "{s:?}: bundle:DIR needs a directory");
            return Ok(MirrorDest::Bundle(PathBuf::from(dir)));
        }
        if s.starts_with("oci:") {
            return match s.parse::<ImageRef>() {
                Ok(ImageRef::OciLayout { dir, tag }) => Ok(MirrorDest::Oci { dir, tag }),
                Ok(_) => unreachable!("an oci: reference parses as a layout"),
                Err(e) => Err(anyhow::anyhow!("{e}")),
            };
        }
        bail!("destination {s:?}: want oci:DIR[:TAG] or bundle:DIR")
    }
}

impl std::fmt::Display for MirrorDest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MirrorDest::Oci { dir, tag } => {
                write!(f, "oci:{}", dir.display())?;
                tag.iter().try_for_each(|t| write!(f, ":{t}"))
            }
            MirrorDest::Bundle(d) => write!(f, "bundle:{}", d.display()),
        }
    }
}

/// Where an image's signatures come from when it is published for a
/// bundle, as `serve --image` would: what the image's repo carries, merged
/// with a `--signatures` bundle made by `oscontent-server sign` (whose
/// `summary.sig` is installed only if it signs exactly the summary
/// published; see `signing.rs`).
#[derive(Debug, Clone, Default)]
pub struct Signatures {
    pub bundle_dir: Option<PathBuf>,
}

impl Signatures {
    fn publish_releases(&self, releases: &[Release], state: &StateDir) -> Result<Generation> {
        let opts = crate::signing::SignatureOptions {
            bundle_dir: self.bundle_dir.clone(),
            ..Default::default()
        };
        crate::publish::publish_releases_signed(releases, state, &opts)
    }
}

/// Options of one mirror run.
#[derive(Debug, Clone)]
pub struct MirrorOptions {
    pub fetch: FetchOptions,
    pub signatures: Signatures,
    pub trusted: Option<Arc<Vec<Cert>>>,
    /// Keep this many releases in a bundle (and what is published now).
    pub keep: Option<usize>,
    pub jobs: usize,
    /// Bytes per second, all transfers together.
    pub max_rate: Option<u64>,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        Self {
            fetch: FetchOptions::default(),
            signatures: Signatures::default(),
            trusted: None,
            keep: None,
            jobs: SyncOptions::default().jobs,
            max_rate: None,
        }
    }
}

/// What pruning freed.
#[derive(Debug, Clone, Serialize)]
pub struct PrunedReport {
    pub releases: Vec<String>,
    pub objects: u64,
    pub deltas: u64,
    pub bytes: u64,
}

impl From<&Pruned> for PrunedReport {
    fn from(p: &Pruned) -> Self {
        Self {
            releases: p.releases.iter().map(|r| r.commit.clone()).collect(),
            objects: p.objects,
            deltas: p.deltas,
            bytes: p.bytes,
        }
    }
}

/// What a bundle mirror did (printed as JSON on stdout).
#[derive(Debug, Clone, Serialize)]
pub struct BundleReport {
    pub source: String,
    pub dest: String,
    pub summary_sha256: String,
    pub summary_signed: bool,
    /// With `--trusted-keys`: the summary and this many commits verified.
    pub summary_verified: bool,
    pub commits_verified: usize,
    pub refs: Vec<(String, String)>,
    pub releases: Vec<ReleaseEntry>,
    /// Objects the published commits reach, and their bytes in the bundle.
    pub objects: u64,
    pub release_bytes: u64,
    /// Objects (and delta files) this run fetched, and their bytes.
    pub objects_copied: u64,
    pub bytes_copied: u64,
    /// Every file this run wrote (objects, metadata, manifest excluded).
    pub files_written: u64,
    pub bytes_written: u64,
    /// Objects an interrupted run left, verified again instead of fetched.
    pub objects_reverified: u64,
    /// For an image source: its size as stored (config and layers).
    pub image_bytes: Option<u64>,
    pub image_manifest: Option<String>,
    pub pruned: Option<PrunedReport>,
}

/// What a mirror run did.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum MirrorReport {
    Bundle(BundleReport),
    Oci(oci::OciReport),
}

/// Runs one mirror (blocking; call it off the async runtime).
pub fn mirror(src: &MirrorSource, dest: &MirrorDest, opts: &MirrorOptions) -> Result<MirrorReport> {
    let limit = opts.max_rate.map(|r| Arc::new(RateLimit::new(r)));
    match (src, dest) {
        (MirrorSource::Image(image), MirrorDest::Oci { dir, tag }) => {
            let tag = tag.clone().or_else(|| oci::default_tag(image));
            oci::copy_image(image, &opts.fetch, dir, tag, limit).map(MirrorReport::Oci)
        }
        (MirrorSource::Upstream(u), MirrorDest::Oci { .. }) => bail!(
            "{u} is an ostree remote, not an image: it can be mirrored into a bundle:DIR, not an OCI layout"
        ),
        (src, MirrorDest::Bundle(dir)) => mirror_bundle(src, dir, opts, limit).map(MirrorReport::Bundle),
    }
}

/// Reads and verifies what `remote` publishes (summary signature, commit
/// signatures) before the destination is touched, then starts the update
/// and walks. A refused source leaves a complete destination complete.
pub(crate) fn update_from(
    dest: &Destination,
    remote: &dyn remote::Remote,
    opts: &SyncOptions,
) -> Result<sync::Snapshot> {
    let meta = sync::read_metadata(remote, opts)?;
    sync::verify_commits(remote, &meta, opts)?;
    dest.start_update()?;
    sync::sync_with(remote, &dest.store, opts, meta)
}

fn mirror_bundle(
    src: &MirrorSource,
    dir: &std::path::Path,
    opts: &MirrorOptions,
    limit: Option<Arc<RateLimit>>,
) -> Result<BundleReport> {
    if let Some(0) = opts.keep {
        bail!("--keep 0 would keep nothing; keep at least 1 release");
    }
    let sync_opts = SyncOptions {
        trusted: opts.trusted.clone(),
        jobs: opts.jobs.max(1),
    };
    let dest = Destination::begin(dir, &dir.join(bundle::MANIFEST))?;
    if dest.previous.is_none() && dir.join(bundle::WORK_DIR).join("previous.json").exists() {
        tracing::warn!("the last complete manifest is unreadable; verifying what is in place");
    }
    image::clean(&dest.work)?;
    let synced = match src {
        MirrorSource::Image(image) => {
            let fetch = FetchOptions {
                pace: limit.map(|l| l as Arc<dyn crate::source::verify::Pace>),
                ..opts.fetch.clone()
            };
            image::sync_image(image, &fetch, &opts.signatures, &dest, &sync_opts)
                .map(|(snap, info)| (snap, Some(info)))
        }
        MirrorSource::Upstream(url) => HttpRemote::new(url, limit)
            .and_then(|remote| update_from(&dest, &remote, &sync_opts))
            .map(|snap| (snap, None)),
    };
    // Failing while objects were added leaves the last complete release
    // servable, rather than the bundle without a manifest.
    let (snap, staged) = synced.inspect_err(|_| match dest.abandon_update() {
        Ok(true) => tracing::warn!("the update failed; the bundle is left as it was"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!("the update failed, and the bundle could not be left as it was: {e:#}")
        }
    })?;
    dest.write_commitmeta(&snap)?;
    bundle::write_remote_files(&dest.store, &snap.meta)?;
    let mut history = dest.history(&snap);
    let pruned = match opts.keep {
        Some(k) => Some(dest.prune(&mut history, &snap, k)?),
        None => None,
    };
    let stats = &dest.store.stats;
    let (files_written, bytes_written, reverified) = (
        stats.files_written.load(Ordering::Relaxed),
        stats.bytes_written.load(Ordering::Relaxed),
        stats.objects_reverified.load(Ordering::Relaxed),
    );
    let manifest = dest
        .commit(&src.to_string(), &snap.meta, history)
        .context("completing the bundle")?;
    Ok(BundleReport {
        source: src.to_string(),
        dest: format!("bundle:{}", dir.display()),
        summary_sha256: manifest.summary_sha256.clone(),
        summary_signed: manifest.summary_signed,
        summary_verified: snap.meta.verified_summary.is_some(),
        commits_verified: snap.verified_commits.len(),
        refs: snap
            .meta
            .refs
            .iter()
            .map(|r| (r.name.clone(), r.commit.to_hex()))
            .collect(),
        releases: manifest.releases,
        objects: snap.objects,
        release_bytes: snap.object_bytes,
        objects_copied: snap.fetched,
        bytes_copied: snap.fetched_bytes,
        files_written,
        bytes_written,
        objects_reverified: reverified,
        image_bytes: staged.as_ref().map(|s| s.compressed_bytes),
        image_manifest: staged.map(|s| s.manifest_digest),
        pruned: pruned.as_ref().map(PrunedReport::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sources_and_destinations() {
        let srcs: &[(&str, bool)] = &[
            ("http://hub:8080", true),
            ("https://hub/os/", true),
            ("docker://reg:5000/os:1", true),
            ("oci:/x:tag", true),
            ("oci-archive:/x.tar", true),
            ("ftp://x", false),
            ("plain", false),
        ];
        for (s, ok) in srcs {
            assert_eq!(s.parse::<MirrorSource>().is_ok(), *ok, "{s}");
        }
        let dests: &[(&str, Option<MirrorDest>)] = &[
            ("bundle:/usb/os", Some(MirrorDest::Bundle("/usb/os".into()))),
            (
                "oci:/l:41.1",
                Some(MirrorDest::Oci {
                    dir: "/l".into(),
                    tag: Some("41.1".into()),
                }),
            ),
            (
                "oci:/l",
                Some(MirrorDest::Oci {
                    dir: "/l".into(),
                    tag: None,
                }),
            ),
            ("bundle:", None),
            ("docker://r/x", None),
            ("/just/a/dir", None),
        ];
        for (s, want) in dests {
            assert_eq!(s.parse::<MirrorDest>().ok(), *want, "{s}");
        }
    }
}
