//! The trust chain of a stage, from the pinned digest down: the manifest
//! hashes to the digest, the config to the manifest's config digest, the
//! config's `ostree.commit` is the commit the server stages, and each
//! layer the server indexes is that manifest's layer, in order, under the
//! importer's own ref name and of the kind the config makes it. Pure: the
//! bytes were fetched with bounds by the caller, nothing is written until
//! this passes.

use super::image::{sha256_digest, Config, ImageError, Manifest};
pub use oscontent_format::staging::LayerKind as Kind;
use oscontent_format::staging::{digest_string, StagedImage};
use oscontent_format::Checksum;

/// What the server's staging index says of one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedLayer {
    pub digest: String,
    pub ref_name: String,
    pub kind: Kind,
}

/// What the server's staging index says of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedImage {
    pub config: String,
    pub commit: Checksum,
    pub layers: Vec<ServedLayer>,
}

/// A layer the stage will write a ref for, or leave to the importer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLayer {
    pub digest: String,
    pub size: u64,
    pub ref_name: String,
    pub kind: Kind,
}

/// The verified plan of a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub commit: Checksum,
    pub layers: Vec<PlannedLayer>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    #[error("the manifest served for {pinned} hashes to {got}: it is not the pinned image")]
    ManifestDigest { pinned: String, got: String },
    #[error("the manifest: {0}")]
    Manifest(ImageError),
    #[error(
        "the server indexes config {served} for this image, but its manifest names {manifest}"
    )]
    IndexConfig { served: String, manifest: String },
    #[error("the config served for {want} hashes to {got}")]
    ConfigDigest { want: String, got: String },
    #[error("the config: {0}")]
    Config(ImageError),
    #[error("the config names commit {config}, but the server stages commit {served}")]
    Commit { config: Checksum, served: Checksum },
    #[error("the server indexes {served} layers for this image, its manifest has {manifest}")]
    LayerCount { served: usize, manifest: usize },
    #[error("the server indexes layer {index} as {served}, which the manifest lacks (it lists {manifest} there)")]
    LayerDigest {
        index: usize,
        served: String,
        manifest: String,
    },
    #[error(
        "the server names the ref of layer {digest} {served:?}; the importer looks for {want:?}"
    )]
    RefName {
        digest: String,
        served: String,
        want: String,
    },
    #[error(
        "the server indexes layer {index} ({digest}) as {served}, but the image makes it {want}"
    )]
    LayerKind {
        index: usize,
        digest: String,
        served: &'static str,
        want: &'static str,
    },
}

const OBJECT_SET: &str = "an object-set layer";

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Commit => "the commit layer",
        Kind::ObjectSet(_) => OBJECT_SET,
        Kind::Derived => "a derived layer",
    }
}

impl ServedImage {
    /// What the server's index says of one image, in the terms of the
    /// manifest (`sha256:<hex>` digests) and with each layer's ref as the
    /// server names it.
    pub fn of(image: &StagedImage) -> Self {
        Self {
            config: digest_string(&image.config),
            commit: image.commit,
            layers: image
                .layers
                .iter()
                .map(|l| ServedLayer {
                    digest: digest_string(&l.digest),
                    ref_name: l.ref_name(),
                    kind: l.kind,
                })
                .collect(),
        }
    }
}

/// Checks the chain from `pinned` (`sha256:<hex>`) through the manifest and
/// config bytes to what the server indexes; `layer_ref` is the importer's
/// ref name of a layer digest.
pub fn check(
    pinned: &str,
    manifest_bytes: &[u8],
    config_bytes: &[u8],
    served: &ServedImage,
    layer_ref: impl Fn(&str) -> String,
) -> Result<Plan, ChainError> {
    let got = sha256_digest(manifest_bytes);
    if got != pinned {
        return Err(ChainError::ManifestDigest {
            pinned: pinned.to_owned(),
            got,
        });
    }
    let manifest = Manifest::parse(manifest_bytes).map_err(ChainError::Manifest)?;
    if served.config != manifest.config {
        return Err(ChainError::IndexConfig {
            served: served.config.clone(),
            manifest: manifest.config,
        });
    }
    let got = sha256_digest(config_bytes);
    if got != manifest.config {
        return Err(ChainError::ConfigDigest {
            want: manifest.config,
            got,
        });
    }
    let config = Config::parse(config_bytes, manifest.layers.len()).map_err(ChainError::Config)?;
    if config.commit != served.commit {
        return Err(ChainError::Commit {
            config: config.commit,
            served: served.commit,
        });
    }
    if served.layers.len() != manifest.layers.len() {
        return Err(ChainError::LayerCount {
            served: served.layers.len(),
            manifest: manifest.layers.len(),
        });
    }
    let mut layers = Vec::with_capacity(served.layers.len());
    for (index, (s, m)) in served.layers.iter().zip(&manifest.layers).enumerate() {
        if s.digest != m.digest {
            return Err(ChainError::LayerDigest {
                index,
                served: s.digest.clone(),
                manifest: m.digest.clone(),
            });
        }
        let want = layer_ref(&m.digest);
        if s.ref_name != want {
            return Err(ChainError::RefName {
                digest: m.digest.clone(),
                served: s.ref_name.clone(),
                want,
            });
        }
        let want_kind = match index {
            0 => kind_name(Kind::Commit),
            i if i < config.ostree_layers => OBJECT_SET,
            _ => kind_name(Kind::Derived),
        };
        if kind_name(s.kind) != want_kind {
            return Err(ChainError::LayerKind {
                index,
                digest: m.digest.clone(),
                served: kind_name(s.kind),
                want: want_kind,
            });
        }
        layers.push(PlannedLayer {
            digest: m.digest.clone(),
            size: m.size,
            ref_name: want,
            kind: s.kind,
        });
    }
    Ok(Plan {
        commit: config.commit,
        layers,
    })
}

#[cfg(test)]
mod tests;
