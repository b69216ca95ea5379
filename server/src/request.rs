//! What a local publication is asked to publish: the source (an
//! oscontainer root or a plain archive repo), the commit and refs, and the
//! layout names every reader of a source agrees on (where an oscontainer
//! or a native image keeps its repo, and how its commits are found).

use crate::fsutil;
use anyhow::{bail, Result};
use oscontent_format::{self as format, Checksum, ObjectKind};
use std::path::{Path, PathBuf};

/// Where an oscontainer keeps its repo.
pub const OSCONTAINER_REPO: &str = "srv/repo";
/// Where an ostree-native image keeps its (bare-split-xattrs) repo.
pub const NATIVE_ROOT_REPO: &str = "sysroot/ostree/repo";
/// Commits listed when refusing to guess among several.
const MAX_COMMITS_LISTED: usize = 5;

/// Where the content comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Root of an unpacked oscontainer image; the repo is `srv/repo`.
    Oscontainer(PathBuf),
    /// A plain archive repo, served as each publication snapshotted it.
    Repo(PathBuf),
}

impl Source {
    /// What the operator named: the oscontainer root, or the repo.
    pub fn given(&self) -> &Path {
        match self {
            Source::Oscontainer(d) | Source::Repo(d) => d,
        }
    }

    pub fn repo_path(&self) -> PathBuf {
        match self {
            Source::Oscontainer(d) => d.join(OSCONTAINER_REPO),
            Source::Repo(d) => d.clone(),
        }
    }
}

/// What to publish.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub source: Source,
    pub commit: Option<Checksum>,
    pub refs: Vec<String>,
}

/// Every commit object in a repo (bounded by the directory listing limits).
pub fn find_commits(repo: &Path) -> Result<Vec<Checksum>> {
    let mut found = Vec::new();
    let dirs = fsutil::list_dir(repo, "objects", 1024)?.unwrap_or_default();
    for d in dirs.into_iter().filter(|d| d.is_dir && d.name.len() == 2) {
        let rel = format!("objects/{}", d.name);
        for f in fsutil::list_dir(repo, &rel, 10_000_000)?.unwrap_or_default() {
            if let Some(format::RepoPath::Object(o)) =
                format::RepoPath::parse(&format!("{rel}/{}", f.name))
            {
                if o.kind == ObjectKind::Commit && f.is_file {
                    found.push(o.checksum);
                }
            }
        }
    }
    Ok(found)
}

/// The first few of `commits`, for a message that refuses to guess.
pub fn list_some(commits: &[Checksum]) -> String {
    let shown: Vec<String> = commits
        .iter()
        .take(MAX_COMMITS_LISTED)
        .map(|c| c.to_hex())
        .collect();
    let more = if commits.len() > MAX_COMMITS_LISTED {
        ", ..."
    } else {
        ""
    };
    format!("{}{more}", shown.join(", "))
}

/// Finds the one commit object in a repo (an oscontainer holds exactly one).
pub fn find_single_commit(repo: &Path) -> Result<Checksum> {
    match find_commits(repo)?.as_slice() {
        [] => bail!("{} contains no commit object", repo.display()),
        [one] => Ok(*one),
        many => bail!(
            "{} contains {} commits ({}); choose one with --commit",
            repo.display(),
            many.len(),
            list_some(many)
        ),
    }
}
