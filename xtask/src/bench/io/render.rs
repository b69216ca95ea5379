//! What a `bench io` run shows: the table on stdout (also rendered from a
//! saved report) and the SVG chart of each update.

use super::arms::Arm;
use super::chart;
use super::neighbour::NeighbourLog;
use super::results::ArmJudgement;
use super::results::{ArmSummary, Calibration, Report, Trial, UpdateReport};
use crate::bench::{mib, report, Summary};
use std::path::{Path, PathBuf};

/// The human-readable table.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    s += &format!(
        "\nbench io: {} fixture, {} target repo, {} run(s) (+{} solo) per arm, warm-up {:.0}s, git {}\n",
        r.scale,
        r.repo_mode.as_str(),
        r.runs,
        r.solo_runs,
        r.warmup_s,
        r.git.as_deref().unwrap_or("?")
    );
    s += &format!(
        "{}; load {:.2} -> {:.2} on {} CPUs; kernel {}\n",
        report::scratch_line(r.scratch_direct_io, r.scratch_fs_bytes),
        r.load_before,
        r.load_after,
        r.cpus,
        r.kernel
    );
    s += &format!("neighbour: {}\n", r.neighbour);
    if let Some(c) = &r.calibration {
        s += &calibration(c);
    }
    for u in &r.updates {
        s += &update_header(u);
        s += &latency_table(&u.summaries);
        s += &judged_table(&u.judgements);
        s += &twins_table(&u.judgements);
        s += &cost_table(&u.summaries);
        s += &burner_line(&u.trials);
        s += &etcd_table(&u.summaries);
        s += "\n";
        for t in &u.targets {
            s += &format!(
                "{:<12} {:<5} {:<90} {} (target {} {:.2})\n",
                t.verdict,
                t.update,
                t.name,
                num(t.value, 3),
                t.rule,
                t.limit
            );
        }
        if let Some(c) = &u.chart {
            s += &format!("chart: {}\n", c.display());
        }
    }
    s += &format!("logs: {}\n", r.logs.display());
    s
}

/// fio against the built-in neighbour, each alone.
fn calibration(c: &Calibration) -> String {
    format!(
        "calibration ({}s alone): fio p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.1} ms, {:.0} IOPS | built-in p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.1} ms, {:.0} IOPS\n",
        c.seconds,
        c.fio.p50_ms,
        c.fio.p99_ms,
        c.fio.p999_ms,
        c.fio.max_ms,
        c.fio.iops,
        c.builtin.p50_ms,
        c.builtin.p99_ms,
        c.builtin.p999_ms,
        c.builtin.max_ms,
        c.builtin.iops
    )
}

/// The update's line: its v2, the new objects, the baseline's bytes per op.
fn update_header(u: &UpdateReport) -> String {
    let med = |x: &Summary| x.median;
    let pulling = u.summaries.iter().find(|x| x.arm != "baseline");
    format!(
        "\n== {} update (v2 {}), new objects (median): {:.0}, apparent {}, allocated {}; baseline {:.0} device bytes per neighbour op\n",
        u.update,
        &u.v2_commit.get(..12).unwrap_or(""),
        u.summaries
            .iter()
            .find(|x| x.arm == "ostree")
            .or(pulling)
            .map_or(f64::NAN, |x| med(&x.new_objects)),
        mib(pulling.map_or(f64::NAN, |x| med(&x.new_apparent_bytes))),
        mib(pulling.map_or(f64::NAN, |x| med(&x.new_allocated_bytes))),
        u.baseline_bytes_per_op
    )
}

/// The neighbour's latency ratios, arm by arm.
fn latency_table(summaries: &[ArmSummary]) -> String {
    let mut s = String::from("neighbour fdatasync in the update window, as ratios to the baseline's same-length window (median [min..max] over trials)\n");
    s += &format!(
        "{:<26} {:>3} {:>18} {:>18} {:>18} {:>18} {:>8} {:>9} {:>9}\n",
        "arm", "n", "p50 x", "p99 x", "p99.9 x", "max x", "IOPS x", "p99 ms", "max ms"
    );
    let cell = |x: &Summary| {
        if x.n == 0 || !x.median.is_finite() {
            "-".to_owned()
        } else {
            format!("{:.2} [{:.2}..{:.2}]", x.median, x.min, x.max)
        }
    };
    for a in summaries {
        s += &format!(
            "{:<26} {:>3} {:>18} {:>18} {:>18} {:>18} {:>8.2} {:>9.2} {:>9.1}\n",
            a.arm,
            a.trials,
            cell(&a.p50_ratio),
            cell(&a.p99_ratio),
            cell(&a.p999_ratio),
            cell(&a.max_ratio),
            a.iops_ratio.median,
            a.p99_ms.median,
            a.max_ms.median
        );
    }
    s
}

