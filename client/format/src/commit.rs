//! Commit objects: `(a{sv}aya(say)sstayay)`.

use crate::checksum::Checksum;
use crate::error::FormatError;
use crate::variant::{check_size, parse_normal};
use ostree::glib::{Variant, VariantDict, VariantTy};

pub const COMMIT_GVARIANT_TYPE: &str = "(a{sv}aya(say)sstayay)";

/// Commit objects above this size are refused: real ones are a few KiB
/// (metadata included), and this bounds what untrusted input can cost.
pub const MAX_COMMIT_SIZE: usize = 16 << 20;

/// The ref-binding metadata key stock ostree checks on pull.
pub const REF_BINDING_KEY: &str = "ostree.ref-binding";
pub const COLLECTION_BINDING_KEY: &str = "ostree.collection-binding";
pub const VERSION_KEY: &str = "version";

/// A parsed commit object.
#[derive(Debug, Clone)]
pub struct Commit {
    /// The checksum of the exact bytes parsed.
    pub checksum: Checksum,
    /// Serialized size in bytes (what a summary records).
    pub size: u64,
    pub metadata: Variant,
    pub parent: Option<Checksum>,
    pub subject: String,
    pub body: String,
    /// Seconds since the epoch (stored big-endian on disk).
    pub timestamp: u64,
    pub root_tree: Checksum,
    pub root_meta: Checksum,
}

const WHAT: &str = "commit object";

fn err(why: impl Into<String>) -> FormatError {
    FormatError::Variant {
        what: WHAT,
        why: why.into(),
    }
}

impl Commit {
    /// Parses commit bytes. The bytes must be in GVariant normal form, so
    /// that what we parse is what ostree hashes.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        check_size(bytes, MAX_COMMIT_SIZE, WHAT)?;
        let v = parse_normal(bytes, COMMIT_GVARIANT_TYPE, WHAT)?;
        let checksum_at = |i: usize, what: &str| -> Result<Checksum, FormatError> {
            let c = v.child_value(i);
            let b = c
                .fixed_array::<u8>()
                .map_err(|e| err(format!("{what}: {e}")))?;
            Checksum::from_bytes(b).map_err(|_| err(format!("{what}: {} bytes, want 32", b.len())))
        };
        let parent_v = v.child_value(1);
        let parent = match parent_v
            .fixed_array::<u8>()
            .map_err(|e| err(e.to_string()))?
        {
            [] => None,
            b => Some(Checksum::from_bytes(b).map_err(|_| err("parent checksum is not 32 bytes"))?),
        };
        Ok(Self {
            checksum: Checksum::digest(bytes),
            size: bytes.len() as u64,
            metadata: v.child_value(0),
            parent,
            subject: v.child_value(3).str().unwrap_or_default().to_owned(),
            body: v.child_value(4).str().unwrap_or_default().to_owned(),
            timestamp: u64::from_be(
                v.child_value(5)
                    .get::<u64>()
                    .ok_or_else(|| err("timestamp"))?,
            ),
            root_tree: checksum_at(6, "root dirtree")?,
            root_meta: checksum_at(7, "root dirmeta")?,
        })
    }

    fn lookup(&self, key: &str, ty: &str) -> Option<Variant> {
        let ty = VariantTy::new(ty).ok()?;
        VariantDict::new(Some(&self.metadata)).lookup_value(key, Some(ty))
    }

    /// The `version` metadata string, if any.
    pub fn version(&self) -> Option<String> {
        self.lookup(VERSION_KEY, "s")
            .and_then(|v| v.str().map(str::to_owned))
    }

    /// The refs this commit is bound to (`ostree.ref-binding`, `as`), or
    /// `None` if it carries no binding. `Some(empty)` is a commit stock
    /// ostree refuses to pull under any ref name.
    pub fn ref_binding(&self) -> Option<Vec<String>> {
        self.lookup(REF_BINDING_KEY, "as")
            .and_then(|v| v.get::<Vec<String>>())
    }

    /// The bound refs; empty when there is no (or an empty) binding.
    pub fn ref_bindings(&self) -> Vec<String> {
        self.ref_binding().unwrap_or_default()
    }

    pub fn collection_binding(&self) -> Option<String> {
        self.lookup(COLLECTION_BINDING_KEY, "s")
            .and_then(|v| v.str().map(str::to_owned))
    }

    /// A metadata value rendered as text, for `ostree show`-like output.
    pub fn metadata_value(&self, key: &str) -> Option<Variant> {
        VariantDict::new(Some(&self.metadata)).lookup_value(key, None)
    }
}
