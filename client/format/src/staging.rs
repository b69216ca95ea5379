//! What a node needs to stage an ostree-native image in the form
//! ostree-ext's container importer (rpm-ostree, bootc) reads back as
//! "layer already fetched", shared by the server that publishes it and the
//! client that stages it.
//!
//! The importer decides per layer with one ref, [`layer_ref`]: for the
//! first (commit) layer it names the ostree commit; for each chunk layer up
//! to `ostree.final-diffid` it names an *object-set commit*
//! (`tar::Importer::finish_import_object_set` in ostree-ext): a root tree
//! with each of the layer's content objects as a file named by its own
//! checksum, the default dirmeta (uid 0, gid 0, mode 040755, no xattrs),
//! time 0, no parent, subject, body or metadata. [`ObjectSet::build`]
//! makes those bytes, so server and client compute the same commit ID.
//!
//! [`StagingIndex`] lists, for each image the server streamed, its manifest
//! and config digests, its commit and its layers. It travels in the
//! summary's metadata under [`SUMMARY_KEY`] as the GVariant
//! [`STAGING_GVARIANT_TYPE`], so `summary.sig` covers it and a signer
//! reproduces it: images sorted by manifest digest, layers in manifest
//! order, sizes in GVariant's own little-endian (no byte swap: nothing in
//! libostree reads them).

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::tree::{parse_dirtree, DIRMETA_GVARIANT_TYPE, DIRTREE_GVARIANT_TYPE};
use crate::variant::{check_size, parse_normal, ty};
use glib::prelude::ToVariant;
use glib::Variant;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The summary metadata key the index is stored under.
pub const SUMMARY_KEY: &str = "oscontent.staging";
/// Images: `(manifest digest, manifest size, config digest, config size,
/// ostree commit, layers)`; layers: `(layer digest, layer ref, kind, commit
/// the ref names, empty for a derived layer)`.
pub const STAGING_GVARIANT_TYPE: &str = "a(ststaya(ssyay))";
/// The prefix of ostree-ext's layer refs (`container/store.rs`).
pub const LAYER_REF_PREFIX: &str = "ostree/container/blob";
/// More images than one server streams at once.
pub const MAX_STAGED_IMAGES: usize = 1024;
/// More layers than an ostree-native image has (ostree-ext splits into at
/// most 64 by default; registries refuse a few hundred).
pub const MAX_LAYERS: usize = 1024;
/// A manifest or config bigger than this is not listed: the client fetches
/// exactly the size the index names, so the index bounds it.
pub const MAX_BLOB_SIZE: u64 = 16 << 20;
/// An index bigger than this is refused before it is walked.
pub const MAX_INDEX_SIZE: usize = 16 << 20;
/// More content objects than one layer holds (an OS image has ~100,000 in
/// all).
pub const MAX_OBJECT_SET: usize = 1_000_000;

const WHAT: &str = "staging index";

fn err(what: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what,
        why: why.into(),
    }
}

/// `sha256:<hex>`, as OCI spells a digest.
pub fn digest_string(d: &Checksum) -> String {
    format!("sha256:{}", d.to_hex())
}

/// The reverse of [`digest_string`]: only SHA-256, in lowercase hex.
pub fn parse_digest(s: &str) -> Result<Checksum, FormatError> {
    let hex = s
        .strip_prefix("sha256:")
        .ok_or_else(|| err("digest", format!("{:?} is not sha256:<hex>", trunc(s))))?;
    Checksum::from_hex(hex)
}

fn trunc(s: &str) -> String {
    s.chars().take(80).collect()
}

