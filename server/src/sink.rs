//! Where publishers put what they published: the generation being served
//! (one atomic slot the HTTP side reads at each request) and the metrics
//! that describe it. Before a generation becomes visible, the object cache
//! the HTTP side attached is warmed with what its releases bring new
//! (`cache::warm`), so the first wave of a fleet update finds it there.

use crate::cache::{warm, ObjectCache};
use crate::metrics::{gauge_value, Metrics};
use crate::served::Generation;
use arc_swap::ArcSwapOption;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The outcome of one source check, the `result` label of
/// `oscontent_source_checks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Published,
    Unchanged,
    Failed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Published => "published",
            Outcome::Unchanged => "unchanged",
            Outcome::Failed => "failed",
        }
    }
}

/// The served generation and the metrics publication updates.
#[derive(Debug)]
pub struct Sink {
    current: ArcSwapOption<Generation>,
    metrics: Arc<Metrics>,
    /// Each generation a publisher published, for the delta rounds.
    published: tokio::sync::watch::Sender<Option<Arc<Generation>>>,
    /// The HTTP side's object cache, warmed at each publication.
    cache: OnceLock<Arc<ObjectCache>>,
    /// Held while the served generation changes, or what it serves does,
    /// and the metrics that describe it are set: they then describe the
    /// generation served, whichever of two publishers came last.
    serving: Mutex<()>,
}

impl Default for Sink {
    fn default() -> Self {
        Self::new(Arc::new(Metrics::new()))
    }
}

impl Sink {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            current: ArcSwapOption::empty(),
            metrics,
            published: tokio::sync::watch::Sender::new(None),
            cache: OnceLock::new(),
            serving: Mutex::new(()),
        }
    }

    /// The object cache publication warms: `cache`, unless one was
    /// attached before (then that one, which the caller must use too).
    pub fn attach_cache(&self, cache: ObjectCache) -> Arc<ObjectCache> {
        self.cache.get_or_init(|| Arc::new(cache)).clone()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Makes a generation visible in one step, after warming the object
    /// cache for it (bounded in time by [`warm::WARM_TIME`]; a failure
    /// only logs). Requests already holding the previous one finish on
    /// it; it is dropped with its last request.
    pub async fn publish(&self, generation: Generation) {
        let generation = Arc::new(generation);
        if let Some(cache) = self.cache.get() {
            let warmed = warm::warm_for(cache.clone(), generation.clone()).await;
            self.metrics
                .cache_warmed_bytes
                .set(gauge_value(warmed.bytes));
            self.metrics
                .cache_warmed_objects
                .set(gauge_value(warmed.objects));
        }
        self.store(generation.clone());
        self.published.send_replace(Some(generation));
    }

    fn store(&self, generation: Arc<Generation>) {
        let _serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        self.metrics
            .published_refs
            .set(generation.derived_refs.len() as i64);
        self.metrics.generation.set(generation.id as i64);
        self.set_deltas_published(&generation);
        self.current.store(Some(generation));
        self.metrics.ready.set(1);
    }

    fn set_deltas_published(&self, generation: &Generation) {
        let deltas = generation.deltas().map_or(0, |d| d.count());
        self.metrics.deltas_published.set(deltas as i64);
    }

    /// Serves `deltas` with `base` (generated for it), unless another
    /// generation replaced it first or it has deltas already.
    pub fn publish_deltas(
        &self,
        base: &Arc<Generation>,
        deltas: Arc<dyn crate::served::deltas::ServedDeltas>,
    ) -> bool {
        let _serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.current.load();
        if !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, base)) {
            return false;
        }
        if !base.attach_deltas(deltas) {
            return false;
        }
        self.set_deltas_published(base);
        true
    }

    /// Stops serving: from now on `/readyz` fails and repo paths answer
    /// 503 until the next publication. For a generation whose files were
    /// found changed under it (see [`crate::refresh::Publisher::discredits`]):
    /// serving it on would serve what no longer verifies.
    pub fn withdraw(&self) {
        let _serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        self.current.store(None);
        self.metrics.ready.set(0);
    }

    /// Every generation publishers publish from now on (not again when
    /// deltas are attached to one).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<Arc<Generation>>> {
        self.published.subscribe()
    }

    /// The generation being served, if any.
    pub fn current(&self) -> Option<Arc<Generation>> {
        self.current.load_full()
    }

    pub fn has_generation(&self) -> bool {
        self.current.load().is_some()
    }

    /// Counts one source check.
    pub fn count(&self, outcome: Outcome) {
        self.metrics
            .source_checks
            .with_label_values(&[outcome.label()])
            .inc();
    }
}
