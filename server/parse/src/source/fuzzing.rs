//! Entry points for the fuzz targets (`tests/fuzz`): the source's parsers
//! of untrusted bytes, driven from memory, with no filesystem, network or
//! clock. Not an API (hidden from the docs); each returns what its target
//! needs to check the parser's invariants.

use super::decode::{self, Decoder};
use super::mirrors::{Endpoint, RegistriesConf};
use super::resolve::{self as pipeline, Root, Store};
use super::{auth, detect, native_path, FetchOptions, Limits, Reference, SourceError, Subject};
use std::collections::BTreeMap;
use std::io::Read;

/// What [`tar_entries`] decided for one entry it would apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedEntry {
    /// The components the entry writes (or, for a whiteout, its marker).
    pub components: Vec<Vec<u8>>,
    /// A symlink's target.
    pub symlink: Option<Vec<u8>>,
    /// A hardlink's target, as components.
    pub hardlink: Option<Vec<Vec<u8>>>,
    /// A whiteout's victim, as components.
    pub whiteout: Option<Vec<Vec<u8>>>,
}

fn owned(c: &[&[u8]]) -> Vec<Vec<u8>> {
    c.iter().map(|c| c.to_vec()).collect()
}

/// The legacy unpacker's decisions for an uncompressed layer: every entry
/// decoded (extension headers, limits) and classified as the unpacker
/// would before writing anything; the entries it would apply, in order.
pub fn tar_entries(tar: &[u8], limits: &Limits) -> Result<Vec<DecodedEntry>, SourceError> {
    let subject = Subject::new("fuzz", "layer");
    let invalid = |e| decode::invalid(&subject, e);
    let mut decoder = Decoder::new(&subject, limits);
    let mut out = Vec::new();
    let mut archive = tar::Archive::new(tar);
    for (count, entry) in archive.entries().map_err(invalid)?.raw(true).enumerate() {
        let mut entry = entry.map_err(invalid)?;
        if count as u64 >= limits.max_entries {
            return Err(SourceError::Invalid {
                subject,
                reason: "too many entries".into(),
            });
        }
        let Some(h) = decoder.header(&mut entry)? else {
            continue;
        };
        // The data is read as the applier would, so a truncated body
        // fails here as it fails there.
        std::io::copy(&mut entry, &mut std::io::sink()).map_err(invalid)?;
        let Some(e) = decode::classify(&h, &subject, limits)? else {
            continue;
        };
        out.push(DecodedEntry {
            components: owned(&e.at.components()),
            symlink: match e.kind {
                decode::Kind::Symlink { target } => Some(target.to_vec()),
                _ => None,
            },
            hardlink: match &e.kind {
                decode::Kind::Hardlink { to, .. } => Some(owned(&to.components())),
                _ => None,
            },
            whiteout: match &e.kind {
                decode::Kind::Whiteout { victim } => Some(owned(&victim.components())),
                _ => None,
            },
        });
    }
    decoder.finish()?;
    Ok(out)
}

/// Where a native layer's entry path falls: split as the unpacker splits
/// it, then classified.
pub fn native_path(path: &[u8]) -> Result<native_path::Place, String> {
    let comps = decode::components(path).map_err(str::to_owned)?;
    native_path::classify(&comps)
}

/// Registry credentials from an `auth.json`: (key, user, password).
pub fn auth_json(bytes: &[u8]) -> Result<Vec<(String, String, String)>, String> {
    let map = auth::parse(std::path::Path::new("auth.json"), bytes)?;
    Ok(map
        .into_iter()
        .map(|(k, c)| (k, c.username, c.password))
        .collect())
}

/// A registries.conf, then the endpoints it gives `registry/repository`.
pub fn registries_conf(
    text: &str,
    registry: &str,
    repository: &str,
    by_digest: bool,
) -> Result<Vec<Endpoint>, String> {
    let conf = RegistriesConf::parse(text)?;
    let reference = if by_digest {
        Reference::Digest(format!("sha256:{}", "0".repeat(64)))
    } else {
        Reference::Tag("latest".into())
    };
    conf.endpoints(registry, repository, &reference, &[])
}

/// Serves documents from memory: the first is the root, each manifest
/// asked for is the next one (digests are the verifier's business, not the
/// parser's: a fuzzer cannot forge SHA-256).
struct Documents<'a> {
    docs: std::slice::Iter<'a, &'a [u8]>,
    layout_tag: Option<Option<String>>,
    media_type: Option<String>,
}

impl Store for Documents<'_> {
    fn root(&mut self, subject: &Subject, _: &FetchOptions) -> Result<Root, SourceError> {
        let bytes = self.next(subject)?;
        Ok(match self.layout_tag.take() {
            Some(tag) => Root::LayoutIndex { bytes, tag },
            None => Root::Document {
                digest: super::verify::sha256_digest(&bytes),
                bytes,
                media_type: self.media_type.take(),
            },
        })
    }

    fn manifest(
        &mut self,
        _: &str,
        _: u64,
        subject: &Subject,
        _: &FetchOptions,
    ) -> Result<Vec<u8>, SourceError> {
        self.next(subject)
    }

    fn blob(
        &mut self,
        _: &str,
        subject: &Subject,
    ) -> Result<(Box<dyn Read + '_>, String), SourceError> {
        let bytes = self.next(subject)?;
        Ok((Box::new(std::io::Cursor::new(bytes)), "memory".into()))
    }
}

impl Documents<'_> {
    fn next(&mut self, subject: &Subject) -> Result<Vec<u8>, SourceError> {
        self.docs
            .next()
            .map(|d| d.to_vec())
            .ok_or_else(|| SourceError::NotFound {
                subject: subject.clone(),
                reason: "no more documents".into(),
            })
    }
}

/// What [`oci_documents`] resolved.
#[derive(Debug)]
pub struct ResolvedImage {
    pub manifest_digest: String,
    /// Documents read on the way (indexes, then the manifest).
    pub documents: usize,
    pub layers: usize,
    /// The config's format, when the next document parsed as a config
    /// whose labels say.
    pub format: Option<Result<ImageFormat, String>>,
}

use super::ImageFormat;

/// Resolves a manifest through indexes (or an OCI layout's `index.json`
/// by tag), as a fetch does; then, if a document is left, reads it as the
/// image config and detects the format from its labels.
pub fn oci_documents(
    docs: &[&[u8]],
    layout_tag: Option<Option<String>>,
    media_type: Option<String>,
) -> Result<ResolvedImage, SourceError> {
    let mut store = Documents {
        docs: docs.iter(),
        layout_tag,
        media_type,
    };
    let opts = FetchOptions::default();
    let r = pipeline::resolve(&mut store, "fuzz", &opts)?;
    let layers = r.manifest.layers().len();
    let format = store.docs.next().and_then(|c| {
        let config: oci_spec::image::ImageConfiguration = serde_json::from_slice(c).ok()?;
        let labels: BTreeMap<String, String> = config
            .config()
            .as_ref()
            .and_then(|c| c.labels().clone())
            .map(|l| l.into_iter().collect())
            .unwrap_or_default();
        Some(
            detect::detect(&labels)
                .map(|d| d.format)
                .map_err(|p| format!("{p:?}")),
        )
    });
    Ok(ResolvedImage {
        manifest_digest: r.manifest_digest,
        documents: r.documents.len(),
        layers,
        format,
    })
}
