//! The fetch itself, the same for every kind of source: resolve the
//! manifest (through indexes, by platform), verify and read the config,
//! stream every layer into the staging tree, check the labels, sync.

use super::detect::{self, Detected, ImageFormat};
use super::error::{SourceError, Subject};
use super::reference::{normalize_arch, Platform};
use super::unpack::{Compression, LayerInfo, LayerSink, Tree};
use super::verify::{self, Stop, VerifyingReader};
use super::{native, FetchOptions, StagedImage};
use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Index → index → manifest nesting allowed (a layout's index.json
/// pointing at a multi-arch index is two).
const MAX_INDEX_DEPTH: usize = 4;
/// The annotation naming a manifest in an OCI layout's index.json.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// Where the first document comes from.
pub enum Root {
    /// A manifest or an index (what a registry returns for a reference).
    Document {
        bytes: Vec<u8>,
        digest: String,
        media_type: Option<String>,
    },
    /// An OCI layout's `index.json`, to pick a manifest from by tag.
    LayoutIndex { bytes: Vec<u8>, tag: Option<String> },
}

/// A place holding an image's manifests and blobs.
pub trait Store {
    /// The first document.
    fn root(&mut self, subject: &Subject, opts: &FetchOptions) -> Result<Root, SourceError>;
    /// A manifest or index by digest, verified against `digest` and `size`.
    /// Stores that keep manifests as blobs (OCI layouts) use this default.
    fn manifest(
        &mut self,
        digest: &str,
        size: u64,
        subject: &Subject,
        opts: &FetchOptions,
    ) -> Result<Vec<u8>, SourceError> {
        let (r, origin) = self.blob(digest, subject)?;
        super::verify::read_small(
            r,
            subject,
            &origin,
            digest,
            size,
            opts.limits.max_manifest_bytes,
            "manifest size",
        )
    }
    /// A blob's raw (unverified) byte stream, and where it comes from.
    fn blob(
        &mut self,
        digest: &str,
        subject: &Subject,
    ) -> Result<(Box<dyn Read + '_>, String), SourceError>;
}

/// Refuses digests we cannot verify (and that could be path tricks).
pub fn check_digest(d: &str, subject: &Subject) -> Result<(), SourceError> {
    if super::reference::valid_sha256_digest(d) {
        Ok(())
    } else {
        Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!("digest {d:?} (only sha256 is supported)"),
        })
    }
}

fn invalid(subject: &Subject, reason: impl Into<String>) -> SourceError {
    SourceError::Invalid {
        subject: subject.clone(),
        reason: reason.into(),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Index,
    Manifest,
}

/// Index or manifest: the document's own `mediaType`, else the one it
/// was served or referenced with, else its shape.
fn kind(bytes: &[u8], hint: Option<&str>, subject: &Subject) -> Result<Kind, SourceError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        schema_version: Option<u32>,
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
    }
    let p: Probe = serde_json::from_slice(bytes)
        .map_err(|e| invalid(subject, format!("not a JSON manifest: {e}")))?;
    if p.schema_version != Some(2) {
        return Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!(
                "manifest schemaVersion {:?} (only 2: OCI and Docker schema2)",
                p.schema_version
            ),
        });
    }
    let media = p
        .media_type
        .as_deref()
        .or(hint.map(|h| h.split(';').next().unwrap_or(h).trim()));
    match media {
        Some(OCI_INDEX | DOCKER_LIST) => Ok(Kind::Index),
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => Ok(Kind::Manifest),
        _ if p.manifests.is_some() => Ok(Kind::Index),
        _ if p.layers.is_some() => Ok(Kind::Manifest),
        m => Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!("manifest media type {m:?}"),
        }),
    }
}

fn platform_matches(d: &Descriptor, want: &Platform) -> bool {
    let Some(p) = d.platform() else { return false };
    let arch = p.architecture().to_string();
    if p.os().to_string() != want.os || normalize_arch(&arch) != want.architecture {
        return false;
    }
    match (&want.variant, p.variant()) {
        (None, _) => true,
        (Some(w), Some(v)) => w == v,
        (Some(w), None) => want.architecture == "arm64" && w == "v8",
    }
}

