//! `--oscontainer DIR` on an ostree-native image root (a mounted image
//! volume, or an unpacked image: `DIR/sysroot/ostree/repo`, mode
//! `bare-split-xattrs`, no labels). Such a repo cannot be served as it
//! stands (its content objects are bare files), so the commit's closure is
//! converted into an archive repo under the state dir, through the same
//! [`Objects`] a streamed native image goes through: metadata hashed to
//! its name, content re-encoded to `.filez` and kept only if libostree's
//! content checksum (over owner, mode, xattrs and bytes as found on disk)
//! is its name, the closure complete. Nothing is ever written into `DIR`.
//!
//! On disk the format is the layer's one, materialized: a `.file`'s owner
//! and mode are the file's own, and its xattrs are the bytes of its
//! `.file-xattrs-link` (a hardlink to a `.file-xattrs`), or of the older
//! `.file.xattrs`. A content object with neither has no xattrs; if it
//! should have had some, its checksum says so.
//!
//! The conversion is kept while its commit is the one to serve: a
//! refresh (SIGHUP, new signatures) re-converts only when the commit
//! changed. Each conversion is removed once no generation serves it.

use super::closure::join;
use super::objects::{max_metadata_size, Objects, WriteError};
use super::Converter;
use crate::fsutil;
use crate::request::{
    find_single_commit, PublishRequest, Source, NATIVE_ROOT_REPO, OSCONTAINER_REPO,
};
use crate::source::{Limits, SourceError, Subject, IMAGE_PREFIX, STAGING_PREFIX};
use crate::state::{check_disjoint, StateDir};
use anyhow::{Context, Result};
use oscontent_format::filez::FileMeta;
use oscontent_format::{self as format, Checksum, Commit, ObjectKind, ObjectName, RepoConfig};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Under the state dir: the native roots converted for serving.
pub const ROOTS_DIR: &str = "native-roots";
/// The mode of the repo a native image carries.
pub const NATIVE_MODE: &str = "bare-split-xattrs";
/// Largest xattrs set (ostree-ext's own limit, as for layers).
const MAX_XATTRS: u64 = super::layer::MAX_XATTRS_SIZE;

/// The native repo of `root`, if `root` is an ostree-native image root:
/// `sysroot/ostree/repo` in `bare-split-xattrs` mode and no `srv/repo`
/// (which makes it a legacy root, served in place). A repo of another mode
/// there is an error saying which.
pub fn native_repo(root: &Path) -> Result<Option<PathBuf>> {
    let repo = root.join(NATIVE_ROOT_REPO);
    if root.join(OSCONTAINER_REPO).exists() || !repo.is_dir() {
        return Ok(None);
    }
    let max = format::config::MAX_CONFIG_SIZE as u64;
    let (config, _) = fsutil::read_file(&repo, "config", max)
        .with_context(|| format!("reading {}/config", repo.display()))?
        .with_context(|| format!("{} has no config: not an ostree repo", repo.display()))?;
    let config =
        RepoConfig::parse(&config).with_context(|| format!("reading {}/config", repo.display()))?;
    let mode = config.mode.as_deref().unwrap_or("bare");
    anyhow::ensure!(
        mode == NATIVE_MODE,
        "{} is a {mode:?} repo; an ostree-native image root carries a {NATIVE_MODE:?} one (the legacy format's is srv/repo)",
        repo.display()
    );
    Ok(Some(repo))
}

/// A native root's commit converted into an archive repo (`root/srv/repo`),
/// removed when dropped (when no generation serves it any more).
#[derive(Debug)]
pub struct ConvertedRoot {
    pub root: PathBuf,
    pub commit: Checksum,
    /// Bytes written into object files.
    pub written_bytes: u64,
}

impl Drop for ConvertedRoot {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.root) {
            Ok(()) => {
                tracing::info!(dir = %self.root.display(), "removed a converted native root no generation serves")
            }
            Err(e) => {
                tracing::warn!(dir = %self.root.display(), "removing a converted native root: {e}")
            }
        }
    }
}

/// The conversions of one `--oscontainer` source, kept across refreshes.
#[derive(Debug)]
pub struct NativeRoots {
    parent: PathBuf,
    current: Option<Arc<ConvertedRoot>>,
}

impl NativeRoots {
    /// Where conversions go, emptied of what an earlier process left.
    pub fn open(state: &StateDir) -> Result<Self> {
        let parent = state.path().join(ROOTS_DIR);
        crate::source::clean_staging(&parent)?;
        Ok(Self {
            parent,
            current: None,
        })
    }

