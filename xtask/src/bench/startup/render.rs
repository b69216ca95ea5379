//! The table `bench startup` prints (also rendered from a saved report).

use super::results::{Arm, Report, Trial};
use crate::bench::{mib, report, Summary};

/// The table.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let rel = &r.release;
    s += &format!(
        "\nbench startup: {} fixture, {} ({} files, unpacked repo {}, image layers {}), {} run(s), server {} ({})\n",
        r.scale,
        rel.version,
        rel.tree_files,
        mib(rel.repo_bytes as f64),
        mib(rel.image_bytes as f64),
        r.runs,
        r.server_profile,
        r.git.as_deref().unwrap_or("?"),
    );
    s += &format!(
        "{}; caches dropped before each arm: {}; load {:.2} -> {:.2} on {} CPUs\n\n",
        report::scratch_line(r.scratch_direct_io, r.scratch_fs_bytes),
        r.drop_caches,
        r.load_before,
        r.load_after,
        r.cpus
    );
    let secs = |x: &Summary| format!("{:.2} [{:.2}..{:.2}]", x.median, x.min, x.max);
    let mibs = |x: &Summary| {
        format!(
            "{:.1} [{:.1}..{:.1}]",
            x.median / 1048576.0,
            x.min / 1048576.0,
            x.max / 1048576.0
        )
    };
    s += &format!(
        "{:<14} {:>30} {:>8} {:>8} {:>34} {:>13}\n",
        "arm",
        "ready s: median [min..max]",
        "cpu s",
        "sync s",
        "written MiB: median [min..max]",
        "written/repo"
    );
    for a in &r.summaries {
        s += &format!(
            "{:<14} {:>30} {:>8.2} {:>8.2} {:>34} {:>12.3}x\n",
            a.arm.label(),
            secs(&a.time_to_ready_s),
            a.cpu_s.median,
            a.sync_s.median,
            mibs(&a.written_bytes),
            a.written_over_repo.median
        );
    }
    s += &format!(
        "\noscontent / pull-and-extract: time {:.3}x, bytes written {:.3}x\n",
        r.time_ratio, r.bytes_ratio
    );
    s += &breakdown(r);
    for t in &r.targets {
        s += &format!(
            "{}  {:<50} {:.3}x (target <= {:.2}x)\n",
            if t.pass { "PASS" } else { "MISS" },
            t.name,
            t.value,
            t.limit
        );
    }
    s
}

/// Where each arm's time and bytes went (medians over its trials).
fn breakdown(r: &Report) -> String {
    let mut s = String::new();
    // Where oscontent's time and bytes went (medians over its trials).
    let osc: Vec<&Trial> = r
        .trials
        .iter()
        .filter(|t| t.arm == Arm::Oscontent)
        .collect();
    let med = |f: &dyn Fn(&Trial) -> Option<f64>| {
        let v: Vec<f64> = osc.iter().filter_map(|t| f(t)).collect();
        Summary::of(&v).median
    };
    let phase = |name: &'static str| med(&|t: &Trial| t.phases.get(name).copied());
    s += &format!(
        "oscontent phases (median s since spawn): listening {:.2}, staged {:.2}, published {:.2}, ready {:.2}\n",
        phase("listening"),
        phase("staged"),
        phase("published"),
        phase("ready")
    );
    s += &format!(
        "oscontent on disk (median): {} files, apparent {}, allocated {}; device writes {}, flushes {}\n",
        med(&|t| Some(t.usage.files as f64)),
        mib(med(&|t| Some(t.usage.apparent_bytes as f64))),
        mib(med(&|t| Some(t.usage.allocated_bytes as f64))),
        med(&|t| Some(t.device.writes as f64)),
        med(&|t| Some(t.device.flushes as f64)),
    );
    s += &format!(
        "oscontent bytes written / repo rounded up to {} B blocks ({}, the floor for one file per object): {:.3}x; / its allocated size on the scratch fs: {:.3}x\n",
        r.block_size,
        mib(r.repo_rounded_bytes as f64),
        r.oscontent_written_over_rounded,
        r.oscontent_written_over_allocated,
    );
    let anchor: Vec<&Trial> = r
        .trials
        .iter()
        .filter(|t| t.arm == Arm::PullExtract)
        .collect();
    let amed = |f: &dyn Fn(&Trial) -> Option<f64>| {
        let v: Vec<f64> = anchor.iter().filter_map(|t| f(t)).collect();
        Summary::of(&v).median
    };
    s += &format!(
        "pull-and-extract (median): copy {:.2}s + unpack {:.2}s; on disk apparent {}, allocated {}\n\n",
        amed(&|t| t.phases.get("copy").copied()),
        amed(&|t| t.phases.get("unpack").copied()),
        mib(amed(&|t| Some(t.usage.apparent_bytes as f64))),
        mib(amed(&|t| Some(t.usage.allocated_bytes as f64))),
    );
    s
}