fn describe_platforms(ds: &[Descriptor]) -> String {
    let v: Vec<String> = ds
        .iter()
        .filter_map(|d| d.platform().as_ref())
        .map(|p| {
            let mut s = format!("{}/{}", p.os(), p.architecture());
            if let Some(v) = p.variant() {
                s = format!("{s}/{v}");
            }
            s
        })
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn select_platform<'a>(
    ds: &'a [Descriptor],
    want: &Platform,
    subject: &Subject,
) -> Result<&'a Descriptor, SourceError> {
    ds.iter()
        .find(|d| platform_matches(d, want))
        .ok_or_else(|| SourceError::NoPlatform {
            subject: subject.clone(),
            platform: want.to_string(),
            available: describe_platforms(ds),
        })
}

/// Picks the manifest an OCI layout's index.json names by `tag` (or its
/// only one).
fn select_from_layout<'a>(
    index: &'a ImageIndex,
    tag: Option<&str>,
    want: &Platform,
    subject: &Subject,
) -> Result<&'a Descriptor, SourceError> {
    let name = |d: &Descriptor| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME_ANNOTATION))
            .cloned()
    };
    let all = index.manifests();
    let candidates: Vec<Descriptor> = match tag {
        Some(t) => all
            .iter()
            .filter(|d| name(d).as_deref() == Some(t))
            .cloned()
            .collect(),
        None => all.clone(),
    };
    match candidates.len() {
        0 => {
            let tags: Vec<String> = all.iter().filter_map(name).collect();
            Err(SourceError::NotFound {
                subject: subject.clone(),
                reason: format!(
                    "no manifest tagged {:?} (tags: {})",
                    tag.unwrap_or(""),
                    tags.join(", ")
                ),
            })
        }
        1 => Ok(all
            .iter()
            .find(|d| Some(*d) == candidates.first())
            .expect("from all")),
        _ => {
            let chosen = select_platform(&candidates, want, subject).map_err(|_| match tag {
                None => SourceError::Invalid {
                    subject: subject.clone(),
                    reason: format!(
                        "index.json lists {} manifests; name one with :TAG",
                        candidates.len()
                    ),
                },
                Some(_) => SourceError::NoPlatform {
                    subject: subject.clone(),
                    platform: want.to_string(),
                    available: describe_platforms(&candidates),
                },
            })?;
            Ok(all.iter().find(|d| *d == chosen).expect("from all"))
        }
    }
}

/// What the manifest resolution found.
pub struct Resolved {
    pub manifest: ImageManifest,
    pub manifest_digest: String,
    pub index_digest: Option<String>,
    /// Every document read on the way, verified, exactly as stored: the
    /// indexes (outermost first) and then the manifest. What a layout copy
    /// writes so that the same digests resolve.
    pub documents: Vec<Document>,
}

/// A manifest or index as stored.
pub struct Document {
    pub digest: String,
    pub media_type: Option<String>,
    pub bytes: Vec<u8>,
}

pub fn resolve(
    store: &mut dyn Store,
    image: &str,
    opts: &FetchOptions,
) -> Result<Resolved, SourceError> {
    let root_subject = Subject::new(image, "manifest");
    let (mut bytes, mut digest, mut media) = match store.root(&root_subject, opts)? {
        Root::Document {
            bytes,
            digest,
            media_type,
        } => (bytes, digest, media_type),
        Root::LayoutIndex { bytes, tag } => {
            let s = Subject::new(image, "index.json");
            let index: ImageIndex =
                serde_json::from_slice(&bytes).map_err(|e| invalid(&s, format!("{e}")))?;
            let d = select_from_layout(&index, tag.as_deref(), &opts.platform, &s)?;
            let digest = d.digest().to_string();
            let s = Subject::new(image, format!("manifest {digest}"));
            check_digest(&digest, &s)?;
            let bytes = store.manifest(&digest, d.size(), &s, opts)?;
            (bytes, digest, Some(d.media_type().to_string()))
        }
    };
    let mut index_digest = None;
    let mut documents = Vec::new();
    for _ in 0..MAX_INDEX_DEPTH {
        let s = Subject::new(image, format!("manifest {digest}"));
        match kind(&bytes, media.as_deref(), &s)? {
            Kind::Manifest => {
                let manifest: ImageManifest = serde_json::from_slice(&bytes)
                    .map_err(|e| invalid(&s, format!("image manifest: {e}")))?;
                documents.push(Document {
                    digest: digest.clone(),
                    media_type: media,
                    bytes,
                });
                return Ok(Resolved {
                    manifest,
                    manifest_digest: digest,
                    index_digest,
                    documents,
                });
            }
            Kind::Index => {
                let s = Subject::new(image, format!("index {digest}"));
                let index: ImageIndex = serde_json::from_slice(&bytes)
                    .map_err(|e| invalid(&s, format!("image index: {e}")))?;
                let d = select_platform(index.manifests(), &opts.platform, &s)?;
                documents.push(Document {
                    digest: digest.clone(),
                    media_type: media.clone(),
                    bytes: std::mem::take(&mut bytes),
                });
                index_digest.get_or_insert(digest);
                digest = d.digest().to_string();
                let s = Subject::new(image, format!("manifest {digest}"));
                check_digest(&digest, &s)?;
                bytes = store.manifest(&digest, d.size(), &s, opts)?;
                media = Some(d.media_type().to_string());
            }
        }
    }
    Err(invalid(
        &root_subject,
        format!("indexes nested deeper than {MAX_INDEX_DEPTH}"),
    ))
}

