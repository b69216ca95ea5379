//! Where publishers put what they published: the generation being served
//! (one atomic slot the HTTP side reads at each request) and the metrics
//! that describe it.

use crate::metrics::Metrics;
use crate::served::Generation;
use arc_swap::ArcSwapOption;
use std::sync::Arc;

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
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Makes a generation visible in one step. Requests already holding the
    /// previous one finish on it; it is dropped with its last request.
    pub fn publish(&self, generation: Generation) {
        self.metrics
            .published_refs
            .set(generation.derived_refs.len() as i64);
        self.metrics.generation.set(generation.id as i64);
        self.current.store(Some(Arc::new(generation)));
        self.metrics.ready.set(1);
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