    /// For a native root: the request to publish in its place (the
    /// converted root, its commit) and the conversion the generation must
    /// keep alive. `None` when the source is not a native root.
    pub fn prepare(
        &mut self,
        req: &PublishRequest,
        state: &StateDir,
    ) -> Result<Option<(PublishRequest, Arc<ConvertedRoot>)>> {
        let Source::Oscontainer(dir) = &req.source else {
            return Ok(None);
        };
        let Some(repo) = native_repo(dir)? else {
            return Ok(None);
        };
        check_disjoint(state.path(), dir)?;
        let commit = match req.commit {
            Some(c) => c,
            None => find_single_commit(&repo)?,
        };
        let converted = match &self.current {
            Some(c) if c.commit == commit && c.root.join(OSCONTAINER_REPO).is_dir() => c.clone(),
            _ => {
                let c = Arc::new(convert(dir, &repo, commit, &self.parent)?);
                self.current = Some(c.clone());
                c
            }
        };
        let req = PublishRequest {
            source: Source::Oscontainer(converted.root.clone()),
            commit: Some(commit),
            refs: req.refs.clone(),
        };
        Ok(Some((req, converted)))
    }
}

/// Converts `commit`'s closure from the native `repo` of `dir` into a new
/// directory under `parent`; on any failure nothing is left there.
pub fn convert(
    dir: &Path,
    repo: &Path,
    commit: Checksum,
    parent: &Path,
) -> Result<ConvertedRoot, SourceError> {
    let subject = Subject::new(dir.display().to_string(), NATIVE_ROOT_REPO);
    let io = |p: &Path, e| SourceError::from_io(&subject, p.display().to_string(), e);
    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let staging = tempfile::Builder::new()
        .prefix(STAGING_PREFIX)
        .tempdir_in(parent)
        .map_err(|e| io(parent, e))?;
    let mut conv = Converter::create(staging.path(), commit, &subject)?;
    let mut walk = Walk {
        repo,
        objects: &mut conv.objects,
        subject: &subject,
    };
    walk.commit(&commit, Limits::default().max_depth)?;
    // The same last check as for a streamed image: the closure is complete.
    conv.finish(&subject, &Limits::default())?;
    let written_bytes = conv.written_bytes();
    // Unique, like the staging name: an older conversion of the same
    // commit may still be served.
    let suffix = staging
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(STAGING_PREFIX))
        .unwrap_or("x")
        .to_owned();
    let short = commit.to_hex().get(..12).unwrap_or_default().to_owned();
    let dest = parent.join(format!("{IMAGE_PREFIX}native-{short}-{suffix}"));
    std::fs::rename(staging.path(), &dest).map_err(|e| io(&dest, e))?;
    let _ = staging.keep();
    tracing::info!(dir = %dir.display(), %commit, written_bytes, "native root converted");
    Ok(ConvertedRoot {
        root: dest,
        commit,
        written_bytes,
    })
}

/// `objects/XX/REST.ext` of the native repo.
fn rel(c: &Checksum, ext: &str) -> String {
    let hex = c.to_hex();
    format!("objects/{}/{}.{ext}", &hex[..2], &hex[2..])
}

/// The walk of one commit's closure through the native repo.
struct Walk<'a> {
    repo: &'a Path,
    objects: &'a mut Objects,
    subject: &'a Subject,
}

