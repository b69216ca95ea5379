//! An image into an OCI image layout, digests preserved: the layout a
//! site's registry can be seeded from (`skopeo copy oci:DIR:TAG
//! docker://...`), or that `serve --image oci:DIR:TAG` reads directly.
//!
//! Unlike `serve --image`, this stores the compressed blobs: a layout copy
//! is the point. Every byte is still verified: the manifest (and any index
//! on the way) and config by digest, each layer by digest and size while it
//! streams into a temporary file in the layout, which is renamed into
//! `blobs/sha256/` only once it verified. Blobs already in the layout are
//! hashed and kept if they match (that is what makes a second release
//! incremental, and a killed copy resumable), and `index.json` is replaced
//! atomically, last, so it never names an image whose blobs are not all
//! there.
//!
//! With a multi-platform source, the index is copied verbatim together
//! with the manifest of the `--platform` chosen (and its blobs), so the
//! same `@sha256:` references (of the index and of the manifest) resolve in
//! the layout; the other platforms' manifests are not copied.

use super::bundle::{write_atomic, WORK_DIR};
use super::remote::RateLimit;
use crate::source::pipeline::{self, Document, REF_NAME_ANNOTATION};
use crate::source::verify::{Stop, VerifyingReader};
use crate::source::{self, FetchOptions, ImageRef, Reference, SourceError, Subject};
use anyhow::{Context, Result};
use oci_spec::image::ImageManifest;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// A layout's `index.json` is a list of descriptors.
const MAX_INDEX_JSON: u64 = 16 << 20;

/// What a layout copy did.
#[derive(Debug, Clone, Serialize)]
pub struct OciReport {
    pub dest: String,
    pub tag: Option<String>,
    /// The digest `index.json` names (the index, for a multi-platform
    /// source; else the manifest).
    pub digest: String,
    pub manifest_digest: String,
    /// Blobs of the image (documents, config, layers) and their bytes.
    pub blobs: u64,
    pub image_bytes: u64,
    /// Blobs written by this run, and their bytes.
    pub blobs_copied: u64,
    pub bytes_copied: u64,
}

/// The tag a copy is stored under: the destination's, else the source's.
pub fn default_tag(image: &ImageRef) -> Option<String> {
    match image {
        ImageRef::Registry {
            reference: Reference::Tag(t),
            ..
        } => Some(t.clone()),
        ImageRef::OciLayout { tag, .. } | ImageRef::OciArchive { tag, .. } => tag.clone(),
        _ => None,
    }
}

fn blob_path(dir: &Path, digest: &str) -> PathBuf {
    // Only called with checked sha256 digests.
    dir.join("blobs/sha256").join(&digest["sha256:".len()..])
}

/// Whether the layout already holds this blob, intact.
fn have_blob(dir: &Path, digest: &str, size: u64) -> Result<bool> {
    let p = blob_path(dir, digest);
    match std::fs::metadata(&p) {
        Ok(m) if m.is_file() && m.len() == size => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", p.display())),
    }
    let e = super::store::hash_file(&p)?;
    Ok(format!("sha256:{}", e.sha256) == digest)
}

/// The media type to list a document under in `index.json`: its own
/// `mediaType`, else what it was served as, else its shape.
fn media_type_of(doc: &Document) -> String {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    let probe: Option<Probe> = serde_json::from_slice(&doc.bytes).ok();
    if let Some(m) = probe.as_ref().and_then(|p| p.media_type.clone()) {
        return m;
    }
    if let Some(h) = &doc.media_type {
        return h.split(';').next().unwrap_or(h).trim().to_owned();
    }
    if probe.is_some_and(|p| p.manifests.is_some()) {
        OCI_INDEX.into()
    } else {
        OCI_MANIFEST.into()
    }
}

