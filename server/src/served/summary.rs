//! The summary a generation serves when its source has none: built from
//! the overlay's refs, the deltas and the config, deterministically (the
//! signer and every server compute the same bytes), and cached: for good
//! when the sources are images the server staged, else under a fingerprint
//! of those inputs taken at most once a second.

use super::metadata::{identity, Identity, MAX_CONFIG};
use super::{FoundRef, Generated, Generation, MAX_DIR_ENTRIES, MAX_METADATA_FILE};
use crate::fsutil;
use crate::verify::ObjectGate;
use anyhow::{Context, Result};
use oscontent_format::{
    self as format, build_summary, Checksum, Commit, DeltaName, RefNamespace, Summary,
    SummaryDelta, SummaryRef,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug)]
pub(super) struct SummaryCache {
    fingerprint: [u8; 32],
    summary: Generated,
    /// When the fingerprint was last taken.
    checked: Instant,
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
                for (name, rel) in Self::list_deltas(root)? {
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
    /// ([`Generation::fixed_sources`]): what a request may answer without a
    /// look.
    pub(super) fn fresh_generated_summary(&self) -> Option<Generated> {
        let cache = self.summary.lock().expect("poisoned");
        let c = cache.as_ref()?;
        (self.fixed_sources || c.checked.elapsed() < SUMMARY_RECHECK).then(|| c.summary.clone())
    }

    /// The summary the server publishes when the source has none. Its bytes
    /// depend only on the refs, their commits and the deltas (see
    /// [`summary_for`]), never on the clock.
    pub fn generated_summary(&self) -> Result<Generated> {
        if let Some(g) = self.fresh_generated_summary() {
            return Ok(g);
        }
        let refs = self.refs()?;
        let deltas = self.summary_delta_files()?;
        let indexed = self.index_deltas || self.has_delta_indexes()?;
        let collection_id = self.collection_id()?;
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
        let fingerprint: [u8; 32] = h.finalize().into();
        let mut cache = self.summary.lock().expect("poisoned");
        if let Some(c) = cache.as_mut().filter(|c| c.fingerprint == fingerprint) {
            c.checked = Instant::now();
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
        let generated = Generated::new(build_summary(&summary)?.into(), SystemTime::now());
        *cache = Some(SummaryCache {
            fingerprint,
            summary: generated.clone(),
            checked: Instant::now(),
        });
        Ok(generated)
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