/// ostree-ext's escaping of arbitrary text into a ref (`refescape.rs`):
/// ASCII letters and digits pass, `-` passes, `_` doubles, `/` passes
/// between an alphanumeric and something more, and every other character
/// becomes `_XX_`, its code point in uppercase hex.
fn escape_for_ref(s: &str, out: &mut String) {
    let mut chars = s.chars().peekable();
    let mut after_alnum = false;
    while let Some(c) = chars.next() {
        let alnum = c.is_ascii_alphanumeric();
        match c {
            _ if alnum => out.push(c),
            '/' if after_alnum && chars.peek().is_some() => out.push(c),
            '-' => out.push(c),
            '_' => out.push_str("__"),
            _ => write!(out, "_{:02X}_", u32::from(c)).expect("a String takes writes"),
        }
        after_alnum = alnum;
    }
}

/// The ref ostree-ext's importer looks a layer up by:
/// `ostree/container/blob/sha256_3A_<hex>`.
pub fn layer_ref(digest: &Checksum) -> String {
    let mut r = String::with_capacity(LAYER_REF_PREFIX.len() + 1 + 10 + Checksum::HEX_LEN);
    r.push_str(LAYER_REF_PREFIX);
    r.push('/');
    escape_for_ref(&digest_string(digest), &mut r);
    r
}

/// The layer digest a [`layer_ref`] names, or `None` for any other ref
/// (including another spelling of the same digest: one layer, one ref).
pub fn layer_digest(r: &str) -> Option<Checksum> {
    let hex = r
        .strip_prefix(LAYER_REF_PREFIX)?
        .strip_prefix("/sha256_3A_")?;
    let d = Checksum::from_hex(hex).ok()?;
    (layer_ref(&d) == r).then_some(d)
}

/// One built object: its bytes and the checksum that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub checksum: Checksum,
    pub bytes: Vec<u8>,
}

impl Built {
    fn of(v: &Variant) -> Self {
        let bytes = v.data().to_vec();
        Self {
            checksum: Checksum::digest(&bytes),
            bytes,
        }
    }
}

/// An object-set commit's three objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltObjectSet {
    pub commit: Built,
    pub dirtree: Built,
    pub dirmeta: Built,
}

/// The content objects of one chunk layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSet {
    /// Sorted by bytes, which is the order of their hex names: the order
    /// libostree writes a dirtree's files in.
    objects: BTreeSet<Checksum>,
}

impl ObjectSet {
    /// The set of `objects`. A checksum twice is refused, as the importer
    /// refuses a layer that carries an object twice.
    pub fn new(objects: impl IntoIterator<Item = Checksum>) -> Result<Self, FormatError> {
        let mut set = BTreeSet::new();
        for o in objects {
            if set.len() >= MAX_OBJECT_SET {
                return Err(err(
                    "object set",
                    format!("more than {MAX_OBJECT_SET} objects"),
                ));
            }
            if !set.insert(o) {
                return Err(err("object set", format!("object {o} listed twice")));
            }
        }
        Ok(Self { objects: set })
    }

