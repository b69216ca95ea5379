//! Whether an update's trials can tell harm from noise, arm by arm: the
//! neighbour's p99, max and expected latency at a random instant as
//! ratios of medians against the CPU-matched baseline, each with a
//! bootstrap interval; the time-weighted stall shares; and the targets
//! that need them (stalls halved against stock `ostree pull`, and stock
//! `ostree pull` visibly harmful, without which no "pass" means anything).

use super::arms::{Arm, RAM_SUFFIX};
use super::bootstrap;
use super::neighbour::NeighbourLog;
use super::results::{ArmJudgement, Target, Trial};
use super::stats::{self, WindowStats};
use super::trial::window_ns;
use super::{MAX_TARGET, P99_TARGET};
use crate::bench::Summary;

/// Target: the default arm's share of the window stalled > 10 ms, against
/// stock `ostree pull`'s.
pub const STALL_TARGET: f64 = 0.5;

/// Every arm's judgement.
pub(super) fn judge(trials: &[(Trial, NeighbourLog)], arms: &[Arm]) -> Vec<ArmJudgement> {
    let mut out: Vec<ArmJudgement> = arms.iter().map(|a| arm(trials, &a.name())).collect();
    let ostree = out
        .iter()
        .find(|j| j.arm == "ostree")
        .map_or(f64::NAN, |j| j.stall_share[0].median);
    for j in &mut out {
        j.stall_vs_ostree = j.stall_share[0].median / ostree;
    }
    out
}

fn arm(trials: &[(Trial, NeighbourLog)], name: &str) -> ArmJudgement {
    let with: Vec<&WindowStats> = trials
        .iter()
        .filter(|(t, _)| t.arm == name && !t.solo)
        .filter_map(|(t, _)| t.neighbour.as_ref())
        .collect();
    let len = Summary::of(&with.iter().map(|w| w.seconds).collect::<Vec<_>>()).median;
    // The baselines over windows as long as this arm's (typical) window,
    // after the same warm-up.
    let base: Vec<WindowStats> = trials
        .iter()
        .filter(|(t, _)| t.arm == "baseline" && !t.solo && len.is_finite())
        .map(|(t, l)| {
            let (from, _) = window_ns(t);
            let secs = len.min(t.window_end_s - t.window_start_s);
            stats::window(&l.ops, from, from + (secs * 1e9) as u64)
        })
        .collect();
    let ci = |f: fn(&WindowStats) -> f64| {
        let a: Vec<f64> = with.iter().map(|w| f(w)).collect();
        let b: Vec<f64> = base.iter().map(f).collect();
        bootstrap::ratio_of_medians(&a, &b, bootstrap::RESAMPLES, bootstrap::SEED)
    };
    let of = |f: &dyn Fn(&WindowStats) -> f64| {
        Summary::of(&with.iter().map(|w| f(w)).collect::<Vec<_>>())
    };
    ArmJudgement {
        arm: name.to_owned(),
        trials: with.len(),
        p99: ci(|w| w.p99_ms),
        max: ci(|w| w.max_ms),
        expected: ci(|w| w.time_weighted.expected_ms),
        stall_share: [0, 1, 2].map(|i| of(&|w| w.time_weighted.stall_share[i])),
        min_ops_per_slice: of(&|w| w.time_weighted.min_ops_per_slice),
        stall_vs_ostree: f64::NAN,
    }
}

/// An arm's ratios over its in-RAM twin's: what its disk writes add to
/// the harm its CPU does anyway (both are ratios to the same baseline).
#[derive(Debug, Clone, PartialEq)]
pub struct OverTwin {
    pub arm: String,
    pub p99: f64,
    pub max: f64,
    pub expected: f64,
}

