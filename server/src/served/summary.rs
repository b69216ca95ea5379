//! The summary a generation serves when its source has none: built from
//! the overlay's refs, the deltas and the config, deterministically (the
//! signer and every server compute the same bytes), and cached: for good
//! when the sources are images the server staged, else under a fingerprint
//! of those inputs taken at most once a second. Between fingerprints, a
//! glance at the identities of what a source's owner can change, taken on
//! the request's thread when the kernel has the lookups, keeps the cached
//! summary without a trip to the blocking pool.

use super::metadata::{identity, Identity, MAX_CONFIG};
use super::{FoundRef, Generated, Generation, Layer, MAX_DIR_ENTRIES, MAX_METADATA_FILE};
use crate::fsutil::{self, Lookup};
use crate::verify::ObjectGate;
use anyhow::{Context, Result};
use oscontent_format::{
    self as format, build_summary, Checksum, Commit, DeltaName, RefNamespace, Summary,
    SummaryDelta, SummaryRef,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug, Clone)]
pub(super) struct SummaryCache {
    fingerprint: [u8; 32],
    summary: Generated,
    /// When the fingerprint was last taken, or the glance last matched.
    checked: Instant,
    /// [`Generation::glance`] before that fingerprint was taken.
    glance: Option<[u8; 32]>,
}

/// How long a generated summary is served before its inputs are looked at
/// again. Taking the fingerprint opens each verified delta's superblock,
/// lists `delta-indexes` and reads the config (a few tens of syscalls, in
/// a trip to the blocking pool); every node asks for the summary, and for its
/// signature, which names it, so in a delta update of a few requests that
/// listing was a fifth of the server's work for a node. A second is far
/// below what clients may cache it for (`--metadata-max-age`).
const SUMMARY_RECHECK: Duration = Duration::from_secs(1);

impl Generation {
    /// `core.collection-id` of the served config (source, else overlay).
    fn collection_id(&self) -> Result<Option<String>> {
        for root in self.all_roots() {
            if let Some((cfg, _)) = fsutil::read_file(root, "config", MAX_CONFIG)? {
                // An unreadable config, like an invalid ID, advertises none.
                let cid = format::RepoConfig::parse(&cfg).map(|c| c.collection_id);
                return Ok(cid
                    .unwrap_or_default()
                    .filter(|c| format::validate_collection_id(c).is_ok()));
            }
        }
        Ok(None)
    }

    /// The staging index publication wrote into the overlay, if any. One
    /// that does not parse is an error: the summary must not silently
    /// drop what a signer elsewhere included.
    fn staging_index(&self) -> Result<Option<format::staging::StagingIndex>> {
        let cap = format::staging::MAX_INDEX_SIZE as u64;
        let Some((bytes, _)) = fsutil::read_file(&self.overlay, super::STAGING_INDEX, cap)? else {
            return Ok(None);
        };
        let index = format::staging::StagingIndex::parse(&bytes)
            .with_context(|| format!("reading the overlay's {}", super::STAGING_INDEX))?;
        Ok(Some(index))
    }

