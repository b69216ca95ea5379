//! From an update's trials to its report: the neighbour's figures as
//! ratios to the baseline, the device bytes corrected for the neighbour's
//! own writes, per-arm summaries and the targets.

use super::arms::Arm;
use super::neighbour::{NeighbourLog, Op};
use super::results::{ArmSummary, Target, Trial, UpdateReport};
use super::stats::{self, Ratios, WindowStats};
use super::trial::window_ns;
use super::{render, BYTES_TARGET, MAX_TARGET, P99_TARGET, TIME_TARGET};
use crate::bench::Summary;
use std::path::{Path, PathBuf};

/// Ratios against the baseline, corrected bytes, summaries, targets, chart.
pub(super) fn analyse(
    u: super::Update,
    mut trials: Vec<(Trial, NeighbourLog)>,
    arms: &[Arm],
    default_mode: Option<&str>,
    logs: &Path,
) -> UpdateReport {
    let per_op = baseline_bytes_per_op(&trials);
    let sync_ratios = neighbour_ratios(&mut trials, per_op);
    etcd_ratios(&mut trials);
    let ostree_time = Summary::of(
        &trials
            .iter()
            .filter(|(t, _)| t.arm == "ostree" && !t.solo)
            .map(|(t, _)| t.update_s)
            .collect::<Vec<_>>(),
    )
    .median;
    let summaries = arms
        .iter()
        .map(|arm| arm_summary(arm, &trials, &sync_ratios, ostree_time))
        .collect::<Vec<_>>();
    let update = u.label();
    let judgements = super::judge::judge(&trials, arms);
    let mut targets = targets(&update, &summaries, default_mode);
    targets.extend(super::judge::targets(&update, &judgements, default_mode));
    let chart = render::chart(&update, &trials, arms, logs);
    UpdateReport {
        share: u.share,
        update: update.clone(),
        fixture: PathBuf::new(),
        v1_commit: String::new(),
        v2_commit: String::new(),
        v2_repo_bytes: 0,
        template: PathBuf::new(),
        template_objects: 0,
        server_url: String::new(),
        baseline_bytes_per_op: per_op,
        trials: trials.into_iter().map(|(t, _)| t).collect(),
        summaries,
        judgements,
        targets,
        chart,
    }
}

/// The baseline trials' windows: (their ops, the window's start in ns,
/// its length in seconds), what [`stats::baseline_reference`] cuts from.
fn baseline_windows<'a>(
    trials: &'a [(Trial, NeighbourLog)],
    ops: impl Fn(&'a NeighbourLog) -> &'a [Op],
    keep: impl Fn(&Trial) -> bool,
) -> Vec<(&'a [Op], u64, f64)> {
    trials
        .iter()
        .filter(|(t, _)| t.arm == "baseline" && keep(t))
        .map(|(t, l)| (ops(l), window_ns(t).0, t.window_end_s - t.window_start_s))
        .collect()
}

/// Device bytes per neighbour op, from the baseline windows (which hold
/// nothing but the neighbour).
fn baseline_bytes_per_op(trials: &[(Trial, NeighbourLog)]) -> f64 {
    Summary::of(
        &trials
            .iter()
            .filter(|(t, _)| t.arm == "baseline")
            .map(|(t, l)| {
                let n = l
                    .ops
                    .iter()
                    .filter(|o| {
                        let e = o.end_ns() as f64 / 1e9;
                        e >= t.window_start_s && e < t.sync_end_s
                    })
                    .count();
                t.written_bytes as f64 / n.max(1) as f64
            })
            .collect::<Vec<_>>(),
    )
    .median
}

