//! Objects of a repo on disk, and tiny repos built for a test.

use anyhow::{anyhow, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Object kinds, normalised across repo modes (`.file` and `.filez` are
/// both content).
pub const CONTENT: &str = "content";

/// Objects of a repo: kind (`commit`, `dirtree`, `dirmeta`, `content`,
/// `commitmeta`, ...) to checksums.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSet(pub BTreeMap<String, BTreeSet<String>>);

impl ObjectSet {
    pub fn get(&self, kind: &str) -> BTreeSet<String> {
        self.0.get(kind).cloned().unwrap_or_default()
    }

    pub fn contains(&self, kind: &str, checksum: &str) -> bool {
        self.0.get(kind).is_some_and(|s| s.contains(checksum))
    }

    pub fn len(&self) -> usize {
        self.0.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Normalises an object file extension to a kind.
pub fn object_kind(ext: &str) -> &str {
    match ext {
        "file" | "filez" => CONTENT,
        other => other,
    }
}

/// Lists `objects/XX/*.EXT` of a repo directory without the ostree CLI (so
/// that shared fixtures are never opened by a tool that may write).
pub fn list_objects(repo: &Path) -> Result<ObjectSet> {
    let mut set = ObjectSet::default();
    let objects = repo.join("objects");
    for d in
        std::fs::read_dir(&objects).with_context(|| format!("listing {}", objects.display()))?
    {
        let d = d?;
        let prefix = d.file_name().to_string_lossy().into_owned();
        if prefix.len() != 2 || !d.file_type()?.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(d.path())? {
            let f = f?;
            let name = f.file_name().to_string_lossy().into_owned();
            let Some((rest, ext)) = name.split_once('.') else {
                continue;
            };
            if rest.len() != 62 {
                continue;
            }
            set.0
                .entry(object_kind(ext).to_owned())
                .or_default()
                .insert(format!("{prefix}{rest}"));
        }
    }
    Ok(set)
}

/// Path of an object file in an archive repo.
pub fn object_path(repo: &Path, checksum: &str, ext: &str) -> PathBuf {
    repo.join("objects")
        .join(&checksum[..2])
        .join(format!("{}.{ext}", &checksum[2..]))
}

/// The URL path of an object.
pub fn object_url_path(checksum: &str, ext: &str) -> String {
    format!("/objects/{}/{}.{ext}", &checksum[..2], &checksum[2..])
}

/// The `.filez` objects of an archive repo: (checksum, size).
pub fn filez_sizes(repo: &Path) -> Result<Vec<(String, u64)>> {
    let objs = list_objects(repo)?;
    Ok(objs
        .get(CONTENT)
        .into_iter()
        .map(|c| {
            let len = std::fs::metadata(object_path(repo, &c, "filez"))
                .map(|m| m.len())
                .unwrap_or(0);
            (c, len)
        })
        .collect())
}

/// The largest `.filez` object of an archive repo: (checksum, size).
pub fn largest_filez(repo: &Path) -> Result<(String, u64)> {
    filez_sizes(repo)?
        .into_iter()
        .max_by_key(|(_, l)| *l)
        .ok_or_else(|| anyhow!("{} has no content objects", repo.display()))
}

/// SHA-256 of bytes, hex.
pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}
