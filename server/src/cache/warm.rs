//! Warming the object cache before a generation becomes visible, with what
//! a fleet update will ask every node for: the objects each published
//! commit reaches that its parent commit does not.
//!
//! A new server (or a new generation) otherwise pays the first request for
//! each of those objects with an open, a whole read and an insert, once
//! per wave of nodes; warmed, the first node is answered from memory too.
//! Everything is read through `Generation::load_object`, so only what the
//! publication verified can enter the cache (invariant 1): an object its
//! gate does not allow is missing here as it is to a request.
//!
//! Before that, the paths every node asks for besides objects are looked
//! up once ([`look_up_first_paths`]), so that the first wave's requests
//! find them known to the kernel, there or not.
//!
//! [`new_objects`] is the walk, pure (trees in, names out); [`warm`] reads
//! and inserts, on a blocking thread, within a byte budget and a deadline;
//! [`warm_for`] runs it from the async side and logs what it did.

use super::{CachedObject, ObjectCache, ENTRY_OVERHEAD};
use crate::prepared::Prepared;
use crate::served::objects::Loaded;
use crate::served::Generation;
use crate::treewalk::MAX_TREE_DEPTH;
use anyhow::{Context, Result};
use bytes::Bytes;
use oscontent_format::commit::MAX_COMMIT_SIZE;
use oscontent_format::tree::MAX_DIRTREE_SIZE;
use oscontent_format::{
    parse_dirtree, Checksum, Commit, DirTree, ObjectKind, ObjectName, RepoPath,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest warming holds a generation back. Half the default cache
/// (64 MiB) reads in well under a second from a local disk and in about
/// three at 20 MB/s (a slow network volume); a disk slower than that is
/// better left to the requests, since a new release (a security fix,
/// perhaps) should not wait long on what only saves CPU. The first
/// publication happens before the server listens, and 10 s also stays
/// well inside the deploy's startup probe allowance.
pub const WARM_TIME: Duration = Duration::from_secs(10);
/// The walk and the reads stop this long before [`WARM_TIME`], so that
/// what they did is reported; publication stops waiting at [`WARM_TIME`]
/// whatever a read stuck on the disk does.
const REPORT_MARGIN: Duration = Duration::from_millis(500);

/// Why warming ended before the last object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Half the cache's capacity (the rest is for what requests bring).
    Budget,
    /// [`WARM_TIME`] ran out.
    Deadline,
    /// An object could not be read (logged).
    Failed,
}

/// What warming did for one generation.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Warmed {
    /// Objects put into the cache, and their bodies' bytes.
    pub objects: usize,
    pub bytes: u64,
    /// Published commits whose parent commit the generation serves too:
    /// those warmed for.
    pub tips: usize,
    /// New objects left out for being over the cache's per-entry limit
    /// (they are streamed).
    pub too_large: usize,
    pub stopped: Option<Stop>,
}

impl Warmed {
    fn outcome(&self) -> &'static str {
        match self.stopped {
            None => "done",
            Some(Stop::Budget) => "budget",
            Some(Stop::Deadline) => "deadline",
            Some(Stop::Failed) => "failed",
        }
    }
}

/// A tree as a commit, or a dirtree's entry, names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Root {
    pub tree: Checksum,
    pub meta: Checksum,
}

impl Root {
    fn of(c: &Commit) -> Self {
        Self {
            tree: c.root_tree,
            meta: c.root_meta,
        }
    }
}

/// What a tip's tree reaches that its parent's does not, each once, in
/// the order a pull asks for it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NewObjects {
    /// Dirtrees and dirmetas, level by level from the root.
    pub metadata: Vec<ObjectName>,
    /// Content objects, in the order the walk met them.
    pub content: Vec<ObjectName>,
}

/// Everything the parent's tree reaches: what every node has already.
#[derive(Debug, Default)]
struct Reached {
    trees: HashSet<Checksum>,
    metas: HashSet<Checksum>,
    files: HashSet<Checksum>,
}

/// The objects `tip` reaches and `parent` does not. `tree` gives a dirtree
/// by checksum (`None`: absent, as a pruned parent's may be; nothing below
/// it is known). The parent's trees are walked first; a dirtree the
/// parent reaches is not entered in the tip, since an identical subtree
/// holds nothing new (its dirmeta may still be new: a directory whose
/// mode changed).
pub fn new_objects(
    parent: Root,
    tip: Root,
    mut tree: impl FnMut(&Checksum) -> Result<Option<DirTree>>,
) -> Result<NewObjects> {
    let mut old = Reached::default();
    breadth_first(
        parent,
        &mut tree,
        |r| {
            old.metas.insert(r.meta);
            old.trees.insert(r.tree)
        },
        |f| {
            old.files.insert(f);
        },
    )?;
    let mut new = NewObjects::default();
    let mut seen = Reached::default();
    breadth_first(
        tip,
        &mut tree,
        |r| {
            if !old.metas.contains(&r.meta) && seen.metas.insert(r.meta) {
                new.metadata
                    .push(ObjectName::new(r.meta, ObjectKind::DirMeta));
            }
            if old.trees.contains(&r.tree) || !seen.trees.insert(r.tree) {
                return false;
            }
            new.metadata
                .push(ObjectName::new(r.tree, ObjectKind::DirTree));
            true
        },
        |f| {
            if !old.files.contains(&f) && seen.files.insert(f) {
                new.content.push(ObjectName::new(f, ObjectKind::File));
            }
        },
    )?;
    Ok(new)
}

