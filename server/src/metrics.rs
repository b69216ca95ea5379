//! `/metrics`, Prometheus text format 0.0.4.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::sync::OnceLock;

/// The path kinds (`http::classify`) and statuses whose series the request
/// path keeps handles to, so that counting a request takes no label lookup
/// (hashing and a lock) and formats no string. Others go the slow way.
const KINDS: [&str; 15] = [
    "health",
    "metrics",
    "config",
    "summary",
    "summary_sig",
    "ref",
    "commit",
    "dirtree",
    "dirmeta",
    "filez",
    "commitmeta",
    "delta",
    "delta_index",
    "blob",
    "other",
];
const STATUSES: [u16; 10] = [200, 206, 304, 400, 404, 405, 412, 416, 500, 503];

/// Handles to each kind's series, made on first use (a series appears in
/// `/metrics` once a request of its kind was counted, as before).
#[derive(Debug)]
struct Handles {
    requests: [[OnceLock<IntCounter>; STATUSES.len()]; KINDS.len()],
    bytes: [OnceLock<IntCounter>; KINDS.len()],
    latency: [OnceLock<Histogram>; KINDS.len()],
}

/// Latency buckets: 100 µs to ~13 s. Objects are served from page cache in
/// well under a millisecond; the tail is big deltas over slow links.
const LATENCY_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// A count as a gauge's value: Prometheus gauges here are `i64`, and a
/// count past it shows as the largest value rather than wrapping.
pub fn gauge_value<T: TryInto<i64>>(n: T) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub response_bytes: IntCounterVec,
    pub latency: HistogramVec,
    pub ready: IntGauge,
    pub published_refs: IntGauge,
    pub generation: IntGauge,
    /// Source checks (first fetch, refreshes): published, unchanged, failed.
    pub source_checks: IntCounterVec,
    /// The listener's connections.
    pub connections: Connections,
    /// Access log lines dropped because the writer fell behind.
    pub access_log_dropped: IntCounter,
    /// Metadata files refused for being over their size cap, by path kind.
    pub oversized_metadata: IntCounterVec,
    /// Refs a refresh moved back in time, by `result`: refused or allowed.
    pub rollbacks: IntCounterVec,
    /// 1 when `--allow-rollback` publishes rollbacks.
    pub rollback_allowed: IntGauge,
    /// Static delta rounds, by `result`: generated, reused, failed.
    pub deltas: IntCounterVec,
    /// Generated static deltas the current generation serves.
    pub deltas_published: IntGauge,
    /// Delta compilations stopped by a bound, by `bound`: time or memory.
    pub delta_bounds: IntCounterVec,
    /// An `--image` whose new release a check refused while the others
    /// moved on, by `image` (as given) and `reason`: `rollback`,
    /// `signatures` or `failed` (fetch or verification).
    pub image_refusals: IntCounterVec,
    /// What the last publication put into the object cache before it
    /// became visible (`cache::warm`).
    pub cache_warmed_bytes: IntGauge,
    pub cache_warmed_objects: IntGauge,
    /// What the object cache holds, set when `/metrics` is read.
    pub cache_bytes: IntGauge,
    pub cache_objects: IntGauge,
    /// The staging slots, set from their table at each scrape.
    pub stage_slots: StageSlots,
    handles: Handles,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    // long-fn: registers every metric, one statement each
    pub fn new() -> Self {
        let r = Register(Registry::new());
        let requests = r.counter_vec(
            "oscontent_http_requests_total",
            "HTTP requests by path kind and status code",
            &["kind", "status"],
        );
        let response_bytes = r.counter_vec(
            "oscontent_http_response_bytes_total",
            "Response body bytes sent (handed to the connection; a response cut short counts what went), by path kind",
            &["kind"],
        );
        let latency = r.add(
            HistogramVec::new(
                HistogramOpts::new(
                    "oscontent_http_request_duration_seconds",
                    "Time to produce the response head, by path kind",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["kind"],
            )
            .expect("valid metric"),
        );
        let ready = r.gauge("oscontent_ready", "1 once verified content is published");
        let published_refs = r.gauge(
            "oscontent_published_refs",
            "Refs the server derived for the current generation",
        );
        let generation = r.gauge("oscontent_generation", "ID of the generation being served");
        let source_checks = r.counter_vec(
            "oscontent_source_checks_total",
            "Source checks (first fetch, --refresh-interval, SIGHUP) by outcome: published, unchanged or failed",
            &["result"],
        );
        // Every bounded label value is shown at 0 from the start, so that an
        // alert (`increase(...) > 0`, `absent(...)`) sees a series before the
        // first event.
        for result in ["published", "unchanged", "failed"] {
            source_checks.with_label_values(&[result]);
        }
        let connections = Connections::new(&r);
        let access_log_dropped = r.counter(
            "oscontent_access_log_dropped_total",
            "Access log lines dropped because the log's output fell behind or failed",
        );
        let oversized_metadata = r.counter_vec(
            "oscontent_oversized_metadata_total",
            "Metadata files refused for exceeding their size cap, by path kind",
            &["kind"],
        );
        for kind in [
            "config",
            "summary",
            "summary_sig",
            "ref",
            "commitmeta",
            "delta_index",
        ] {
            oversized_metadata.with_label_values(&[kind]);
        }
        let rollbacks = r.counter_vec(
            "oscontent_rollbacks_total",
            "Refs a refresh moved to an older commit (timestamp or version), by result: refused (the previous generation stays served), allowed (--allow-rollback), or future (an unverified commit dated past --max-future-skew, refused so it never becomes the mark)",
            &["result"],
        );
        // Shown at 0 from the start, so an alert can watch for the first.
        for result in ["refused", "allowed", "future"] {
            rollbacks.with_label_values(&[result]);
        }
        let rollback_allowed = r.gauge(
            "oscontent_rollback_allowed",
            "1 when --allow-rollback publishes refreshes that move a ref back in time",
        );
        let deltas = r.counter_vec(
            "oscontent_deltas_total",
            "Static deltas between served releases, by result: generated, reused (from the state dir) or failed (nodes fetch objects)",
            &["result"],
        );
        for result in ["generated", "reused", "failed"] {
            deltas.with_label_values(&[result]);
        }
        let deltas_published = r.gauge(
            "oscontent_deltas_published",
            "Generated static deltas the current generation serves",
        );
        let delta_bounds = r.counter_vec(
            "oscontent_delta_bounds_hit_total",
            "Static delta compilations stopped by a bound (and counted failed), by bound: time (killed at --delta-timeout) or memory (--delta-memory)",
            &["bound"],
        );
        for bound in ["time", "memory"] {
            delta_bounds.with_label_values(&[bound]);
        }
        let image_refusals = r.counter_vec(
            "oscontent_image_refusals_total",
            "Checks that kept an --image at its previous release (or did not serve it) while the others moved on, by image and reason: rollback, signatures or failed",
            &["image", "reason"],
        );
        let cache_warmed_bytes = r.gauge(
            "oscontent_cache_warmed_bytes",
            "Object bytes the last publication put into the object cache before it became visible (what its releases bring new)",
        );
        let cache_warmed_objects = r.gauge(
            "oscontent_cache_warmed_objects",
            "Objects the last publication put into the object cache before it became visible",
        );
        let cache_bytes = r.gauge(
            "oscontent_cache_bytes",
            "Bytes the object cache holds now, bodies and per-entry overhead (at most --cache-size)",
        );
        let cache_objects = r.gauge(
            "oscontent_cache_objects",
            "Objects the object cache holds now",
        );
        let stage_slots = StageSlots::new(&r);
        Self {
            registry: r.0,
            requests,
            response_bytes,
            latency,
            ready,
            published_refs,
            generation,
            source_checks,
            connections,
            access_log_dropped,
            oversized_metadata,
            rollbacks,
            rollback_allowed,
            deltas,
            deltas_published,
            delta_bounds,
            image_refusals,
            cache_warmed_bytes,
            cache_warmed_objects,
            cache_bytes,
            cache_objects,
            stage_slots,
            handles: Handles {
                requests: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
                bytes: std::array::from_fn(|_| OnceLock::new()),
                latency: std::array::from_fn(|_| OnceLock::new()),
            },
        }
    }

    /// Counts one answered request: its kind, status and the time to its
    /// response head.
    pub fn observe_request(&self, kind: &'static str, status: u16, seconds: f64) {
        let Some(k) = KINDS.iter().position(|x| *x == kind) else {
            self.requests
                .with_label_values(&[kind, &status.to_string()])
                .inc();
            self.latency.with_label_values(&[kind]).observe(seconds);
            return;
        };
        let h = &self.handles;
        match STATUSES.iter().position(|x| *x == status) {
            Some(s) => h.requests[k][s]
                .get_or_init(|| {
                    self.requests
                        .with_label_values(&[kind, &status.to_string()])
                })
                .inc(),
            None => self
                .requests
                .with_label_values(&[kind, &status.to_string()])
                .inc(),
        }
        h.latency[k]
            .get_or_init(|| self.latency.with_label_values(&[kind]))
            .observe(seconds);
    }

    /// Counts the body bytes a response of `kind` sent.
    pub fn sent(&self, kind: &'static str, bytes: u64) {
        match KINDS.iter().position(|x| *x == kind) {
            Some(k) => self.handles.bytes[k]
                .get_or_init(|| self.response_bytes.with_label_values(&[kind]))
                .inc_by(bytes),
            None => self.response_bytes.with_label_values(&[kind]).inc_by(bytes),
        }
    }

    /// The exposition text and its content type.
    pub fn render(&self) -> (String, &'static str) {
        let enc = TextEncoder::new();
        let text = enc
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default();
        (text, prometheus::TEXT_FORMAT)
    }
}

