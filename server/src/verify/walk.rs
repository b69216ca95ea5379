//! The verifying walk over a generation's sources.

use super::{default_jobs, Corrupt, FileId, Root, VerdictCache, VerifiedSet, VerifyOptions};
use crate::fsutil;
use crate::treewalk::{list_deltas, max_object_size, parallel, MAX_OBJECTS, MAX_TREE_DEPTH};
use anyhow::{bail, Context, Result};
use oscontent_format::content::archive_checksum;
use oscontent_format::delta::MAX_SUPERBLOCK_SIZE;
use oscontent_format::{
    check_dirmeta, parse_dirtree, Checksum, Commit, DeltaName, DirTree, ObjectKind, ObjectName,
    Superblock,
};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// What one walk shares between its threads.
struct Walk<'a> {
    roots: &'a [Root],
    cache: Option<&'a VerdictCache>,
    verdicts: Mutex<HashMap<ObjectName, (PathBuf, FileId)>>,
    hashed: AtomicUsize,
    /// Absent objects are skipped, not an error (history: ostree keeps
    /// older commits whose trees were pruned). Corrupt ones still fail.
    lenient: AtomicBool,
}

/// What [`Walk::check`] found.
enum Found {
    /// Not in any root (only in a lenient walk).
    Absent,
    /// A verified metadata object's bytes, for the walk to parse.
    Meta(Vec<u8>),
    /// A verified content object (or detached metadata).
    Content,
}

impl<'a> Walk<'a> {
    /// A walk over `roots` with `opts`' verdicts, and the threads to run it
    /// on; `lenient`: an object absent from every root is skipped.
    fn new(roots: &'a [Root], opts: &'a VerifyOptions, lenient: bool) -> (Self, usize) {
        let walk = Walk {
            roots,
            cache: opts.cache.as_deref(),
            verdicts: Mutex::new(HashMap::new()),
            hashed: AtomicUsize::new(0),
            lenient: AtomicBool::new(lenient),
        };
        let jobs = if opts.jobs == 0 {
            default_jobs()
        } else {
            opts.jobs
        };
        (walk, jobs)
    }

    /// The file the generation would serve for `o`: the first root's.
    fn open(&self, o: &ObjectName) -> Result<Option<(&Root, std::fs::File, std::fs::Metadata)>> {
        let rel = o.path();
        for root in self.roots {
            if let Some((f, m)) = fsutil::open_file(&root.path, &rel)
                .with_context(|| format!("opening {}/{rel}", root.path.display()))?
            {
                return Ok(Some((root, f, m)));
            }
        }
        if self.lenient.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if let Some(why) = self.roots.iter().find_map(|r| not_plain(&r.path, &rel)) {
            bail!(
                "{} {} is not served from the source: {why}; objects are read only as \
                 plain files reached without symlinks",
                o.kind.extension(),
                o.checksum
            )
        }
        bail!(
            "{} {} is missing from the source: the commit is incomplete",
            o.kind.extension(),
            o.checksum
        )
    }

    /// Checks that the file served for `o` is `o`, unless it was verified
    /// before (as the same file) or its root holds only verified objects.
    fn check(&self, o: &ObjectName) -> Result<Found> {
        let Some((root, file, meta)) = self.open(o)? else {
            return Ok(Found::Absent);
        };
        let id = FileId::of(&meta);
        let trusted = root.preverified || self.cache.is_some_and(|c| c.verified(o, &root.path, id));
        if !trusted {
            self.hashed.fetch_add(1, Ordering::Relaxed);
        }
        let where_ = || format!("{}/{}", root.path.display(), o.path());
        let max = max_object_size(o.kind);
        if meta.len() > max {
            return Err(Corrupt {
                what: format!("{} {}", o.kind.extension(), o.checksum),
                detail: format!(
                    "{} is {} bytes, over the {max} byte limit for a {}",
                    where_(),
                    meta.len(),
                    o.kind.extension()
                ),
            }
            .into());
        }
        let bytes = match o.kind {
            ObjectKind::File => {
                if !trusted {
                    let got = archive_checksum(std::io::BufReader::new(file))
                        .with_context(|| format!("content object {} ({})", o.checksum, where_()))?;
                    if got != o.checksum {
                        return Err(Corrupt {
                            what: format!("content object {}", o.checksum),
                            detail: format!("{} has the content checksum {got}", where_()),
                        }
                        .into());
                    }
                }
                Found::Content
            }
            ObjectKind::CommitMeta => Found::Content,
            ObjectKind::Commit | ObjectKind::DirTree | ObjectKind::DirMeta => {
                let mut bytes = Vec::with_capacity(meta.len() as usize);
                file.take(max + 1)
                    .read_to_end(&mut bytes)
                    .with_context(|| format!("reading {}", where_()))?;
                if !trusted {
                    let got = Checksum::digest(&bytes);
                    if got != o.checksum {
                        return Err(Corrupt {
                            what: format!("{} {}", o.kind.extension(), o.checksum),
                            detail: format!("{} hashes to {got}", where_()),
                        }
                        .into());
                    }
                    if o.kind == ObjectKind::DirMeta {
                        check_dirmeta(&bytes).with_context(where_)?;
                    }
                }
                Found::Meta(bytes)
            }
        };
        self.verdicts
            .lock()
            .expect("verdicts lock")
            .insert(*o, (root.path.clone(), id));
        Ok(bytes)
    }
}

