//! Latency statistics over a time window of the neighbour's operations:
//! pure functions, no I/O, so they are tested on hand-made samples.

use super::neighbour::Op;
use super::timeweighted::{self, TimeWeighted};

/// What the neighbour saw in one window: its fdatasync latencies (the
/// figure etcd's `wal_fsync_duration` reports) and its rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct WindowStats {
    /// Window length in seconds.
    pub seconds: f64,
    /// Operations (write + fdatasync) that completed inside the window.
    pub ops: usize,
    /// `ops / seconds`.
    pub iops: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
    /// The slowest write(2) (not fdatasync) in the window: large values
    /// mean the neighbour was throttled in the page cache (dirty limits)
    /// rather than at the device.
    pub write_max_ms: f64,
    /// The window by the clock, not by the ops (see [`timeweighted`]).
    pub time_weighted: TimeWeighted,
}

/// The statistics of the ops that complete within `[from_ns, to_ns)`
/// (nanoseconds on the neighbour's clock). NaN latencies if none did.
pub fn window(ops: &[Op], from_ns: u64, to_ns: u64) -> WindowStats {
    let seconds = to_ns.saturating_sub(from_ns) as f64 / 1e9;
    let inside: Vec<&Op> = ops
        .iter()
        .filter(|o| (from_ns..to_ns).contains(&o.end_ns()))
        .collect();
    let mut sync: Vec<u32> = inside.iter().map(|o| o.sync_ns).collect();
    sync.sort_unstable();
    let ms = |ns: Option<u32>| ns.map_or(f64::NAN, |v| f64::from(v) / 1e6);
    let mean = if sync.is_empty() {
        f64::NAN
    } else {
        sync.iter().map(|&v| f64::from(v)).sum::<f64>() / sync.len() as f64 / 1e6
    };
    WindowStats {
        seconds,
        ops: sync.len(),
        iops: if seconds > 0.0 {
            sync.len() as f64 / seconds
        } else {
            f64::NAN
        },
        p50_ms: ms(percentile(&sync, 0.50)),
        p99_ms: ms(percentile(&sync, 0.99)),
        p999_ms: ms(percentile(&sync, 0.999)),
        max_ms: ms(sync.last().copied()),
        mean_ms: mean,
        write_max_ms: ms(inside.iter().map(|o| o.write_ns).max()),
        time_weighted: timeweighted::time_weighted(ops, from_ns, to_ns),
    }
}

/// Nearest-rank percentile of an ascending sample: the smallest value
/// with at least `q` of the sample at or below it.
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Each statistic of `trial` divided by the same statistic of `base`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Ratios {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub iops: f64,
    /// Of the expected latency of an op issued at a random instant.
    pub expected: f64,
}

impl Ratios {
    pub fn of(trial: &WindowStats, base: &WindowStats) -> Ratios {
        Ratios {
            p50: trial.p50_ms / base.p50_ms,
            p99: trial.p99_ms / base.p99_ms,
            p999: trial.p999_ms / base.p999_ms,
            max: trial.max_ms / base.max_ms,
            iops: trial.iops / base.iops,
            expected: trial.time_weighted.expected_ms / base.time_weighted.expected_ms,
        }
    }
}

