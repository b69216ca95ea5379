//! The verifying walk over a generation's sources.

use super::{default_jobs, FileId, Root, VerdictCache, VerifiedSet, VerifyOptions};
use crate::fsutil;
use crate::mirror::store::max_object_size;
use crate::mirror::sync::{parallel, MAX_OBJECTS, MAX_TREE_DEPTH};
use crate::served::Generation;
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What one walk shares between its threads.
struct Walk<'a> {
    roots: &'a [Root],
    cache: Option<&'a VerdictCache>,
    verdicts: Mutex<HashMap<ObjectName, (PathBuf, FileId)>>,
    hashed: AtomicUsize,
}

impl Walk<'_> {
    /// The file the generation would serve for `o`: the first root's.
    fn open(&self, o: &ObjectName) -> Result<(&Root, std::fs::File, std::fs::Metadata)> {
        let rel = o.path();
        for root in self.roots {
            if let Some((f, m)) = fsutil::open_file(&root.path, &rel)
                .with_context(|| format!("opening {}/{rel}", root.path.display()))?
            {
                return Ok((root, f, m));
            }
        }
        bail!(
            "{} {} is missing from the source: the commit is incomplete",
            o.kind.extension(),
            o.checksum
        )
    }

    /// Checks that the file served for `o` is `o`, unless it was verified
    /// before (as the same file) or its root holds only verified objects.
    /// Returns a metadata object's bytes, for the walk to parse.
    fn check(&self, o: &ObjectName) -> Result<Option<Vec<u8>>> {
        let (root, file, meta) = self.open(o)?;
        let id = FileId::of(&meta);
        let trusted = root.preverified || self.cache.is_some_and(|c| c.verified(o, &root.path, id));
        if !trusted {
            self.hashed.fetch_add(1, Ordering::Relaxed);
        }
        let where_ = || format!("{}/{}", root.path.display(), o.path());
        let max = max_object_size(o.kind);
        anyhow::ensure!(
            meta.len() <= max,
            "{} is {} bytes, over the {max} byte limit for a {}",
            where_(),
            meta.len(),
            o.kind.extension()
        );
        let bytes = match o.kind {
            ObjectKind::File => {
                if !trusted {
                    let got = archive_checksum(std::io::BufReader::new(file))
                        .with_context(|| format!("content object {} ({})", o.checksum, where_()))?;
                    anyhow::ensure!(
                        got == o.checksum,
                        "content object {} is corrupt: {} has the content checksum {got}",
                        o.checksum,
                        where_()
                    );
                }
                None
            }
            ObjectKind::CommitMeta => None,
            ObjectKind::Commit | ObjectKind::DirTree | ObjectKind::DirMeta => {
                let mut bytes = Vec::with_capacity(meta.len() as usize);
                file.take(max + 1)
                    .read_to_end(&mut bytes)
                    .with_context(|| format!("reading {}", where_()))?;
                if !trusted {
                    let got = Checksum::digest(&bytes);
                    anyhow::ensure!(
                        got == o.checksum,
                        "{} {} is corrupt: {} hashes to {got}",
                        o.kind.extension(),
                        o.checksum,
                        where_()
                    );
                    if o.kind == ObjectKind::DirMeta {
                        check_dirmeta(&bytes).with_context(where_)?;
                    }
                }
                Some(bytes)
            }
        };
        self.verdicts
            .lock()
            .expect("verdicts lock")
            .insert(*o, (root.path.clone(), id));
        Ok(bytes)
    }
}

