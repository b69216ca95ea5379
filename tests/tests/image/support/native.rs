//! Native images for the suite: a real commit made by stock ostree,
//! written as ostree-ext's tar format (the testkit's `native` module),
//! tampered with as a test needs, then stored as an OCI layout; and the
//! comparison of what stock ostree pulled with the source commit.

use super::TINY_REF;
use oscontent_testkit::native::*;
use oscontent_testkit::oci::{write_layout, Layer, Tar};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};

/// A native image in an OCI layout, and what it was made from.
pub struct NativeImage {
    pub work: tempfile::TempDir,
    pub source: PathBuf,
    pub commit: String,
    pub version: String,
    pub parts: NativeLayers,
    /// The content objects of each chunk layer (layers 2, 3, ...).
    pub chunks: Vec<Vec<String>>,
    pub layout: PathBuf,
    pub tag: String,
    /// `sha256:…` of each layer blob, in manifest order.
    pub layer_digests: Vec<String>,
}

impl NativeImage {
    /// `oci:LAYOUT:TAG`.
    pub fn reference(&self) -> String {
        format!("oci:{}:{}", self.layout.display(), self.tag)
    }

    /// `layer I/N sha256:…`, as errors name the layer holding `checksum`.
    pub fn layer_of(&self, checksum: &str) -> String {
        let i = self
            .chunks
            .iter()
            .position(|c| c.iter().any(|s| s == checksum))
            .map_or(0, |i| i + 1);
        format!(
            "layer {}/{} {}",
            i + 1,
            self.layer_digests.len(),
            self.layer_digests[i]
        )
    }
}

/// The biggest content object of a commit.
pub fn biggest(parts: &NativeLayers) -> String {
    parts
        .files
        .values()
        .max_by_key(|f| f.content.len())
        .unwrap()
        .checksum
        .clone()
}

/// Changes one part of a native image.
pub type Edit<T> = Option<Box<dyn FnOnce(&mut T)>>;

/// What a test changes in a native image before it is stored.
#[derive(Default)]
pub struct Tamper {
    /// Changes the objects (content, removal) before the layers are laid out.
    pub parts: Edit<NativeLayers>,
    /// Changes the layers' tar streams (appends entries).
    pub tars: Edit<Vec<Tar>>,
    /// Layers on top, after the final diff ID.
    pub derived: Vec<Tar>,
    /// Changes the labels.
    pub labels: Edit<Vec<(&'static str, String)>>,
    /// Changes the layers as the config and manifest describe them (after
    /// the final diff ID label is taken from them).
    pub layers: Edit<Vec<Layer>>,
}

/// A commit (seed `seed`) as a native image: the commit layer and two
/// chunk layers, the `ostree.final-diffid` the last of them, changed as
/// `tamper` says.
pub fn native_image(seed: u32, tamper: Tamper) -> NativeImage {
    let work = tempdir();
    let version = format!("2.{seed}");
    let source = work.path().join("source");
    let commit = source_commit(&source, TINY_REF, &version, seed).unwrap();
    let mut parts = NativeLayers::read(&source, &commit).unwrap();
    if let Some(f) = tamper.parts {
        f(&mut parts);
    }
    // The first content object stays in the commit layer; the rest are
    // split into two chunks.
    let sums = parts.file_checksums();
    let (a, b) = sums[1..].split_at(sums.len() / 2);
    let chunks = vec![a.to_vec(), b.to_vec()];
    let mut tars = parts.layers(&chunks);
    if let Some(f) = tamper.tars {
        f(&mut tars);
    }
    let mut layers: Vec<Layer> = tars.into_iter().map(|t| Layer::gz(t.finish())).collect();
    let final_diffid = layers.last().unwrap().diff_id.clone();
    layers.extend(tamper.derived.into_iter().map(|t| Layer::gz(t.finish())));
    if let Some(f) = tamper.layers {
        f(&mut layers);
    }
    let mut labels: Vec<(&'static str, String)> = native_labels(&commit, &final_diffid, &version)
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
    if let Some(f) = tamper.labels {
        f(&mut labels);
    }
    let refs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let layout = work.path().join("oci");
    let tag = "native".to_owned();
    write_layout(&layout, &tag, &layers, &refs);
    let layer_digests = layers
        .iter()
        .map(|l| oscontent_testkit::oci::sha256_digest(&l.blob))
        .collect();
    NativeImage {
        work,
        source,
        commit,
        version,
        parts,
        chunks,
        layout,
        tag,
        layer_digests,
    }
}

/// `parts` laid out as `img` was (same chunks, labels for `img`'s commit)
/// in a new layout under `dir`; its reference.
pub fn relayout(img: &NativeImage, parts: &NativeLayers, dir: &Path) -> String {
    let layers: Vec<Layer> = parts
        .layers(&img.chunks)
        .into_iter()
        .map(|t| Layer::gz(t.finish()))
        .collect();
    let final_diffid = layers.last().unwrap().diff_id.clone();
    let labels = native_labels(&img.commit, &final_diffid, &img.version);
    write_layout(dir, &img.tag, &layers, &labels);
    format!("oci:{}:{}", dir.display(), img.tag)
}

/// A native image exactly as the format writes it.
pub fn plain_native_image(seed: u32) -> NativeImage {
    native_image(seed, Tamper::default())
}

/// Stock `ostree pull` of `r` from the server into a bare repo (owners,
/// modes and xattrs as on a node's disk), then fsck.
pub fn pull_bare(server: &Server, r: &str, commit: &str) -> (tempfile::TempDir, Ostree) {
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    repo.pull(&["os", r])
        .unwrap_or_else(|e| panic!("stock ostree pull: {e:#}\n{}", server.stderr()));
    assert_eq!(repo.rev_parse(&format!("os:{r}")).unwrap(), commit);
    repo.fsck().unwrap();
    (tmp, repo)
}
