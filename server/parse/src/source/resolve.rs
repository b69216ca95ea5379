//! The first step of every fetch, the same for every kind of source:
//! resolve the manifest from the root document, through indexes (by
//! platform) or an OCI layout's `index.json` (by tag). The documents come
//! from a [`Store`]; the server's stores read registries and layouts, the
//! fuzz targets' read memory.

use super::error::{SourceError, Subject};
use super::reference::{normalize_arch, Platform};
use super::FetchOptions;
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use std::io::Read;

/// Index → index → manifest nesting allowed (a layout's index.json
/// pointing at a multi-arch index is two).
pub const MAX_INDEX_DEPTH: usize = 4;
/// The annotation naming a manifest in an OCI layout's index.json.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Config media types an image may have.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// Where the first document comes from.
#[derive(Debug)]
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

/// An [`SourceError::Invalid`] about `subject`.
pub fn invalid(subject: &Subject, reason: impl Into<String>) -> SourceError {
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
#[derive(Debug)]
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
#[derive(Debug)]
pub struct Document {
    pub digest: String,
    pub media_type: Option<String>,
    pub bytes: Vec<u8>,
}

/// Reads the root document, then indexes down to the platform's manifest
/// (at most [`MAX_INDEX_DEPTH`] deep), every one from `store`.
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
