//! Where generated deltas live (`<state-dir>/deltas/`), and what a
//! generation serves of them.
//!
//! Each delta is a directory named by what it depends on: from and to
//! commits, and the digest of the detached metadata of `to` it embeds (a
//! stock client verifies the commit's signatures from the superblock, so
//! a new signature bundle needs a new delta). Inside, it is laid out as a
//! repo (`deltas/XX/REST/{superblock,0,…}`), so the one verification of
//! deltas (`verify::verify_deltas`) checks it. Directories are kept across
//! restarts and SIGHUP and verified again before reuse; one is removed
//! when a round finds no generation needs it.

use crate::served::deltas::ServedDeltas;
use crate::served::{Generated, Layer, Resolved};
use crate::verify::{self, VerifiedSet};
use anyhow::{Context, Result};
use oscontent_format::{
    build_delta_index, Checksum, DeltaName, RepoPath, SummaryDelta, Superblock,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::SystemTime;

/// Under the state dir.
pub const DELTAS_DIR: &str = "deltas";
/// Leftovers of an interrupted round start with this.
pub(super) const TMP_PREFIX: &str = ".tmp-";

/// One verified delta on disk. Generations serving it hold it; the store
/// only removes a directory no live one refers to.
#[derive(Debug)]
pub struct StoredDelta {
    pub name: DeltaName,
    /// The delta's repo-shaped root.
    pub dir: PathBuf,
    /// SHA-256 of its superblock: what the delta index lists.
    pub superblock: Checksum,
    /// Bytes of its superblock and parts.
    pub bytes: u64,
    /// `dir`, opened by the first request for one of its files.
    fd: OnceLock<Option<OwnedFd>>,
}

impl StoredDelta {
    /// `dir` as a directory fd (`None` if it cannot be opened: its files
    /// are then not found, and a warning says why).
    fn dir_fd(&self) -> Option<BorrowedFd<'_>> {
        let fd = self.fd.get_or_init(|| {
            crate::fsutil::open_dir(&self.dir).unwrap_or_else(|e| {
                tracing::warn!(dir = %self.dir.display(), "opening a stored delta: {e}");
                None
            })
        });
        fd.as_ref().map(AsFd::as_fd)
    }
}

/// The deltas directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    live: HashMap<String, Weak<StoredDelta>>,
}

impl Store {
    /// Opens (creating) the directory; an interrupted round's scratch and
    /// temporary directories are removed.
    pub fn open(state: &Path) -> Result<Self> {
        let dir = state.join(DELTAS_DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                remove(&e.path());
            }
        }
        Ok(Self {
            dir,
            live: HashMap::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory name of a delta with this embedded detached metadata.
    pub fn key(name: &DeltaName, commitmeta: Option<&[u8]>) -> String {
        let meta = commitmeta.map_or_else(
            || "unsigned".to_owned(),
            |m| Checksum::digest(m).to_hex()[..16].to_owned(),
        );
        format!("{}-{meta}", name.summary_name())
    }

    /// A delta in the store, reused if alive, else verified again from
    /// disk (a corrupt one is removed); `None` if it must be generated.
    pub fn get(&mut self, key: &str, name: &DeltaName) -> Option<Arc<StoredDelta>> {
        if let Some(d) = self.live.get(key).and_then(Weak::upgrade) {
            return Some(d);
        }
        let dir = self.dir.join(key);
        if !dir.is_dir() {
            return None;
        }
        match check(&dir, name) {
            Ok(d) => Some(self.adopt(key, d)),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "a stored delta failed verification; generating it again: {e:#}");
                remove(&dir);
                None
            }
        }
    }

    /// Moves a generated delta's root (`tmp`, on the same filesystem) into
    /// the store under `key` once it verifies.
    pub fn insert(&mut self, key: &str, name: &DeltaName, tmp: &Path) -> Result<Arc<StoredDelta>> {
        let dir = self.dir.join(key);
        let mut d = check(tmp, name).context("verifying the generated delta")?;
        remove(&dir);
        std::fs::rename(tmp, &dir)
            .with_context(|| format!("renaming {} into place", tmp.display()))?;
        d.dir = dir;
        Ok(self.adopt(key, d))
    }

    fn adopt(&mut self, key: &str, d: StoredDelta) -> Arc<StoredDelta> {
        let d = Arc::new(d);
        self.live.insert(key.to_owned(), Arc::downgrade(&d));
        d
    }