// The names and help texts are constants of this file: a bad one is a bug
// the first test run shows, hence `expect`.
/// What the listener counts of its connections.
#[derive(Debug)]
pub struct Connections {
    /// Open now: `normal`, or `probe_reserve` (over the cap, answering
    /// probes only).
    pub open: IntGaugeVec,
    /// `open`'s two series, looked up once rather than at every
    /// connection ([`Connections::open_now`]).
    open_series: [IntGauge; 2],
    pub accepted: IntCounter,
    /// Closed at accept: `total`, `per_ip` or `per_net` cap reached (and
    /// the probe reserve too), or an `accept_error` (descriptors
    /// exhausted).
    pub refused: IntCounterVec,
    /// Sent to the probe reserve (probes only) at accept: the `total`,
    /// `per_ip` or `per_net` cap reached.
    pub reserved: IntCounterVec,
    /// Idle connections closed to make room for a new one, the cap full.
    pub idle_closed: IntCounter,
    /// 1 while `/readyz` says not ready for refusing new clients.
    pub refusing: IntGauge,
    /// Bytes of streamed bodies' chunks held now (`served::memory`), set
    /// at each scrape.
    pub body_bytes: IntGauge,
    /// Closed by the server for inactivity: `first_byte`, `idle`,
    /// `keepalive` (HTTP/2 PING unanswered), `header_read` (HTTP/1.1).
    pub expired: IntCounterVec,
    /// Files held open by streamed bodies now (`served::streams`), set at
    /// each scrape.
    pub streamed_files: IntGauge,
    /// Bodies streamed past that budget, opening their file for each read.
    pub streams_reopened: IntCounter,
}