fn compression(media_type: &str, subject: &Subject) -> Result<Compression, SourceError> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Ok(Compression::Zstd),
        other => Err(SourceError::Unsupported {
            subject: subject.clone(),
            reason: format!("layer media type {other:?}"),
        }),
    }
}

/// Everything after the manifest: config, layers, labels. Writes into
/// `tree` (the caller owns the staging directory and removes it on error).
#[allow(clippy::too_many_arguments)]
pub fn pull_into(
    store: &mut dyn Store,
    image: &str,
    opts: &FetchOptions,
    resolved: Resolved,
    tree: &mut Tree,
    root: &Path,
    stop: &Stop,
) -> Result<StagedImage, SourceError> {
    let m = &resolved.manifest;
    let config = read_config(store, image, m.config(), opts)?;
    // Checked before any layer is fetched: no point streaming an image
    // that will be refused.
    let detected =
        detect::detect(&config.labels).map_err(|p| config.label_err(image, p.label, p.reason))?;
    check_layer_totals(m.layers(), image, &resolved.manifest_digest, opts)?;
    check_diff_ids(&config, m.layers().len(), image)?;
    let (layer_bytes, written_bytes) = match detected.format {
        ImageFormat::Legacy => {
            let n = apply_layers(store, image, m.layers(), &config.diff_ids, tree, stop, opts)?;
            check_commit_present(root, image, &config, &detected.commit)?;
            (n, tree.written_bytes)
        }
        ImageFormat::Native => stage_native(store, image, m, &config, &detected, root, stop, opts)?,
    };
    tree.sync().map_err(|e| {
        SourceError::from_io(
            &Subject::new(image, "staging"),
            root.display().to_string(),
            e,
        )
    })?;
    Ok(StagedImage {
        root: root.to_path_buf(),
        version: detected.version,
        labels: config.labels,
        manifest_digest: resolved.manifest_digest,
        index_digest: resolved.index_digest,
        config_digest: config.digest,
        compressed_bytes: config.size + layer_bytes,
        written_bytes,
        commit: detected.commit,
        format: detected.format,
    })
}

/// A native image: its ostree layers converted into `root/srv/repo` and
/// the commit's closure checked. Derived layers are refused unless the
/// base commit is asked for, and then are not fetched. Returns the
/// compressed bytes read and the bytes written.
#[allow(clippy::too_many_arguments)]
fn stage_native(
    store: &mut dyn Store,
    image: &str,
    m: &ImageManifest,
    config: &Config,
    detected: &Detected,
    root: &Path,
    stop: &Stop,
    opts: &FetchOptions,
) -> Result<(u64, u64), SourceError> {
    let layers = m.layers();
    let base = detect::base_layers(&config.labels, &config.diff_ids, layers.len())
        .map_err(|p| config.label_err(image, p.label, p.reason))?;
    let subject = Subject::new(image, format!("config {}", config.digest));
    let derived = layers.len() - base;
    if derived > 0 && !opts.serve_base_commit {
        return Err(SourceError::DerivedLayers {
            subject,
            count: derived,
            commit: detected.commit.clone(),
        });
    }
    if derived > 0 {
        tracing::warn!(image, derived, commit = detected.commit, "serving the base commit of an image with derived layers (--serve-base-commit); they are not fetched");
    }
    let commit = detected.commit.parse().map_err(|_| {
        config.label_err(image, detect::NATIVE_COMMIT_LABEL, "not a checksum".into())
    })?;
    let mut conv = native::Converter::create(root, commit, &subject)?;
    let n = apply_layers(
        store,
        image,
        &layers[..base],
        &config.diff_ids[..base],
        &mut conv,
        stop,
        opts,
    )?;
    conv.finish(&Subject::new(image, ""), &opts.limits)?;
    Ok((n, conv.written_bytes()))
}