/// Level by level below `root`: `enter` says whether to go into a tree
/// (and remembers it), `file` gets each file of the trees entered.
fn breadth_first(
    root: Root,
    tree: &mut impl FnMut(&Checksum) -> Result<Option<DirTree>>,
    mut enter: impl FnMut(&Root) -> bool,
    mut file: impl FnMut(Checksum),
) -> Result<()> {
    let mut level = vec![root];
    for depth in 1.. {
        if level.is_empty() {
            break;
        }
        anyhow::ensure!(
            depth <= MAX_TREE_DEPTH,
            "trees nested deeper than {MAX_TREE_DEPTH}"
        );
        let mut next = Vec::new();
        for r in level {
            if !enter(&r) {
                continue;
            }
            let Some(t) = tree(&r.tree)? else { continue };
            t.files.into_iter().for_each(|(_, f)| file(f));
            next.extend(
                t.dirs
                    .into_iter()
                    .map(|(_, tree, meta)| Root { tree, meta }),
            );
        }
        level = next;
    }
    Ok(())
}

/// Fills `cache` with what `g`'s published commits bring new relative to
/// their parents (where `g` serves the parent's commit too): the commits
/// and trees first, then content, until the last one, half the cache's
/// capacity, or `deadline`. Objects over the per-entry limit are left
/// out. Blocking: it reads the disk. A failure is logged and ends it;
/// what was warmed until then stays (it is what a request would read).
pub fn warm(cache: &ObjectCache, g: &Generation, deadline: Instant) -> Warmed {
    let mut report = Warmed::default();
    if cache.capacity() == 0 {
        return report;
    }
    let tips = tips(g);
    look_up_first_paths(g, &tips);
    let (metadata, content) = plan(g, &tips, deadline, &mut report);
    if report.stopped.is_some() {
        return report;
    }
    let budget = cache.capacity() / 2;
    let mut charged = 0;
    for name in metadata.iter().chain(&content) {
        if Instant::now() >= deadline {
            report.stopped = Some(Stop::Deadline);
            break;
        }
        let (bytes, meta) = match g.load_object(name, cache.max_entry() as u64, false) {
            Ok(Loaded::Whole(b, m)) => (b, m),
            Ok(Loaded::Open(..)) => {
                report.too_large += 1;
                continue;
            }
            // Not verified (or gone): not warmed, as it is not served.
            Ok(Loaded::Missing | Loaded::WouldBlock) => continue,
            Err(e) => {
                tracing::warn!(
                    generation = g.id,
                    "warming the object cache: reading {}: {e}",
                    name.path()
                );
                report.stopped = Some(Stop::Failed);
                break;
            }
        };
        let charge = bytes.len() + ENTRY_OVERHEAD;
        if charged + charge > budget {
            report.stopped = Some(Stop::Budget);
            break;
        }
        let len = bytes.len() as u64;
        let obj = CachedObject::new(bytes, Prepared::for_object(name, len, &meta));
        if cache.insert(g.cache_key, *name, obj) {
            charged += charge;
            report.objects += 1;
            report.bytes += len;
        }
    }
    report
}

/// The published commits, each once.
fn tips(g: &Generation) -> Vec<Checksum> {
    let mut tips: Vec<Checksum> = g.derived_refs.iter().map(|(_, c)| *c).collect();
    tips.sort();
    tips.dedup();
    tips
}

/// Looks up what every node asks for besides objects: the config, the
/// summary and its signature, and each tip's detached metadata and delta
/// index, most of them usually missing. A request looks a path up without
/// waiting on the disk and takes the blocking pool when the kernel does
/// not know it yet, there or not; the first nodes of a wave each did, one
/// new pool thread each. Failures are the requests' to report.
fn look_up_first_paths(g: &Generation, tips: &[Checksum]) {
    let per_tip = tips.iter().flat_map(|c| {
        [
            RepoPath::Object(ObjectName::new(*c, ObjectKind::CommitMeta)),
            RepoPath::DeltaIndex { to: *c },
        ]
    });
    let paths = [RepoPath::Config, RepoPath::Summary, RepoPath::SummarySig];
    for path in paths.into_iter().chain(per_tip) {
        if let Err(e) = g.resolve(&path) {
            tracing::debug!(generation = g.id, "looking up {path:?} ahead: {e:#}");
        }
    }
}

