//! A generation: verified, read-only source repos plus the overlay the
//! server wrote for it (refs, summary pieces, config, later signatures and
//! deltas), resolved path by path.
//!
//! Objects are read from the sources at each request, but only those the
//! publication verified (`ObjectGate`); refs and summaries come from the
//! overlay, where publication snapshotted them, so what other tools add to
//! a `--repo` waits for the next publication. What the server derives (the
//! summary, when the repo has none: `summary.rs`) is cached under a
//! fingerprint of its inputs, taken at most once a second, and rebuilt only
//! when they change; of those inputs the overlay's refs are listed once, as
//! an overlay is never written after it is published.

pub mod body;
pub mod deltas;
pub mod memory;
pub mod metadata;
pub mod objects;
pub mod streams;
mod summary;

use summary::SummaryCache;
pub use summary::{summary_for, summary_sig_path};

use crate::fsutil;
use crate::prepared::Prepared;
use crate::treewalk::MAX_DIR_ENTRIES;
use crate::verify::ObjectGate;
use anyhow::{Context, Result};
use metadata::{MetadataCache, MetadataFile, MAX_COMMITMETA, MAX_REF};
use oscontent_format::openpgp::VerifiedSig;
use oscontent_format::{
    self as format, Checksum, Commit, ObjectKind, ObjectName, RefNamespace, RepoPath,
};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Signature bundle files and delta superblocks read whole; anything
/// larger is refused rather than read into memory. What the HTTP surface
/// serves whole has tighter caps, by kind (`metadata.rs`).
pub const MAX_METADATA_FILE: u64 = 64 << 20;
/// An overlay file that, when present, is the summary served (with
/// `summary.sig` next to it), instead of a generated one.
pub const PINNED_SUMMARY: &str = "summary";
/// Where a publication keeps the staging index of the native images it
/// serves (`oscontent_format::staging`), in the overlay: carried by the
/// generated summary, never served as a file of its own.
pub const STAGING_INDEX: &str = "staging-index";
/// Bounds for walking refs and deltas (external input, invariant 5).
pub const MAX_REFS: usize = 100_000;

static NEXT_CACHE_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Where a resolved file lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Source,
    Overlay,
}

/// Bytes the server generated, with their validators.
#[derive(Debug, Clone)]
pub struct Generated {
    pub bytes: bytes::Bytes,
    /// The ETag of the bytes, and when these exact bytes were first
    /// produced (for Last-Modified): made once, not per request.
    pub prepared: Arc<Prepared>,
}

impl Generated {
    pub fn new(bytes: bytes::Bytes, produced: SystemTime) -> Self {
        let prepared = metadata::whole(&bytes, Some(produced));
        Self { bytes, prepared }
    }
}

/// A request path as [`Generation::locate`] found it.
#[derive(Debug)]
pub enum Located {
    File {
        layer: Layer,
        root: PathBuf,
        rel: String,
        file: std::fs::File,
        meta: std::fs::Metadata,
    },
    Generated(Generated),
    Missing,
    /// Asked not to wait, it would have: ask again from a thread that may.
    WouldBlock,
}

/// Opens `rel` beneath `dir` (the fd of `root`, a `layer`).
fn open_in(
    layer: Layer,
    root: &Path,
    dir: BorrowedFd<'_>,
    rel: &str,
    nonblocking: bool,
) -> Result<Located> {
    Ok(
        match fsutil::open_beneath(dir, rel, nonblocking)
            .with_context(|| format!("opening {rel} in {}", root.display()))?
        {
            fsutil::Opened::File(file, meta) => Located::File {
                layer,
                root: root.to_owned(),
                rel: rel.to_owned(),
                file,
                meta,
            },
            fsutil::Opened::Absent => Located::Missing,
            fsutil::Opened::WouldBlock => Located::WouldBlock,
        },
    )
}

/// How a request path is answered.
#[derive(Debug)]
pub enum Resolved {
    File {
        layer: Layer,
        root: PathBuf,
        rel: String,
    },
    Generated(Generated),
    Missing,
}

