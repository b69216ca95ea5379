//! The `fleet --stage` table: per wave, the most nodes staging at once
//! against the slots, how many staged, time to staged, and egress against
//! N × the new objects.

use super::wave::StageWave;
use super::Report;
use crate::bench::new_objects::NewObjects;

/// Time-to-staged percentile (nearest rank) of a sorted sample.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Figures of one wave, derived.
#[derive(Debug)]
pub struct Derived {
    pub staged: usize,
    pub errors: usize,
    pub p50: f64,
    pub max: f64,
    /// Server egress (link bytes, headers included) over N × new objects.
    pub egress_ratio: f64,
    /// Response bytes in the access log over N × new objects.
    pub body_ratio: f64,
    pub refusals_per_node: f64,
    pub cpu_ms_per_node: f64,
}

pub fn derive(w: &StageWave, new: &NewObjects) -> Derived {
    let mut t: Vec<f64> = w.nodes.iter().filter_map(|n| n.staged_seconds).collect();
    t.sort_by(f64::total_cmp);
    let n = w.nodes.len().max(1) as f64;
    let needed = n * new.bytes as f64;
    let bodies: u64 = w.nodes.iter().map(|x| x.bytes).sum();
    Derived {
        staged: t.len(),
        errors: w.nodes.iter().filter(|x| x.error.is_some()).count(),
        p50: pct(&t, 50.0),
        max: t.last().copied().unwrap_or(f64::NAN),
        egress_ratio: w.server_egress_bytes as f64 / needed,
        body_ratio: bodies as f64 / needed,
        refusals_per_node: w.nodes.iter().map(|x| x.refusals).sum::<u64>() as f64 / n,
        cpu_ms_per_node: w.server_cpu_seconds / n * 1e3,
    }
}

/// A progress line after each wave.
pub fn one_line(w: &StageWave, new: &NewObjects) -> String {
    let d = derive(w, new);
    format!(
        "  {} nodes, run {}: {} staged, {} errors, at most {} staging at once (peak gauge {}), time to staged p50 {:.1} s, max {:.1} s, egress / needed {:.3} (bodies {:.3})",
        w.nodes.len(),
        w.repeat + 1,
        d.staged,
        d.errors,
        w.sampled_max_in_use,
        w.slots.peak,
        d.p50,
        d.max,
        d.egress_ratio,
        d.body_ratio,
    )
}

pub fn table(r: &Report) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut s = format!(
        "fleet --stage ({} scale, {:.0}% update: {} new objects, {:.2} MiB compressed; {} slots, Retry-After {} s; {}; {})\n\n",
        r.run.scale,
        r.run.share * 100.0,
        r.new_objects.count,
        mib(r.new_objects.bytes),
        r.slots,
        r.retry_after_secs,
        r.run.links_and_build(),
        r.run.machine(),
    );
    s += "| nodes | run | staged | most staging at once: sampled / peak gauge (target <= slots) | time to staged p50 / max s | wall s | refusals/node | egress / N × new (target 0.95-1.05) | response bodies / N × new | errors | server CPU-ms/node | leases granted / released / expired |\n";
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for w in &r.waves {
        let d = derive(w, &r.new_objects);
        s += &format!(
            "| {} | {} | {}/{} | {} / {} | {:.1} / {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {} | {:.1} | {} / {} / {} |\n",
            w.nodes.len(),
            w.repeat + 1,
            d.staged,
            w.nodes.len(),
            w.sampled_max_in_use,
            w.slots.peak,
            d.p50,
            d.max,
            w.wall_seconds,
            d.refusals_per_node,
            d.egress_ratio,
            d.body_ratio,
            d.errors,
            d.cpu_ms_per_node,
            w.slots.grants,
            w.slots.releases,
            w.slots.expiries,
        );
    }
    for w in &r.waves {
        let n = w.nodes.len().max(1) as u64;
        let twice: u64 = w.nodes.iter().map(|x| x.served_twice).sum();
        s += &format!(
            "\n{} nodes, per node: {}; objects served twice: {twice}",
            w.nodes.len(),
            w.by_kind
                .iter()
                .map(|(k, (req, b))| format!("{k} {} req {} B", req / n, b / n))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    s.push('\n');
    for w in &r.waves {
        for (i, n) in w.nodes.iter().enumerate() {
            if let Some(e) = &n.error {
                s += &format!("\n{} nodes, node {i}: {e}", w.nodes.len());
            }
        }
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::super::super::cpuacct::CpuSource;
    use super::super::wave::{SlotMetrics, StageNode};
    use super::*;

    #[test]
    fn a_wave_is_judged_against_n_times_the_new_objects() {
        let node = |t: Option<f64>, bytes, error: Option<&str>| StageNode {
            staged_seconds: t,
            error: error.map(str::to_owned),
            refusals: 2,
            requests: 10,
            bytes,
            served_twice: 0,
        };
        let w = StageWave {
            nodes: vec![
                node(Some(3.0), 1000, None),
                node(Some(1.0), 1000, None),
                node(None, 100, Some("no staged event")),
                node(Some(2.0), 1100, None),
            ],
            repeat: 0,
            wall_seconds: 4.0,
            sampled_max_in_use: 2.0,
            samples: 20,
            slots: SlotMetrics::default(),
            server_cpu_seconds: 0.4,
            cpu_source: CpuSource::Cgroup,
            server_egress_bytes: 4200,
            by_kind: Default::default(),
        };
        let new = NewObjects {
            count: 3,
            bytes: 1000,
        };
        let d = derive(&w, &new);
        assert_eq!((d.staged, d.errors), (3, 1));
        assert_eq!((d.p50, d.max), (2.0, 3.0));
        assert!((d.egress_ratio - 1.05).abs() < 1e-9, "{d:?}");
        assert!((d.body_ratio - 0.8).abs() < 1e-9, "{d:?}");
        assert_eq!(d.refusals_per_node, 2.0);
        assert!((d.cpu_ms_per_node - 100.0).abs() < 1e-9, "{d:?}");
    }
}