/// What to warm, each object once: every tip's commit and new trees, and
/// then their new content. A tip whose trees cannot be walked is logged
/// and left out.
fn plan(
    g: &Generation,
    tips: &[Checksum],
    deadline: Instant,
    report: &mut Warmed,
) -> (Vec<ObjectName>, Vec<ObjectName>) {
    let (mut metadata, mut content, mut seen) = (Vec::new(), Vec::new(), HashSet::new());
    for &tip in tips {
        let new = match tip_objects(g, &tip, deadline) {
            Ok(Some(new)) => new,
            Ok(None) => continue,
            Err(_) if Instant::now() >= deadline => {
                report.stopped = Some(Stop::Deadline);
                break;
            }
            Err(e) => {
                tracing::warn!(generation = g.id, commit = %tip, "not warming the object cache for it: {e:#}");
                continue;
            }
        };
        report.tips += 1;
        let commit = ObjectName::new(tip, ObjectKind::Commit);
        for o in std::iter::once(commit).chain(new.metadata) {
            if seen.insert(o) {
                metadata.push(o);
            }
        }
        content.extend(new.content.into_iter().filter(|o| seen.insert(*o)));
    }
    (metadata, content)
}

/// What `tip` brings new, or `None` (said at debug level) when the
/// generation does not serve its parent commit: a first release, or an
/// image holding only its own commit.
fn tip_objects(g: &Generation, tip: &Checksum, deadline: Instant) -> Result<Option<NewObjects>> {
    let commit = read_commit(g, tip)?.context("the published commit is not served")?;
    let Some(parent) = commit.parent else {
        tracing::debug!(generation = g.id, commit = %tip, "a first release (no parent): nothing to warm for it");
        return Ok(None);
    };
    let Some(before) = read_commit(g, &parent)? else {
        tracing::debug!(generation = g.id, commit = %tip, %parent, "its parent commit is not served: nothing to warm for it");
        return Ok(None);
    };
    let tree = |c: &Checksum| {
        anyhow::ensure!(Instant::now() < deadline, "out of time walking the trees");
        let name = ObjectName::new(*c, ObjectKind::DirTree);
        read_whole(g, &name, MAX_DIRTREE_SIZE as u64)?
            .map(|b| parse_dirtree(&b).with_context(|| format!("parsing dirtree {c}")))
            .transpose()
    };
    new_objects(Root::of(&before), Root::of(&commit), tree).map(Some)
}

fn read_commit(g: &Generation, c: &Checksum) -> Result<Option<Commit>> {
    let name = ObjectName::new(*c, ObjectKind::Commit);
    read_whole(g, &name, MAX_COMMIT_SIZE as u64)?
        .map(|b| Commit::parse(&b).with_context(|| format!("parsing commit {c}")))
        .transpose()
}

/// A metadata object's bytes, if the generation serves it.
fn read_whole(g: &Generation, name: &ObjectName, cap: u64) -> Result<Option<Bytes>> {
    let path = name.path();
    match g
        .load_object(name, cap, false)
        .with_context(|| format!("reading {path}"))?
    {
        Loaded::Whole(b, _) => Ok(Some(b)),
        Loaded::Missing => Ok(None),
        Loaded::Open(_, m) => anyhow::bail!("{path} has {} bytes, over {cap}", m.len()),
        Loaded::WouldBlock => anyhow::bail!("{path}: a blocking read would block"),
    }
}

/// Warms `cache` for `g` on a blocking thread, waiting [`WARM_TIME`] at
/// most, and logs what it did. Never fails: warming only saves requests
/// work, so a generation is published whatever happens here.
pub async fn warm_for(cache: Arc<ObjectCache>, g: Arc<Generation>) -> Warmed {
    if cache.capacity() == 0 {
        return Warmed::default();
    }
    let started = Instant::now();
    let deadline = started + WARM_TIME.saturating_sub(REPORT_MARGIN);
    let id = g.id;
    let task = tokio::task::spawn_blocking(move || warm(&cache, &g, deadline));
    let warmed = match tokio::time::timeout(WARM_TIME, task).await {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            tracing::warn!(generation = id, "warming the object cache: {e}");
            return Warmed::default();
        }
        Err(_) => {
            tracing::warn!(
                generation = id,
                "warming the object cache took over {WARM_TIME:?}: publishing without it"
            );
            return Warmed::default();
        }
    };
    tracing::info!(
        generation = id,
        objects = warmed.objects,
        bytes = warmed.bytes,
        tips = warmed.tips,
        too_large = warmed.too_large,
        outcome = warmed.outcome(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "warmed the object cache"
    );
    warmed
}

#[cfg(test)]
mod tests;
