//! The verified walk: copy what an archive remote publishes (its summary,
//! signatures, commits and every object they reach, and its static deltas)
//! into a [`Store`], fetching only what the store does not already hold,
//! and verifying everything before it is written.
//!
//! Order, and why:
//! 1. `config` (must be an archive repo), `summary` and `summary.sig`: with
//!    trusted keys the summary signature must verify before anything else
//!    is read, so a forged ref list never steers the walk.
//! 2. Each commit the summary names: its object must hash to its name; its
//!    detached metadata (signatures) must verify with trusted keys.
//! 3. The trees, level by level: dirtree and dirmeta objects (each must
//!    hash to its name), then every content object (libostree's content
//!    checksum must be its name). Objects in the store are not fetched.
//! 4. The static deltas the summary lists: superblocks against the
//!    summary's SHA-256, parts against their superblock's.
//!
//! Nothing here writes refs, the summary or the manifest: the caller does
//! that once everything is in place ([`super::bundle`], [`super::upstream`]).

use super::remote::Remote;
use super::store::Store;
use crate::treewalk::{
    parallel, MAX_COMMITMETA_SIZE, MAX_COMMIT_SIZE, MAX_DIRTREE_SIZE, MAX_OBJECTS, MAX_TREE_DEPTH,
};
use anyhow::{bail, Context, Result};
use oscontent_format::delta::MAX_SUPERBLOCK_SIZE;
use oscontent_format::openpgp::{self, Cert, VerifiedSig};
use oscontent_format::{
    parse_dirtree, parse_gpgsigs, parse_summary, Checksum, Commit, DeltaName, ObjectKind,
    ObjectName, RefNamespace, Summary, Superblock,
};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// A repo `config` is a few lines.
pub const MAX_CONFIG_SIZE: u64 = 1 << 20;
/// Largest summary.
pub const MAX_SUMMARY_SIZE: u64 = oscontent_format::summary::MAX_SUMMARY_SIZE as u64;
/// Most commits one summary may name (refs of all collections).
pub const MAX_COMMITS: usize = 4096;
/// A progress line every this many objects fetched.
pub const PROGRESS_EVERY: u64 = 200;

/// How to sync.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Verify the summary and every published commit against these.
    pub trusted: Option<Arc<Vec<Cert>>>,
    /// Objects fetched at once.
    pub jobs: usize,
}

impl Default for SyncOptions {
    fn default() -> Self {
        Self {
            trusted: None,
            jobs: 8,
        }
    }
}

/// A ref as published.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PublishedRef {
    pub namespace: RefNamespace,
    /// For mirrors: `collection-id/ref`.
    pub name: String,
    pub commit: Checksum,
}

impl PublishedRef {
    /// Its path in a repo (`refs/heads/NAME`, `refs/mirrors/CID/NAME`).
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace.dir(), self.name)
    }
}

/// The remote's metadata: what a sync republishes verbatim.
#[derive(Debug, Clone)]
pub struct Metadata {
    pub config: Vec<u8>,
    pub summary: Vec<u8>,
    pub summary_sig: Option<Vec<u8>>,
    pub parsed: Summary,
    pub refs: Vec<PublishedRef>,
    pub verified_summary: Option<VerifiedSig>,
}

impl Metadata {
    pub fn summary_digest(&self) -> Checksum {
        Checksum::digest(&self.summary)
    }
}

/// What a sync found and did.
#[derive(Debug)]
pub struct Snapshot {
    pub meta: Metadata,
    pub commits: BTreeMap<Checksum, Commit>,
    /// Detached metadata, as published (absent: none).
    pub commitmeta: BTreeMap<Checksum, Vec<u8>>,
    pub verified_commits: BTreeMap<Checksum, VerifiedSig>,
    /// Delta files in the store (superblocks and parts).
    pub delta_files: BTreeSet<String>,
    /// Objects the published commits reach, and their bytes in the store.
    pub objects: u64,
    pub object_bytes: u64,
    /// Objects (and delta files) fetched by this sync, and their bytes.
    pub fetched: u64,
    pub fetched_bytes: u64,
}

fn archive_mode(config: &[u8]) -> Result<()> {
    let config = oscontent_format::RepoConfig::parse(config)?;
    match config.mode.as_deref() {
        _ if config.is_archive() => Ok(()),
        Some(m) => bail!("the remote repo is in {m:?} mode; only archive repos can be mirrored"),
        None => bail!("the remote's config has no core.mode: not an ostree repo"),
    }
}