impl Connections {
    /// The open connections of one kind: in the probe reserve, or not.
    pub fn open_now(&self, probe_only: bool) -> &IntGauge {
        &self.open_series[usize::from(probe_only)]
    }

    fn new(r: &Register) -> Self {
        let open = r.gauge_vec(
            "oscontent_http_connections_open",
            "Connections open now: normal, or probe_reserve (over the cap, probes only)",
            &["kind"],
        );
        let c = Self {
            open_series: ["normal", "probe_reserve"].map(|kind| open.with_label_values(&[kind])),
            open,
            accepted: r.counter(
                "oscontent_http_connections_accepted_total",
                "Connections accepted",
            ),
            refused: r.counter_vec(
                "oscontent_http_connections_refused_total",
                "Connections closed at accept: total, per_ip or per_net (/24, /64) cap reached and the probe reserve too, or accept_error",
                &["reason"],
            ),
            reserved: r.counter_vec(
                "oscontent_http_connections_reserved_total",
                "Connections admitted to the probe reserve only (probes and metrics answered, content refused): total (none idle to close), per_ip or per_net cap reached",
                &["reason"],
            ),
            idle_closed: r.counter(
                "oscontent_http_connections_idle_closed_total",
                "Idle connections closed to make room for a new one while every connection was in use",
            ),
            refusing: r.gauge(
                "oscontent_http_refusing",
                "1 while /readyz fails because new clients have been refused for want of room for longer than --unready-after-refusing",
            ),
            body_bytes: r.gauge(
                "oscontent_http_body_bytes",
                "Bytes of streamed response chunks held in memory now (at most --max-body-memory, plus 4 KiB a stream past a client's share)",
            ),
            expired: r.counter_vec(
                "oscontent_http_connections_expired_total",
                "Connections the server closed: nothing sent (first_byte), no response moved (idle), a keepalive PING unanswered (keepalive), a request head not whole in time (header_read)",
                &["reason"],
            ),
            streamed_files: r.gauge(
                "oscontent_http_streamed_files",
                "Files held open by streamed bodies now, each with a descriptor and a chunk (at most --max-streamed-files)",
            ),
            streams_reopened: r.counter(
                "oscontent_http_streams_reopened_total",
                "Bodies streamed past --max-streamed-files (or a client's share), opening their file for each 8 KiB read",
            ),
        };
        c.refused.with_label_values(&["accept_error"]);
        c
    }