/// Copies `image` into the layout `dir` under `tag`.
pub fn copy_image(
    image: &ImageRef,
    fetch: &FetchOptions,
    dir: &Path,
    tag: Option<String>,
    limit: Option<Arc<RateLimit>>,
) -> Result<OciReport> {
    if let Some(t) = &tag {
        check_tag(t)?;
    }
    let layout = Layout::open(dir)?;
    // Paced by `limit` in `copy_blob`, not here.
    let stop = Stop {
        pace: None,
        cancel: Arc::new(AtomicBool::new(false)),
        deadline: fetch
            .total_timeout
            .map(|t| (std::time::Instant::now() + t, t)),
    };
    let mut report = None;
    source::with_store(image, fetch, &mut |store, label| {
        let resolved = pipeline::resolve(store, label, fetch)?;
        let mut r = OciReport {
            dest: dir.display().to_string(),
            tag: tag.clone(),
            digest: resolved.documents[0].digest.clone(),
            manifest_digest: resolved.manifest_digest.clone(),
            blobs: 0,
            image_bytes: 0,
            blobs_copied: 0,
            bytes_copied: 0,
        };
        for (digest, size, what) in blobs_of(&resolved.manifest) {
            let s = Subject::new(label, what);
            layout.copy_blob(store, &digest, size, &s, &stop, limit.as_deref(), &mut r)?;
        }
        for doc in &resolved.documents {
            layout.store_document(doc, label, &mut r)?;
        }
        layout.sync(label)?;
        let top = &resolved.documents[0];
        report = Some((r, media_type_of(top), top.bytes.len() as u64));
        Ok(())
    })
    .with_context(|| format!("copying {image} into {}", dir.display()))?;
    let (r, media_type, size) = report.context("the copy reported nothing")?;
    update_index(dir, &r.digest, &media_type, size, tag.as_deref())?;
    let _ = std::fs::remove_dir_all(&layout.tmp);
    Ok(r)
}

/// A tag as OCI layouts (and registries) spell them.
fn check_tag(t: &str) -> Result<()> {
    anyhow::ensure!(
        !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
        "tag {t:?}: want 1 to 128 of [A-Za-z0-9._-]"
    );
    Ok(())
}

/// The config and the layers, in order: digest, size, and what to call
/// each in messages.
fn blobs_of(m: &ImageManifest) -> Vec<(String, u64, String)> {
    std::iter::once(m.config())
        .chain(m.layers().iter())
        .enumerate()
        .map(|(i, d)| {
            let what = if i == 0 {
                format!("config {}", d.digest())
            } else {
                format!("layer {i}/{} {}", m.layers().len(), d.digest())
            };
            (d.digest().to_string(), d.size(), what)
        })
        .collect()
}

/// The OCI layout being written, locked against another copy into it.
struct Layout {
    dir: PathBuf,
    /// Temporary blobs, renamed into `blobs/sha256/` once verified.
    tmp: PathBuf,
    _lock: std::fs::File,
}

impl Layout {
    /// Refuses a foreign directory, takes the lock, starts with an empty
    /// temporary directory, and writes (or checks) `oci-layout`.
    fn open(dir: &Path) -> Result<Self> {
        super::bundle::refuse_foreign_dir(dir, &["oci-layout", WORK_DIR])?;
        std::fs::create_dir_all(dir.join("blobs/sha256"))
            .with_context(|| format!("creating {}/blobs/sha256", dir.display()))?;
        let work = dir.join(WORK_DIR);
        let tmp = work.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
        }
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(work.join("lock"))
            .with_context(|| format!("opening {}/lock", work.display()))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |e| anyhow::anyhow!("{} is being written by another mirror ({e})", dir.display()),
        )?;
        check_layout_file(&dir.join("oci-layout"))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tmp,
            _lock: lock,
        })
    }

    /// Copies one blob (config or layer) unless the layout holds it intact:
    /// streamed into a temporary file, verified by digest and size, then
    /// renamed into place.
    #[allow(clippy::too_many_arguments)]
    fn copy_blob(
        &self,
        store: &mut dyn pipeline::Store,
        digest: &str,
        size: u64,
        s: &Subject,
        stop: &Stop,
        limit: Option<&RateLimit>,
        r: &mut OciReport,
    ) -> Result<(), SourceError> {
        pipeline::check_digest(digest, s)?;
        let io = |p: &Path, e: std::io::Error| SourceError::from_io(s, p.display().to_string(), e);
        r.blobs += 1;
        r.image_bytes += size;
        let dest = blob_path(&self.dir, digest);
        let have = have_blob(&self.dir, digest, size)
            .map_err(|e| io(&dest, std::io::Error::other(format!("{e:#}"))))?;
        if have {
            return Ok(());
        }
        let (body, origin) = store.blob(digest, s)?;
        let mut vr =
            VerifyingReader::new(body, s.clone(), origin, digest, size, Some(stop.clone()));
        let mut f = tempfile::Builder::new()
            .prefix("blob-")
            .tempfile_in(&self.tmp)
            .map_err(|e| io(&self.tmp, e))?;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match vr.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    return Err(vr.failure.take().unwrap_or_else(|| io(f.path(), e)));
                }
            };
            if let Some(l) = limit {
                l.take(n as u64);
            }
            f.write_all(&buf[..n]).map_err(|e| io(f.path(), e))?;
        }
        vr.finish()?;
        std::fs::set_permissions(
            f.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .map_err(|e| io(f.path(), e))?;
        f.persist(&dest).map_err(|e| io(&dest, e.error))?;
        r.blobs_copied += 1;
        r.bytes_copied += size;
        tracing::info!(blob = digest, bytes = size, "blob copied and verified");
        Ok(())
    }

    /// Stores a manifest or index as it was read (and verified then).
    fn store_document(
        &self,
        doc: &Document,
        label: &str,
        r: &mut OciReport,
    ) -> Result<(), SourceError> {
        let size = doc.bytes.len() as u64;
        r.blobs += 1;
        r.image_bytes += size;
        let s = Subject::new(label, format!("manifest {}", doc.digest));
        let dest = blob_path(&self.dir, &doc.digest);
        let io = |e: anyhow::Error| {
            SourceError::from_io(
                &s,
                dest.display().to_string(),
                std::io::Error::other(format!("{e:#}")),
            )
        };
        if !have_blob(&self.dir, &doc.digest, size).map_err(io)? {
            write_atomic(&dest, &doc.bytes).map_err(io)?;
            r.blobs_copied += 1;
            r.bytes_copied += size;
        }
        Ok(())
    }

    /// Every blob durable before `index.json` names the image.
    fn sync(&self, label: &str) -> Result<(), SourceError> {
        let io = |e: std::io::Error| {
            SourceError::from_io(&Subject::new(label, ""), self.dir.display().to_string(), e)
        };
        let d = std::fs::File::open(&self.dir).map_err(io)?;
        rustix::fs::syncfs(&d).map_err(|e| io(e.into()))
    }
}

