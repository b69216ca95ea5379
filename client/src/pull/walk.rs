//! The object walk: commit → dirtree → dirmeta → content, fetching only
//! what is absent locally.
//!
//! Two stages share one request semaphore, one after the other. The
//! metadata stage keeps at most `concurrency` directory jobs in flight
//! (each fetches, verifies and writes a dirtree and its dirmeta, or reads
//! them locally if present) and lists the content objects that are
//! missing; the content stage then keeps at most `concurrency` of them
//! streaming into the repo, in checksum order (sorted by `content_stage`: a
//! small update wrote 1.09x its objects' allocated size so, against 1.15x
//! in discovery order). Memory stays bounded by the in-flight jobs and 32
//! bytes per object seen (the dedup sets and the content list).

use super::error::{PullError, PullResult, Tag};
use super::fetch::{ConsumeError, FetchError, Fetcher, Protocol};
use super::report::Progress;
use super::space::SpaceGuard;
use super::store::{Store, MAX_CONTENT_SIZE};
use crate::governor::Governor;
use anyhow::anyhow;
use oscontent_format::tree::{MAX_DIRMETA_SIZE, MAX_DIRTREE_SIZE};
use oscontent_format::{check_dirmeta, parse_dirtree, Checksum, DirTree, ObjectKind, ObjectName};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;
use tokio::task::JoinSet;

#[derive(Debug)]
pub struct Ctx {
    /// Objects and deltas: the remote's `contenturl` if it has one, else
    /// `meta` itself.
    pub content: Arc<Fetcher>,
    /// What the walk fetches objects with, decided at its first fetch
    /// ([`Fetcher::for_objects`]; `None`: `content` itself). A pull that a
    /// static delta completes never decides it.
    objects: tokio::sync::OnceCell<Option<Fetcher>>,
    /// The remote's `url`: what decides or proves the target (`.commitmeta`
    /// here; config, summary and refs before the context exists).
    pub meta: Arc<Fetcher>,
    store: Mutex<Store>,
    pub governor: Arc<Governor>,
    pub progress: Arc<Progress>,
    pub concurrency: usize,
    /// Present objects changed since then are checked before they are
    /// trusted (None: no pull was interrupted).
    pub suspect_since: Option<SystemTime>,
    /// Keeps the repo's free-space reserve for every write of the pull.
    pub space: Arc<SpaceGuard>,
    /// Sizes the target commit declares (`ostree.sizes`), set once the
    /// commit is verified; what the remote sends may not be larger.
    sizes: OnceLock<DeclaredSizes>,
}

/// What a verified commit's `ostree.sizes` declares, by object.
#[derive(Debug, Default)]
pub struct DeclaredSizes {
    /// A content object's file size: its `.filez` may not declare more.
    pub content: HashMap<Checksum, u64>,
    /// A dirtree's or dirmeta's bytes: a fetch stops past them (as stock
    /// ostree caps a fetch by the archived size it declares).
    pub metadata: HashMap<Checksum, u64>,
}

impl Ctx {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        meta: Arc<Fetcher>,
        content: Arc<Fetcher>,
        store: Store,
        governor: Arc<Governor>,
        progress: Arc<Progress>,
        concurrency: usize,
        suspect_since: Option<SystemTime>,
        space: Arc<SpaceGuard>,
    ) -> Self {
        Self {
            content,
            meta,
            store: Mutex::new(store),
            governor,
            progress,
            concurrency: concurrency.max(1),
            suspect_since,
            space,
            sizes: OnceLock::new(),
            objects: tokio::sync::OnceCell::new(),
        }
    }

    /// The fetcher for the walk's objects (see `objects`).
    pub async fn objects(&self) -> PullResult<&Fetcher> {
        let f = self
            .objects
            .get_or_try_init(|| self.content.for_objects())
            .await?;
        Ok(f.as_ref().unwrap_or(&self.content))
    }

    /// The protocol the walk fetched objects over, if it fetched any.
    pub fn objects_protocol(&self) -> Option<Protocol> {
        let f = self.objects.get()?;
        Some(f.as_ref().unwrap_or(&self.content).protocol)
    }

    /// Records the verified target commit's declared sizes (only the
    /// first call counts: one pull, one target).
    pub fn set_sizes(&self, sizes: DeclaredSizes) {
        let _ = self.sizes.set(sizes);
    }

    /// The size the target commit declares for content object `c`.
    pub fn content_size(&self, c: &Checksum) -> Option<u64> {
        self.sizes.get().and_then(|m| m.content.get(c).copied())
    }

    /// The size the target commit declares for metadata object `c`.
    pub fn declared_metadata(&self, c: &Checksum) -> Option<u64> {
        self.sizes.get().and_then(|m| m.metadata.get(c).copied())
    }

    /// The most a metadata object `c` may be: what the commit declares,
    /// within the cap for its kind.
    pub fn metadata_cap(&self, c: &Checksum, kind_cap: usize) -> usize {
        let declared = self.sizes.get().and_then(|m| m.metadata.get(c).copied());
        declared.map_or(kind_cap, |d| {
            usize::try_from(d).map_or(kind_cap, |d| d.min(kind_cap))
        })
    }

    /// A handle on the repo for one task (libostree repos are used from
    /// many threads; the Rust handle is `Send` but not `Sync`).
    pub fn store(&self) -> Store {
        self.store.lock().expect("store lock").clone()
    }

    pub fn has(&self, kind: ObjectKind, c: &Checksum) -> PullResult<bool> {
        self.store().has(kind, c).local()
    }

    /// Whether the object is present and can be trusted. After an
    /// interrupted pull (see [`Store::oldest_partial_marker`]), a present
    /// object created since it began is checked first, and fetched again
    /// if it is damaged.
    pub async fn present(&self, kind: ObjectKind, c: &Checksum) -> PullResult<bool> {
        if !self.has(kind, c)? {
            return Ok(false);
        }
        let Some(since) = self.suspect_since else {
            return Ok(true);
        };
        let store = self.store();
        let progress = self.progress.clone();
        let c = *c;
        tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
            if !store.changed_since(kind, &c, since)? {
                return Ok(true);
            }
            progress.rechecked.fetch_add(1, Ordering::Relaxed);
            let intact = store.recheck(kind, &c)?;
            if !intact {
                progress.repaired.fetch_add(1, Ordering::Relaxed);
            }
            Ok(intact)
        })
        .await
        .map_err(join_err)?
        .local()
    }
}

