//! The neighbour's window seen by the clock rather than by its ops: what
//! a closed-loop neighbour's per-op percentiles hide. During a 200 ms
//! stall it completes one op, so p99 over ops barely moves (coordinated
//! omission); the share of the window spent stalled, the emptiest 100 ms
//! slice, and the latency an op issued at a uniformly random instant
//! would see all grow with the stall's length. Pure: ops in, figures out.

use super::neighbour::Op;

/// Stall thresholds, ms: an fdatasync in flight longer than this is a
/// stall from that point on.
pub const STALL_MS: [u64; 3] = [10, 50, 100];
/// Slice length for [`TimeWeighted::min_ops_per_slice`].
pub const SLICE_NS: u64 = 100_000_000;

/// Time-weighted figures of one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TimeWeighted {
    /// Share of the window (0..=1) during which an fdatasync had been in
    /// flight longer than 10, 50 and 100 ms.
    pub stall_share: [f64; 3],
    /// The fewest ops completed in any whole 100 ms slice of the window
    /// (NaN if the window is shorter than a slice).
    pub min_ops_per_slice: f64,
    /// The expected latency, ms, of an op issued at a uniformly random
    /// instant of the window: it waits for the op in flight to finish,
    /// then takes as long as the next op did.
    pub expected_ms: f64,
}

/// The time-weighted figures of `ops` (ascending start, one at a time, as
/// a closed loop issues them) over `[from_ns, to_ns)`.
pub fn time_weighted(ops: &[Op], from_ns: u64, to_ns: u64) -> TimeWeighted {
    let len = to_ns.saturating_sub(from_ns);
    if len == 0 {
        return TimeWeighted {
            stall_share: [f64::NAN; 3],
            min_ops_per_slice: f64::NAN,
            expected_ms: f64::NAN,
        };
    }
    let clip = |a: u64, b: u64| b.min(to_ns).saturating_sub(a.max(from_ns));
    let mut stall_share = [0.0; 3];
    for (share, ms) in stall_share.iter_mut().zip(STALL_MS) {
        let stalled: u64 = ops
            .iter()
            .map(|o| clip(sync_start(o) + ms * 1_000_000, o.end_ns()))
            .sum();
        *share = stalled as f64 / len as f64;
    }
    TimeWeighted {
        stall_share,
        min_ops_per_slice: min_ops_per_slice(ops, from_ns, to_ns),
        expected_ms: expected_latency_ns(ops, from_ns, to_ns) / 1e6,
    }
}

fn sync_start(o: &Op) -> u64 {
    o.start_ns + u64::from(o.write_ns)
}

/// The fewest completions in the window's whole slices.
fn min_ops_per_slice(ops: &[Op], from_ns: u64, to_ns: u64) -> f64 {
    let slices = (to_ns.saturating_sub(from_ns) / SLICE_NS) as usize;
    if slices == 0 {
        return f64::NAN;
    }
    let mut counts = vec![0u32; slices];
    for o in ops {
        let e = o.end_ns();
        if e >= from_ns {
            if let Some(c) = counts.get_mut(((e - from_ns) / SLICE_NS) as usize) {
                *c += 1;
            }
        }
    }
    f64::from(counts.into_iter().min().unwrap_or(0))
}

/// For an instant `t` between two op starts `s_i <= t < s_{i+1}`, the op
/// issued at `t` would complete when op `i + 1` did: `e_{i+1} - t`. The
/// mean of that over the window, in ns; instants after the last start
/// (nothing to wait behind) are left out, and NaN if none remain.
fn expected_latency_ns(ops: &[Op], from_ns: u64, to_ns: u64) -> f64 {
    let mut area = 0.0;
    let mut covered = 0u64;
    for w in ops.windows(2) {
        let (a, b) = (w[0].start_ns.max(from_ns), w[1].start_ns.min(to_ns));
        if b <= a {
            continue;
        }
        // ∫_a^b (e - t) dt with e = the next op's end.
        let e = w[1].end_ns() as f64;
        area += (b - a) as f64 * (e - (a as f64 + b as f64) / 2.0);
        covered += b - a;
    }
    if covered == 0 {
        f64::NAN
    } else {
        area / covered as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closed loop from `ms` sync latencies: each op starts when the
    /// previous one ended, with a 0 ms write.
    fn closed_loop(sync_ms: &[u64]) -> Vec<Op> {
        let mut t = 0;
        sync_ms
            .iter()
            .map(|&s| {
                let o = Op {
                    start_ns: t,
                    write_ns: 0,
                    sync_ns: (s * 1_000_000) as u32,
                };
                t = o.end_ns();
                o
            })
            .collect()
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn stalls_slices_and_expected_latency() {
        // (sync latencies ms, window ms, stall shares, min ops per slice,
        // expected ms)
        type Case = (Vec<u64>, (u64, u64), [f64; 3], f64, f64);
        let cases: Vec<Case> = vec![
            // 1 ms each: no stall; 99 ends in the first slice (the 100th
            // is at 100 ms), 100 in the others; an op issued at random
            // waits half an op, then a whole one.
            (vec![1; 1000], (0, 500), [0.0; 3], 99.0, 1.5),
            // One 200 ms stall among 1 ms ops, in a 500 ms window: in
            // flight > 10 ms for 190 ms, > 50 for 150, > 100 for 100;
            // the stall's slices hold 0 or 1 ops.
            (
                [vec![1; 100], vec![200], vec![1; 300]].concat(),
                (0, 500),
                [0.38, 0.30, 0.20],
                0.0,
                // The 200 ms during the stall wait 100 ms on average plus
                // the next 1 ms op; the 1 ms before it waits 200.5 ms; the
                // other 299 ms, 1.5 ms.
                (200.0 * 101.0 + 200.5 + 299.0 * 1.5) / 500.0,
            ),
            // A stall that began before the window counts only inside it.
            (
                [vec![200], vec![1; 300]].concat(),
                (150, 250),
                [0.50, 0.50, 0.50],
                50.0,
                (50.0 * 26.0 + 50.0 * 1.5) / 100.0,
            ),
        ];
        for (sync, (a, b), stalls, min_ops, expected) in cases {
            let ops = closed_loop(&sync);
            let tw = time_weighted(&ops, a * MS, b * MS);
            for (got, want) in tw.stall_share.iter().zip(stalls) {
                assert!((got - want).abs() < 1e-9, "{tw:?} want stalls {stalls:?}");
            }
            assert_eq!(tw.min_ops_per_slice, min_ops, "{tw:?}");
            assert!(
                (tw.expected_ms - expected).abs() < 1e-6,
                "{tw:?} want {expected}"
            );
        }
    }

    #[test]
    fn empty_and_short_windows() {
        let ops = closed_loop(&[1, 1, 1]);
        let none = time_weighted(&ops, 5 * MS, 5 * MS);
        assert!(none.expected_ms.is_nan() && none.stall_share[0].is_nan());
        let short = time_weighted(&ops, 0, 50 * MS);
        assert!(short.min_ops_per_slice.is_nan());
        assert_eq!(short.stall_share, [0.0; 3]);
        let after = time_weighted(&ops, 10 * MS, 300 * MS);
        assert!(after.expected_ms.is_nan());
        assert_eq!(after.min_ops_per_slice, 0.0);
    }
}