/// The image config, as far as we need it.
struct Config {
    digest: String,
    /// Its size in bytes, as read.
    size: u64,
    labels: BTreeMap<String, String>,
    /// `rootfs.diff_ids`: where a native image's ostree layers end.
    diff_ids: Vec<String>,
}

impl Config {
    /// A label error, about the config.
    fn label_err(&self, image: &str, label: &str, reason: String) -> SourceError {
        SourceError::Label {
            subject: Subject::new(image, format!("config {}", self.digest)),
            label: label.into(),
            reason,
        }
    }
}

/// Reads the config (small, verified) and parses its labels.
fn read_config(
    store: &mut dyn Store,
    image: &str,
    cd: &Descriptor,
    opts: &FetchOptions,
) -> Result<Config, SourceError> {
    let digest = cd.digest().to_string();
    let s = Subject::new(image, format!("config {digest}"));
    check_digest(&digest, &s)?;
    let ct = cd.media_type().to_string();
    if ct != OCI_CONFIG && ct != DOCKER_CONFIG {
        return Err(SourceError::Unsupported {
            subject: s,
            reason: format!("config media type {ct:?} (not an image)"),
        });
    }
    let (r, origin) = store.blob(&digest, &s)?;
    let bytes = verify::read_small(
        r,
        &s,
        &origin,
        &digest,
        cd.size(),
        opts.limits.max_config_bytes,
        "config size",
    )?;
    let config: ImageConfiguration =
        serde_json::from_slice(&bytes).map_err(|e| invalid(&s, format!("image config: {e}")))?;
    let labels = config
        .config()
        .as_ref()
        .and_then(|c| c.labels().clone())
        .map(|l| l.into_iter().collect())
        .unwrap_or_default();
    Ok(Config {
        digest,
        size: bytes.len() as u64,
        labels,
        diff_ids: config.rootfs().diff_ids().clone(),
    })
}

/// The layer count and their total (compressed) size, from the manifest,
/// before any is fetched.
fn check_layer_totals(
    layers: &[Descriptor],
    image: &str,
    manifest_digest: &str,
    opts: &FetchOptions,
) -> Result<(), SourceError> {
    let limits = &opts.limits;
    let subject = || Subject::new(image, format!("manifest {manifest_digest}"));
    if layers.len() > limits.max_layers {
        return Err(SourceError::LimitExceeded {
            subject: subject(),
            limit: "layer count",
            detail: format!(
                "{} layers, the limit is {}",
                layers.len(),
                limits.max_layers
            ),
        });
    }
    let total: u64 = layers.iter().map(|l| l.size()).fold(0, u64::saturating_add);
    if total > limits.max_compressed_bytes {
        return Err(SourceError::LimitExceeded {
            subject: subject(),
            limit: "compressed size",
            detail: format!(
                "the layers add up to {total} bytes, the limit is {}",
                limits.max_compressed_bytes
            ),
        });
    }
    Ok(())
}

/// The config's `rootfs.diff_ids`, one `sha256:` digest per layer of the
/// manifest, checked before any layer is fetched.
fn check_diff_ids(config: &Config, layers: usize, image: &str) -> Result<(), SourceError> {
    let subject = || Subject::new(image, format!("config {}", config.digest));
    if config.diff_ids.len() != layers {
        return Err(invalid(
            &subject(),
            format!(
                "rootfs.diff_ids lists {} diff IDs for the manifest's {layers} layers",
                config.diff_ids.len()
            ),
        ));
    }
    for (i, d) in config.diff_ids.iter().enumerate() {
        check_digest(d, &subject()).map_err(|_| {
            invalid(
                &subject(),
                format!("rootfs.diff_ids[{i}] {d:?} is not a sha256 digest"),
            )
        })?;
    }
    Ok(())
}

