//! The fleet table: per wave, the node-side times and requests, and the
//! server's cost beside nginx's for the same clients, deltas and size.

use super::cpuacct::CpuSource;
use super::repos::Repos;
use super::wave::{ServerKind, WaveResult, WaveSpec};
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
        "  {} nodes, {:?} server, {:?} client, deltas {}, run {}: p50 {:.2} s, max {:.2} s, {:.0} req/node, {:.2} CPU-ms/node ({:?}), {} errors",
        w.spec.nodes,
        w.spec.server,
        w.spec.client,
        w.spec.delta,
        w.repeat + 1,
        d.p50,
        d.max,
        d.requests_per_node,
        d.cpu_per_node * 1e3,
        w.cpu_source,
        d.errors
    )
}

/// Every run of one spec, pooled: node times and requests over all runs,
/// the server's CPU per node as the median of the runs (and their range).
struct Pooled {
    p50: f64,
    p99: f64,
    max: f64,
    requests_per_node: f64,
    cpu: Summary,
    egress_ratio: f64,
    errors: usize,
    served_twice: u64,
    peak_rss_kib: u64,
    ticks: bool,
}

fn pool(r: &Report, runs: &[&WaveResult]) -> Pooled {
    let mut t: Vec<f64> = runs
        .iter()
        .flat_map(|w| w.nodes.iter().map(|n| n.seconds))
        .collect();
    t.sort_by(f64::total_cmp);
    let requests: Vec<f64> = runs
        .iter()
        .flat_map(|w| w.nodes.iter().map(|n| n.requests as f64))
        .collect();
    let derived: Vec<Derived> = runs.iter().map(|w| derive(w, needed(r, w))).collect();
    let of = |f: fn(&Derived) -> f64| Summary::of(&derived.iter().map(f).collect::<Vec<_>>());
    Pooled {
        p50: pct(&t, 50.0),
        p99: pct(&t, 99.0),
        max: t.last().copied().unwrap_or(f64::NAN),
        requests_per_node: Summary::of(&requests).median,
        cpu: of(|d| d.cpu_per_node),
        egress_ratio: of(|d| d.egress_ratio).median,
        errors: derived.iter().map(|d| d.errors).sum(),
        served_twice: derived.iter().map(|d| d.served_twice).sum(),
        peak_rss_kib: runs
            .iter()
            .map(|w| w.server_peak_rss_kib)
            .max()
            .unwrap_or(0),
        ticks: runs.iter().any(|w| w.cpu_source == CpuSource::Ticks),
    }
}

/// The runs of each spec, in the order the specs first ran.
fn by_spec(r: &Report) -> Vec<(WaveSpec, Vec<&WaveResult>)> {
    let mut groups: Vec<(WaveSpec, Vec<&WaveResult>)> = Vec::new();
    for w in &r.waves {
        match groups.iter_mut().find(|(s, _)| same(s, &w.spec)) {
            Some((_, runs)) => runs.push(w),
            None => groups.push((w.spec, vec![w])),
        }
    }
    groups
}

fn same(a: &WaveSpec, b: &WaveSpec) -> bool {
    a.nodes == b.nodes && a.server == b.server && a.client == b.client && a.delta == b.delta
}

pub fn table(r: &Report) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut s = format!(
        "fleet ({} scale, {:.0}% update: {} new objects, {:.2} MiB; delta {}; {}; {} runs of each wave; {})\n\n",
        r.run.scale,
        r.run.share * 100.0,
        r.new_objects,
        mib(r.new_bytes),
        r.delta_bytes.map_or("-".into(), |b| format!("{:.2} MiB", mib(b))),
        r.run.links_and_build(),
        r.repeat,
        r.run.machine(),
    );
    s += "| nodes | deltas | client | server | update p50 / p99 / max s | requests/node | server CPU-ms/node, median [min-max] | × nginx | egress / needed | errors | served twice | server peak RSS |\n";
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let groups = by_spec(r);
    let mut ticks = false;
    for (spec, runs) in &groups {
        let p = pool(r, runs);
        ticks |= p.ticks;
        let anchor = groups.iter().find(|(a, _)| {
            a.server == ServerKind::Nginx
                && same(
                    a,
                    &WaveSpec {
                        server: ServerKind::Nginx,
                        ..*spec
                    },
                )
        });
        let vs = anchor
            .map(|(_, a)| pool(r, a).cpu.median)
            .filter(|c| *c > 0.0)
            .map_or("-".into(), |c| format!("{:.2}", p.cpu.median / c));
        s += &format!(
            "| {} | {} | {:?} | {:?} | {:.2} / {:.2} / {:.2} | {:.0} | {:.2} [{:.2}-{:.2}]{} | {vs} | {:.2} | {} | {} | {:.0} MiB |\n",
            spec.nodes,
            if spec.delta { "yes" } else { "no" },
            spec.client,
            spec.server,
            p.p50,
            p.p99,
            p.max,
            p.requests_per_node,
            p.cpu.median * 1e3,
            p.cpu.min * 1e3,
            p.cpu.max * 1e3,
            if p.ticks { "*" } else { "" },
            p.egress_ratio,
            p.errors,
            p.served_twice,
            p.peak_rss_kib as f64 / 1024.0,
        );
    }
    s += if ticks {
        "\nServer CPU from the tree's cpuacct cgroup (ns), except * (no cgroup: /proc clock ticks of 10 ms).\n"
    } else {
        "\nServer CPU from a cpuacct cgroup holding the server's processes (ns resolution).\n"
    };
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