/// One published generation.
#[derive(Debug)]
pub struct Generation {
    pub id: u64,
    /// The served repos (read-only, never written): one for `--repo` and
    /// `--oscontainer`, one per image for `--image`. Earlier ones win.
    pub sources: Vec<PathBuf>,
    /// Held for as long as the generation is: e.g. staged image
    /// directories, removed when the last request on it is done.
    pub keepalive: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// This generation's overlay under the state dir.
    pub overlay: PathBuf,
    pub published: SystemTime,
    /// Refs the server published into the overlay, with their commits.
    pub derived_refs: Vec<(String, Checksum)>,
    /// What publication did with signatures (bundle, signing, verification).
    pub signatures: SignatureReport,
    /// The objects and deltas of the sources it serves: those its
    /// publication verified (closed until one sets it).
    pub gate: ObjectGate,
    summary: Mutex<Option<SummaryCache>>,
    /// Held while the generated summary's inputs are looked at
    /// (`summary.rs`).
    summary_look: Mutex<()>,
    /// The overlay's refs, listed once. An overlay is written while it is
    /// being built (refs, config, signatures: `state::Building`), where
    /// publication lists them only once the refs are all written, and
    /// never once a `Generation` serves it, so one listing holds for its
    /// life; listing again was most of a generated summary's recheck.
    refs: std::sync::OnceLock<Vec<FoundRef>>,
    commits: Mutex<BTreeMap<Checksum, Commit>>,
    metadata: MetadataCache,
    objects: objects::ObjectRoots,
    /// Unique in this process (ids restart with a state dir, and a
    /// process may open several: a site mirror's, `sign`'s scratch one):
    /// what the object cache keys this generation's entries by.
    pub cache_key: u64,
    /// The summary says `ostree.summary.indexed-deltas`: set by
    /// publication when the refs name several commits, whether or not
    /// deltas exist yet, so the summary's bytes (and their signature) stay
    /// the same when generated deltas are published later.
    pub index_deltas: bool,
    /// Deltas the server generated between the releases (`crate::deltas`),
    /// listed only in their delta indexes; unset in a generation as
    /// published from its source ([`Self::attach_deltas`]).
    deltas: std::sync::OnceLock<Arc<dyn deltas::ServedDeltas>>,
    /// Its sources are images the server staged, which nothing writes once
    /// they are published, so the generated summary's inputs are fixed for
    /// its life: it is generated once, never rechecked. A `--repo` or an
    /// `--oscontainer` is a directory someone else owns, and is rechecked.
    pub fixed_sources: bool,
}

/// What publication did with signatures (`crate::signing::apply`), kept
/// with the generation for logs and for deciding when to publish again.
#[derive(Debug, Clone, Default)]
pub struct SignatureReport {
    /// Bundle identity at load time ([`crate::signing::bundle_identity`]).
    pub bundle_identity: Option<[u8; 32]>,
    /// SHA-256 of the summary the generation serves.
    pub summary_digest: Option<Checksum>,
    /// Whether a signature over that summary is installed.
    pub summary_signed: bool,
    /// With `--trusted-keys`: each ref's verified signature.
    pub verified_refs: Vec<(String, Checksum, VerifiedSig)>,
    /// With `--trusted-keys`: the summary's verified signature.
    pub verified_summary: Option<VerifiedSig>,
}

/// A ref as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRef {
    pub namespace: RefNamespace,
    /// For mirrors: `collection-id/ref`.
    pub name: String,
    pub commit: Checksum,
}

impl Generation {
    pub fn new(
        id: u64,
        sources: Vec<PathBuf>,
        overlay: PathBuf,
        derived_refs: Vec<(String, Checksum)>,
    ) -> Self {
        Self {
            id,
            sources,
            keepalive: Vec::new(),
            overlay,
            published: SystemTime::now(),
            derived_refs,
            signatures: Default::default(),
            gate: ObjectGate::default(),
            summary: Mutex::new(None),
            summary_look: Mutex::new(()),
            refs: std::sync::OnceLock::new(),
            commits: Mutex::new(BTreeMap::new()),
            metadata: MetadataCache::default(),
            objects: Default::default(),
            cache_key: NEXT_CACHE_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            index_deltas: false,
            deltas: std::sync::OnceLock::new(),
            fixed_sources: false,
        }
    }

    /// The deltas generated for it (`crate::deltas` implements
    /// [`deltas::ServedDeltas`]), once compiled and verified: served from
    /// then on beside what it published. Neither the summary nor its
    /// signature changes (they are listed in delta indexes only), nor
    /// anything the object cache holds for it, so the generation stays the
    /// one being served. `false` if it has deltas already.
    pub fn attach_deltas(&self, deltas: Arc<dyn deltas::ServedDeltas>) -> bool {
        self.deltas.set(deltas).is_ok()
    }

    /// The deltas generated for it, if any are attached yet.
    pub fn deltas(&self) -> Option<&Arc<dyn deltas::ServedDeltas>> {
        self.deltas.get()
    }