/// Every judged arm whose twin was judged too, in the twins' order.
pub(super) fn over_twins(judged: &[ArmJudgement]) -> Vec<OverTwin> {
    judged
        .iter()
        .filter_map(|twin| {
            let name = twin.arm.strip_suffix(RAM_SUFFIX)?;
            let arm = judged.iter().find(|j| j.arm == name)?;
            Some(OverTwin {
                arm: name.to_owned(),
                p99: arm.p99.median / twin.p99.median,
                max: arm.max.median / twin.max.median,
                expected: arm.expected.median / twin.expected.median,
            })
        })
        .collect()
}

/// The targets judged here: the default arm's stalls against stock's, and
/// whether stock `ostree pull` is clearly harmful in this run (the low
/// end of its p99 or max interval beyond the targets).
pub(super) fn targets(
    update: &str,
    judged: &[ArmJudgement],
    default_mode: Option<&str>,
) -> Vec<Target> {
    let arm = default_mode.map(|m| format!("oscontent:{m}"));
    let ours = judged.iter().find(|j| Some(&j.arm) == arm.as_ref());
    let stock = judged.iter().find(|j| j.arm == "ostree");
    let label = arm.unwrap_or_else(|| "oscontent (default mode)".into());
    let stall = ours.map_or(f64::NAN, |j| j.stall_vs_ostree);
    let harm = stock.map_or(f64::NAN, |s| {
        (s.p99.lo / P99_TARGET).max(s.max.lo / MAX_TARGET)
    });
    vec![
        Target::at_most(
            update,
            format!("{label}: share of the window stalled > 10 ms / stock ostree's"),
            stall,
            STALL_TARGET,
        ),
        Target {
            update: update.to_owned(),
            name: format!(
                "stock ostree pull clearly harmful: max(p99 CI low / {P99_TARGET}, max CI low / {MAX_TARGET})"
            ),
            value: harm,
            limit: 1.0,
            rule: ">",
            verdict: if !harm.is_finite() {
                "NOT RUN"
            } else if harm > 1.0 {
                "PASS"
            } else {
                "CANNOT JUDGE"
            },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::io::bootstrap::Interval;

    fn judged(arm: &str, p99_lo: f64, max_lo: f64, stall: f64) -> ArmJudgement {
        let i = |lo: f64| Interval {
            median: lo,
            lo,
            hi: lo,
        };
        ArmJudgement {
            arm: arm.into(),
            trials: 3,
            p99: i(p99_lo),
            max: i(max_lo),
            expected: Interval::default(),
            stall_share: [Summary::of(&[0.0]); 3],
            min_ops_per_slice: Summary::of(&[]),
            stall_vs_ostree: stall,
        }
    }

    #[test]
    fn an_arm_over_its_twin() {
        let judged = [
            judged("oscontent:paced", 3.5, 2.5, 0.1),
            judged("ostree@ram", 2.0, 1.0, 0.0),
            judged("oscontent:paced@ram", 2.0, 1.0, 0.0),
        ];
        // ostree's twin has no arm beside it in this run.
        let got = over_twins(&judged);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].arm, "oscontent:paced");
        assert_eq!((got[0].p99, got[0].max), (1.75, 2.5));
        assert!(over_twins(&judged[..1]).is_empty());
    }

    #[test]
    fn stock_must_be_harmful_and_ours_half_the_stalls() {
        // (stock p99 CI low, stock max CI low, ours' stall ratio,
        // expected verdicts)
        let cases: &[(f64, f64, f64, [&str; 2])] = &[
            (2.0, 1.0, 0.3, ["PASS", "PASS"]),
            (1.2, 3.5, 0.6, ["MISS", "PASS"]),
            (1.2, 2.0, 0.5, ["PASS", "CANNOT JUDGE"]),
            (f64::NAN, f64::NAN, f64::NAN, ["NOT RUN", "NOT RUN"]),
        ];
        for &(p99, max, stall, want) in cases {
            let j = [
                judged("ostree", p99, max, 1.0),
                judged("oscontent:paced", 1.0, 1.0, stall),
            ];
            let t = targets("5%", &j, Some("paced"));
            let got: Vec<&str> = t.iter().map(|t| t.verdict).collect();
            assert_eq!(got, want, "{p99} {max} {stall}");
        }
    }
}