/// The reference for a window of `seconds`: each statistic is the median,
/// over the baseline trials, of that statistic in the baseline's window
/// of the same length starting where the baseline's window did (after the
/// same warm-up). Medians per statistic, not pooled samples, so that a max
/// compares with a typical max of one window, not the max of several.
/// Each baseline is `(ops, window start ns, window length in seconds)`; a baseline
/// shorter than `seconds` contributes its whole window (and the result's
/// `seconds` says how long the reference windows really were, at least).
pub fn baseline_reference(baselines: &[(&[Op], u64, f64)], seconds: f64) -> Option<WindowStats> {
    if baselines.is_empty() {
        return None;
    }
    let w: Vec<WindowStats> = baselines
        .iter()
        .map(|(ops, from, len)| {
            let to = from + (seconds.min(*len) * 1e9) as u64;
            window(ops, *from, to)
        })
        .collect();
    let shortest = w.iter().map(|s| s.seconds).fold(f64::INFINITY, f64::min);
    let med = |f: fn(&WindowStats) -> f64| {
        crate::bench::Summary::of(&w.iter().map(f).collect::<Vec<_>>()).median
    };
    Some(WindowStats {
        seconds: shortest,
        ops: med(|s| s.ops as f64).round() as usize,
        iops: med(|s| s.iops),
        p50_ms: med(|s| s.p50_ms),
        p99_ms: med(|s| s.p99_ms),
        p999_ms: med(|s| s.p999_ms),
        max_ms: med(|s| s.max_ms),
        mean_ms: med(|s| s.mean_ms),
        write_max_ms: med(|s| s.write_max_ms),
        time_weighted: TimeWeighted {
            stall_share: [0, 1, 2].map(|i| {
                crate::bench::Summary::of(
                    &w.iter()
                        .map(|s| s.time_weighted.stall_share[i])
                        .collect::<Vec<_>>(),
                )
                .median
            }),
            min_ops_per_slice: med(|s| s.time_weighted.min_ops_per_slice),
            expected_ms: med(|s| s.time_weighted.expected_ms),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(start_ms: u64, sync_ms: u32) -> Op {
        Op {
            start_ns: start_ms * 1_000_000,
            write_ns: 0,
            sync_ns: sync_ms * 1_000_000,
        }
    }

    #[test]
    fn percentiles() {
        let cases: &[(&[u32], f64, Option<u32>)] = &[
            (&[], 0.5, None),
            (&[7], 0.5, Some(7)),
            (&[7], 0.999, Some(7)),
            (&[1, 2, 3, 4], 0.5, Some(2)),
            (&[1, 2, 3, 4], 0.75, Some(3)),
            (&[1, 2, 3, 4], 0.99, Some(4)),
            (&[1, 2, 3, 4], 0.0, Some(1)),
        ];
        for (sample, q, want) in cases {
            assert_eq!(percentile(sample, *q), *want, "{sample:?} q={q}");
        }
        let hundred: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&hundred, 0.99), Some(99));
        assert_eq!(percentile(&hundred, 0.999), Some(100));
    }

    #[test]
    fn window_counts_ops_by_completion() {
        // Ends at 10, 21, 40, 1050 ms.
        let ops = [op(0, 10), op(20, 1), op(30, 10), op(50, 1000)];
        let s = window(&ops, 15_000_000, 1_015_000_000);
        assert_eq!(s.ops, 2); // the one that started at 50 ms ends at 1050
        assert!((s.seconds - 1.0).abs() < 1e-9);
        assert!((s.iops - 2.0).abs() < 1e-9);
        assert_eq!((s.p50_ms, s.max_ms), (1.0, 10.0));
        let all = window(&ops, 0, 2_000_000_000);
        assert_eq!((all.ops, all.max_ms, all.p99_ms), (4, 1000.0, 1000.0));
        let none = window(&ops, 5_000_000_000, 6_000_000_000);
        assert_eq!(none.ops, 0);
        assert!(none.p99_ms.is_nan());
    }

    #[test]
    fn reference_is_median_per_statistic() {
        let a = [op(0, 1), op(10, 2), op(20, 30)];
        let b = [op(0, 1), op(10, 2), op(20, 3)];
        let c = [op(0, 1), op(10, 2), op(20, 5)];
        let r = baseline_reference(&[(&a, 0, 5.0), (&b, 0, 5.0), (&c, 0, 5.0)], 1.0).unwrap();
        assert_eq!(r.max_ms, 5.0);
        assert_eq!(r.p50_ms, 2.0);
        assert_eq!(r.seconds, 1.0);
        // The window is cut at the same length as the trial's.
        let short = baseline_reference(&[(&a, 0, 5.0)], 0.015).unwrap();
        assert_eq!((short.ops, short.max_ms), (2, 2.0));
        // ...or at the baseline's own end, if that comes first.
        let capped = baseline_reference(&[(&a, 0, 0.015)], 1.0).unwrap();
        assert_eq!((capped.ops, capped.seconds), (2, 0.015));
        assert!(baseline_reference(&[], 1.0).is_none());
        // A later window start shifts the reference window.
        let later = baseline_reference(&[(&a, 11_000_000, 5.0)], 0.01).unwrap();
        assert_eq!((later.ops, later.max_ms), (1, 2.0));
        let t = WindowStats {
            p99_ms: 10.0,
            max_ms: 20.0,
            iops: 1.0,
            ..r
        };
        let ratio = Ratios::of(&t, &r);
        assert_eq!((ratio.max, ratio.p50), (4.0, 1.0));
    }
}