    /// Exports every reason the listener can refuse (`refused`) or close
    /// (`expired`) a connection for at 0, so a scrape sees each series
    /// before its first event. The listener names them: it owns the reasons.
    pub fn name_reasons(&self, refused: &[&str], expired: &[&str]) {
        for why in refused {
            self.refused.with_label_values(&[why]);
            self.reserved.with_label_values(&[why]);
        }
        for why in expired {
            self.expired.with_label_values(&[why]);
        }
    }
}

/// The staging slots (`crate::slots`), by pool: at most `--stage-max-pools`
/// of them, plus `*` for the refusals of pools past it.
#[derive(Debug)]
pub struct StageSlots {
    pub slots: IntGaugeVec,
    pub in_use: IntGaugeVec,
    pub peak: IntGaugeVec,
    pub grants: IntCounterVec,
    pub refusals: IntCounterVec,
    pub expiries: IntCounterVec,
    pub releases: IntCounterVec,
}

/// The `pool` label of the refusals of pools past `--stage-max-pools`: no
/// pool's name (a pool is `A-Za-z0-9._-`).
pub const UNKNOWN_POOL: &str = "*";

impl StageSlots {
    fn new(r: &Register) -> Self {
        let pool = &["pool"];
        Self {
            slots: r.gauge_vec(
                "oscontent_stage_slots",
                "Staging slots a pool may hold at once (--stage-slots), on this replica",
                pool,
            ),
            in_use: r.gauge_vec(
                "oscontent_stage_slots_in_use",
                "Staging leases a pool holds now (expired ones gone)",
                pool,
            ),
            peak: r.gauge_vec(
                "oscontent_stage_slots_peak",
                "The most staging leases a pool held at once since start",
                pool,
            ),
            grants: r.counter_vec(
                "oscontent_stage_slot_grants_total",
                "New staging leases granted (a node asking again while it holds one is not counted)",
                pool,
            ),
            refusals: r.counter_vec(
                "oscontent_stage_slot_refusals_total",
                "Staging slot requests refused (429), by pool and reason: full, control_plane (--stage-slots-control-plane), pools (past --stage-max-pools, pool \"*\"), address (--stage-leases-per-address)",
                &["pool", "reason"],
            ),
            expiries: r.counter_vec(
                "oscontent_stage_slot_expiries_total",
                "Staging leases that expired, not renewed within --stage-lease-ttl (a node that died, or lost this replica)",
                pool,
            ),
            releases: r.counter_vec(
                "oscontent_stage_slot_releases_total",
                "Staging leases given back (DELETE)",
                pool,
            ),
        }
    }