/// Why `root/rel`, which exists in some form, is not a file
/// [`fsutil::open_file`] opens: the first symlink on the way, or what the
/// last component is instead of a plain file. `None` if nothing is there.
fn not_plain(root: &Path, rel: &str) -> Option<String> {
    let mut p = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        p.push(part);
        let meta = p.symlink_metadata().ok()?;
        let ty = meta.file_type();
        if ty.is_symlink() {
            return Some(format!("{} is a symlink", p.display()));
        }
        if i + 1 == parts.len() && !ty.is_file() {
            return Some(format!("{} is not a plain file", p.display()));
        }
    }
    None
}

/// Verifies the closure of `commits` (each commit, and every dirtree,
/// dirmeta and content object it reaches) as the generation over `roots`
/// would serve it, in parallel, level by level. Any object missing or
/// corrupt fails the whole verification, naming it.
pub fn verify_closure(
    roots: &[Root],
    commits: &[Checksum],
    opts: &VerifyOptions,
) -> Result<VerifiedSet> {
    verify_with_history(roots, commits, &[], 0, opts)
}

/// [`verify_closure`] of `tips`, then of up to `history` more commits:
/// `others` (other commits the source holds) and the ancestors (`parent`
/// links) whose commit objects are present: what stock ostree pulls by
/// checksum (a rollback). Their absent objects (pruned trees, a missing
/// parent: how a truncated history looks) are skipped and answer 404; a
/// corrupt one fails as it would for a tip.
pub fn verify_with_history(
    roots: &[Root],
    tips: &[Checksum],
    others: &[Checksum],
    history: usize,
    opts: &VerifyOptions,
) -> Result<VerifiedSet> {
    let (walk, jobs) = Walk::new(roots, opts, false);
    let mut set = VerifiedSet::default();
    let mut parents = walk.closure(tips, jobs, &mut set)?;
    parents.extend(others.iter().filter(|c| !tips.contains(c)));
    parents.sort();
    parents.dedup();
    walk.lenient.store(true, Ordering::Relaxed);
    let mut left = history;
    while !parents.is_empty() && left > 0 {
        parents.truncate(left);
        left -= parents.len();
        parents = walk.closure(&parents, jobs, &mut set)?;
    }
    set.hashed = walk.hashed.load(Ordering::Relaxed);
    if let Some(cache) = opts.cache.as_deref() {
        cache.replace(walk.verdicts.into_inner().expect("verdicts lock"));
    }
    Ok(set)
}

