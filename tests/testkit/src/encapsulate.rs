//! The real ostree-native tooling (ostree-ext 0.15, in `xtask/encapsulate`,
//! a cargo project of its own): where its binary is, building it on demand,
//! and its two commands with their JSON outputs typed.
//!
//! It is built by a separate `cargo build`, never in the build graph of the
//! suites or xtask: ostree-ext needs another version of the ostree crate,
//! whose `-sys` crate declares `links`. It shares the workspace's target
//! dir all the same: `links` binds one graph, not a directory, and the
//! units both graphs build alike (syn, serde, thiserror and some 80 more)
//! are then compiled once.

use crate::process::{check_output, local_only};
use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// A prebuilt `oscontent-encapsulate` to use instead of building one.
pub const ENCAPSULATE_ENV: &str = "OSCONTENT_ENCAPSULATE";

/// A cold build of ostree-ext takes a few minutes on two cores.
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Encapsulating or importing a full-scale (1 GiB) image.
const RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What `encapsulate` wrote.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Encapsulated {
    /// `sha256:<hex>` of the manifest.
    pub digest: String,
    /// Layers in the manifest, the commit layer included.
    pub layers: usize,
}

/// A layer: its compressed digest and size.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct Layer {
    pub digest: String,
    pub size: u64,
}

/// What `import` did.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Imported {
    /// The image's ostree commit.
    pub commit: String,
    /// The importer's merge commit over it.
    pub merge_commit: String,
    pub manifest_digest: String,
    pub layers: usize,
    /// The layers this import downloaded (none if the image was present).
    pub fetched: Vec<Layer>,
    pub fetched_bytes: u64,
}

/// The `oscontent-encapsulate` binary: `$OSCONTENT_ENCAPSULATE`, or built
/// (once per process; cargo makes it a no-op when up to date) into
/// `$CARGO_TARGET_DIR` (default `target`).
pub fn encapsulator() -> Result<PathBuf> {
    static BIN: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| locate_or_build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn locate_or_build() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(ENCAPSULATE_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let root = crate::workspace::workspace_root();
    let target = crate::workspace::target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = root.join("xtask/encapsulate/Cargo.toml");
    eprintln!(
        "testkit: building oscontent-encapsulate (ostree-ext) into {}",
        target.display()
    );
    check_output(
        Command::new(cargo)
            .arg("build")
            .arg("--locked")
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            // Cargo's variables for the caller's own build would leak into
            // this one's build scripts.
            .env_remove("CARGO_MANIFEST_DIR")
            .env_remove("CARGO_PKG_NAME"),
        BUILD_TIMEOUT,
    )
    .with_context(|| format!("building {}", manifest.display()))?;
    Ok(target.join("debug").join("oscontent-encapsulate"))
}

/// Encapsulates `rev` of `repo` into `dest` (`oci:DIR:TAG`), chunked by the
/// component map at `components`, keeping `prior_build`'s packing.
pub fn encapsulate(
    repo: &Path,
    rev: &str,
    dest: &str,
    components: &Path,
    prior_build: Option<&str>,
    created: &str,
) -> Result<Encapsulated> {
    let mut cmd = Command::new(encapsulator()?);
    cmd.arg("encapsulate")
        .arg("--repo")
        .arg(repo)
        .args(["--rev", rev, "--dest", dest, "--created", created])
        .arg("--components")
        .arg(components);
    if let Some(prior) = prior_build {
        cmd.args(["--prior-build", prior]);
    }
    parse(&check_output(local_only(&mut cmd), RUN_TIMEOUT)?)
}

/// Imports `image` into the bare-user repo at `repo` (created if missing)
/// with ostree-ext's ImageImporter, as a node does.
pub fn import(repo: &Path, image: &str, insecure_registry: bool) -> Result<Imported> {
    let mut cmd = Command::new(encapsulator()?);
    cmd.arg("import").arg("--repo").arg(repo).arg(image);
    if insecure_registry {
        cmd.arg("--insecure-registry");
    }
    parse(&check_output(local_only(&mut cmd), RUN_TIMEOUT)?)
}

fn parse<T: serde::de::DeserializeOwned>(stdout: &str) -> Result<T> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("oscontent-encapsulate printed no JSON: {stdout:?}"))?;
    serde_json::from_str(line).with_context(|| format!("parsing {line:?}"))
}
