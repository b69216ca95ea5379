//! What a stage leaves behind besides the layer refs: `oscontent/staged/<digest
//! hex>`, a ref to a record commit (the staged commit's own tree, the staged
//! commit as its parent) whose metadata `oscontent.staged` is this record
//! as a JSON string. The tree keeps every content object alive when
//! ostree-ext's layer GC or `rpm-ostree cleanup` drops layer refs no image
//! uses yet (prune keeps a ref's tree whatever its depth); the record says
//! which layer refs the stage wrote, for `--list` and `--forget`. Pure.

use super::chain::{Kind, Plan};
use super::image::digest_hex;
use oscontent_format::Checksum;

/// Where the stage records live (below `refs/heads/`).
pub const STAGED_PREFIX: &str = "oscontent/staged/";
/// The record's key in its commit's metadata.
pub const RECORD_KEY: &str = "oscontent.staged";
/// Records above this are refused when read back: a few hundred layers
/// of two digests and a ref each.
pub const MAX_RECORD_SIZE: usize = 1 << 20;

/// The importer's image refs (ostree-ext `container::store::IMAGE_PREFIX`).
pub const IMAGE_PREFIX: &str = "ostree/container/image/";
/// The manifest digest on the importer's merge commit (ostree-ext
/// `container::store::META_MANIFEST_DIGEST`).
pub const MANIFEST_DIGEST_KEY: &str = "ostree.manifest-digest";
/// The manifest JSON on the importer's merge commit (ostree-ext
/// `container::store::META_MANIFEST`).
pub const MANIFEST_KEY: &str = "ostree.manifest";

/// The staged ref of a manifest digest.
pub fn staged_ref(digest: &str) -> String {
    let hex = digest_hex(digest).expect("a checked digest");
    format!("{STAGED_PREFIX}{hex}")
}

/// One layer ref a stage wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordLayer {
    pub digest: String,
    /// Compressed size in the manifest: what the importer would download.
    pub size: u64,
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// What the ref names; `None` for a derived layer (no ref written).
    pub commit: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// `sha256:<hex>` of the manifest.
    pub digest: String,
    /// The reference the operator gave, for people reading `--list`.
    pub reference: String,
    /// The image's ostree commit.
    pub commit: String,
    pub layers: Vec<RecordLayer>,
}

impl Record {
    pub fn new(digest: &str, reference: &str, plan: &Plan) -> Self {
        let layers = plan
            .layers
            .iter()
            .map(|l| RecordLayer {
                digest: l.digest.clone(),
                size: l.size,
                ref_name: l.ref_name.clone(),
                commit: match l.kind {
                    Kind::Commit => Some(plan.commit.to_hex()),
                    Kind::ObjectSet(c) => Some(c.to_hex()),
                    Kind::Derived => None,
                },
            })
            .collect();
        Self {
            digest: digest.to_owned(),
            reference: reference.to_owned(),
            commit: plan.commit.to_hex(),
            layers,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("serialisable")
    }

    /// Parses a record read back from the repo, bounded and checked.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            s.len() <= MAX_RECORD_SIZE,
            "a staged record of {} bytes (at most {MAX_RECORD_SIZE})",
            s.len()
        );
        let r: Record = serde_json::from_str(s)?;
        anyhow::ensure!(
            digest_hex(&r.digest).is_some(),
            "staged record digest {:?}",
            r.digest
        );
        Checksum::from_hex(&r.commit)?;
        for l in &r.layers {
            oscontent_format::validate_ref(&l.ref_name)?;
            if let Some(c) = &l.commit {
                Checksum::from_hex(c)?;
            }
        }
        Ok(r)
    }

    /// The layer refs this record wrote: `(ref, commit)`.
    pub fn refs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.layers
            .iter()
            .filter_map(|l| l.commit.as_deref().map(|c| (l.ref_name.as_str(), c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::chain::PlannedLayer;

    #[test]
    fn a_record_reads_back_as_written() {
        let c = Checksum::from_hex(&"ab".repeat(32)).unwrap();
        let s = Checksum::from_hex(&"cd".repeat(32)).unwrap();
        let d = |n: u8| format!("sha256:{}", hex::encode([n; 32]));
        let plan = Plan {
            commit: c,
            layers: [
                (1, Kind::Commit),
                (2, Kind::ObjectSet(s)),
                (3, Kind::Derived),
            ]
            .into_iter()
            .map(|(n, kind)| PlannedLayer {
                digest: d(n),
                size: n.into(),
                ref_name: format!("ostree/container/blob/sha256_3A_{}", hex::encode([n; 32])),
                kind,
            })
            .collect(),
        };
        let r = Record::new(&d(9), "quay.io/os@x", &plan);
        let back = Record::parse(&r.to_json()).unwrap();
        assert_eq!(back, r);
        let refs: Vec<_> = back.refs().map(|(_, c)| c.to_owned()).collect();
        assert_eq!(refs, [c.to_hex(), s.to_hex()]);
        assert_eq!(
            staged_ref(&d(9)),
            format!("oscontent/staged/{}", hex::encode([9; 32]))
        );
        let bad = r.to_json().replace("ostree/container/blob", "../x");
        assert!(Record::parse(&bad).is_err());
    }
}