/// Ratios of medians with their intervals, and the time-weighted view.
fn judged_table(judged: &[ArmJudgement]) -> String {
    let mut s = String::from("\nratios of medians to the CPU-matched baseline [95% bootstrap interval]; the window by the clock: share stalled (an fdatasync in flight > 10/50/100 ms), fewest ops in a 100 ms slice, expected latency at a random instant\n");
    s += &format!(
        "{:<26} {:>3} {:>20} {:>20} {:>20} {:>7} {:>7} {:>7} {:>8} {:>9}\n",
        "arm", "n", "p99 x", "max x", "E[lat] x", ">10ms", ">50ms", ">100ms", "min/100", "stall/os"
    );
    let pct = |x: &Summary| format!("{:.1}%", x.median * 100.0);
    for j in judged {
        s += &format!(
            "{:<26} {:>3} {:>20} {:>20} {:>20} {:>7} {:>7} {:>7} {:>8.0} {:>9.2}\n",
            j.arm,
            j.trials,
            j.p99.show(),
            j.max.show(),
            j.expected.show(),
            pct(&j.stall_share[0]),
            pct(&j.stall_share[1]),
            pct(&j.stall_share[2]),
            j.min_ops_per_slice.median,
            j.stall_vs_ostree
        );
    }
    s
}

/// Each arm over its in-RAM twin, when the run has both.
fn twins_table(judged: &[ArmJudgement]) -> String {
    let rows = super::judge::over_twins(judged);
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from("\nover its in-RAM twin (the arm's ratio of medians over its twin's): what its disk writes add to the harm of its CPU\n");
    s += &format!(
        "{:<26} {:>9} {:>9} {:>9}\n",
        "arm", "p99 x", "max x", "E[lat] x"
    );
    for r in rows {
        s += &format!(
            "{:<26} {:>9.2} {:>9.2} {:>9.2}\n",
            r.arm, r.p99, r.max, r.expected
        );
    }
    s
}

/// Time, sync, CPU and device bytes of the pulling arms.
fn cost_table(summaries: &[ArmSummary]) -> String {
    let mut s = String::from("\nupdate cost (medians; bytes are device bytes from the window's start to the end of the post-pull sync)\n");
    s += &format!(
        "{:<26} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
        "arm",
        "update s",
        "x ostree",
        "sync s",
        "cpu s",
        "srv cpu",
        "w/alloc",
        "w/alloc",
        "w/alloc",
        "w/appar",
        "solo s",
        "solo syn",
        "p99x+sync"
    );
    s += &format!(
        "{:<26} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
        "", "", "", "", "", "", "raw", "corr.", "solo", "solo", "", "", ""
    );
    for a in summaries.iter().filter(|a| a.arm != "baseline") {
        s += &format!(
            "{:<26} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
            a.arm,
            num(a.update_s.median, 2),
            num(a.time_vs_ostree, 3),
            num(a.sync_s.median, 2),
            num(a.cpu_s.median, 1),
            num(a.server_cpu_s.median, 1),
            num(a.written_over_allocated_raw.median, 3),
            num(a.written_over_allocated_corrected.median, 3),
            num(a.written_over_allocated_solo.median, 3),
            num(a.written_over_apparent_solo.median, 3),
            num(a.update_s_solo.median, 2),
            num(a.sync_s_solo.median, 2),
            num(a.p99_ratio_with_sync.median, 2),
        );
    }
    s
}

/// What the baseline's burner ran, trial by trial (it follows the pulls
/// measured before it).
fn burner_line(trials: &[Trial]) -> String {
    let loads: Vec<String> = trials
        .iter()
        .filter_map(|t| t.baseline_load)
        .map(|l| format!("{:.2}+{:.2}", l.cpu_per_s, l.server_cpu_per_s))
        .collect();
    let nice = trials
        .iter()
        .find_map(|t| t.baseline_load)
        .map_or(0, |l| l.nice);
    if loads.is_empty() {
        return String::new();
    }
    format!(
        "baseline burner, CPU/s client (nice {nice}) + server (nice {}), by trial: {}\n",
        super::repo::SERVER_NICE,
        loads.join(", ")
    )
}