    /// The set a served object-set dirtree lists: files only, each named
    /// by its own checksum. Anything else is not an object set.
    pub fn from_dirtree(bytes: &[u8]) -> Result<Self, FormatError> {
        let tree = parse_dirtree(bytes)?;
        if let Some((name, _, _)) = tree.dirs.first() {
            return Err(err(
                "object set",
                format!("has a subdirectory {:?}", trunc(name)),
            ));
        }
        let mut objects = Vec::with_capacity(tree.files.len());
        for (name, checksum) in tree.files {
            if name != checksum.to_hex() {
                return Err(err(
                    "object set",
                    format!("file {:?} names object {checksum}", trunc(&name)),
                ));
            }
            objects.push(checksum);
        }
        Self::new(objects)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn contains(&self, c: &Checksum) -> bool {
        self.objects.contains(c)
    }

    /// The objects, in dirtree order.
    pub fn iter(&self) -> impl Iterator<Item = &Checksum> {
        self.objects.iter()
    }

    /// The commit, dirtree and dirmeta the importer writes for this set.
    pub fn build(&self) -> BuiltObjectSet {
        let ay = |c: &Checksum| Variant::array_from_fixed_array(c.as_bytes());
        let files = Variant::array_from_iter_with_type(
            ty("(say)"),
            self.objects
                .iter()
                .map(|c| Variant::tuple_from_iter([c.to_hex().to_variant(), ay(c)])),
        );
        let dirs = Variant::array_from_iter_with_type(ty("(sayay)"), [] as [Variant; 0]);
        let dirtree = Variant::tuple_from_iter([files, dirs]);
        debug_assert_eq!(dirtree.type_(), ty(DIRTREE_GVARIANT_TYPE));
        let dirmeta = default_dirmeta();
        let (dirtree, dirmeta) = (Built::of(&dirtree), Built::of(&dirmeta));
        let commit = Variant::tuple_from_iter([
            Variant::array_from_iter_with_type(ty("{sv}"), [] as [Variant; 0]),
            Variant::array_from_fixed_array::<u8>(&[]),
            Variant::array_from_iter_with_type(ty("(say)"), [] as [Variant; 0]),
            "".to_variant(),
            "".to_variant(),
            0u64.to_variant(),
            ay(&dirtree.checksum),
            ay(&dirmeta.checksum),
        ]);
        debug_assert_eq!(commit.type_(), ty(crate::commit::COMMIT_GVARIANT_TYPE));
        BuiltObjectSet {
            commit: Built::of(&commit),
            dirtree,
            dirmeta,
        }
    }
}

/// ostree-ext's default dirmeta: uid 0, gid 0, mode 040755, no xattrs
/// (integers big-endian, as libostree stores them).
fn default_dirmeta() -> Variant {
    let v = Variant::tuple_from_iter([
        0u32.to_be().to_variant(),
        0u32.to_be().to_variant(),
        0o040755u32.to_be().to_variant(),
        Variant::array_from_iter_with_type(ty("(ayay)"), [] as [Variant; 0]),
    ]);
    debug_assert_eq!(v.type_(), ty(DIRMETA_GVARIANT_TYPE));
    v
}

/// What a layer's ref names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// The first layer: its ref names the image's ostree commit.
    Commit,
    /// A chunk layer up to `ostree.final-diffid`: its ref names this
    /// object-set commit.
    ObjectSet(Checksum),
    /// A layer after `ostree.final-diffid`: not staged.
    Derived,
}

impl LayerKind {
    const COMMIT: u8 = 0;
    const OBJECT_SET: u8 = 1;
    const DERIVED: u8 = 2;
}

/// One layer of a staged image, in manifest order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedLayer {
    pub digest: Checksum,
    pub kind: LayerKind,
}

impl StagedLayer {
    /// The ref the importer looks this layer up by.
    pub fn ref_name(&self) -> String {
        layer_ref(&self.digest)
    }
}

/// One image the server streamed and serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedImage {
    /// The manifest's digest: what a node pins.
    pub manifest: Checksum,
    pub manifest_size: u64,
    pub config: Checksum,
    pub config_size: u64,
    /// The config's `ostree.commit`.
    pub commit: Checksum,
    pub layers: Vec<StagedLayer>,
}

impl StagedImage {
    /// The index's rules for one image: bounded sizes and layer count, the
    /// first layer (and only it) the commit layer, no object set or commit
    /// once a layer is derived, and each commit layer naming `commit`.
    fn check(&self) -> Result<(), FormatError> {
        let bad = |why: String| err(WHAT, format!("image {}: {why}", self.manifest));
        for (what, size) in [
            ("manifest", self.manifest_size),
            ("config", self.config_size),
        ] {
            if size > MAX_BLOB_SIZE {
                return Err(bad(format!(
                    "{what} of {size} bytes (limit {MAX_BLOB_SIZE})"
                )));
            }
        }
        if self.layers.is_empty() || self.layers.len() > MAX_LAYERS {
            return Err(bad(format!(
                "{} layers (want 1 to {MAX_LAYERS})",
                self.layers.len()
            )));
        }
        let mut derived = false;
        for (i, l) in self.layers.iter().enumerate() {
            match (i, l.kind) {
                (0, LayerKind::Commit) => {}
                (0, _) => return Err(bad("the first layer is not the commit layer".into())),
                (_, LayerKind::Commit) => {
                    return Err(bad(format!("layer {i} is a second commit layer")))
                }
                (_, LayerKind::ObjectSet(_)) if derived => {
                    return Err(bad(format!(
                        "layer {i} is an object set after a derived one"
                    )))
                }
                (_, LayerKind::ObjectSet(_)) => {}
                (_, LayerKind::Derived) => derived = true,
            }
        }
        Ok(())
    }

