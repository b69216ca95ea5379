//! The OCI image a stage is pinned to: the `REFERENCE@sha256:DIGEST` the
//! operator gives, and the parts of the manifest and config that staging
//! relies on. Pure parsing, no I/O; the bytes come from
//! `blobs/sha256/<hex>` below the remote, bounded by the caller.

use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;

/// Manifests above this are refused (the OCI distribution spec's
/// recommended limit).
pub const MAX_MANIFEST_SIZE: usize = 4 << 20;
/// Configs above this are refused: an ostree image's config is its labels
/// and one history entry a layer, a few KiB for hundreds of layers.
pub const MAX_CONFIG_SIZE: usize = 4 << 20;
/// Layers in one manifest: ostree-ext chunks into at most a few hundred.
pub const MAX_LAYERS: usize = 4096;

/// The label naming the image's ostree commit (ostree-ext
/// `container::OSTREE_COMMIT_LABEL`).
pub const COMMIT_LABEL: &str = "ostree.commit";
/// The label naming the diff_id of the last ostree layer; layers after it
/// are derived (ostree-ext `encapsulate::DIFFID_LABEL`).
pub const FINAL_DIFFID_LABEL: &str = "ostree.final-diffid";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("{0:?} is not REFERENCE@sha256:<64 lowercase hex digits>")]
    BadReference(String),
    #[error("{what} is not valid JSON of the expected shape: {why}")]
    Json { what: &'static str, why: String },
    #[error("{what} digest {digest:?} is not sha256:<64 lowercase hex digits>")]
    BadDigest { what: &'static str, digest: String },
    #[error("the manifest lists {0} layers, more than the {MAX_LAYERS} allowed")]
    TooManyLayers(usize),
    #[error("the manifest lists no layers")]
    NoLayers,
    #[error("the config has {diff_ids} diff_ids for the manifest's {layers} layers")]
    DiffIdCount { diff_ids: usize, layers: usize },
    #[error("the config has no {COMMIT_LABEL:?} label: not an ostree-native image")]
    NoCommitLabel,
    #[error("the config's {COMMIT_LABEL:?} label {0:?} is not an ostree checksum")]
    BadCommitLabel(String),
    #[error("the config's {FINAL_DIFFID_LABEL:?} label {0:?} is none of its diff_ids")]
    UnknownFinalDiffId(String),
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The 64 hex digits of a `sha256:<hex>` digest, if it is one.
pub fn digest_hex(d: &str) -> Option<&str> {
    let h = d.strip_prefix("sha256:")?;
    (h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(h)
}

/// `--image REFERENCE@sha256:DIGEST`: the reference (kept for messages)
/// and the pinned manifest digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedImage {
    pub reference: String,
    pub digest: String,
}

impl PinnedImage {
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let bad = || ImageError::BadReference(s.to_owned());
        let (reference, digest) = s.rsplit_once('@').ok_or_else(bad)?;
        digest_hex(digest).ok_or_else(bad)?;
        Ok(Self {
            reference: reference.to_owned(),
            digest: digest.to_owned(),
        })
    }

    pub fn hex(&self) -> &str {
        digest_hex(&self.digest).expect("checked when parsed")
    }
}

#[derive(serde::Deserialize)]
struct RawDescriptor {
    digest: String,
    size: u64,
}

#[derive(serde::Deserialize)]
struct RawManifest {
    config: RawDescriptor,
    layers: Vec<RawDescriptor>,
}

/// A layer of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub digest: String,
    pub size: u64,
}

/// What staging reads of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub config: String,
    pub config_size: u64,
    pub layers: Vec<Layer>,
}

fn json_err(what: &'static str) -> impl FnOnce(serde_json::Error) -> ImageError {
    move |e| ImageError::Json {
        what,
        why: e.to_string(),
    }
}

fn checked_digest(what: &'static str, d: String) -> Result<String, ImageError> {
    match digest_hex(&d) {
        Some(_) => Ok(d),
        None => Err(ImageError::BadDigest { what, digest: d }),
    }
}

impl Manifest {
    pub fn parse(bytes: &[u8]) -> Result<Self, ImageError> {
        let raw: RawManifest = serde_json::from_slice(bytes).map_err(json_err("the manifest"))?;
        if raw.layers.len() > MAX_LAYERS {
            return Err(ImageError::TooManyLayers(raw.layers.len()));
        }
        if raw.layers.is_empty() {
            return Err(ImageError::NoLayers);
        }
        let layers = raw
            .layers
            .into_iter()
            .map(|l| {
                Ok(Layer {
                    digest: checked_digest("a layer", l.digest)?,
                    size: l.size,
                })
            })
            .collect::<Result<_, ImageError>>()?;
        Ok(Self {
            config: checked_digest("the config", raw.config.digest)?,
            config_size: raw.config.size,
            layers,
        })
    }
}

#[derive(serde::Deserialize, Default)]
struct RawInner {
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(serde::Deserialize)]
struct RawRootfs {
    diff_ids: Vec<String>,
}

#[derive(serde::Deserialize)]
struct RawConfig {
    #[serde(default)]
    config: Option<RawInner>,
    rootfs: RawRootfs,
}

