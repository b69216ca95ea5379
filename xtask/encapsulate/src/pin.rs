//! Reproducible images: ostree-ext stamps each layer's history entry in
//! the config with the time it ran (ocidir's `push_layer`), so the same
//! commit and packing gave another config, hence another manifest digest,
//! at every build. Here the history times are pinned to the config's own
//! `created` (the `--created` time, or the commit's), and the config,
//! manifest and index rewritten: the layers are untouched.

use anyhow::{anyhow, Context};
use ostree_ext::glib::{self, ChecksumType};
use serde_json::Value;
use std::path::Path;

const TAG_ANNOTATION: &str = "org.opencontainers.image.ref.name";

fn read_json(p: &Path) -> anyhow::Result<Value> {
    let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", p.display()))
}

fn blob_path(dir: &Path, digest: &str) -> anyhow::Result<std::path::PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| anyhow!("unexpected digest {digest:?}"))?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// Writes `v` as a blob; its digest and size.
fn write_blob(dir: &Path, v: &Value) -> anyhow::Result<(String, u64)> {
    let bytes = serde_json::to_vec(v)?;
    let hex = glib::compute_checksum_for_data(ChecksumType::Sha256, &bytes)
        .context("sha256 of a blob")?;
    let digest = format!("sha256:{hex}");
    let p = blob_path(dir, &digest)?;
    std::fs::write(&p, &bytes).with_context(|| format!("writing {}", p.display()))?;
    Ok((digest, bytes.len() as u64))
}

/// Pins the history times of image `tag` in the OCI layout `dir`; returns
/// its (possibly new) manifest digest. The replaced config and manifest
/// blobs are removed.
pub(crate) fn pin_history(dir: &Path, tag: &str) -> anyhow::Result<String> {
    let index_path = dir.join("index.json");
    let mut index = read_json(&index_path)?;
    let entry = index["manifests"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"][TAG_ANNOTATION] == tag)
        .ok_or_else(|| anyhow!("tag {tag} not in {}", index_path.display()))?;
    let old_manifest = entry["digest"].as_str().unwrap_or_default().to_owned();
    let mut manifest = read_json(&blob_path(dir, &old_manifest)?)?;
    let old_config = manifest["config"]["digest"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut config = read_json(&blob_path(dir, &old_config)?)?;
    let created = config["created"].clone();
    anyhow::ensure!(
        created.is_string(),
        "config {old_config} has no created time"
    );
    for h in config["history"].as_array_mut().into_iter().flatten() {
        h["created"] = created.clone();
    }
    let (config_digest, config_size) = write_blob(dir, &config)?;
    if config_digest == old_config {
        return Ok(old_manifest);
    }
    manifest["config"]["digest"] = config_digest.into();
    manifest["config"]["size"] = config_size.into();
    let (manifest_digest, manifest_size) = write_blob(dir, &manifest)?;
    entry["digest"] = manifest_digest.clone().into();
    entry["size"] = manifest_size.into();
    let bytes = serde_json::to_vec(&index)?;
    let tmp = dir.join("index.json.tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &index_path)
        .with_context(|| format!("replacing {}", index_path.display()))?;
    for old in [old_manifest, old_config] {
        let p = blob_path(dir, &old)?;
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(manifest_digest)
}