    /// The layers the importer needs staged (all but the derived ones).
    pub fn staged_layers(&self) -> impl Iterator<Item = &StagedLayer> {
        self.layers
            .iter()
            .filter(|l| !matches!(l.kind, LayerKind::Derived))
    }

    /// What the importer's ref for `layer` names, if the layer is staged.
    pub fn ref_target(&self, layer: &StagedLayer) -> Option<Checksum> {
        match layer.kind {
            LayerKind::Commit => Some(self.commit),
            LayerKind::ObjectSet(c) => Some(c),
            LayerKind::Derived => None,
        }
    }
}

/// The images a server publishes for staging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StagingIndex {
    pub images: Vec<StagedImage>,
}

impl StagingIndex {
    /// The image pinned by `manifest`, if served.
    pub fn image(&self, manifest: &Checksum) -> Option<&StagedImage> {
        self.images.iter().find(|i| &i.manifest == manifest)
    }

    /// The index as the summary carries it. Deterministic: images sorted by
    /// manifest digest, whatever their order here. An image twice, or one
    /// that breaks [`StagedImage`]'s rules, is refused.
    pub fn to_variant(&self) -> Result<Variant, FormatError> {
        if self.images.len() > MAX_STAGED_IMAGES {
            return Err(err(WHAT, format!("more than {MAX_STAGED_IMAGES} images")));
        }
        let mut sorted: Vec<&StagedImage> = self.images.iter().collect();
        sorted.sort_by_key(|i| i.manifest);
        for w in sorted.windows(2) {
            if w[0].manifest == w[1].manifest {
                return Err(err(WHAT, format!("image {} listed twice", w[0].manifest)));
            }
        }
        let ay = |c: &Checksum| Variant::array_from_fixed_array(c.as_bytes());
        let mut images = Vec::with_capacity(sorted.len());
        for i in sorted {
            i.check()?;
            let layers = i.layers.iter().map(|l| {
                let (kind, target) = match l.kind {
                    LayerKind::Commit => (LayerKind::COMMIT, ay(&i.commit)),
                    LayerKind::ObjectSet(c) => (LayerKind::OBJECT_SET, ay(&c)),
                    LayerKind::Derived => (
                        LayerKind::DERIVED,
                        Variant::array_from_fixed_array::<u8>(&[]),
                    ),
                };
                Variant::tuple_from_iter([
                    digest_string(&l.digest).to_variant(),
                    l.ref_name().to_variant(),
                    kind.to_variant(),
                    target,
                ])
            });
            images.push(Variant::tuple_from_iter([
                digest_string(&i.manifest).to_variant(),
                i.manifest_size.to_variant(),
                digest_string(&i.config).to_variant(),
                i.config_size.to_variant(),
                ay(&i.commit),
                Variant::array_from_iter_with_type(ty("(ssyay)"), layers),
            ]));
        }
        let v = Variant::array_from_iter_with_type(ty("(ststaya(ssyay))"), images);
        debug_assert_eq!(v.type_(), ty(STAGING_GVARIANT_TYPE));
        Ok(v)
    }

    /// [`Self::to_variant`]'s bytes.
    pub fn build(&self) -> Result<Vec<u8>, FormatError> {
        Ok(self.to_variant()?.data().to_vec())
    }

