//! What the agent exports on `--metrics-listen`: Prometheus text on
//! `GET /metrics`, every other path 404 (axum, as the server serves its own).

use super::decide::AgentState;
use crate::stage::StageDone;
use anyhow::{Context, Result};
use prometheus::{Gauge, IntCounter, IntGaugeVec, Opts, Registry, TextEncoder};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    staged_info: IntGaugeVec,
    state: IntGaugeVec,
    stage_bytes: IntCounter,
    stage_duration: Gauge,
    slot_waits: IntCounter,
    stage_failures: IntCounter,
    last_success: Gauge,
}

// The names and help texts are constants of this file: a bad one is a bug
// the first test run shows, hence `expect`.
fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone())).expect("a unique metric");
    c
}

impl Metrics {
    pub fn new(node: &str, pool: &str) -> Self {
        let r = Registry::new();
        let vec = |name: &str, help: &str, labels: &[&str]| {
            register(
                &r,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric"),
            )
        };
        let counter = |name: &str, help: &str| {
            register(&r, IntCounter::new(name, help).expect("a valid metric"))
        };
        let gauge =
            |name: &str, help: &str| register(&r, Gauge::new(name, help).expect("a valid metric"));
        let info = vec(
            "oscontent_agent_info",
            "The node and the pool this agent stages for (always 1).",
            &["node", "pool"],
        );
        info.with_label_values(&[node, pool]).set(1);
        let m = Metrics {
            staged_info: vec(
                "oscontent_agent_staged_info",
                "The image this agent staged last (always 1).",
                &["digest", "commit"],
            ),
            state: vec(
                "oscontent_agent_state",
                "1 for the agent's current state, 0 for the others.",
                &["state"],
            ),
            stage_bytes: counter(
                "oscontent_agent_stage_bytes_total",
                "Bytes fetched from the remote by the stages this agent ran.",
            ),
            stage_duration: gauge(
                "oscontent_agent_stage_duration_seconds",
                "How long the last successful stage took, slot wait excluded.",
            ),
            slot_waits: counter(
                "oscontent_agent_slot_waits_total",
                "Slot requests the server refused (429), each followed by a wait.",
            ),
            stage_failures: counter(
                "oscontent_agent_stage_failures_total",
                "Rounds that failed (summary, slot or stage), each followed by a backoff.",
            ),
            last_success: gauge(
                "oscontent_agent_last_success_timestamp_seconds",
                "When a stage last succeeded, or found the image staged or imported (Unix time).",
            ),
            registry: r,
        };
        m.set_state(AgentState::Idle);
        m
    }

    pub fn set_state(&self, now: AgentState) {
        for s in AgentState::ALL {
            self.state
                .with_label_values(&[s.as_str()])
                .set(i64::from(s == now));
        }
    }

    pub fn staged(&self, done: &StageDone, took: Duration) {
        self.staged_info.reset();
        self.staged_info
            .with_label_values(&[&done.digest, &done.commit])
            .set(1);
        self.stage_bytes.inc_by(done.bytes_downloaded);
        self.stage_duration.set(took.as_secs_f64());
        self.succeeded();
    }

    /// A round that found nothing to do counts as a success too: the node
    /// is where the ref says.
    pub fn succeeded(&self) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_success.set(now.as_secs_f64());
    }

    pub fn slot_wait(&self) {
        self.slot_waits.inc();
    }

    pub fn failure(&self) {
        self.stage_failures.inc();
    }

    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

/// Serves `/metrics` on `listener` until the runtime ends.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) -> Result<()> {
    use axum::http::{header, StatusCode};
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let text = metrics.render();
                async move { ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text) }
            }),
        )
        .fallback(|| async { StatusCode::NOT_FOUND });
    axum::serve(listener, app)
        .await
        .context("serving --metrics-listen")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_every_series_the_docs_name() {
        let m = Metrics::new("worker-0", "worker");
        m.set_state(AgentState::Staging);
        m.slot_wait();
        m.failure();
        let done = StageDone {
            digest: format!("sha256:{}", "a".repeat(64)),
            commit: "b".repeat(64),
            bytes_downloaded: 1234,
        };
        m.staged(&done, Duration::from_millis(1500));
        let again = StageDone {
            digest: format!("sha256:{}", "c".repeat(64)),
            ..done.clone()
        };
        m.staged(&again, Duration::from_secs(2));
        let text = m.render();
        let want = [
            r#"oscontent_agent_info{node="worker-0",pool="worker"} 1"#.to_owned(),
            format!(
                r#"oscontent_agent_staged_info{{commit="{}",digest="{}"}} 1"#,
                again.commit, again.digest
            ),
            r#"oscontent_agent_state{state="staging"} 1"#.to_owned(),
            r#"oscontent_agent_state{state="idle"} 0"#.to_owned(),
            r#"oscontent_agent_state{state="waiting_for_slot"} 0"#.to_owned(),
            r#"oscontent_agent_state{state="error"} 0"#.to_owned(),
            "oscontent_agent_stage_bytes_total 2468".to_owned(),
            "oscontent_agent_stage_duration_seconds 2".to_owned(),
            "oscontent_agent_slot_waits_total 1".to_owned(),
            "oscontent_agent_stage_failures_total 1".to_owned(),
        ];
        for w in want {
            assert!(text.lines().any(|l| l == w), "{w:?} missing from:\n{text}");
        }
        // Only the last staged image is exported.
        assert!(!text.contains(&done.digest), "{text}");
        assert!(text.contains("oscontent_agent_last_success_timestamp_seconds "));
    }
}