/// What staging reads of a config, checked against its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `ostree.commit`.
    pub commit: oscontent_format::Checksum,
    /// How many leading layers are ostree layers (the commit layer and
    /// the chunks up to `ostree.final-diffid`); the rest are derived.
    /// All of them without the label (an image ostree-ext made whole).
    pub ostree_layers: usize,
}

impl Config {
    /// Parses the config of a manifest with `layers` layers.
    pub fn parse(bytes: &[u8], layers: usize) -> Result<Self, ImageError> {
        let raw: RawConfig = serde_json::from_slice(bytes).map_err(json_err("the config"))?;
        let diff_ids = raw.rootfs.diff_ids;
        if diff_ids.len() != layers {
            return Err(ImageError::DiffIdCount {
                diff_ids: diff_ids.len(),
                layers,
            });
        }
        let labels = raw.config.and_then(|c| c.labels).unwrap_or_default();
        let commit = labels.get(COMMIT_LABEL).ok_or(ImageError::NoCommitLabel)?;
        let commit = oscontent_format::Checksum::from_hex(commit)
            .map_err(|_| ImageError::BadCommitLabel(commit.clone()))?;
        let ostree_layers = match labels.get(FINAL_DIFFID_LABEL) {
            None => layers,
            Some(f) => {
                diff_ids
                    .iter()
                    .position(|d| d == f)
                    .ok_or_else(|| ImageError::UnknownFinalDiffId(f.clone()))?
                    + 1
            }
        };
        Ok(Self {
            commit,
            ostree_layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references() {
        let d = format!("sha256:{H}");
        let table: &[(String, Option<(&str, &str)>)] = &[
            (
                format!("quay.io/os/node@{d}"),
                Some(("quay.io/os/node", &d)),
            ),
            (
                format!("localhost:5000/os:v2@{d}"),
                Some(("localhost:5000/os:v2", &d)),
            ),
            ("quay.io/os/node:v2".into(), None),
            (format!("quay.io/os/node@sha512:{H}"), None),
            (format!("quay.io/os/node@sha256:{}", &H[1..]), None),
            (format!("quay.io/os/node@sha256:{}", H.to_uppercase()), None),
        ];
        for (input, want) in table {
            let got = PinnedImage::parse(input).ok();
            let got = got
                .as_ref()
                .map(|p| (p.reference.as_str(), p.digest.as_str()));
            assert_eq!(got, *want, "{input}");
        }
    }

    fn manifest(layers: &[&str]) -> String {
        let layers: Vec<_> = layers
            .iter()
            .map(|l| serde_json::json!({"mediaType": "x", "digest": l, "size": 10}))
            .collect();
        serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": "c", "digest": format!("sha256:{H}"), "size": 5},
            "layers": layers,
        })
        .to_string()
    }

    #[test]
    fn manifests() {
        let d = format!("sha256:{H}");
        let table: &[(String, Result<usize, &str>)] = &[
            (manifest(&[&d, &d]), Ok(2)),
            (manifest(&[]), Err("no layers")),
            (manifest(&["sha256:zz"]), Err("a layer digest")),
            ("{}".into(), Err("not valid JSON")),
            ("[".into(), Err("not valid JSON")),
        ];
        for (input, want) in table {
            match (Manifest::parse(input.as_bytes()), want) {
                (Ok(m), Ok(n)) => assert_eq!(m.layers.len(), *n),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} for {input}"),
                (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn config(labels: serde_json::Value, diff_ids: &[&str]) -> String {
        serde_json::json!({"config": {"Labels": labels}, "rootfs": {"type": "layers", "diff_ids": diff_ids}})
            .to_string()
    }

    #[test]
    fn configs() {
        let c = H;
        let table: &[(String, usize, Result<usize, &str>)] = &[
            (
                config(serde_json::json!({"ostree.commit": c}), &["a", "b"]),
                2,
                Ok(2),
            ),
            (
                config(
                    serde_json::json!({"ostree.commit": c, "ostree.final-diffid": "b"}),
                    &["a", "b", "c"],
                ),
                3,
                Ok(2),
            ),
            (
                config(
                    serde_json::json!({"ostree.commit": c, "ostree.final-diffid": "x"}),
                    &["a"],
                ),
                1,
                Err("none of its diff_ids"),
            ),
            (
                config(serde_json::json!({}), &["a"]),
                1,
                Err("no \"ostree.commit\""),
            ),
            (
                config(serde_json::json!({"ostree.commit": "abc"}), &["a"]),
                1,
                Err("not an ostree checksum"),
            ),
            (
                config(serde_json::json!({"ostree.commit": c}), &["a"]),
                2,
                Err("1 diff_ids for the manifest's 2"),
            ),
        ];
        for (input, layers, want) in table {
            match (Config::parse(input.as_bytes(), *layers), want) {
                (Ok(got), Ok(n)) => {
                    assert_eq!(got.ostree_layers, *n, "{input}");
                    assert_eq!(got.commit.to_hex(), H);
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} for {input}"),
                (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
            }
        }
    }
}