/// The neighbour over each trial's window (and window plus sync), its
/// baseline reference and ratios, and the neighbour-corrected bytes, set
/// on the trials. Returns the window-plus-sync ratios, trial by trial.
fn neighbour_ratios(trials: &mut [(Trial, NeighbourLog)], per_op: f64) -> Vec<Option<Ratios>> {
    let baselines = baseline_windows(trials, |l| l.ops.as_slice(), |_| true);
    let mut computed = Vec::new();
    for (t, l) in trials.iter() {
        if t.solo {
            computed.push((None, None, None, None, None));
            continue;
        }
        let (a, b) = window_ns(t);
        let sync_end = (t.sync_end_s * 1e9) as u64;
        let w = stats::window(&l.ops, a, b);
        let ws = stats::window(&l.ops, a, sync_end);
        let reference = stats::baseline_reference(&baselines, w.seconds);
        let ratios = reference.as_ref().map(|r| Ratios::of(&w, r));
        let ref_sync = stats::baseline_reference(&baselines, ws.seconds);
        let ratios_sync = ref_sync.as_ref().map(|r| Ratios::of(&ws, r));
        let corrected = (t.arm != "baseline" && per_op.is_finite())
            .then(|| (t.written_bytes as f64 - ws.ops as f64 * per_op).max(0.0) as u64);
        computed.push((Some((w, ws)), reference, ratios, ratios_sync, corrected));
    }
    let mut sync_ratios: Vec<Option<Ratios>> = Vec::new();
    for ((t, _), (w, reference, ratios, rs, corrected)) in trials.iter_mut().zip(computed) {
        if let Some((w, ws)) = w {
            t.neighbour = Some(w);
            t.neighbour_with_sync = Some(ws);
        }
        t.reference = reference;
        t.ratios = ratios;
        t.written_bytes_corrected = corrected;
        sync_ratios.push(rs);
    }
    sync_ratios
}

/// The etcd neighbour's put latencies over each window and their ratios
/// to the baseline's, set on the trials that ran it.
fn etcd_ratios(trials: &mut [(Trial, NeighbourLog)]) {
    let etcd_baselines = baseline_windows(trials, |l| l.etcd_ops.as_slice(), |t| t.etcd.is_some());
    let etcd_computed: Vec<Option<(WindowStats, Option<WindowStats>)>> = trials
        .iter()
        .map(|(t, l)| {
            t.etcd.as_ref()?;
            let (a, b) = window_ns(t);
            let w = stats::window(&l.etcd_ops, a, b);
            Some((w, stats::baseline_reference(&etcd_baselines, w.seconds)))
        })
        .collect();
    for ((t, _), c) in trials.iter_mut().zip(etcd_computed) {
        if let (Some(e), Some((w, reference))) = (t.etcd.as_mut(), c) {
            e.puts = w;
            e.ratios = reference.as_ref().map(|r| Ratios::of(&w, r));
            e.reference = reference;
        }
    }
}