impl Walk<'_> {
    fn bad(&self, object: String, reason: impl Into<String>) -> SourceError {
        SourceError::BadObject {
            subject: self.subject.clone(),
            object,
            reason: reason.into(),
        }
    }

    fn write_err(&self, object: String, e: WriteError) -> SourceError {
        super::object_err(self.subject, object, e)
    }

    fn read_io(&self, rel: &str, e: std::io::Error) -> SourceError {
        SourceError::from_io(self.subject, self.repo.join(rel).display().to_string(), e)
    }

    /// Verifies and stages a metadata object, unless staged already;
    /// returns its bytes. Absent: `Ok(None)`.
    fn metadata(&mut self, name: &ObjectName) -> Result<Option<Vec<u8>>, SourceError> {
        let ext = name.kind.extension();
        let shown = format!("{}.{ext}", name.checksum);
        let rel = rel(&name.checksum, ext);
        let Some((bytes, meta)) = fsutil::read_file(self.repo, &rel, max_metadata_size(name.kind))
            .map_err(|e| self.read_io(&rel, e))?
        else {
            return Ok(None);
        };
        let staged = self
            .objects
            .has(name)
            .map_err(|e| self.write_err(shown.clone(), e))?;
        if !staged {
            self.objects
                .write_metadata(name, &bytes, meta.mtime())
                .map_err(|e| self.write_err(shown, e))?;
        }
        Ok(Some(bytes))
    }

    fn need(&mut self, name: &ObjectName, at: &str) -> Result<Vec<u8>, SourceError> {
        self.metadata(name)?.ok_or_else(|| {
            self.bad(
                format!("{}.{}", name.checksum, name.kind.extension()),
                format!("missing: the commit reaches it at {at:?}"),
            )
        })
    }

    /// The commit, its detached metadata, and everything it reaches.
    fn commit(&mut self, commit: &Checksum, max_depth: usize) -> Result<(), SourceError> {
        let name = ObjectName::new(*commit, ObjectKind::Commit);
        let bytes = self.need(&name, "/")?;
        let c = Commit::parse(&bytes)
            .map_err(|e| self.bad(format!("{commit}.commit"), e.to_string()))?;
        self.metadata(&ObjectName::new(*commit, ObjectKind::CommitMeta))?;
        let (mut seen, mut seen_metas) = (HashSet::new(), HashSet::new());
        let mut stack = vec![(c.root_tree, c.root_meta, "/".to_owned(), 0usize)];
        while let Some((tree, meta, path, depth)) = stack.pop() {
            if seen_metas.insert(meta) {
                self.need(&ObjectName::new(meta, ObjectKind::DirMeta), &path)?;
            }
            if !seen.insert(tree) {
                continue;
            }
            if depth > max_depth {
                return Err(self.bad(
                    format!("{tree}.dirtree"),
                    format!("{path:?} is nested deeper than {max_depth} directories"),
                ));
            }
            let t = ObjectName::new(tree, ObjectKind::DirTree);
            let dt = format::parse_dirtree(&self.need(&t, &path)?)
                .map_err(|e| self.bad(format!("{tree}.dirtree"), e.to_string()))?;
            for (file, checksum) in &dt.files {
                self.content(checksum, &join(&path, file))?;
            }
            for (dir, sub_tree, sub_meta) in dt.dirs {
                stack.push((sub_tree, sub_meta, join(&path, &dir), depth + 1));
            }
        }
        Ok(())
    }

    /// The xattrs of content object `c`: its `.file-xattrs-link`, else the
    /// older `.file.xattrs`, else none.
    fn xattrs(&self, c: &Checksum) -> Result<Vec<u8>, SourceError> {
        for ext in ["file-xattrs-link", "file.xattrs"] {
            let rel = rel(c, ext);
            if let Some((bytes, _)) =
                fsutil::read_file(self.repo, &rel, MAX_XATTRS).map_err(|e| self.read_io(&rel, e))?
            {
                return Ok(bytes);
            }
        }
        Ok(Vec::new())
    }

    /// Converts content object `c` (at `at` in the tree) unless staged.
    fn content(&mut self, c: &Checksum, at: &str) -> Result<(), SourceError> {
        let name = ObjectName::new(*c, ObjectKind::File);
        let shown = format!("{c}.file");
        if self
            .objects
            .has(&name)
            .map_err(|e| self.write_err(shown.clone(), e))?
        {
            return Ok(());
        }
        let xattrs = self.xattrs(c)?;
        let rel = rel(c, "file");
        if let Some((mut f, m)) =
            fsutil::open_file(self.repo, &rel).map_err(|e| self.read_io(&rel, e))?
        {
            let meta = FileMeta::regular(m.uid(), m.gid(), m.mode(), xattrs);
            return self
                .objects
                .write_content(&name, &meta, m.len(), &mut f, m.mtime())
                .map_err(|e| self.write_err(shown, e));
        }
        let path = self.repo.join(&rel);
        let m = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => m,
            Ok(_) => return Err(self.bad(shown, "neither a regular file nor a symlink")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.bad(shown, format!("missing: the commit reaches it at {at:?}")))
            }
            Err(e) => return Err(self.read_io(&rel, e)),
        };
        let target = std::fs::read_link(&path).map_err(|e| self.read_io(&rel, e))?;
        let target = target
            .into_os_string()
            .into_string()
            .map_err(|_| self.bad(shown.clone(), "symlink target is not UTF-8"))?;
        let meta = FileMeta::symlink(m.uid(), m.gid(), target, xattrs);
        self.objects
            .write_content(&name, &meta, 0, &mut std::io::empty(), m.mtime())
            .map_err(|e| self.write_err(shown, e))
    }
}

#[cfg(test)]
mod tests;