/// Writes `oci-layout` if missing; else it must say version 1.0.0.
fn check_layout_file(layout: &Path) -> Result<()> {
    match std::fs::read(layout) {
        Ok(b) => {
            let v: serde_json::Value = serde_json::from_slice(&b)
                .with_context(|| format!("{}: not JSON", layout.display()))?;
            anyhow::ensure!(
                v["imageLayoutVersion"] == "1.0.0",
                "{} is not an OCI image layout 1.0.0",
                layout.display()
            );
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_atomic(layout, OCI_LAYOUT),
        Err(e) => Err(e).with_context(|| format!("reading {}", layout.display())),
    }
}

/// Names `digest` in `index.json` (under `tag`, replacing what the tag
/// named before), atomically.
fn update_index(
    dir: &Path,
    digest: &str,
    media_type: &str,
    size: u64,
    tag: Option<&str>,
) -> Result<()> {
    let path = dir.join("index.json");
    let mut index: serde_json::Value = match std::fs::File::open(&path) {
        Ok(f) => {
            let mut buf = Vec::new();
            f.take(MAX_INDEX_JSON + 1)
                .read_to_end(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            anyhow::ensure!(
                buf.len() as u64 <= MAX_INDEX_JSON,
                "{} is over {MAX_INDEX_JSON} bytes",
                path.display()
            );
            serde_json::from_slice(&buf).with_context(|| format!("parsing {}", path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            serde_json::json!({"schemaVersion": 2, "manifests": []})
        }
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let manifests = index["manifests"]
        .as_array_mut()
        .with_context(|| format!("{}: no manifests list", path.display()))?;
    let name_of = |d: &serde_json::Value| {
        d["annotations"][REF_NAME_ANNOTATION]
            .as_str()
            .map(str::to_owned)
    };
    manifests.retain(|d| match tag {
        Some(t) => name_of(d).as_deref() != Some(t),
        None => !(name_of(d).is_none() && d["digest"] == digest),
    });
    let mut desc = serde_json::json!({
        "mediaType": media_type,
        "digest": digest,
        "size": size,
    });
    if let Some(t) = tag {
        desc["annotations"] = serde_json::json!({ REF_NAME_ANNOTATION: t });
    }
    manifests.push(desc);
    let bytes = serde_json::to_vec(&index).context("serializing index.json")?;
    write_atomic(&path, &bytes)
}

/// SHA-256 digest string of bytes (`sha256:<hex>`).
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}
