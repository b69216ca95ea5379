//! The fetch after the manifest is resolved ([`resolve`], in
//! `oscontent-parse`), the same for every kind of source: verify and read
//! the config, stream every layer into the staging tree, check the labels,
//! sync.

use super::detect::{self, Detected, ImageFormat};
use super::error::{SourceError, Subject};
use super::unpack::{self, Compression, LayerInfo, LayerSink, Tree};
use super::verify::{self, Stop, VerifyingReader};
use super::{native, FetchOptions, StagedImage};
use oci_spec::image::{Descriptor, ImageConfiguration, ImageManifest};
pub use oscontent_parse::source::resolve::{
    check_digest, resolve, Document, Resolved, Root, Store, REF_NAME_ANNOTATION,
};
use oscontent_parse::source::resolve::{invalid, DOCKER_CONFIG, OCI_CONFIG};
use std::collections::BTreeMap;
use std::path::Path;

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
    let (layer_bytes, written_bytes, staging) = match detected.format {
        ImageFormat::Legacy => {
            let n = apply_layers(
                store,
                image,
                m.layers(),
                &config.diff_ids,
                tree,
                root,
                stop,
                opts,
            )?;
            check_commit_present(root, image, &config, &detected.commit)?;
            (n, tree.written_bytes, None)
        }
        ImageFormat::Native => {
            let (n, written, carried) =
                stage_native(store, image, m, &config, &detected, root, stop, opts)?;
            let staging = native_staging(image, &resolved, &config, &detected, carried);
            (n, written, staging)
        }
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
        staging,
    })
}

/// What a node needs to stage the native image, or `None` (logged) when
/// the importer could not take it as staged: the image is still served.
fn native_staging(
    image: &str,
    resolved: &Resolved,
    config: &Config,
    detected: &Detected,
    carried: Vec<Vec<oscontent_format::Checksum>>,
) -> Option<std::sync::Arc<native::staging::NativeStaging>> {
    let manifest = resolved
        .documents
        .last()
        .filter(|d| d.digest == resolved.manifest_digest)
        .map(|d| d.bytes.clone());
    let layers: Vec<String> = resolved
        .manifest
        .layers()
        .iter()
        .map(|l| l.digest().to_string())
        .collect();
    let planned = manifest
        .ok_or_else(|| "the manifest's bytes were not kept".to_owned())
        .and_then(|m| {
            let commit = detected
                .commit
                .parse()
                .map_err(|_| "the commit label is not a checksum".to_owned())?;
            native::staging::plan(
                (&resolved.manifest_digest, m),
                (&config.digest, config.bytes.clone()),
                commit,
                &layers,
                carried,
            )
        });
    match planned {
        Ok(p) => Some(std::sync::Arc::new(p)),
        Err(why) => {
            tracing::warn!(
                image,
                manifest = resolved.manifest_digest,
                "the image is served, but not for staging: {why}"
            );
            None
        }
    }
}

/// A native image: its ostree layers converted into `root/srv/repo` and
/// the commit's closure checked. Derived layers are refused unless the
/// base commit is asked for, and then are not fetched. Returns the
/// compressed bytes read, the bytes written, and the content objects each
/// ostree layer carried.
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
) -> Result<(u64, u64, Vec<Vec<oscontent_format::Checksum>>), SourceError> {
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
        root,
        stop,
        opts,
    )?;
    conv.finish(&Subject::new(image, ""), &opts.limits)?;
    Ok((n, conv.written_bytes(), conv.take_carried()))
}

/// The image config, as far as we need it.
struct Config {
    digest: String,
    /// Its size in bytes, as read.
    size: u64,
    labels: BTreeMap<String, String>,
    /// `rootfs.diff_ids`: where a native image's ostree layers end.
    diff_ids: Vec<String>,
    /// As read, verified by its digest (a native image publishes it).
    bytes: Vec<u8>,
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
        bytes,
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
#[allow(clippy::too_many_arguments)]
fn apply_layers(
    store: &mut dyn Store,
    image: &str,
    layers: &[Descriptor],
    diff_ids: &[String],
    tree: &mut impl LayerSink,
    root: &Path,
    stop: &Stop,
    opts: &FetchOptions,
) -> Result<u64, SourceError> {
    check_declared_room(layers, image, root)?;
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

/// The layers about to be fetched, by the sizes the manifest declares
/// (compressed: the least they unpack to), against the state volume's
/// real room: what `statvfs` of the staging directory leaves free, which
/// is what the served generation, its deltas and the access log have not
/// taken, minus the unpacker's reserve. `--max-image-bytes` can be more
/// than that; an image that cannot fit is refused here, before a byte is
/// written, instead of filling the volume the served generation is on.
/// What the layers then unpack to is checked entry by entry against the
/// same room.
fn check_declared_room(layers: &[Descriptor], image: &str, root: &Path) -> Result<(), SourceError> {
    let declared: u64 = layers.iter().map(|l| l.size()).fold(0, u64::saturating_add);
    let subject = Subject::new(image, "staging");
    let dir = std::fs::File::open(root)
        .map_err(|e| SourceError::from_io(&subject, root.display().to_string(), e))?;
    let what = format!(
        "the image's {} layer{} as the manifest declares them, before fetching any",
        layers.len(),
        if layers.len() == 1 { "" } else { "s" }
    );
    unpack::check_room(std::os::fd::AsFd::as_fd(&dir), &what, declared, &subject)
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
        crate::request::OSCONTAINER_REPO,
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
