//! Static deltas between the releases a generation serves (`--deltas`).
//!
//! After a generation whose refs name several commits is published, a
//! background round (one at a time, on its own thread at nice 10) picks
//! the pairs (`select.rs`), reuses those already in the store
//! (`store.rs`, kept across restarts and SIGHUP, verified again), compiles
//! the others with libostree into a scratch repo in the state dir
//! (`generate.rs`), verifies each like any delta, and attaches the deltas
//! to the generation being served: listed only in delta indexes, so the
//! summary's bytes and signature do not change. Serving never waits for
//! it; a delta that fails is logged and counted, and nodes fetch objects.
//!
//! Listed in delta indexes only (`delta-indexes/XX/<to>.index`), never in
//! the summary's `ostree.static-deltas`: a generation whose refs name more
//! than one commit says `ostree.summary.indexed-deltas: true` from the
//! start, whatever `--deltas`, so the summary's bytes (its `summary.sig`,
//! and what `sign` computes elsewhere) are the same before and after its
//! deltas appear. Until one exists (or with `--deltas none`) a client's
//! index request is a 404 and it fetches objects. An index is not signed:
//! `oscontent pull` with a verified summary takes only the deltas the
//! signed summary lists, so it fetches objects loose; unverified, it takes
//! indexed deltas, every part checked before it is applied.
//!
//! Stock `ostree pull` 2022.7 applies such a delta and still fetches some
//! objects loose: it writes the target commit from the superblock and scans
//! it while the parts are still being applied, fetching whatever is not yet
//! written when the scan reaches it (ostree#2053, ostree#2680; fixed in
//! ostree 2023.7, which does not scan a delta's target). No compiler
//! setting removes that race on those clients.
//!
//! `/metrics`: `oscontent_deltas_total{result=generated|reused|failed}`,
//! `oscontent_deltas_published` (deltas the current generation serves) and
//! `oscontent_delta_bounds_hit_total{bound=time|memory}` (compilations
//! killed by a bound, also counted failed).

mod child;
pub mod compile;
mod generate;
pub mod select;
mod store;

pub use select::DeltaMode;
pub use store::{PublishedDeltas, StoredDelta, DELTAS_DIR};

use crate::ages::RefAge;
use crate::metrics::Metrics;
use crate::served::Generation;
use crate::sink::Sink;
use anyhow::{Context, Result};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::Store;

/// The delta rounds' thread runs at this nice: compiling is CPU work the
/// serving threads must not wait behind.
const NICE: i32 = 10;

/// What the rounds need, fixed for the server's life.
#[derive(Debug, Clone)]
pub struct DeltaOptions {
    pub mode: DeltaMode,
    /// The state dir (its `deltas/` is created at the first round, after
    /// publication checked the state dir is apart from the served repo).
    pub state_dir: PathBuf,
    /// Longest one delta may take to compile.
    pub timeout: Duration,
    /// Address space of the compiler's process, in bytes.
    pub memory: u64,
    /// The compiler: this server's own executable.
    pub exe: PathBuf,
}

/// Runs a round for every generation published into `sink`, for the
/// server's life.
pub async fn run(opts: DeltaOptions, sink: Arc<Sink>) {
    let mut rx = sink.subscribe();
    // A local source published before this task started.
    if rx.borrow().is_some() {
        rx.mark_changed();
    }
    if opts.mode == DeltaMode::None {
        forget_all(&opts, &mut rx).await;
        return;
    }
    let store: Arc<Mutex<Option<Store>>> = Arc::default();
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let Some(base) = rx.borrow_and_update().clone() else {
            continue;
        };
        if base.deltas().is_some() {
            continue;
        }
        let deltas = match on_thread(&opts, &store, &base, sink.metrics()).await {
            Ok(d) => d,
            Err(e) => {
                sink.metrics().deltas.with_label_values(&["failed"]).inc();
                tracing::warn!("static deltas not generated; nodes fetch objects instead: {e:#}");
                continue;
            }
        };
        if deltas.is_empty() {
            continue;
        }
        let n = deltas.len();
        if sink.publish_deltas(&base, Arc::new(PublishedDeltas::new(deltas))) {
            tracing::info!(deltas = n, generation = base.id, "published static deltas");
        } else {
            tracing::info!(
                generation = base.id,
                "a newer generation was published meanwhile; its own round follows"
            );
        }
    }
}

/// With `--deltas none`, what an earlier run stored is removed once the
/// first publication has checked the state dir.
async fn forget_all(
    opts: &DeltaOptions,
    rx: &mut tokio::sync::watch::Receiver<Option<Arc<Generation>>>,
) {
    if rx.changed().await.is_err() || !opts.state_dir.join(DELTAS_DIR).is_dir() {
        return;
    }
    let state = opts.state_dir.clone();
    let swept = tokio::task::spawn_blocking(move || {
        Store::open(&state).map(|mut s| s.sweep(&HashSet::new()))
    })
    .await;
    if let Ok(Err(e)) = swept {
        tracing::warn!("removing stored static deltas: {e:#}");
    }
}