/// The etcd neighbour's figures (`--etcd`), or nothing.
fn etcd_table(summaries: &[ArmSummary]) -> String {
    let mut s = String::new();
    if summaries.iter().any(|a| a.etcd_put_p99_ratio.n > 0) {
        s += "\netcd neighbour (--etcd): put latency ratios to baseline, and etcd's wal fsync p99 (bucket bound)\n";
        for a in summaries {
            s += &format!(
                "{:<26} put p99 x{:>6}  put max x{:>6}  wal_fsync p99 <= {:>6} ms\n",
                a.arm,
                num(a.etcd_put_p99_ratio.median, 2),
                num(a.etcd_put_max_ratio.median, 2),
                num(a.etcd_wal_fsync_p99_le_ms.median, 1)
            );
        }
    }
    s
}

/// `x` with `p` decimals, or `-` when it is not a number.
fn num(x: f64, p: usize) -> String {
    if x.is_finite() {
        format!("{x:.p$}")
    } else {
        "-".to_owned()
    }
}

/// One panel per arm: its trial with the median p99 ratio (the baseline's
/// first trial), the window shaded, the baseline's p99 and max drawn.
pub(super) fn chart(
    update: &str,
    trials: &[(Trial, NeighbourLog)],
    arms: &[Arm],
    logs: &Path,
) -> Option<PathBuf> {
    let mut panels = Vec::new();
    let mut mode_i = 0;
    for arm in arms {
        let name = arm.name();
        let mut mine: Vec<&(Trial, NeighbourLog)> = trials
            .iter()
            .filter(|(t, _)| t.arm == name && !t.solo)
            .collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by(|a, b| {
            let k = |x: &(Trial, NeighbourLog)| x.0.ratios.map_or(f64::NAN, |r| r.p99);
            k(a).total_cmp(&k(b))
        });
        let (t, l) = mine[mine.len() / 2];
        let n = t.neighbour.unwrap_or_default();
        let title = match arm {
            Arm::Baseline => format!(
                "baseline (run {}): p99 {:.2} ms, max {:.1} ms, {:.0} IOPS over the shaded {:.1}s window",
                t.run + 1,
                n.p99_ms,
                n.max_ms,
                n.iops,
                n.seconds
            ),
            _ => {
                let r = t.ratios.unwrap_or_default();
                format!(
                    "{name} (run {}): update {:.1}s + sync {:.2}s; p99 {:.2} ms (x{:.2}), max {:.1} ms (x{:.2}), IOPS x{:.2}",
                    t.run + 1,
                    t.update_s,
                    t.sync_s,
                    n.p99_ms,
                    r.p99,
                    n.max_ms,
                    r.max,
                    r.iops
                )
            }
        };
        let mut references = Vec::new();
        if let Some(r) = t.reference.filter(|_| *arm != Arm::Baseline) {
            references.push((format!("baseline p99 {:.2} ms", r.p99_ms), r.p99_ms));
            references.push((format!("baseline max {:.1} ms", r.max_ms), r.max_ms));
        }
        if matches!(arm, Arm::Oscontent(_)) {
            mode_i += 1;
        }
        panels.push(chart::Panel {
            title,
            points: l
                .ops
                .iter()
                .map(|o| (o.end_ns() as f64 / 1e9, f64::from(o.sync_ns) / 1e6))
                .collect(),
            window: (t.window_start_s, t.window_end_s.max(t.window_start_s)),
            sync: (*arm != Arm::Baseline).then_some((t.window_end_s, t.sync_end_s)),
            references,
            color: arm.color(mode_i),
        });
    }
    if panels.is_empty() {
        return None;
    }
    let path = logs.join(format!("io-{}.svg", update.trim_end_matches('%')));
    let title = format!(
        "bench io, {update} update: neighbour fdatasync latency (blue: update window, orange: post-pull sync)"
    );
    match chart::draw(&path, &title, &panels) {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("xtask: WARNING: no chart: {e:#}");
            None
        }
    }
}