/// Fetches and checks the remote's config, summary and summary signature.
pub fn read_metadata(remote: &dyn Remote, opts: &SyncOptions) -> Result<Metadata> {
    let src = remote.describe();
    let config = remote
        .get("config", MAX_CONFIG_SIZE)?
        .with_context(|| format!("{src}: no config: not an ostree archive remote"))?;
    archive_mode(&config).with_context(|| format!("{src}: config"))?;
    let summary = remote
        .get("summary", MAX_SUMMARY_SIZE)?
        .with_context(|| format!("{src}: no summary: nothing says what to mirror"))?;
    let summary_sig = remote.get("summary.sig", MAX_COMMITMETA_SIZE)?;
    let mut verified_summary = None;
    if let Some(trusted) = &opts.trusted {
        let sigs = match &summary_sig {
            Some(b) => parse_gpgsigs(b).context("summary.sig")?,
            None => bail!(
                "{src}: the summary is not signed (no summary.sig), and --trusted-keys requires signatures"
            ),
        };
        let v = openpgp::verify_detached(trusted, &summary, &sigs, SystemTime::now())
            .map_err(|e| anyhow::anyhow!("{src}: summary signature: {e}"))?;
        verified_summary = Some(v);
    }
    let parsed = parse_summary(&summary).with_context(|| format!("{src}: parsing the summary"))?;
    let mut refs = Vec::new();
    for r in &parsed.refs {
        refs.push(PublishedRef {
            namespace: RefNamespace::Heads,
            name: r.name.clone(),
            commit: r.commit,
        });
    }
    for (cid, list) in &parsed.collection_map {
        for r in list {
            refs.push(PublishedRef {
                namespace: RefNamespace::Mirrors,
                name: format!("{cid}/{}", r.name),
                commit: r.commit,
            });
        }
    }
    anyhow::ensure!(!refs.is_empty(), "{src}: the summary lists no refs");
    Ok(Metadata {
        config,
        summary,
        summary_sig,
        parsed,
        refs,
        verified_summary,
    })
}

/// Checks what the metadata publishes before anything is written: each
/// commit object must hash to its name and, with trusted keys, carry a
/// valid signature. (The walk checks them again as it writes them.)
pub fn verify_commits(remote: &dyn Remote, meta: &Metadata, opts: &SyncOptions) -> Result<()> {
    let Some(trusted) = &opts.trusted else {
        return Ok(());
    };
    let src = remote.describe();
    let commits: BTreeSet<Checksum> = meta.refs.iter().map(|r| r.commit).collect();
    check_commit_count(&src, commits.len())?;
    for c in commits {
        let rel = ObjectName::new(c, ObjectKind::Commit).path();
        let bytes = remote
            .get(&rel, MAX_COMMIT_SIZE)?
            .with_context(|| format!("{src}: commit {c} is missing"))?;
        anyhow::ensure!(
            Checksum::digest(&bytes) == c,
            "{src}: commit {c}: the bytes hash to {}",
            Checksum::digest(&bytes)
        );
        let meta_rel = ObjectName::new(c, ObjectKind::CommitMeta).path();
        let sigs = detached_sigs(c, remote.get(&meta_rel, MAX_COMMITMETA_SIZE)?.as_deref())?;
        openpgp::verify_detached(trusted, &bytes, &sigs, SystemTime::now())
            .map_err(|e| anyhow::anyhow!("{src}: commit {c}: signature: {e}"))?;
    }
    Ok(())
}

/// A summary may name at most [`MAX_COMMITS`] commits.
fn check_commit_count(src: &str, n: usize) -> Result<()> {
    anyhow::ensure!(
        n <= MAX_COMMITS,
        "{src}: the summary names {n} commits, over the limit of {MAX_COMMITS}"
    );
    Ok(())
}

/// The signatures in a commit's detached metadata (none if it has none).
fn detached_sigs(c: Checksum, detached: Option<&[u8]>) -> Result<Vec<Vec<u8>>> {
    match detached {
        Some(b) => parse_gpgsigs(b).with_context(|| format!("detached metadata of commit {c}")),
        None => Ok(Vec::new()),
    }
}

