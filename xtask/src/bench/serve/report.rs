//! `bench serve`'s results: every replay as measured, and the table of
//! medians with each figure as a ratio to nginx in the same run.

use super::h2load::{Counts, Proto};
use super::servers::Arm;
use crate::bench::Summary;
use std::fmt::Write;

/// One replay.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    pub arm: Arm,
    pub proto: Proto,
    pub concurrency: u32,
    pub rep: usize,
    pub counts: Counts,
    pub req_per_s: f64,
    pub mib_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub cpu_s: f64,
    pub req_per_cpu_s: f64,
}

impl Sample {
    #[allow(clippy::too_many_arguments)] // one replay's coordinates and figures
    pub fn new(
        arm: Arm,
        proto: Proto,
        concurrency: u32,
        rep: usize,
        counts: Counts,
        p50_ms: f64,
        p99_ms: f64,
        cpu_s: f64,
    ) -> Self {
        let secs = counts.seconds.max(1e-9);
        Self {
            arm,
            proto,
            concurrency,
            rep,
            req_per_s: counts.done as f64 / secs,
            mib_per_s: counts.bytes as f64 / secs / (1024.0 * 1024.0),
            req_per_cpu_s: counts.done as f64 / cpu_s.max(1e-3),
            counts,
            p50_ms,
            p99_ms,
            cpu_s,
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub started: String,
    pub git: Option<String>,
    pub kernel: String,
    pub scale: String,
    pub server_profile: String,
    pub server_args: Vec<String>,
    /// Servers on CPU 0, h2load on CPU 1.
    pub pinned: bool,
    pub load_average: f64,
    pub cpus: usize,
    pub requests_per_replay: usize,
    /// Bytes of the files the mix names, each once.
    pub mix_bytes: u64,
    pub replay: super::h2load::Replay,
    pub samples: Vec<Sample>,
    /// VmHWM of each server's process tree at the end of the run.
    pub peak_rss: Vec<(Arm, u64)>,
}

/// Medians of one (arm, protocol, concurrency).
#[derive(Debug, Clone, Copy)]
struct Row {
    req_s: f64,
    mib_s: f64,
    p50: f64,
    p99: f64,
    errors: u64,
    cpu: f64,
    per_cpu: f64,
    n: usize,
}

fn row(r: &Report, arm: Arm, proto: Proto, conc: u32) -> Option<Row> {
    let s: Vec<&Sample> = r
        .samples
        .iter()
        .filter(|s| s.arm == arm && s.proto == proto && s.concurrency == conc)
        .collect();
    if s.is_empty() {
        return None;
    }
    let med = |f: fn(&Sample) -> f64| Summary::of(&s.iter().map(|x| f(x)).collect::<Vec<_>>());
    Some(Row {
        req_s: med(|x| x.req_per_s).median,
        mib_s: med(|x| x.mib_per_s).median,
        p50: med(|x| x.p50_ms).median,
        p99: med(|x| x.p99_ms).median,
        errors: s.iter().map(|x| x.counts.errors).sum(),
        cpu: med(|x| x.cpu_s).median,
        per_cpu: med(|x| x.req_per_cpu_s).median,
        n: s.len(),
    })
}

/// A markdown table (what RESULTS.md carries), one row per server,
/// protocol and concurrency.
pub fn render(r: &Report) -> String {
    let mut t = format!(
        "bench serve: {} scale, {} requests per replay ({}), server {} {}; {}; load {:.2} on {} CPUs; git {}; {}\n\n",
        r.scale,
        r.requests_per_replay,
        match r.replay {
            super::h2load::Replay::Split => format!(
                "split: every path of the mix once, {:.1} MiB",
                r.mix_bytes as f64 / (1024.0 * 1024.0)
            ),
            super::h2load::Replay::Shared => {
                "shared: every connection from the mix's first path".to_owned()
            }
        },
        r.server_profile,
        r.server_args.join(" "),
        if r.pinned { "servers pinned to CPU 0, h2load to CPU 1" } else { "not pinned" },
        r.load_average,
        r.cpus,
        r.git.as_deref().unwrap_or("?"),
        r.started,
    );
    t += "| proto | conc | server | req/s | MiB/s | p50 ms | p99 ms | errors | CPU-s | req/CPU-s | req/s ÷ nginx | req/CPU-s ÷ nginx | p99 ÷ nginx | runs |\n";
    t += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let mut protos: Vec<Proto> = r.samples.iter().map(|s| s.proto).collect();
    protos.dedup();
    let mut concs: Vec<u32> = r.samples.iter().map(|s| s.concurrency).collect();
    concs.sort_unstable();
    concs.dedup();
    let mut arms: Vec<Arm> = r.peak_rss.iter().map(|(a, _)| *a).collect();
    arms.dedup();
    for &proto in [Proto::H1, Proto::H2c]
        .iter()
        .filter(|p| protos.contains(p))
    {
        for &conc in &concs {
            let anchor = row(r, Arm::Nginx, proto, conc);
            for &arm in &arms {
                let Some(x) = row(r, arm, proto, conc) else {
                    continue;
                };
                let ratio = |f: fn(&Row) -> f64| {
                    anchor.map_or("–".into(), |a| format!("{:.2}", f(&x) / f(&a)))
                };
                let _ = writeln!(
                    t,
                    "| {proto:?} | {conc} | {arm:?} | {:.0} | {:.1} | {:.2} | {:.2} | {} | {:.2} | {:.0} | {} | {} | {} | {} |",
                    x.req_s,
                    x.mib_s,
                    x.p50,
                    x.p99,
                    x.errors,
                    x.cpu,
                    x.per_cpu,
                    ratio(|r| r.req_s),
                    ratio(|r| r.per_cpu),
                    ratio(|r| r.p99),
                    x.n
                );
            }
        }
    }
    let nginx_rss = r
        .peak_rss
        .iter()
        .find(|(a, _)| *a == Arm::Nginx)
        .map(|(_, b)| *b);
    t += "\n| server | peak RSS MiB | ÷ nginx |\n|---|---|---|\n";
    for (arm, b) in &r.peak_rss {
        let ratio = nginx_rss.map_or("–".into(), |n| format!("{:.1}", *b as f64 / n as f64));
        let _ = writeln!(
            t,
            "| {arm:?} | {:.1} | {ratio} |",
            *b as f64 / (1024.0 * 1024.0)
        );
    }
    t
}
