//! `oscontent-bundle.json`: the list of a bundle's files and releases,
//! and its "complete" marker (a bundle arrives on untrusted media). The
//! server reads the file (`mirror::bundle`); this parses its bytes.
//!
//! Parsed as a stream ([`BundleManifest::read_from`]): at most
//! [`MAX_MANIFEST_SIZE`] bytes are read, and every count and string is
//! checked as it is deserialised ([`mod@bounds`]), so what a manifest can
//! make the server hold is bounded by the caps below, not by how many
//! tiny values fit in the file.

mod bounds;
#[cfg(test)]
mod tests;

use anyhow::{Context, Result};
use oscontent_format::{Checksum, RepoPath};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;

/// The manifest (and "complete" marker) of a bundle.
pub const MANIFEST: &str = "oscontent-bundle.json";
/// A mirror's work directory inside the destination.
pub const WORK_DIR: &str = ".oscontent-mirror";
/// What `kind` says, so that a stray JSON file is not taken for a manifest.
pub const KIND: &str = "oscontent-bundle";
/// Manifest format written and understood.
pub const FORMAT: u32 = 1;
/// Largest manifest read or written: about 150 bytes per file, so some
/// 400,000 files (several releases of a whole OS). What such a manifest
/// holds in memory stays well inside the server's 512 MiB.
pub const MAX_MANIFEST_SIZE: u64 = 64 << 20;
/// Most files one manifest lists.
pub const MAX_FILES: usize = 1_000_000;
/// Most releases one manifest lists (a mirror's `MAX_COMMITS`).
pub const MAX_RELEASES: usize = 4096;
/// Most ref names across all releases: each names one commit of the
/// summary, which holds at most this many refs.
pub const MAX_REFS: usize = oscontent_format::summary::MAX_REFS;
/// Longest `source`, `version` or `kind`.
pub const MAX_TEXT: usize = 4096;
/// Longest checksum string (SHA-256 in hex).
pub const MAX_HASH: usize = 64;
/// Longest listed path (a ref path is `refs/heads/` and a ref name).
pub const MAX_PATH: usize = oscontent_format::MAX_REF_LEN + 64;

/// One file as a manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// SHA-256 of the file's bytes, hex.
    #[serde(deserialize_with = "bounds::hash")]
    pub sha256: String,
    pub size: u64,
}

/// A release a bundle (or a site server's store) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseEntry {
    #[serde(deserialize_with = "bounds::hash")]
    pub commit: String,
    /// The refs that name it in the current summary (empty: kept for
    /// pulls by checksum until pruned).
    #[serde(deserialize_with = "bounds::refs")]
    pub refs: Vec<String>,
    #[serde(default, deserialize_with = "bounds::opt_text")]
    pub version: Option<String>,
    /// Commit timestamp, seconds since the epoch.
    pub timestamp: u64,
}

/// `oscontent-bundle.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    /// Always [`KIND`].
    #[serde(deserialize_with = "bounds::text")]
    pub kind: String,
    /// [`FORMAT`].
    pub format: u32,
    /// Where the current content was mirrored from.
    #[serde(deserialize_with = "bounds::text")]
    pub source: String,
    /// SHA-256 (hex) of `summary`.
    #[serde(deserialize_with = "bounds::hash")]
    pub summary_sha256: String,
    /// Whether `summary.sig` is there.
    pub summary_signed: bool,
    /// Every release held, oldest mirrored first (what `--keep` counts).
    #[serde(deserialize_with = "bounds::releases")]
    pub releases: Vec<ReleaseEntry>,
    /// Every file (path relative to the bundle) with its SHA-256 and size.
    #[serde(deserialize_with = "bounds::files")]
    pub files: BTreeMap<String, FileEntry>,
}

impl BundleManifest {
    /// Parses and checks a manifest held in memory; `what` names it in
    /// errors.
    pub fn parse(bytes: &[u8], what: &str) -> Result<Self> {
        Self::read_from(bytes, what)
    }

    /// Parses and checks a manifest as it is read from `r`, reading at
    /// most [`MAX_MANIFEST_SIZE`] bytes (more is an error); `what` names
    /// it in errors. Counts and lengths are refused as they go over their
    /// caps, before the rest is read.
    pub fn read_from(r: impl Read, what: &str) -> Result<Self> {
        let capped = bounds::Capped::new(r, MAX_MANIFEST_SIZE);
        let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(capped));
        let m = Self::deserialize(&mut de)
            .and_then(|m| de.end().map(|()| m))
            .with_context(|| format!("{what}: not a bundle manifest"))?;
        anyhow::ensure!(m.kind == KIND, "{what}: kind {:?}, not {KIND:?}", m.kind);
        anyhow::ensure!(
            m.format == FORMAT,
            "{what}: format {} is not supported (this build reads format {FORMAT})",
            m.format
        );
        Ok(m)
    }

    /// The manifest as written: refused if a reader would refuse it
    /// (over [`MAX_MANIFEST_SIZE`]), so a mirror never completes a bundle
    /// no server can read.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        bounds::check_counts(self).map_err(|e| anyhow::anyhow!("the manifest would list {e}"))?;
        let mut bytes = serde_json::to_vec_pretty(self).context("serializing the manifest")?;
        bytes.push(b'\n');
        anyhow::ensure!(
            bytes.len() as u64 <= MAX_MANIFEST_SIZE,
            "the manifest would be {} bytes, over the {MAX_MANIFEST_SIZE} byte limit of a {MANIFEST} ({} files listed)",
            bytes.len(),
            self.files.len()
        );
        Ok(bytes)
    }

    /// The releases' commits, oldest first.
    pub fn commits(&self) -> Vec<Checksum> {
        self.releases
            .iter()
            .filter_map(|r| Checksum::from_hex(&r.commit).ok())
            .collect()
    }
}

/// Whether `p` may be listed: an archive repo path.
fn listable(p: &str) -> bool {
    RepoPath::parse(p).is_some()
}