    fn has_delta_indexes(&self) -> Result<bool> {
        for root in self.all_roots() {
            if let Some(e) = fsutil::list_dir(root, "delta-indexes", MAX_DIR_ENTRIES)? {
                if e.iter().any(|e| e.is_dir) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The deltas the summary lists, each with where its superblock is
    /// and that file's identity. Those a publication verified are looked
    /// for by name, one `openat2` each beneath each root, rather than by
    /// listing every root's `deltas/` (a delta it did not verify is not
    /// listed either way); a mirror's store, where everything verified, is
    /// listed.
    fn summary_delta_files(&self) -> Result<BTreeMap<DeltaName, (PathBuf, String, Identity)>> {
        let mut deltas = BTreeMap::new();
        let ObjectGate::Only(verified) = &self.gate else {
            for root in self.all_roots().collect::<Vec<_>>().into_iter().rev() {
                for (name, rel) in crate::treewalk::list_deltas(root)? {
                    if let Some((_, m)) = fsutil::open_file(root, &rel)? {
                        deltas.insert(name, (root.clone(), rel, identity(&m)));
                    }
                }
            }
            return Ok(deltas);
        };
        for name in verified.deltas() {
            let rel = format!("{}/superblock", name.dir());
            let roots = self.root_fds().iter().zip(self.all_roots());
            for ((_, dir), root) in roots {
                let Some(dir) = dir else { continue };
                match fsutil::open_beneath(dir.as_fd(), &rel, false)
                    .with_context(|| format!("opening {rel} in {}", root.display()))?
                {
                    fsutil::Opened::File(_, m) => {
                        deltas.insert(*name, (root.clone(), rel, identity(&m)));
                        break;
                    }
                    fsutil::Opened::Absent | fsutil::Opened::WouldBlock => {}
                }
            }
        }
        Ok(deltas)
    }

    /// The generated summary if its inputs were looked at within
    /// [`SUMMARY_RECHECK`], or ever when they cannot change
    /// ([`Generation::fixed_sources`]), or if a glance at them now, without
    /// waiting on the disk, sees them as they were at the last look: what
    /// a request may answer without the blocking pool.
    pub(super) fn fresh_generated_summary(&self) -> Option<Generated> {
        {
            let cache = self.summary.lock().expect("poisoned");
            let c = cache.as_ref()?;
            if let Some(g) = self.recent_summary(c) {
                return Some(g);
            }
            // Without a glance at the last look (a mirror's store), only
            // the pool looks.
            c.glance?;
        }
        // Outside the lock: a few syscalls.
        let seen = self.glance(true).ok().flatten()?;
        self.kept_on(seen)
    }

    /// The cached summary if it needs no look: within its second, or for
    /// good ([`Generation::fixed_sources`]).
    fn recent_summary(&self, c: &SummaryCache) -> Option<Generated> {
        (self.fixed_sources || c.checked.elapsed() < SUMMARY_RECHECK).then(|| c.summary.clone())
    }

    /// The cached summary, looked at now, if `seen` is the glance taken at
    /// its last look (compared under the lock, with what is cached then).
    fn kept_on(&self, seen: [u8; 32]) -> Option<Generated> {
        let mut cache = self.summary.lock().expect("poisoned");
        let c = cache.as_mut().filter(|c| c.glance == Some(seen))?;
        c.checked = Instant::now();
        Some(c.summary.clone())
    }

    /// The identities of the generated summary's inputs that a source's
    /// owner can change: each verified delta's superblock (in the first
    /// root that has it, as [`Self::summary_delta_files`] finds it), and
    /// each source's `config` and `delta-indexes` directory (adding or
    /// removing an index changes the directory's). The refs and everything
    /// in the overlay are the generation's own, written once. Looked up
    /// beneath the roots' held fds; `None` if `nonblocking` and a lookup
    /// would wait on the disk, or where the deltas are not a fixed list (a
    /// mirror's store, listed at each fingerprint). A tmpfs keeps no
    /// negative dentries, so there a source without `delta-indexes` takes
    /// the pool, as before the glance.
    fn glance(&self, nonblocking: bool) -> Result<Option<[u8; 32]>> {
        let ObjectGate::Only(verified) = &self.gate else {
            return Ok(None);
        };
        let roots = self.root_fds();
        let mut h = Sha256::new();
        // Whether a file is there, or `None` if the lookup would block.
        let seen = |h: &mut Sha256, at: usize, dir: BorrowedFd<'_>, rel: &str| {
            let found = fsutil::stat_beneath(dir, rel, nonblocking)
                .with_context(|| format!("looking up {rel} beneath a source"))?;
            anyhow::Ok(match found {
                Lookup::Found(m) => {
                    feed(h, at, Some(&m));
                    Some(m.is_file())
                }
                Lookup::Absent => {
                    feed(h, at, None);
                    Some(false)
                }
                Lookup::WouldBlock => None,
            })
        };
        for name in verified.deltas() {
            let rel = format!("{}/superblock", name.dir());
            for (at, (_, dir)) in roots.iter().enumerate() {
                let Some(dir) = dir else { continue };
                match seen(&mut h, at, dir.as_fd(), &rel)? {
                    Some(true) => break,
                    Some(false) => {}
                    None => return Ok(None),
                }
            }
        }
        for (at, (layer, dir)) in roots.iter().enumerate() {
            let (Layer::Source, Some(dir)) = (layer, dir) else {
                continue;
            };
            for rel in ["config", "delta-indexes"] {
                if seen(&mut h, at, dir.as_fd(), rel)?.is_none() {
                    return Ok(None);
                }
            }
        }
        Ok(Some(h.finalize().into()))
    }

    /// The cached summary if it needs no look now.
    fn recent(&self) -> Option<Generated> {
        let cache = self.summary.lock().expect("poisoned");
        cache.as_ref().and_then(|c| self.recent_summary(c))
    }

    /// The summary the server publishes when the source has none. Its bytes
    /// depend only on the refs, their commits and the deltas (see
    /// [`summary_for`]), never on the clock.
    pub fn generated_summary(&self) -> Result<Generated> {
        if let Some(g) = self.recent() {
            return Ok(g);
        }
        // One look at a time: requests that find the summary past its
        // second together wait for the first look rather than each
        // listing and reading the same inputs on a pool thread of its own.
        // The lock guards no data, so a panic under it leaves nothing to
        // distrust.
        let _looking = self
            .summary_look
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(g) = self.recent() {
            return Ok(g);
        }
        // Before the inputs are read: a change meanwhile shows at the next.
        let glance = self.glance(false)?;
        if let Some(g) = glance.and_then(|seen| self.kept_on(seen)) {
            return Ok(g);
        }
        let refs = self.refs()?;
        let deltas = self.summary_delta_files()?;
        let indexed = self.index_deltas || self.has_delta_indexes()?;
        let collection_id = self.collection_id()?;
        let staging = self.staging_index()?;
        // Cheap fingerprint of the inputs: ref targets plus each superblock's
        // identity. Contents are hashed only when it changes.
        let mut h = Sha256::new();
        for r in &refs {
            h.update(format!("{:?}\0{}\0{}\n", r.namespace, r.name, r.commit));
        }
        for (name, (_, _, id)) in &deltas {
            h.update(format!("{}\0{id:?}\n", name.summary_name()));
        }
        h.update([u8::from(indexed)]);
        h.update(format!("{collection_id:?}"));
        if let Some(s) = &staging {
            h.update(Checksum::digest(&s.build()?).as_bytes());
        }
        let fingerprint: [u8; 32] = h.finalize().into();
        let mut cache = self.summary.lock().expect("poisoned");
        if let Some(c) = cache.as_mut().filter(|c| c.fingerprint == fingerprint) {
            c.checked = Instant::now();
            c.glance = glance;
            return Ok(c.summary.clone());
        }
        let mut summary_deltas = Vec::new();
        for (name, (root, rel, _)) in &deltas {
            let Some((bytes, _)) = fsutil::read_file(root, rel, MAX_METADATA_FILE)? else {
                continue;
            };
            summary_deltas.push(SummaryDelta {
                name: *name,
                superblock: Checksum::digest(&bytes),
            });
        }
        let mut summary = summary_for(&refs, summary_deltas, indexed, |c| self.commit(c))?;
        summary.collection_id = collection_id;
        summary.staging = staging;
        let generated = Generated::new(build_summary(&summary)?.into(), SystemTime::now());
        *cache = Some(SummaryCache {
            fingerprint,
            summary: generated.clone(),
            checked: Instant::now(),
            glance,
        });
        Ok(generated)
    }
}

/// One looked-up path's part of [`Generation::glance`]: which root, and
/// what is there by identity, if anything.
fn feed(h: &mut Sha256, at: usize, meta: Option<&std::fs::Metadata>) {
    h.update((at as u64).to_le_bytes());
    let Some(m) = meta else {
        h.update([0]);
        return;
    };
    let (dev, ino, len, mtime, mtime_ns, ctime, ctime_ns) = identity(m);
    h.update([1]);
    for n in [dev, ino, len] {
        h.update(n.to_le_bytes());
    }
    for n in [mtime, mtime_ns, ctime, ctime_ns] {
        h.update(n.to_le_bytes());
    }
}

/// Where a signature over the generated summary with this digest lives in
/// the overlay. Keyed by digest so a signature can never be served next to a
/// summary it does not sign.
pub fn summary_sig_path(summary_digest: &Checksum) -> String {
    format!("summary-sigs/{}.sig", summary_digest.to_hex())
}

/// The deterministic summary for a set of refs: `last-modified` is the
/// newest commit timestamp, not the wall clock, so the signer and every
/// server compute identical bytes. Refs whose commit cannot be loaded are
/// left out (and logged), as a remote with one broken ref should still
/// serve the others.
pub fn summary_for(
    refs: &[FoundRef],
    deltas: Vec<SummaryDelta>,
    indexed_deltas: bool,
    mut load: impl FnMut(&Checksum) -> Result<Commit>,
) -> Result<Summary> {
    let mut s = Summary {
        mode: Some(format::ARCHIVE_MODE.into()),
        deltas,
        indexed_deltas,
        ..Default::default()
    };
    for r in refs {
        let commit = match load(&r.commit) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(r#ref = %r.name, commit = %r.commit, "leaving ref out of the summary: {e:#}");
                continue;
            }
        };
        s.last_modified = s.last_modified.max(Some(commit.timestamp));
        let mut entry = SummaryRef {
            name: r.name.clone(),
            commit: r.commit,
            commit_size: commit.size,
            timestamp: Some(commit.timestamp),
            version: commit.version(),
        };
        match r.namespace {
            RefNamespace::Heads => s.refs.push(entry),
            RefNamespace::Mirrors => {
                let (cid, name) = r.name.split_once('/').expect("validated mirror ref");
                entry.name = name.to_owned();
                s.collection_map
                    .entry(cid.to_owned())
                    .or_default()
                    .push(entry);
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::VerifiedSet;
    use std::sync::Arc;

    impl Generation {
        /// As if the last look at the summary's inputs was long ago.
        fn age_summary(&self) {
            let mut cache = self.summary.lock().unwrap();
            let c = cache.as_mut().expect("a summary was generated");
            c.checked = Instant::now()
                .checked_sub(SUMMARY_RECHECK)
                .expect("the clock is past a second");
        }
    }

    fn listed(g: &Generation) -> Vec<(DeltaName, Checksum)> {
        let bytes = g.generated_summary().unwrap().bytes;
        let s = format::parse_summary(&bytes).unwrap();
        s.deltas.iter().map(|d| (d.name, d.superblock)).collect()
    }

    /// Once its second is up, the generated summary is kept on a glance
    /// from the request's thread while a source's config, `delta-indexes`
    /// and the verified deltas' superblocks are as they were; a change to
    /// any of them is noticed and the summary generated again from the
    /// blocking path.
    #[test]
    fn a_generated_summary_stands_on_a_glance_until_a_source_changes() {
        let src = tempfile::tempdir().unwrap();
        let overlay = tempfile::tempdir().unwrap();
        let name = DeltaName {
            from: Some(Checksum::digest(b"v1")),
            to: Checksum::digest(b"v2"),
        };
        let superblock = src.path().join(name.dir()).join("superblock");
        std::fs::create_dir_all(superblock.parent().unwrap()).unwrap();
        std::fs::write(&superblock, b"first").unwrap();
        std::fs::write(src.path().join("config"), "[core]\nrepo_version=1\n").unwrap();
        // Present from the start: the test's temporary dir may be a tmpfs,
        // which keeps no negative dentries, so a glance at a path that is
        // not there always takes the pool there.
        std::fs::create_dir(src.path().join("delta-indexes")).unwrap();
        let mut g = Generation::new(
            1,
            vec![src.path().to_owned()],
            overlay.path().to_owned(),
            vec![],
        );
        let mut set = VerifiedSet::default();
        set.insert_delta(name);
        g.gate = ObjectGate::Only(Arc::new(set));
        assert_eq!(listed(&g), [(name, Checksum::digest(b"first"))]);

        let write = |rel: &str, body: &[u8]| std::fs::write(src.path().join(rel), body).unwrap();
        let mkdir = |rel: &str| std::fs::create_dir_all(src.path().join(rel)).unwrap();
        type Change<'a> = (&'a str, Box<dyn Fn() + 'a>);
        let cases: Vec<Change<'_>> = vec![
            ("nothing", Box::new(|| {})),
            (
                "the superblock",
                Box::new(|| std::fs::write(&superblock, b"second, longer").unwrap()),
            ),
            (
                "the config",
                Box::new(|| write("config", b"[core]\nrepo_version=1\nmode=archive-z2\n")),
            ),
            ("an index", Box::new(|| mkdir("delta-indexes/ab"))),
        ];
        for (what, change) in cases {
            g.age_summary();
            change();
            let kept = g.fresh_generated_summary().is_some();
            assert_eq!(kept, what == "nothing", "after a change to {what}");
            let want = std::fs::read(&superblock).unwrap();
            assert_eq!(listed(&g), [(name, Checksum::digest(&want))], "{what}");
            // Looked at again: what is there now stands.
            g.age_summary();
            assert!(
                g.fresh_generated_summary().is_some(),
                "{what}, once looked at"
            );
        }
    }
}
