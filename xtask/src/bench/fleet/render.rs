//! The fleet table: per wave, the node-side times and requests, and the
//! server's cost beside nginx's for the same clients, deltas and size.

use super::repos::Repos;
use super::wave::{ServerKind, WaveResult};
use super::Report;
use crate::bench::Summary;

/// Update-time percentile (nearest rank) of a sorted sample.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Figures of one wave, derived.
pub struct Derived {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub requests_per_node: f64,
    pub cpu_per_node: f64,
    pub errors: usize,
    pub served_twice: u64,
    /// Server egress over what the nodes needed (N × the new objects, or
    /// N × the delta when one was served).
    pub egress_ratio: f64,
}

pub fn derive(w: &WaveResult, new_bytes: u64) -> Derived {
    let mut t: Vec<f64> = w.nodes.iter().map(|n| n.seconds).collect();
    t.sort_by(f64::total_cmp);
    let n = w.nodes.len().max(1) as f64;
    Derived {
        p50: pct(&t, 50.0),
        p99: pct(&t, 99.0),
        max: t.last().copied().unwrap_or(f64::NAN),
        requests_per_node: Summary::of(
            &w.nodes
                .iter()
                .map(|x| x.requests as f64)
                .collect::<Vec<_>>(),
        )
        .median,
        cpu_per_node: w.server_cpu_seconds / n,
        errors: w.nodes.iter().filter(|x| x.error.is_some()).count(),
        served_twice: w.nodes.iter().map(|x| x.served_twice).sum(),
        egress_ratio: w.server_egress_bytes as f64 / (n * new_bytes as f64),
    }
}

fn needed(r: &Report, w: &WaveResult) -> u64 {
    if w.spec.delta {
        r.delta_bytes.unwrap_or(r.new_bytes)
    } else {
        r.new_bytes
    }
}

/// A progress line after each wave.
pub fn one_line(w: &WaveResult, repos: &Repos) -> String {
    let d = derive(w, repos.new_bytes);
    format!(
        "  {} nodes, {:?} server, {:?} client, deltas {}: p50 {:.2} s, max {:.2} s, {:.0} req/node, {:.3} CPU-s/node, {} errors",
        w.spec.nodes, w.spec.server, w.spec.client, w.spec.delta, d.p50, d.max, d.requests_per_node, d.cpu_per_node, d.errors
    )
}

/// The same wave with nginx serving, if it ran.
fn anchor<'a>(r: &'a Report, w: &WaveResult) -> Option<&'a WaveResult> {
    r.waves.iter().find(|a| {
        a.spec.server == ServerKind::Nginx
            && a.spec.nodes == w.spec.nodes
            && a.spec.client == w.spec.client
            && a.spec.delta == w.spec.delta
    })
}

pub fn table(r: &Report) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut s = format!(
        "fleet ({} scale, {:.0}% update: {} new objects, {:.2} MiB; delta {}; links {} with {:.1} ms each way; server {} build; {}; {}; load {:.1} on {} CPUs)\n\n",
        r.scale,
        r.share * 100.0,
        r.new_objects,
        mib(r.new_bytes),
        r.delta_bytes.map_or("-".into(), |b| format!("{:.2} MiB", mib(b))),
        r.rate,
        r.delay_ms,
        r.server_profile,
        r.git.as_deref().unwrap_or("no git"),
        r.kernel,
        r.load.0,
        r.load.1,
    );
    s += "| nodes | deltas | client | server | update p50 / p99 / max s | requests/node | server CPU-s/node | × nginx | egress / needed | errors | served twice | server peak RSS |\n";
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for w in &r.waves {
        let d = derive(w, needed(r, w));
        let vs = anchor(r, w)
            .map(|a| derive(a, needed(r, a)).cpu_per_node)
            .filter(|c| *c > 0.0)
            .map_or("-".into(), |c| format!("{:.2}", d.cpu_per_node / c));
        s += &format!(
            "| {} | {} | {:?} | {:?} | {:.2} / {:.2} / {:.2} | {:.0} | {:.4} | {vs} | {:.2} | {} | {} | {:.0} MiB |\n",
            w.spec.nodes,
            if w.spec.delta { "yes" } else { "no" },
            w.spec.client,
            w.spec.server,
            d.p50,
            d.p99,
            d.max,
            d.requests_per_node,
            d.cpu_per_node,
            d.egress_ratio,
            d.errors,
            d.served_twice,
            w.server_peak_rss_kib as f64 / 1024.0,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        let cases = [
            (50.0, 5.0),
            (99.0, 10.0),
            (10.0, 1.0),
            (100.0, 10.0),
            (0.0, 1.0),
        ];
        for (p, want) in cases {
            assert_eq!(pct(&v, p), want, "p{p}");
        }
        assert!(pct(&[], 50.0).is_nan());
    }
}