/// Shared counters of one walk.
struct Walk<'a> {
    remote: &'a dyn Remote,
    store: &'a Store,
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    next_progress: AtomicU64,
}

impl Walk<'_> {
    /// Makes `obj` present: trusted in place, or fetched and verified.
    fn ensure(&self, obj: &ObjectName) -> Result<()> {
        if self.store.has_object(obj)? {
            return Ok(());
        }
        let n = self.store.fetch_object(self.remote, obj)?;
        let count = self.fetched.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.fetched_bytes.fetch_add(n, Ordering::Relaxed) + n;
        let due = self.next_progress.load(Ordering::Relaxed);
        if count >= due
            && self
                .next_progress
                .compare_exchange(
                    due,
                    due + PROGRESS_EVERY,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::info!(objects = count, bytes, "mirror progress");
        }
        Ok(())
    }
}

/// Copies and verifies what `remote` publishes into `store`.
pub fn sync(remote: &dyn Remote, store: &Store, opts: &SyncOptions) -> Result<Snapshot> {
    let meta = read_metadata(remote, opts)?;
    sync_with(remote, store, opts, meta)
}

/// [`sync`] for metadata already read (and verified) with [`read_metadata`].
pub fn sync_with(
    remote: &dyn Remote,
    store: &Store,
    opts: &SyncOptions,
    meta: Metadata,
) -> Result<Snapshot> {
    let walk = Walk {
        remote,
        store,
        fetched: AtomicU64::new(0),
        fetched_bytes: AtomicU64::new(0),
        next_progress: AtomicU64::new(PROGRESS_EVERY),
    };
    let commits = sync_commits(&walk, &meta, opts)?;
    let reached = sync_trees(&walk, &commits.commits, opts)?;
    sync_content(&walk, &reached.files, opts)?;
    let delta_files = sync_deltas(&walk, &meta)?;
    let (objects, object_bytes) = stored_size(store, &commits.commits, &reached);
    Ok(Snapshot {
        objects,
        object_bytes,
        fetched: walk.fetched.load(Ordering::Relaxed),
        fetched_bytes: walk.fetched_bytes.load(Ordering::Relaxed),
        meta,
        commits: commits.commits,
        commitmeta: commits.commitmeta,
        verified_commits: commits.verified,
        delta_files,
    })
}

/// The published commits, as synced.
struct Commits {
    commits: BTreeMap<Checksum, Commit>,
    commitmeta: BTreeMap<Checksum, Vec<u8>>,
    verified: BTreeMap<Checksum, VerifiedSig>,
}

/// Each commit the summary names: its object (hashing to its name), and
/// its detached metadata, whose signature must verify with trusted keys.
fn sync_commits(walk: &Walk<'_>, meta: &Metadata, opts: &SyncOptions) -> Result<Commits> {
    let src = walk.remote.describe();
    let mut by_commit: BTreeMap<Checksum, Vec<&str>> = BTreeMap::new();
    for r in &meta.refs {
        by_commit.entry(r.commit).or_default().push(&r.name);
    }
    check_commit_count(&src, by_commit.len())?;
    let mut out = Commits {
        commits: BTreeMap::new(),
        commitmeta: BTreeMap::new(),
        verified: BTreeMap::new(),
    };
    for (c, names) in &by_commit {
        let obj = ObjectName::new(*c, ObjectKind::Commit);
        walk.ensure(&obj)
            .with_context(|| format!("commit {c} (ref {})", names.join(", ")))?;
        let bytes = walk.store.read(&obj.path(), MAX_COMMIT_SIZE)?;
        let commit = Commit::parse(&bytes).with_context(|| format!("parsing commit {c}"))?;
        let meta_rel = ObjectName::new(*c, ObjectKind::CommitMeta).path();
        let detached = walk.remote.get(&meta_rel, MAX_COMMITMETA_SIZE)?;
        if let Some(trusted) = &opts.trusted {
            let sigs = detached_sigs(*c, detached.as_deref())?;
            let v = openpgp::verify_detached(trusted, &bytes, &sigs, SystemTime::now()).map_err(
                |e| {
                    anyhow::anyhow!(
                        "{src}: commit {c} (ref {}): signature: {e}",
                        names.join(", ")
                    )
                },
            )?;
            out.verified.insert(*c, v);
        }
        if let Some(d) = detached {
            out.commitmeta.insert(*c, d);
        }
        out.commits.insert(*c, commit);
    }
    Ok(out)
}