    /// The first of `order`'s roots holding `rel`, opened: one `openat2`
    /// beneath each root's directory fd (`fsutil::open_beneath`).
    fn first_file(&self, rel: &str, order: &[Layer], nonblocking: bool) -> Result<Located> {
        for &want in order {
            let roots = self.root_fds().iter().zip(self.all_roots());
            for ((layer, dir), root) in roots.filter(|((l, _), _)| *l == want) {
                let Some(dir) = dir else { continue };
                let found = open_in(*layer, root, dir.as_fd(), rel, nonblocking)?;
                if !matches!(found, Located::Missing) {
                    return Ok(found);
                }
            }
        }
        Ok(Located::Missing)
    }

    /// Resolves a request path against source and overlay.
    pub fn resolve(&self, path: &RepoPath) -> Result<Resolved> {
        Ok(match self.locate(path, false)? {
            Located::File {
                layer, root, rel, ..
            } => Resolved::File { layer, root, rel },
            Located::Generated(g) => Resolved::Generated(g),
            Located::Missing => Resolved::Missing,
            Located::WouldBlock => anyhow::bail!("resolving {path:?} without waiting"),
        })
    }

    /// As [`Self::resolve`], with the file it names open: the request
    /// path. With `nonblocking`, nothing waits on the disk (lookups only
    /// from the dentry cache, a summary only as last generated), and
    /// [`Located::WouldBlock`] says to ask again from the blocking pool.
    pub fn locate(&self, path: &RepoPath, nonblocking: bool) -> Result<Located> {
        // Generated deltas were verified before they were published, and
        // their indexes are made from what verified.
        if let Some(d) = self.deltas.get() {
            match d.resolve(path) {
                Some(Resolved::File { layer, root, rel }) => {
                    let Some(dir) = d.dir_fd(path) else {
                        return Ok(Located::Missing);
                    };
                    return open_in(layer, &root, dir, &rel, nonblocking);
                }
                Some(Resolved::Generated(g)) => return Ok(Located::Generated(g)),
                Some(Resolved::Missing) => return Ok(Located::Missing),
                None => {}
            }
        }
        // The one check on the request path: an object or delta the
        // publication did not verify does not exist (invariant 1).
        if !self.gate.allows(path) {
            return Ok(Located::Missing);
        }
        const SOURCE_FIRST: &[Layer] = &[Layer::Source, Layer::Overlay];
        const OVERLAY_FIRST: &[Layer] = &[Layer::Overlay, Layer::Source];
        match path {
            RepoPath::Summary => {
                match self.source_summary(nonblocking)? {
                    Located::Missing => {}
                    pinned => return Ok(pinned),
                }
                if nonblocking {
                    return Ok(self
                        .fresh_generated_summary()
                        .map_or(Located::WouldBlock, Located::Generated));
                }
                Ok(Located::Generated(self.generated_summary()?))
            }
            RepoPath::SummarySig => {
                // summary.sig must sign the summary actually served, or
                // ostree would keep using a stale cached summary. What the
                // server installed (a bundle's, or its own with --sign-key)
                // is keyed by the digest of the summary it signs, so it is
                // served only next to exactly that summary.
                let Some(served) = self.served_summary_with(nonblocking)? else {
                    return Ok(Located::WouldBlock);
                };
                let rel = summary_sig_path(&Checksum::digest(&served));
                match self.first_file(&rel, &[Layer::Overlay], nonblocking)? {
                    Located::Missing => {}
                    found => return Ok(found),
                }
                match self.source_summary(nonblocking)? {
                    Located::File { layer, .. } => {
                        self.first_file("summary.sig", &[layer], nonblocking)
                    }
                    Located::WouldBlock => Ok(Located::WouldBlock),
                    _ => Ok(Located::Missing),
                }
            }
            // Refs only as publication snapshotted them; an image's
            // manifest and config only as publication wrote them, from
            // what verified while the image streamed.
            RepoPath::Ref { .. } | RepoPath::Blob(_) => {
                self.first_file(&path.to_path(), &[Layer::Overlay], nonblocking)
            }
            // Detached metadata from the server (signature bundles) wins
            // over what the source carries: it is the merged superset.
            RepoPath::Object(ObjectName {
                kind: ObjectKind::CommitMeta,
                ..
            }) => self.first_file(&path.to_path(), OVERLAY_FIRST, nonblocking),
            _ => self.first_file(&path.to_path(), SOURCE_FIRST, nonblocking),
        }
    }