/// One arm's medians and ranges over its trials with the neighbour (and,
/// for bytes and times, its solo trials); time against stock ostree's
/// median `ostree_time`.
fn arm_summary(
    arm: &Arm,
    trials: &[(Trial, NeighbourLog)],
    sync_ratios: &[Option<Ratios>],
    ostree_time: f64,
) -> ArmSummary {
    let name = arm.name();
    let pick = |solo: bool| {
        trials
            .iter()
            .zip(sync_ratios)
            .filter(|((t, _), _)| t.arm == name && t.solo == solo)
            .map(|((t, _), rs)| (t, rs))
            .collect::<Vec<_>>()
    };
    let with = pick(false);
    let solo = pick(true);
    let of = |v: &[(&Trial, &Option<Ratios>)], f: &dyn Fn(&Trial, &Option<Ratios>) -> f64| {
        Summary::of(&v.iter().map(|(t, r)| f(t, r)).collect::<Vec<_>>())
    };
    let r = |f: fn(&Ratios) -> f64| {
        move |t: &Trial, _: &Option<Ratios>| t.ratios.as_ref().map_or(f64::NAN, f)
    };
    let rs =
        |f: fn(&Ratios) -> f64| move |_: &Trial, s: &Option<Ratios>| s.as_ref().map_or(f64::NAN, f);
    let pulling = *arm != Arm::Baseline;
    // A twin's writes went to RAM: the device's bytes are not its own.
    let on_device = pulling && !arm.in_ram();
    let over = |bytes: f64, t: &Trial| {
        if on_device {
            bytes / t.new_objects.allocated_bytes as f64
        } else {
            f64::NAN
        }
    };
    let update_s = of(&with, &|t, _| if pulling { t.update_s } else { f64::NAN });
    ArmSummary {
        arm: name.clone(),
        trials: with.len(),
        solo_trials: solo.len(),
        p50_ratio: of(&with, &r(|x| x.p50)),
        p99_ratio: of(&with, &r(|x| x.p99)),
        p999_ratio: of(&with, &r(|x| x.p999)),
        max_ratio: of(&with, &r(|x| x.max)),
        iops_ratio: of(&with, &r(|x| x.iops)),
        p99_ms: of(&with, &|t, _| t.neighbour.map_or(f64::NAN, |n| n.p99_ms)),
        max_ms: of(&with, &|t, _| t.neighbour.map_or(f64::NAN, |n| n.max_ms)),
        p99_ratio_with_sync: of(&with, &rs(|x| x.p99)),
        max_ratio_with_sync: of(&with, &rs(|x| x.max)),
        time_vs_ostree: update_s.median / ostree_time,
        update_s,
        sync_s: of(&with, &|t, _| t.sync_s),
        cpu_s: of(&with, &|t, _| if pulling { t.cpu_s } else { f64::NAN }),
        server_cpu_s: of(&with, &|t, _| {
            if pulling {
                t.server_cpu_s
            } else {
                f64::NAN
            }
        }),
        new_objects: of(&with, &|t, _| t.new_objects.count as f64),
        new_apparent_bytes: of(&with, &|t, _| t.new_objects.apparent_bytes as f64),
        new_allocated_bytes: of(&with, &|t, _| t.new_objects.allocated_bytes as f64),
        written_over_allocated_raw: of(&with, &|t, _| over(t.written_bytes as f64, t)),
        written_over_allocated_corrected: of(&with, &|t, _| {
            t.written_bytes_corrected
                .map_or(f64::NAN, |b| over(b as f64, t))
        }),
        written_over_allocated_solo: of(&solo, &|t, _| over(t.written_bytes as f64, t)),
        written_over_apparent_solo: of(&solo, &|t, _| {
            t.written_bytes as f64 / t.new_objects.apparent_bytes as f64
        }),
        update_s_solo: of(&solo, &|t, _| t.update_s),
        sync_s_solo: of(&solo, &|t, _| t.sync_s),
        etcd_put_p99_ratio: of(&with, &|t, _| {
            t.etcd
                .as_ref()
                .and_then(|e| e.ratios)
                .map_or(f64::NAN, |r| r.p99)
        }),
        etcd_put_max_ratio: of(&with, &|t, _| {
            t.etcd
                .as_ref()
                .and_then(|e| e.ratios)
                .map_or(f64::NAN, |r| r.max)
        }),
        etcd_wal_fsync_p99_le_ms: of(&with, &|t, _| {
            t.etcd
                .as_ref()
                .map_or(f64::NAN, |e| e.server.wal_fsync_p99_le_ms)
        }),
    }
}

/// The targets for the default io-mode's arm.
fn targets(update: &str, summaries: &[ArmSummary], default_mode: Option<&str>) -> Vec<Target> {
    let arm = default_mode.map(|m| format!("oscontent:{m}"));
    let s = arm
        .as_ref()
        .and_then(|a| summaries.iter().find(|s| &s.arm == a && s.trials > 0));
    let bytes = |s: &ArmSummary| {
        if s.written_over_allocated_solo.n > 0 {
            s.written_over_allocated_solo.median
        } else {
            s.written_over_allocated_corrected.median
        }
    };
    let arm_label = arm
        .clone()
        .unwrap_or_else(|| "oscontent (default mode)".into());
    let rows: [(String, Option<f64>, f64); 4] = [
        (
            format!("{arm_label}: neighbour fdatasync p99 / baseline"),
            s.map(|s| s.p99_ratio.median),
            P99_TARGET,
        ),
        (
            format!("{arm_label}: neighbour fdatasync max / baseline max"),
            s.map(|s| s.max_ratio.median),
            MAX_TARGET,
        ),
        (
            format!("{arm_label}: update wall time / stock ostree pull"),
            s.map(|s| s.time_vs_ostree),
            TIME_TARGET,
        ),
        (
            format!(
                "{arm_label}: device bytes written / new objects' allocated size{}",
                if s.is_some_and(|s| s.written_over_allocated_solo.n > 0) {
                    " (solo trials)"
                } else {
                    " (neighbour-corrected)"
                }
            ),
            s.map(bytes),
            BYTES_TARGET,
        ),
    ];
    rows.into_iter()
        .map(|(name, value, limit)| Target::at_most(update, name, value.unwrap_or(f64::NAN), limit))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_need_the_default_arm() {
        let t = targets("30%", &[], Some("paced"));
        assert_eq!(t.len(), 4);
        assert!(t.iter().all(|t| t.verdict == "NOT RUN"));
    }
}