    /// Parses index bytes from an untrusted remote: bounded in size, image
    /// and layer counts; images strictly sorted; every ref the one its
    /// layer digest gives; each commit layer naming the image's commit.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        check_size(bytes, MAX_INDEX_SIZE, WHAT)?;
        Self::from_variant(&parse_normal(bytes, STAGING_GVARIANT_TYPE, WHAT)?)
    }

    /// [`Self::parse`] of a value already read (the summary's metadata).
    pub fn from_variant(v: &Variant) -> Result<Self, FormatError> {
        if v.type_() != ty(STAGING_GVARIANT_TYPE) {
            return Err(err(WHAT, format!("type {}", v.type_())));
        }
        check_size(v.data(), MAX_INDEX_SIZE, WHAT)?;
        if v.n_children() > MAX_STAGED_IMAGES {
            return Err(err(WHAT, format!("more than {MAX_STAGED_IMAGES} images")));
        }
        let mut images: Vec<StagedImage> = Vec::with_capacity(v.n_children());
        for iv in v.iter() {
            let image = parse_image(&iv)?;
            if let Some(prev) = images.last() {
                if prev.manifest >= image.manifest {
                    return Err(err(
                        WHAT,
                        format!("images not strictly sorted at {}", image.manifest),
                    ));
                }
            }
            images.push(image);
        }
        Ok(Self { images })
    }
}

fn checksum_of(v: &Variant, what: &str) -> Result<Checksum, FormatError> {
    let b = v
        .fixed_array::<u8>()
        .map_err(|e| err(WHAT, format!("{what}: {e}")))?;
    Checksum::from_bytes(b).map_err(|_| err(WHAT, format!("{what}: {} bytes, want 32", b.len())))
}

fn digest_of(v: &Variant, what: &str) -> Result<Checksum, FormatError> {
    let s = v.str().unwrap_or_default();
    parse_digest(s).map_err(|e| err(WHAT, format!("{what}: {e}")))
}

fn parse_image(iv: &Variant) -> Result<StagedImage, FormatError> {
    let manifest = digest_of(&iv.child_value(0), "manifest digest")?;
    let in_image = |why: String| err(WHAT, format!("image {manifest}: {why}"));
    let commit = checksum_of(&iv.child_value(4), "commit")?;
    let lv = iv.child_value(5);
    if lv.n_children() > MAX_LAYERS {
        return Err(in_image(format!("more than {MAX_LAYERS} layers")));
    }
    let mut layers = Vec::with_capacity(lv.n_children());
    for (i, l) in lv.iter().enumerate() {
        let digest = digest_of(&l.child_value(0), "layer digest")?;
        let named = l.child_value(1).str().unwrap_or_default().to_owned();
        if named != layer_ref(&digest) {
            return Err(in_image(format!(
                "layer {i} ({}) under ref {:?}",
                digest_string(&digest),
                trunc(&named)
            )));
        }
        let target = l.child_value(3);
        let kind = match l.child_value(2).get::<u8>().unwrap_or(u8::MAX) {
            LayerKind::COMMIT => {
                if checksum_of(&target, "layer commit")? != commit {
                    return Err(in_image(format!(
                        "layer {i} names another commit than the image's"
                    )));
                }
                LayerKind::Commit
            }
            LayerKind::OBJECT_SET => LayerKind::ObjectSet(checksum_of(&target, "object set")?),
            LayerKind::DERIVED if target.n_children() == 0 => LayerKind::Derived,
            LayerKind::DERIVED => {
                return Err(in_image(format!("derived layer {i} names a commit")))
            }
            k => return Err(in_image(format!("layer {i} of unknown kind {k}"))),
        };
        layers.push(StagedLayer { digest, kind });
    }
    let image = StagedImage {
        manifest,
        manifest_size: iv.child_value(1).get::<u64>().unwrap_or(u64::MAX),
        config: digest_of(&iv.child_value(2), "config digest")?,
        config_size: iv.child_value(3).get::<u64>().unwrap_or(u64::MAX),
        commit,
        layers,
    };
    image.check()?;
    Ok(image)
}

#[cfg(test)]
mod tests;