    /// A summary publication pinned in the overlay (a mirrored upstream's,
    /// or a `--repo`'s own as the publication snapshotted it, republished
    /// byte for byte with its signature). A source's live summary is never
    /// served: it may name refs no publication verified.
    fn source_summary(&self, nonblocking: bool) -> Result<Located> {
        self.first_file(PINNED_SUMMARY, &[Layer::Overlay], nonblocking)
    }

    /// Whether the summary served is one publication pinned (not generated).
    pub fn has_pinned_summary(&self) -> Result<bool> {
        Ok(matches!(self.source_summary(false)?, Located::File { .. }))
    }

    /// The exact summary bytes served: the source's own, else the generated
    /// one. This is what `summary.sig` must sign.
    pub fn served_summary(&self) -> Result<bytes::Bytes> {
        Ok(self
            .served_summary_with(false)?
            .expect("a blocking read does not ask to block"))
    }

    /// [`Self::served_summary`]; with `nonblocking`, `None` if that would
    /// wait on the disk or on generating the summary.
    fn served_summary_with(&self, nonblocking: bool) -> Result<Option<bytes::Bytes>> {
        match self.source_summary(nonblocking)? {
            Located::File {
                root,
                rel,
                file,
                meta,
                ..
            } => {
                let cap = format::summary::MAX_SUMMARY_SIZE as u64;
                let read =
                    self.metadata
                        .read_opened(&root, &rel, (&file, &meta), cap, nonblocking)?;
                Ok(read.map(|f| f.bytes))
            }
            Located::WouldBlock => Ok(None),
            _ if nonblocking => Ok(self.fresh_generated_summary().map(|g| g.bytes)),
            _ => Ok(Some(self.generated_summary()?.bytes)),
        }
    }

    /// A metadata file served whole (`metadata::cap` gives its cap), read
    /// and hashed once per version of the file for this generation.
    pub fn read_metadata(
        &self,
        root: &Path,
        rel: &str,
        cap: u64,
    ) -> Result<Option<MetadataFile>, metadata::MetadataError> {
        self.metadata.read(root, rel, cap)
    }

    /// As [`Self::read_metadata`], for a file [`Self::locate`] opened;
    /// `Ok(None)` if `nonblocking` and the bytes are not in memory.
    pub fn read_located(
        &self,
        (root, rel): (&Path, &str),
        opened: (&std::fs::File, &std::fs::Metadata),
        cap: u64,
        nonblocking: bool,
    ) -> Result<Option<MetadataFile>, metadata::MetadataError> {
        self.metadata
            .read_opened(root, rel, opened, cap, nonblocking)
    }

    /// The exact bytes of a commit object, checked to hash to its name:
    /// what its signatures sign.
    pub fn commit_bytes(&self, c: &Checksum) -> Result<Vec<u8>> {
        let rel = ObjectName::new(*c, ObjectKind::Commit).path();
        let (bytes, _) = self
            .all_roots()
            .find_map(|root| {
                fsutil::read_file(root, &rel, format::commit::MAX_COMMIT_SIZE as u64).transpose()
            })
            .transpose()
            .with_context(|| format!("reading commit {c}"))?
            .with_context(|| format!("commit {c} is not in the repo"))?;
        let got = Checksum::digest(&bytes);
        if got != *c {
            return Err(crate::verify::Corrupt {
                what: format!("commit object {c}"),
                detail: format!("its bytes hash to {got}"),
            }
            .into());
        }
        Ok(bytes)
    }