impl Walk<'_> {
    /// Verifies what `commits` reach and `set` does not hold yet (a
    /// dirtree in `set` was walked whole before), adding it to `set`.
    /// Returns the parents of the commits found, not yet in `set`.
    fn closure(
        &self,
        commits: &[Checksum],
        jobs: usize,
        set: &mut VerifiedSet,
    ) -> Result<Vec<Checksum>> {
        let mut parents = Vec::new();
        let mut level = Vec::new();
        for c in commits {
            let o = ObjectName::new(*c, ObjectKind::Commit);
            if set.contains(&o) {
                continue;
            }
            let Found::Meta(bytes) = self.check(&o)? else {
                continue;
            };
            let commit = Commit::parse(&bytes).with_context(|| format!("parsing commit {c}"))?;
            set.insert(o);
            level.push(ObjectName::new(commit.root_tree, ObjectKind::DirTree));
            level.push(ObjectName::new(commit.root_meta, ObjectKind::DirMeta));
            parents.extend(commit.parent);
        }
        let mut files = HashSet::new();
        let mut depth = 0;
        while !level.is_empty() {
            depth += 1;
            anyhow::ensure!(
                depth <= MAX_TREE_DEPTH,
                "trees nested deeper than {MAX_TREE_DEPTH}"
            );
            level.retain(|o| !set.contains(o));
            level.sort();
            level.dedup();
            level = self.level(level, jobs, set, &mut files)?;
        }
        let content: Vec<ObjectName> = files
            .into_iter()
            .map(|f| ObjectName::new(f, ObjectKind::File))
            .filter(|o| !set.contains(o))
            .collect();
        let present = Mutex::new(Vec::new());
        parallel(content, jobs, |o| {
            if !matches!(self.check(&o)?, Found::Absent) {
                present.lock().expect("present lock").push(o);
            }
            Ok(())
        })?;
        for o in present.into_inner().expect("present lock") {
            set.insert(o);
        }
        parents.retain(|p| !set.contains(&ObjectName::new(*p, ObjectKind::Commit)));
        Ok(parents)
    }

    /// One level of trees: checks its dirtrees and dirmetas in parallel,
    /// adds those present to `set`, their files to `files`; returns the
    /// next level.
    fn level(
        &self,
        items: Vec<ObjectName>,
        jobs: usize,
        set: &mut VerifiedSet,
        files: &mut HashSet<Checksum>,
    ) -> Result<Vec<ObjectName>> {
        let found: Mutex<Vec<(ObjectName, Option<DirTree>)>> = Mutex::new(Vec::new());
        parallel(items, jobs, |o| {
            let tree = match self.check(&o)? {
                Found::Absent => return Ok(()),
                Found::Meta(b) if o.kind == ObjectKind::DirTree => {
                    Some(parse_dirtree(&b).with_context(|| format!("dirtree {}", o.checksum))?)
                }
                _ => None,
            };
            found.lock().expect("found lock").push((o, tree));
            Ok(())
        })?;
        let mut next = Vec::new();
        for (o, tree) in found.into_inner().expect("found lock") {
            set.insert(o);
            let Some(tree) = tree else { continue };
            files.extend(tree.files.into_iter().map(|(_, f)| f));
            for (_, sub, m) in tree.dirs {
                next.push(ObjectName::new(sub, ObjectKind::DirTree));
                next.push(ObjectName::new(m, ObjectKind::DirMeta));
            }
        }
        anyhow::ensure!(
            set.len() + files.len() <= MAX_OBJECTS,
            "the published commits reach more than {MAX_OBJECTS} objects"
        );
        Ok(next)
    }
}

/// Verifies the static deltas in `root` that lead to one of `targets`
/// (the published commits) and adds them to `set`: the superblock must be
/// for the delta its directory names, and each part must have the SHA-256
/// the superblock lists. Deltas to other commits are left out
/// (not served); a corrupt delta to a published commit fails, naming it.
/// Checks again every object of `set` as `roots` serve it now, without
/// recording anything: for a generation that serves a source in place,
/// once a check of that source found something corrupt (which stops at the
/// first such object, perhaps one the generation does not serve). Files
/// unchanged since `opts.cache` verified them are not hashed again, and an
/// object gone from the roots answers 404, so it is not a failure here.
/// Deltas are not checked again.
pub fn recheck(roots: &[Root], set: &VerifiedSet, opts: &VerifyOptions) -> Result<()> {
    let (walk, jobs) = Walk::new(roots, opts, true);
    parallel(set.objects().copied().collect(), jobs, |o| {
        walk.check(&o).map(drop)
    })
}

pub fn verify_deltas(root: &Path, targets: &[Checksum], set: &mut VerifiedSet) -> Result<()> {
    for (name, rel) in list_deltas(root)? {
        if !targets.contains(&name.to) {
            continue;
        }
        verify_delta(root, &name, &rel)
            .with_context(|| format!("static delta {}", name.summary_name()))?;
        set.insert_delta(name);
    }
    Ok(())
}

fn verify_delta(root: &Path, name: &DeltaName, superblock: &str) -> Result<()> {
    let (bytes, _) = fsutil::read_file(root, superblock, MAX_SUPERBLOCK_SIZE as u64)
        .with_context(|| format!("reading {}/{superblock}", root.display()))?
        .with_context(|| format!("{}/{superblock} vanished", root.display()))?;
    let sb = Superblock::parse(&bytes).context("parsing the superblock")?;
    anyhow::ensure!(
        sb.to == name.to && sb.from == name.from,
        "the superblock is for {:?} -> {}, not what its name says",
        sb.from,
        sb.to
    );
    for (i, part) in sb.parts.iter().enumerate() {
        let rel = format!("{}/{i}", name.dir());
        let (f, _) = fsutil::open_file(root, &rel)
            .with_context(|| format!("opening {}/{rel}", root.display()))?
            .with_context(|| format!("part {i} ({}/{rel}) is missing", root.display()))?;
        let got = sha256_of(f).with_context(|| format!("reading {}/{rel}", root.display()))?;
        if got != part.checksum {
            return Err(Corrupt {
                what: format!("part {i} ({}/{rel})", root.display()),
                detail: format!("it hashes to {got}, its superblock says {}", part.checksum),
            }
            .into());
        }
    }
    Ok(())
}

fn sha256_of(mut f: std::fs::File) -> std::io::Result<Checksum> {
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(Checksum::from(<[u8; 32]>::from(h.finalize())))
}