fn join_err(e: tokio::task::JoinError) -> PullError {
    PullError::LocalRepo(anyhow!("internal task failed: {e}"))
}

/// Fetches a metadata object with `fetcher`, checks it hashes to its
/// name, and returns the bytes (not yet written).
pub async fn fetch_metadata(
    fetcher: &Fetcher,
    kind: ObjectKind,
    c: &Checksum,
    max: usize,
) -> PullResult<Vec<u8>> {
    let path = ObjectName::new(*c, kind).path();
    let bytes = fetcher
        .get_bytes(&path, max)
        .await
        .map_err(FetchError::into_pull)?
        .ok_or_else(|| {
            PullError::Network(anyhow!("{}: not found on the remote", fetcher.url(&path)))
        })?;
    let got = Checksum::digest(&bytes);
    if &got != c {
        return Err(PullError::Verification(anyhow!(
            "{}: checksum mismatch: the bytes hash to {got}",
            fetcher.url(&path)
        )));
    }
    Ok(bytes.to_vec())
}

/// Writes a verified metadata object, then hands it to the governor.
pub async fn write_metadata(
    ctx: &Ctx,
    kind: ObjectKind,
    c: Checksum,
    bytes: Vec<u8>,
    ty: &'static str,
) -> PullResult<()> {
    let store = ctx.store();
    let governor = ctx.governor.clone();
    let space = ctx.space.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let _room = space.reserve(&format!("{} {c}", kind.extension()), bytes.len() as u64)?;
        store.write_metadata(kind, &c, &bytes, ty)?;
        governor.after_write(store.open_object(kind, &c)?)?;
        Ok(())
    })
    .await
    .map_err(join_err)?
    .local()?;
    ctx.progress.written.fetch_add(1, Ordering::Relaxed);
    ctx.progress
        .metadata_written
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn ensure_dirmeta(ctx: &Ctx, m: Checksum) -> PullResult<()> {
    if ctx.present(ObjectKind::DirMeta, &m).await? {
        ctx.progress.present.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    ctx.progress.needed.fetch_add(1, Ordering::Relaxed);
    let bytes = fetch_metadata(
        ctx.objects().await?,
        ObjectKind::DirMeta,
        &m,
        ctx.metadata_cap(&m, MAX_DIRMETA_SIZE),
    )
    .await?;
    check_dirmeta(&bytes).map_err(|e| PullError::Verification(anyhow!("dirmeta {m}: {e}")))?;
    write_metadata(
        ctx,
        ObjectKind::DirMeta,
        m,
        bytes,
        oscontent_format::tree::DIRMETA_GVARIANT_TYPE,
    )
    .await
}

async fn dirtree(ctx: &Ctx, t: Checksum) -> PullResult<DirTree> {
    let bytes = if ctx.present(ObjectKind::DirTree, &t).await? {
        ctx.progress.present.fetch_add(1, Ordering::Relaxed);
        let store = ctx.store();
        tokio::task::spawn_blocking(move || store.load(ObjectKind::DirTree, &t))
            .await
            .map_err(join_err)?
            .local()?
    } else {
        ctx.progress.needed.fetch_add(1, Ordering::Relaxed);
        let bytes = fetch_metadata(
            ctx.objects().await?,
            ObjectKind::DirTree,
            &t,
            ctx.metadata_cap(&t, MAX_DIRTREE_SIZE),
        )
        .await?;
        // Parse before writing: a malformed tree is never stored.
        let tree = parse_dirtree(&bytes)
            .map_err(|e| PullError::Verification(anyhow!("dirtree {t}: {e}")))?;
        write_metadata(
            ctx,
            ObjectKind::DirTree,
            t,
            bytes,
            oscontent_format::tree::DIRTREE_GVARIANT_TYPE,
        )
        .await?;
        return Ok(tree);
    };
    parse_dirtree(&bytes).map_err(|e| PullError::LocalRepo(anyhow!("local dirtree {t}: {e}")))
}

async fn dir_job(
    ctx: Arc<Ctx>,
    tree: Option<Checksum>,
    meta: Option<Checksum>,
) -> PullResult<Option<DirTree>> {
    if let Some(m) = meta {
        ensure_dirmeta(&ctx, m).await?;
    }
    match tree {
        Some(t) => Ok(Some(dirtree(&ctx, t).await?)),
        None => Ok(None),
    }
}

/// Fetches one content object and streams it into the repo.
async fn content_job(ctx: Arc<Ctx>, c: Checksum) -> PullResult<()> {
    let path = ObjectName::new(c, ObjectKind::File).path();
    let store = ctx.store();
    let governor = ctx.governor.clone();
    let space = ctx.space.clone();
    let max_size = ctx.content_size(&c);
    let written = ctx
        .objects()
        .await?
        .get_streamed(&path, MAX_CONTENT_SIZE, move |body, _len| {
            store.write_content(&c, body, &space, max_size)?;
            let f = store
                .open_object(ObjectKind::File, &c)
                .map_err(ConsumeError::Local)?;
            governor
                .after_write(f)
                .map_err(|e| ConsumeError::Local(e.into()))?;
            Ok(())
        })
        .await
        .map_err(FetchError::into_pull)?;
    if written.is_none() {
        return Err(PullError::Network(anyhow!(
            "{}: not found on the remote",
            ctx.content.url(&path)
        )));
    }
    ctx.progress.written.fetch_add(1, Ordering::Relaxed);
    ctx.progress.content_written.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn content_stage(ctx: Arc<Ctx>, mut all: Vec<Checksum>) -> PullResult<()> {
    // Objects live in `objects/XX/` by their checksum's first byte: in
    // checksum order, the objects between two journal commits share a few
    // directories, whose blocks, inodes and extents each commit then logs
    // once, where discovery order touched a hundred directories per commit.
    all.sort_unstable();
    let mut set = JoinSet::new();
    for c in all {
        while set.len() >= ctx.concurrency {
            if let Some(r) = set.join_next().await {
                r.map_err(join_err)??;
            }
        }
        set.spawn(content_job(ctx.clone(), c));
    }
    while let Some(r) = set.join_next().await {
        r.map_err(join_err)??;
    }
    Ok(())
}

/// Fetches the missing directories and returns the missing content
/// objects, each once.
async fn metadata_stage(
    ctx: Arc<Ctx>,
    root_tree: Checksum,
    root_meta: Checksum,
) -> PullResult<Vec<Checksum>> {
    let mut seen_trees = HashSet::from([root_tree]);
    let mut seen_meta = HashSet::from([root_meta]);
    let mut seen_content = HashSet::new();
    let mut missing = Vec::new();
    let mut pending: Vec<(Option<Checksum>, Option<Checksum>)> =
        vec![(Some(root_tree), Some(root_meta))];
    let mut set = JoinSet::new();
    loop {
        while set.len() < ctx.concurrency {
            let Some((t, m)) = pending.pop() else { break };
            set.spawn(dir_job(ctx.clone(), t, m));
        }
        let Some(res) = set.join_next().await else {
            break;
        };
        let Some(tree) = res.map_err(join_err)?? else {
            continue;
        };
        for (_, c) in tree.files {
            if !seen_content.insert(c) {
                continue;
            }
            if ctx.present(ObjectKind::File, &c).await? {
                ctx.progress.present.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.progress.needed.fetch_add(1, Ordering::Relaxed);
                missing.push(c);
            }
        }
        for (_, t, m) in tree.dirs {
            let t = seen_trees.insert(t).then_some(t);
            let m = seen_meta.insert(m).then_some(m);
            if t.is_some() || m.is_some() {
                pending.push((t, m));
            }
        }
    }
    Ok(missing)
}

/// Walks the tree of a commit and fetches every missing object.
pub async fn walk(ctx: Arc<Ctx>, root_tree: Checksum, root_meta: Checksum) -> PullResult<()> {
    let missing = metadata_stage(ctx.clone(), root_tree, root_meta).await?;
    content_stage(ctx, missing).await
}