/// Streams every layer, in order, into `tree`, each verified by digest and
/// size, and its decompressed stream by its diff ID (`diff_ids[i]`).
/// Returns the compressed bytes read.
fn apply_layers(
    store: &mut dyn Store,
    image: &str,
    layers: &[Descriptor],
    diff_ids: &[String],
    tree: &mut impl LayerSink,
    stop: &Stop,
    opts: &FetchOptions,
) -> Result<u64, SourceError> {
    let mut compressed_bytes = 0;
    for ((i, l), diff_id) in layers.iter().enumerate().zip(diff_ids) {
        let digest = l.digest().to_string();
        let s = Subject::new(image, format!("layer {}/{} {digest}", i + 1, layers.len()));
        check_digest(&digest, &s)?;
        let compression = compression(l.media_type().as_ref(), &s)?;
        let (r, origin) = store.blob(&digest, &s)?;
        let mut vr =
            VerifyingReader::new(r, s.clone(), origin, &digest, l.size(), Some(stop.clone()));
        let info = LayerInfo {
            subject: &s,
            compression,
            diff_id,
        };
        tree.apply_layer(&mut vr, &info, &opts.limits)?;
        vr.finish()?;
        compressed_bytes += vr.count();
        tracing::debug!(image, layer = %digest, bytes = vr.count(), "layer applied");
    }
    Ok(compressed_bytes)
}

/// The commit the label names must be in the repo we extracted.
fn check_commit_present(
    root: &Path,
    image: &str,
    config: &Config,
    commit: &str,
) -> Result<(), SourceError> {
    let rel = format!(
        "{}/objects/{}/{}.commit",
        crate::publish::OSCONTAINER_REPO,
        &commit[..2],
        &commit[2..]
    );
    let present = crate::fsutil::open_file(root, &rel)
        .map_err(|e| SourceError::from_io(&Subject::new(image, ""), rel.clone(), e))?
        .is_some();
    if !present {
        return Err(config.label_err(
            image,
            detect::LEGACY_COMMIT_LABEL,
            format!("the image has no commit object {rel} for {commit}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> Subject {
        Subject::new("img", "")
    }

    #[test]
    fn kinds() {
        let k = |j: &str, h: Option<&str>| kind(j.as_bytes(), h, &s());
        assert_eq!(
            k(
                r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json"}"#,
                None
            )
            .unwrap(),
            Kind::Index
        );
        assert_eq!(
            k(r#"{"schemaVersion":2,"manifests":[]}"#, None).unwrap(),
            Kind::Index
        );
        assert_eq!(
            k(r#"{"schemaVersion":2}"#, Some(DOCKER_MANIFEST)).unwrap(),
            Kind::Manifest
        );
        assert!(matches!(
            k(r#"{"schemaVersion":1}"#, None),
            Err(SourceError::Unsupported { .. })
        ));
        assert!(matches!(
            k(r#"{"schemaVersion":2}"#, Some("text/plain")),
            Err(SourceError::Unsupported { .. })
        ));
        assert!(matches!(k("[", None), Err(SourceError::Invalid { .. })));
    }

    #[test]
    fn platform_selection() {
        let idx: ImageIndex = serde_json::from_str(&format!(
            r#"{{"schemaVersion":2,"manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"sha256:{a}","size":1,"platform":{{"os":"linux","architecture":"arm","variant":"v7"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"sha256:{b}","size":1,"platform":{{"os":"linux","architecture":"arm64"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"sha256:{c}","size":1,"platform":{{"os":"linux","architecture":"amd64"}}}}
            ]}}"#,
            a = "a".repeat(64),
            b = "b".repeat(64),
            c = "c".repeat(64)
        ))
        .unwrap();
        let pick = |p: &str| {
            select_platform(idx.manifests(), &p.parse().unwrap(), &s())
                .map(|d| d.digest().to_string())
        };
        assert!(pick("linux/amd64").unwrap().contains("ccc"));
        assert!(pick("linux/arm64/v8").unwrap().contains("bbb"));
        assert!(pick("linux/arm/v7").unwrap().contains("aaa"));
        let e = pick("linux/s390x").unwrap_err().to_string();
        assert!(e.contains("linux/arm/v7, linux/arm64, linux/amd64"), "{e}");
    }
}