    /// Shows `report`: counters move up to the table's totals. Called
    /// under the table's lock (`http::slots::SlotTable::with_report`), so
    /// two scrapes at once do not both add the same difference.
    pub fn show(&self, report: &crate::slots::Report) {
        let up_to = |c: IntCounter, total: u64| c.inc_by(total.saturating_sub(c.get()));
        for (name, s) in &report.pools {
            let pool = &[name.as_str()];
            self.slots
                .with_label_values(pool)
                .set(i64::from(report.per_pool));
            self.in_use.with_label_values(pool).set(i64::from(s.in_use));
            self.peak.with_label_values(pool).set(i64::from(s.peak));
            up_to(self.grants.with_label_values(pool), s.grants);
            up_to(self.expiries.with_label_values(pool), s.expiries);
            up_to(self.releases.with_label_values(pool), s.releases);
            for (reason, n) in crate::slots::Reason::ALL.iter().zip(s.refusals) {
                up_to(
                    self.refusals
                        .with_label_values(&[name.as_str(), reason.label()]),
                    n,
                );
            }
        }
        let unknown = self
            .refusals
            .with_label_values(&[UNKNOWN_POOL, crate::slots::Reason::Pools.label()]);
        up_to(unknown, report.unknown_pool_refusals);
    }
}

/// Makes metrics already registered, so none can be made and forgotten.
/// Names and help texts are constants: a bad one is a bug, hence `expect`.
struct Register(Registry);

impl Register {
    fn add<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> C {
        self.0
            .register(Box::new(c.clone()))
            .expect("unique metric names");
        c
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid metric"))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("valid metric"))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_kind_and_status_whichever_way() {
        let m = Metrics::new();
        #[rustfmt::skip]
        let cases: &[(&'static str, u16, u64)] = &[
            ("filez", 200, 100), ("filez", 200, 50), ("filez", 304, 0),
            ("ref", 418, 0), ("made_up", 200, 7),
        ];
        for &(kind, status, bytes) in cases {
            m.observe_request(kind, status, 0.001);
            m.sent(kind, bytes);
        }
        let req = |k: &str, s: &str| m.requests.with_label_values(&[k, s]).get();
        assert_eq!(
            (
                req("filez", "200"),
                req("filez", "304"),
                req("ref", "418"),
                req("made_up", "200")
            ),
            (2, 1, 1, 1)
        );
        assert_eq!(m.response_bytes.with_label_values(&["filez"]).get(), 150);
        assert_eq!(m.response_bytes.with_label_values(&["made_up"]).get(), 7);
        assert_eq!(
            m.latency.with_label_values(&["filez"]).get_sample_count(),
            3
        );
        let text = m.render().0;
        assert!(
            !text.contains("oscontent_http_requests_total{kind=\"summary\""),
            "no request series before a request"
        );
    }

    #[test]
    fn bounded_outcomes_are_shown_at_zero_before_the_first() {
        let m = Metrics::new();
        // The listener names its reasons as it starts (`serve::socket::run`).
        m.connections
            .name_reasons(&["total", "per_ip"], &["first_byte"]);
        let text = m.render().0;
        for series in [
            r#"oscontent_source_checks_total{result="unchanged"} 0"#,
            r#"oscontent_http_connections_refused_total{reason="per_ip"} 0"#,
            r#"oscontent_http_connections_expired_total{reason="first_byte"} 0"#,
            r#"oscontent_http_connections_open{kind="probe_reserve"} 0"#,
            r#"oscontent_oversized_metadata_total{kind="summary"} 0"#,
            r#"oscontent_rollbacks_total{result="refused"} 0"#,
        ] {
            assert!(
                text.lines().any(|l| l == series),
                "{series} missing:\n{text}"
            );
        }
    }
}