    /// Removes every delta neither in `keep` nor served by a live
    /// generation.
    pub fn sweep(&mut self, keep: &HashSet<String>) {
        self.live.retain(|_, w| w.strong_count() > 0);
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) || keep.contains(&name) || self.live.contains_key(&name)
            {
                continue;
            }
            tracing::info!(delta = name, "removing a delta no generation needs");
            remove(&e.path());
        }
    }
}

/// Verifies a delta root as publication verifies any delta (superblock
/// for the delta its directory names, every part against the checksum the
/// superblock lists), that the commit it embeds is `to`, and that it is
/// reproducible (the same bytes on every replica).
fn check(dir: &Path, name: &DeltaName) -> Result<StoredDelta> {
    let mut set = VerifiedSet::default();
    verify::verify_deltas(dir, &[name.to], &mut set)?;
    anyhow::ensure!(
        set.contains_delta(name),
        "{} holds no delta {}",
        dir.display(),
        name.summary_name()
    );
    let rel = format!("{}/superblock", name.dir());
    let cap = oscontent_format::delta::MAX_SUPERBLOCK_SIZE as u64;
    let (bytes, _) = crate::fsutil::read_file(dir, &rel, cap)?
        .with_context(|| format!("{}/{rel} vanished", dir.display()))?;
    let sb = Superblock::parse(&bytes)?;
    anyhow::ensure!(
        Checksum::digest(&sb.commit) == name.to,
        "the superblock embeds another commit than {}",
        name.to
    );
    // Older versions kept libostree's compilation time: such a delta
    // differs from every other replica's.
    anyhow::ensure!(
        oscontent_format::delta::reproducible_superblock(&bytes)? == bytes,
        "the superblock carries the time it was compiled, not its commit's"
    );
    let total = sb.total_size().unwrap_or(u64::MAX);
    Ok(StoredDelta {
        name: *name,
        dir: dir.to_owned(),
        superblock: Checksum::digest(&bytes),
        bytes: total.saturating_add(bytes.len() as u64),
        fd: OnceLock::new(),
    })
}

fn remove(p: &Path) {
    match std::fs::remove_dir_all(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %p.display(), "removing: {e}"),
    }
}

/// The generated deltas a generation serves, and their indexes.
#[derive(Debug, Default)]
pub struct PublishedDeltas {
    deltas: BTreeMap<DeltaName, Arc<StoredDelta>>,
    indexes: BTreeMap<Checksum, Generated>,
}

impl PublishedDeltas {
    pub fn new(deltas: Vec<Arc<StoredDelta>>) -> Self {
        let mut by_to: BTreeMap<Checksum, Vec<SummaryDelta>> = BTreeMap::new();
        for d in &deltas {
            by_to.entry(d.name.to).or_default().push(SummaryDelta {
                name: d.name,
                superblock: d.superblock,
            });
        }
        let produced = SystemTime::now();
        let indexes = by_to
            .into_iter()
            .map(|(to, list)| {
                let bytes = build_delta_index(&list).into();
                (to, Generated::new(bytes, produced))
            })
            .collect();
        Self {
            deltas: deltas.into_iter().map(|d| (d.name, d)).collect(),
            indexes,
        }
    }

    pub fn len(&self) -> usize {
        self.deltas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }
}

impl ServedDeltas for PublishedDeltas {
    fn resolve(&self, path: &RepoPath) -> Option<Resolved> {
        match path {
            RepoPath::Delta { name, .. } => self.deltas.get(name).map(|d| Resolved::File {
                layer: Layer::Overlay,
                root: d.dir.clone(),
                rel: path.to_path(),
            }),
            RepoPath::DeltaIndex { to } => self.indexes.get(to).cloned().map(Resolved::Generated),
            _ => None,
        }
    }