/// What the commits' trees reach.
#[derive(Default)]
struct Reached {
    trees: HashSet<Checksum>,
    metas: HashSet<Checksum>,
    files: BTreeSet<Checksum>,
}

impl Reached {
    fn count(&self) -> usize {
        self.trees.len() + self.metas.len() + self.files.len()
    }
}

/// The trees, level by level: each level's dirtree and dirmeta objects
/// fetched in parallel (each must hash to its name), then parsed for the
/// next level. Content objects are only collected.
fn sync_trees(
    walk: &Walk<'_>,
    commits: &BTreeMap<Checksum, Commit>,
    opts: &SyncOptions,
) -> Result<Reached> {
    let src = walk.remote.describe();
    let mut reached = Reached::default();
    let mut level: Vec<Checksum> = Vec::new();
    let mut metas: Vec<Checksum> = Vec::new();
    for commit in commits.values() {
        if reached.trees.insert(commit.root_tree) {
            level.push(commit.root_tree);
        }
        if reached.metas.insert(commit.root_meta) {
            metas.push(commit.root_meta);
        }
    }
    let mut depth = 0;
    while !level.is_empty() || !metas.is_empty() {
        depth += 1;
        anyhow::ensure!(
            depth <= MAX_TREE_DEPTH,
            "{src}: trees nested deeper than {MAX_TREE_DEPTH}"
        );
        let wanted: Vec<ObjectName> = level
            .iter()
            .map(|t| ObjectName::new(*t, ObjectKind::DirTree))
            .chain(
                metas
                    .iter()
                    .map(|m| ObjectName::new(*m, ObjectKind::DirMeta)),
            )
            .collect();
        parallel(wanted, opts.jobs, |o| {
            walk.ensure(&o)
                .with_context(|| format!("{} {}", o.kind.extension(), o.checksum))
        })?;
        metas.clear();
        level = next_level(walk, &src, &level, &mut reached, &mut metas)?;
    }
    Ok(reached)
}

/// Parses the (fetched) dirtrees of one level: records their files, and
/// returns the subtrees not seen yet (their dirmetas go to `metas`).
fn next_level(
    walk: &Walk<'_>,
    src: &str,
    level: &[Checksum],
    reached: &mut Reached,
    metas: &mut Vec<Checksum>,
) -> Result<Vec<Checksum>> {
    let mut next = Vec::new();
    for t in level {
        let rel = ObjectName::new(*t, ObjectKind::DirTree).path();
        let tree = parse_dirtree(&walk.store.read(&rel, MAX_DIRTREE_SIZE)?)
            .with_context(|| format!("dirtree {t}"))?;
        for (_, f) in tree.files {
            reached.files.insert(f);
        }
        for (_, sub, m) in tree.dirs {
            if reached.trees.insert(sub) {
                next.push(sub);
            }
            if reached.metas.insert(m) {
                metas.push(m);
            }
        }
        anyhow::ensure!(
            reached.count() <= MAX_OBJECTS,
            "{src}: the commits reach more than {MAX_OBJECTS} objects"
        );
    }
    Ok(next)
}

/// Every content object, in parallel; libostree's content checksum must be
/// its name.
fn sync_content(walk: &Walk<'_>, files: &BTreeSet<Checksum>, opts: &SyncOptions) -> Result<()> {
    let content: Vec<ObjectName> = files
        .iter()
        .map(|f| ObjectName::new(*f, ObjectKind::File))
        .collect();
    parallel(content, opts.jobs, |o| {
        walk.ensure(&o)
            .with_context(|| format!("content {}", o.checksum))
    })
}

/// The static deltas the summary lists; returns their files.
fn sync_deltas(walk: &Walk<'_>, meta: &Metadata) -> Result<BTreeSet<String>> {
    let mut delta_files = BTreeSet::new();
    for d in &meta.parsed.deltas {
        delta_files.extend(
            sync_delta(walk, &d.name, &d.superblock)
                .with_context(|| format!("static delta {}", d.name.summary_name()))?,
        );
    }
    Ok(delta_files)
}