/// One round on a thread of its own, at a lower priority.
async fn on_thread(
    opts: &DeltaOptions,
    store: &Arc<Mutex<Option<Store>>>,
    base: &Arc<Generation>,
    metrics: &Arc<Metrics>,
) -> Result<Vec<Arc<StoredDelta>>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (opts, store, base, metrics) = (opts.clone(), store.clone(), base.clone(), metrics.clone());
    std::thread::Builder::new()
        .name("deltas".into())
        .spawn(move || {
            // Linux: this thread only.
            if let Err(e) = rustix::process::setpriority_process(None, NICE) {
                tracing::debug!("nice {NICE} for the delta thread: {e}");
            }
            let mut guard = store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = tx.send(round(&opts, &mut guard, &base, &metrics));
        })
        .context("starting the delta thread")?;
    rx.await.context("the delta thread ended")?
}

/// Which deltas `base` gets, each reused or generated; failures are
/// counted and left out.
fn round(
    opts: &DeltaOptions,
    store: &mut Option<Store>,
    base: &Generation,
    metrics: &Metrics,
) -> Result<Vec<Arc<StoredDelta>>> {
    if !base.index_deltas {
        // One commit, or a summary the source pins: no delta, and none of
        // those stored is needed any more.
        if store.is_some() || opts.state_dir.join(DELTAS_DIR).is_dir() {
            store_of(opts, store)?.sweep(&HashSet::new());
        }
        return Ok(Vec::new());
    }
    let store = store_of(opts, store)?;
    let mut refs = Vec::new();
    for (name, commit) in &base.derived_refs {
        let c = base.commit(commit)?;
        refs.push(RefAge {
            name: name.clone(),
            commit: *commit,
            timestamp: c.timestamp,
            version: c.version(),
        });
    }
    let pairs = select::pairs(opts.mode, &refs);
    let mut keep = HashSet::new();
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for name in pairs {
        let meta = base.served_commitmeta(&name.to)?;
        let key = Store::key(&name, meta.as_deref());
        keep.insert(key.clone());
        match store.get(&key, &name) {
            Some(d) => {
                metrics.deltas.with_label_values(&["reused"]).inc();
                out.push(d);
            }
            None => missing.push((name, key, meta)),
        }
    }
    if !missing.is_empty() {
        let names: Vec<_> = missing.iter().map(|(n, _, _)| *n).collect();
        match generate::Scratch::build(store.path(), base, &generate::commits_of(&names)) {
            Ok(scratch) => {
                let bounds = child::Bounds {
                    exe: opts.exe.clone(),
                    memory: opts.memory,
                    timeout: opts.timeout,
                };
                for (name, key, meta) in &missing {
                    let started = std::time::Instant::now();
                    match scratch.generate(store, key, name, meta.as_deref(), &bounds) {
                        Ok(d) => {
                            metrics.deltas.with_label_values(&["generated"]).inc();
                            tracing::info!(
                                delta = name.summary_name(),
                                bytes = d.bytes,
                                elapsed_ms = started.elapsed().as_millis() as u64,
                                "static delta generated and verified"
                            );
                            out.push(d);
                        }
                        Err(e) => {
                            bound_hit(metrics, &e);
                            failed(metrics, name, &e);
                        }
                    }
                }
            }
            Err(e) => {
                for (name, _, _) in &missing {
                    failed(metrics, name, &e);
                }
            }
        }
    }
    store.sweep(&keep);
    Ok(out)
}

fn store_of<'a>(opts: &DeltaOptions, store: &'a mut Option<Store>) -> Result<&'a mut Store> {
    Ok(match store {
        Some(s) => s,
        None => store.insert(Store::open(&opts.state_dir)?),
    })
}

/// Counts a compilation stopped by one of its bounds.
fn bound_hit(metrics: &Metrics, e: &anyhow::Error) {
    let bound = match e.downcast_ref::<child::CompileError>() {
        Some(child::CompileError::Timeout { .. }) => "time",
        Some(child::CompileError::Memory { .. }) => "memory",
        _ => return,
    };
    metrics.delta_bounds.with_label_values(&[bound]).inc();
}

fn failed(metrics: &Metrics, name: &oscontent_format::DeltaName, e: &anyhow::Error) {
    metrics.deltas.with_label_values(&["failed"]).inc();
    tracing::warn!(
        delta = name.summary_name(),
        "static delta not generated; nodes fetch objects instead: {e:#}"
    );
}