    fn dir_fd(&self, path: &RepoPath) -> Option<BorrowedFd<'_>> {
        match path {
            RepoPath::Delta { name, .. } => self.deltas.get(name)?.dir_fd(),
            _ => None,
        }
    }

    fn count(&self) -> usize {
        self.deltas.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oscontent_format::{parse_delta_index, DeltaFile};

    fn c(n: u8) -> Checksum {
        Checksum::from([n; 32])
    }

    fn stored(from: u8, to: u8) -> Arc<StoredDelta> {
        Arc::new(StoredDelta {
            name: DeltaName {
                from: Some(c(from)),
                to: c(to),
            },
            dir: PathBuf::from(format!("/state/deltas/{from}-{to}")),
            superblock: c(100 + from),
            bytes: 1,
            fd: OnceLock::new(),
        })
    }

    #[test]
    fn what_published_deltas_answer() {
        let p = PublishedDeltas::new(vec![stored(1, 3), stored(2, 3), stored(1, 2)]);
        let index = |to: u8| match p.resolve(&RepoPath::DeltaIndex { to: c(to) }) {
            Some(Resolved::Generated(g)) => parse_delta_index(&g.bytes).expect("an index"),
            other => panic!("index of {to}: {other:?}"),
        };
        let names = |l: Vec<SummaryDelta>| -> Vec<(DeltaName, Checksum)> {
            l.into_iter().map(|d| (d.name, d.superblock)).collect()
        };
        assert_eq!(
            names(index(3)),
            vec![(stored(1, 3).name, c(101)), (stored(2, 3).name, c(102))]
        );
        assert_eq!(names(index(2)), vec![(stored(1, 2).name, c(101))]);
        let part = RepoPath::Delta {
            name: stored(2, 3).name,
            file: DeltaFile::Part(0),
        };
        let cases: Vec<(RepoPath, Option<(PathBuf, String)>)> = vec![
            (
                part.clone(),
                Some((PathBuf::from("/state/deltas/2-3"), part.to_path())),
            ),
            (RepoPath::DeltaIndex { to: c(1) }, None),
            (
                RepoPath::Delta {
                    name: DeltaName {
                        from: Some(c(3)),
                        to: c(1),
                    },
                    file: DeltaFile::Superblock,
                },
                None,
            ),
            (RepoPath::Summary, None),
        ];
        for (path, want) in cases {
            let got = match p.resolve(&path) {
                Some(Resolved::File { root, rel, .. }) => Some((root, rel)),
                None => None,
                Some(other) => panic!("{path:?}: {other:?}"),
            };
            assert_eq!(got, want, "{path:?}");
        }
    }

    #[test]
    fn a_delta_key_names_its_embedded_signatures() {
        let name = stored(1, 2).name;
        let unsigned = Store::key(&name, None);
        let a = Store::key(&name, Some(b"one signature"));
        let b = Store::key(&name, Some(b"another"));
        assert!(unsigned.starts_with(&name.summary_name()));
        assert!(unsigned.ends_with("-unsigned"));
        assert_ne!(a, b);
        assert_ne!(a, unsigned);
    }

    /// Deltas are attached to the generation being served, once, and
    /// only while it is served: it then answers their indexes, keeps the
    /// summary it was published with, and the metric counts them.
    #[tokio::test]
    async fn deltas_attach_to_the_generation_being_served_and_only_to_it() {
        use crate::served::{Generation, Resolved};
        use crate::sink::Sink;
        let overlay = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(overlay.path().join("refs/heads")).unwrap();
        let sink = Sink::default();
        let index = RepoPath::DeltaIndex { to: c(3) };
        let indexed = |g: &Generation| matches!(g.resolve(&index).unwrap(), Resolved::Generated(_));
        let published = || sink.metrics().deltas_published.get();
        let deltas = || PublishedDeltas::new(vec![stored(1, 3), stored(2, 3)]);

        let unserved = Arc::new(Generation::new(1, vec![], overlay.path().into(), vec![]));
        assert!(!sink.publish_deltas(&unserved, Arc::new(deltas())));
        assert!(
            unserved.deltas().is_none(),
            "not attached to what is not served"
        );

        sink.publish(Generation::new(2, vec![], overlay.path().into(), vec![]))
            .await;
        let served = sink.current().unwrap();
        let summary = served.served_summary().unwrap();
        assert!(!indexed(&served));
        assert!(sink.publish_deltas(&served, Arc::new(deltas())));
        assert!(
            indexed(&served),
            "the generation served answers its indexes"
        );
        assert_eq!(published(), 2);
        assert!(Arc::ptr_eq(&sink.current().unwrap(), &served));
        assert_eq!(served.served_summary().unwrap(), summary);
        assert!(!sink.publish_deltas(&served, Arc::new(PublishedDeltas::new(vec![stored(1, 2)]))));
        assert_eq!(served.deltas().map(|d| d.count()), Some(2), "attached once");

        sink.publish(Generation::new(3, vec![], overlay.path().into(), vec![]))
            .await;
        assert_eq!(published(), 0, "the new generation has none yet");
        assert!(
            !sink.publish_deltas(&served, Arc::new(deltas())),
            "no longer served"
        );
        assert_eq!(published(), 0);
    }
}