    /// A commit's detached metadata as the sources carry it (the first
    /// source that has it), ignoring the overlay.
    pub fn source_commitmeta(&self, c: &Checksum) -> Result<Option<Vec<u8>>> {
        let rel = ObjectName::new(*c, ObjectKind::CommitMeta).path();
        for root in &self.sources {
            if let Some((b, _)) = fsutil::read_file(root, &rel, MAX_COMMITMETA)
                .with_context(|| format!("reading {}/{rel}", root.display()))?
            {
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    /// A commit's detached metadata as served (overlay first).
    pub fn served_commitmeta(&self, c: &Checksum) -> Result<Option<Vec<u8>>> {
        let rel = ObjectName::new(*c, ObjectKind::CommitMeta).path();
        if let Some((b, _)) = fsutil::read_file(&self.overlay, &rel, MAX_COMMITMETA)
            .with_context(|| format!("reading {}/{rel}", self.overlay.display()))?
        {
            return Ok(Some(b));
        }
        self.source_commitmeta(c)
    }

    /// All roots: sources in precedence order, then the overlay.
    fn all_roots(&self) -> impl Iterator<Item = &PathBuf> {
        self.sources.iter().chain(std::iter::once(&self.overlay))
    }

    /// Refs in one layer, validated. Invalid names and unreadable or
    /// malformed ref files are skipped with a warning: one bad ref must not
    /// take the whole remote down.
    pub fn list_refs(root: &Path) -> Result<Vec<FoundRef>> {
        let mut out = Vec::new();
        for ns in [RefNamespace::Heads, RefNamespace::Mirrors] {
            let mut stack = vec![(String::new(), 0usize)];
            while let Some((prefix, depth)) = stack.pop() {
                let dir = if prefix.is_empty() {
                    ns.dir().to_owned()
                } else {
                    format!("{}/{prefix}", ns.dir())
                };
                let Some(entries) = fsutil::list_dir(root, &dir, MAX_DIR_ENTRIES)
                    .with_context(|| format!("listing {}/{dir}", root.display()))?
                else {
                    continue;
                };
                for e in entries {
                    let name = if prefix.is_empty() {
                        e.name.clone()
                    } else {
                        format!("{prefix}/{}", e.name)
                    };
                    if e.is_dir && depth + 1 < fsutil::MAX_DEPTH {
                        stack.push((name, depth + 1));
                    } else if e.is_file {
                        if let Some(r) = read_ref(root, ns, &name) {
                            out.push(r);
                        }
                        anyhow::ensure!(
                            out.len() <= MAX_REFS,
                            "{} has more than {MAX_REFS} refs",
                            root.display()
                        );
                    }
                }
            }
        }
        Ok(out)
    }

    /// The refs served: the overlay's, which publication wrote after it
    /// verified their commits. A source's live refs are read only by
    /// publication (`publish.rs` snapshots them).
    pub fn refs(&self) -> Result<Vec<FoundRef>> {
        if let Some(r) = self.refs.get() {
            return Ok(r.clone());
        }
        // A failed listing is not kept: the next caller lists again.
        let listed = Self::list_refs(&self.overlay)?;
        Ok(self.refs.get_or_init(|| listed).clone())
    }

    /// Loads and verifies a commit object (its bytes must hash to its
    /// name), and keeps it for the generation's life: the commits its refs
    /// and summary name, read at publication and again for each summary.
    pub fn commit(&self, c: &Checksum) -> Result<Commit> {
        if let Some(hit) = self.commits.lock().expect("poisoned").get(c) {
            return Ok(hit.clone());
        }
        let commit = self.read_commit(c)?;
        self.commits
            .lock()
            .expect("poisoned")
            .insert(*c, commit.clone());
        Ok(commit)
    }

    /// [`Self::commit`] without keeping it: for a look at every commit of
    /// a source, of which the generation serves a few.
    pub fn read_commit(&self, c: &Checksum) -> Result<Commit> {
        let rel = ObjectName::new(*c, ObjectKind::Commit).path();
        let (bytes, _) = self
            .all_roots()
            .find_map(|root| {
                fsutil::read_file(root, &rel, format::commit::MAX_COMMIT_SIZE as u64).transpose()
            })
            .transpose()
            .with_context(|| format!("reading commit {c}"))?
            .with_context(|| format!("commit {c} is not in the repo"))?;
        let commit = Commit::parse(&bytes).with_context(|| format!("parsing commit {c}"))?;
        if commit.checksum != *c {
            return Err(crate::verify::Corrupt {
                what: format!("commit object {c}"),
                detail: format!("its bytes hash to {}", commit.checksum),
            }
            .into());
        }
        Ok(commit)
    }
}

fn read_ref(root: &Path, ns: RefNamespace, name: &str) -> Option<FoundRef> {
    let valid = match ns {
        RefNamespace::Heads => format::validate_ref(name).is_ok(),
        RefNamespace::Mirrors => name.split_once('/').is_some_and(|(c, r)| {
            format::validate_collection_id(c).is_ok() && format::validate_ref(r).is_ok()
        }),
    };
    if !valid {
        tracing::warn!(root = %root.display(), r#ref = name, "skipping ref with an invalid name");
        return None;
    }
    let rel = format!("{}/{name}", ns.dir());
    let bytes = match fsutil::read_file(root, &rel, MAX_REF) {
        Ok(Some((b, _))) => b,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(root = %root.display(), r#ref = name, "skipping unreadable ref: {e}");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    match Checksum::from_hex(text.trim_end_matches('\n')) {
        Ok(commit) => Some(FoundRef {
            namespace: ns,
            name: name.to_owned(),
            commit,
        }),
        Err(e) => {
            tracing::warn!(root = %root.display(), r#ref = name, "skipping malformed ref: {e}");
            None
        }
    }
}
