//! `oscontent-bundle.json`: the list of a bundle's files and releases,
//! and its "complete" marker (a bundle arrives on untrusted media). The
//! server reads the file (`mirror::bundle`); this parses its bytes.

use anyhow::{Context, Result};
use oscontent_format::{Checksum, RepoPath};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The manifest (and "complete" marker) of a bundle.
pub const MANIFEST: &str = "oscontent-bundle.json";
/// A mirror's work directory inside the destination.
pub const WORK_DIR: &str = ".oscontent-mirror";
/// What `kind` says, so that a stray JSON file is not taken for a manifest.
pub const KIND: &str = "oscontent-bundle";
/// Manifest format written and understood.
pub const FORMAT: u32 = 1;
/// Largest manifest read (about 150 bytes per file: a million files).
pub const MAX_MANIFEST_SIZE: u64 = 256 << 20;

/// One file as a manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// SHA-256 of the file's bytes, hex.
    pub sha256: String,
    pub size: u64,
}

/// A release a bundle (or a site server's store) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseEntry {
    pub commit: String,
    /// The refs that name it in the current summary (empty: kept for
    /// pulls by checksum until pruned).
    pub refs: Vec<String>,
    pub version: Option<String>,
    /// Commit timestamp, seconds since the epoch.
    pub timestamp: u64,
}

/// `oscontent-bundle.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    /// Always [`KIND`].
    pub kind: String,
    /// [`FORMAT`].
    pub format: u32,
    /// Where the current content was mirrored from.
    pub source: String,
    /// SHA-256 (hex) of `summary`.
    pub summary_sha256: String,
    /// Whether `summary.sig` is there.
    pub summary_signed: bool,
    /// Every release held, oldest mirrored first (what `--keep` counts).
    pub releases: Vec<ReleaseEntry>,
    /// Every file (path relative to the bundle) with its SHA-256 and size.
    pub files: BTreeMap<String, FileEntry>,
}

impl BundleManifest {
    /// Parses and checks a manifest; `what` names it in errors.
    pub fn parse(bytes: &[u8], what: &str) -> Result<Self> {
        let m: Self = serde_json::from_slice(bytes)
            .with_context(|| format!("{what}: not a bundle manifest"))?;
        anyhow::ensure!(m.kind == KIND, "{what}: kind {:?}, not {KIND:?}", m.kind);
        anyhow::ensure!(
            m.format == FORMAT,
            "{what}: format {} is not supported (this build reads format {FORMAT})",
            m.format
        );
        for p in m.files.keys() {
            anyhow::ensure!(
                RepoPath::parse(p).is_some(),
                "{what}: lists {p:?}, which is not an archive repo path"
            );
        }
        Ok(m)
    }

    /// The releases' commits, oldest first.
    pub fn commits(&self) -> Vec<Checksum> {
        self.releases
            .iter()
            .filter_map(|r| Checksum::from_hex(&r.commit).ok())
            .collect()
    }
}