/// Verifies the closure of `commits` (each commit, and every dirtree,
/// dirmeta and content object it reaches) as the generation over `roots`
/// would serve it, in parallel, level by level. Parent commits are not
/// followed: ostree pulls them only on request, and a 404 there is how a
/// truncated history looks. Any object missing or corrupt fails the whole
/// verification, naming it.
pub fn verify_closure(
    roots: &[Root],
    commits: &[Checksum],
    opts: &VerifyOptions,
) -> Result<VerifiedSet> {
    let jobs = if opts.jobs == 0 {
        default_jobs()
    } else {
        opts.jobs
    };
    let walk = Walk {
        roots,
        cache: opts.cache.as_deref(),
        verdicts: Mutex::new(HashMap::new()),
        hashed: AtomicUsize::new(0),
    };
    let mut set = VerifiedSet::default();
    let (mut trees, mut metas) = (HashSet::new(), HashSet::new());
    let mut level = Vec::new();
    let mut level_metas = Vec::new();
    for c in commits {
        let o = ObjectName::new(*c, ObjectKind::Commit);
        let bytes = walk.check(&o)?.context("a commit has bytes")?;
        let commit = Commit::parse(&bytes).with_context(|| format!("parsing commit {c}"))?;
        set.insert(o);
        if trees.insert(commit.root_tree) {
            level.push(commit.root_tree);
        }
        if metas.insert(commit.root_meta) {
            level_metas.push(commit.root_meta);
        }
    }
    let mut files = HashSet::new();
    let mut depth = 0;
    while !level.is_empty() || !level_metas.is_empty() {
        depth += 1;
        anyhow::ensure!(
            depth <= MAX_TREE_DEPTH,
            "trees nested deeper than {MAX_TREE_DEPTH}"
        );
        let parsed: Mutex<Vec<DirTree>> = Mutex::new(Vec::new());
        let items: Vec<ObjectName> = level
            .iter()
            .map(|t| ObjectName::new(*t, ObjectKind::DirTree))
            .chain(
                level_metas
                    .iter()
                    .map(|m| ObjectName::new(*m, ObjectKind::DirMeta)),
            )
            .collect();
        parallel(items.clone(), jobs, |o| {
            let bytes = walk.check(&o)?;
            if let (ObjectKind::DirTree, Some(b)) = (o.kind, bytes) {
                let tree = parse_dirtree(&b).with_context(|| format!("dirtree {}", o.checksum))?;
                parsed.lock().expect("parsed lock").push(tree);
            }
            Ok(())
        })?;
        items.into_iter().for_each(|o| {
            set.insert(o);
        });
        level.clear();
        level_metas.clear();
        for tree in parsed.into_inner().expect("parsed lock") {
            files.extend(tree.files.into_iter().map(|(_, f)| f));
            for (_, sub, m) in tree.dirs {
                if trees.insert(sub) {
                    level.push(sub);
                }
                if metas.insert(m) {
                    level_metas.push(m);
                }
            }
        }
        anyhow::ensure!(
            trees.len() + metas.len() + files.len() <= MAX_OBJECTS,
            "the published commits reach more than {MAX_OBJECTS} objects"
        );
    }
    let content: Vec<ObjectName> = files
        .into_iter()
        .map(|f| ObjectName::new(f, ObjectKind::File))
        .collect();
    parallel(content.clone(), jobs, |o| walk.check(&o).map(drop))?;
    content.into_iter().for_each(|o| {
        set.insert(o);
    });
    set.hashed = walk.hashed.load(Ordering::Relaxed);
    if let Some(cache) = opts.cache.as_deref() {
        cache.replace(walk.verdicts.into_inner().expect("verdicts lock"));
    }
    Ok(set)
}

/// Verifies the static deltas in `root` that lead to one of `targets`
/// (the published commits) and adds them to `set`: the superblock must be
/// for the delta its directory names, and each part must have the SHA-256
/// the superblock lists. Deltas to other commits are left out
/// (not served); a corrupt delta to a published commit fails, naming it.
pub fn verify_deltas(root: &Path, targets: &[Checksum], set: &mut VerifiedSet) -> Result<()> {
    for (name, rel) in Generation::list_deltas(root)? {
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
        anyhow::ensure!(
            got == part.checksum,
            "part {i} ({}/{rel}) is corrupt: it hashes to {got}, its superblock says {}",
            root.display(),
            part.checksum
        );
    }
    Ok(())
}

fn sha256_of(mut f: std::fs::File) -> std::io::Result<Checksum> {
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(Checksum::from(<[u8; 32]>::from(h.finalize())))
}