/// How many objects the published commits reach, and their bytes as stored.
fn stored_size(
    store: &Store,
    commits: &BTreeMap<Checksum, Commit>,
    reached: &Reached,
) -> (u64, u64) {
    let entries = store.entries();
    let reachable: Vec<String> = commits
        .keys()
        .map(|c| ObjectName::new(*c, ObjectKind::Commit).path())
        .chain(
            reached
                .trees
                .iter()
                .map(|t| ObjectName::new(*t, ObjectKind::DirTree).path()),
        )
        .chain(
            reached
                .metas
                .iter()
                .map(|m| ObjectName::new(*m, ObjectKind::DirMeta).path()),
        )
        .chain(
            reached
                .files
                .iter()
                .map(|f| ObjectName::new(*f, ObjectKind::File).path()),
        )
        .collect();
    let object_bytes = reachable
        .iter()
        .filter_map(|r| entries.get(r).map(|e| e.size))
        .sum();
    (reachable.len() as u64, object_bytes)
}

/// Copies one static delta; returns its files.
fn sync_delta(walk: &Walk<'_>, name: &DeltaName, superblock: &Checksum) -> Result<Vec<String>> {
    let dir = name.dir();
    let sb_rel = format!("{dir}/superblock");
    let n = walk
        .store
        .fetch_file(walk.remote, &sb_rel, MAX_SUPERBLOCK_SIZE as u64, superblock)?;
    count(walk, n);
    let sb = Superblock::parse(&walk.store.read(&sb_rel, MAX_SUPERBLOCK_SIZE as u64)?)
        .context("parsing the superblock")?;
    anyhow::ensure!(
        sb.to == name.to && sb.from == name.from,
        "the superblock is for {:?} -> {}, not what its name says",
        sb.from,
        sb.to
    );
    let mut files = vec![sb_rel];
    for (i, part) in sb.parts.iter().enumerate() {
        let rel = format!("{dir}/{i}");
        let n = walk
            .store
            .fetch_file(walk.remote, &rel, part.size, &part.checksum)
            .with_context(|| format!("part {i}"))?;
        count(walk, n);
        files.push(rel);
    }
    Ok(files)
}

fn count(walk: &Walk<'_>, n: u64) {
    if n > 0 {
        walk.fetched.fetch_add(1, Ordering::Relaxed);
        walk.fetched_bytes.fetch_add(n, Ordering::Relaxed);
    }
}

/// Every object `commits` reach in `store` (commit, dirtree, dirmeta,
/// content), by walking the stored trees. For pruning: what is kept.
pub fn reachable(store: &Store, commits: &[Checksum]) -> Result<BTreeSet<ObjectName>> {
    let mut out = BTreeSet::new();
    let mut stack: Vec<Checksum> = Vec::new();
    for c in commits {
        let obj = ObjectName::new(*c, ObjectKind::Commit);
        let bytes = store
            .read(&obj.path(), MAX_COMMIT_SIZE)
            .with_context(|| format!("kept commit {c}"))?;
        let commit = Commit::parse(&bytes).with_context(|| format!("parsing commit {c}"))?;
        out.insert(obj);
        out.insert(ObjectName::new(*c, ObjectKind::CommitMeta));
        out.insert(ObjectName::new(commit.root_meta, ObjectKind::DirMeta));
        stack.push(commit.root_tree);
    }
    while let Some(t) = stack.pop() {
        if !out.insert(ObjectName::new(t, ObjectKind::DirTree)) {
            continue;
        }
        anyhow::ensure!(
            out.len() <= MAX_OBJECTS,
            "the kept commits reach more than {MAX_OBJECTS} objects"
        );
        let rel = ObjectName::new(t, ObjectKind::DirTree).path();
        let tree = parse_dirtree(&store.read(&rel, MAX_DIRTREE_SIZE)?)
            .with_context(|| format!("dirtree {t}"))?;
        for (_, f) in tree.files {
            out.insert(ObjectName::new(f, ObjectKind::File));
        }
        for (_, sub, m) in tree.dirs {
            out.insert(ObjectName::new(m, ObjectKind::DirMeta));
            stack.push(sub);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_archive_repos() {
        let cases: &[(&str, bool)] = &[
            ("[core]\nrepo_version=1\nmode=archive-z2\n", true),
            ("[core]\nmode=archive\n", true),
            ("[core]\nmode=bare\n", false),
            ("garbage", false),
        ];
        for (c, ok) in cases {
            assert_eq!(archive_mode(c.as_bytes()).is_ok(), *ok, "{c}");
        }
    }
}

#[cfg(test)]
mod walk_tests;
