//! The governor's feedback loop, pure: flush latencies in, a write rate and
//! a chunk size out.
//!
//! - *Slow start*: begin at a rate a neighbour barely notices and grow
//!   geometrically, but only while every recent flush stayed within the
//!   target. A small update is mostly written during this phase, so it is
//!   what keeps a short burst from landing before any feedback arrived.
//! - *Steer on the tail*: the decision looks at the slowest of the recent
//!   flushes, not the median or the last one alone: the neighbour suffers
//!   the tail, and a device that is fast on average but stalls now and
//!   then is a busy device.
//! - *Additive increase, multiplicative decrease* after slow start, one
//!   reaction per round trip (as TCP does).
//!
//! Rates and chunk sizes are in *cost* bytes: an object's length plus a
//! fixed [`AimdConfig::object_cost`], because creating a small file
//! (inode, directory entry, journal) costs the device far more than its
//! few bytes of data.

use std::collections::VecDeque;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct AimdConfig {
    /// Flush latency to stay under (`--io-latency-target`).
    pub target: Duration,
    /// Rate (cost bytes/s) at start.
    pub initial_rate: f64,
    pub min_rate: f64,
    /// `--io-max-rate`, or "unpaced" on any disk a node has.
    pub max_rate: f64,
    /// Slow start multiplies the rate by this after each fast flush.
    pub slow_start_growth: f64,
    /// Added to the rate after each fast flush, once slow start is over.
    pub rate_step: f64,
    /// Multiplies rate and chunk after a slow tail.
    pub decrease: f64,
    pub initial_batch: u64,
    pub min_batch: u64,
    pub max_batch: u64,
    /// Added to the chunk after each fast flush.
    pub batch_step: u64,
    /// Idle time after each flush, as a multiple of its latency.
    pub idle_share: f64,
    /// What one object costs beyond its length, in bytes.
    pub object_cost: u64,
    /// Flushes the tail is taken over.
    pub window: usize,
}

const MIB: f64 = 1024.0 * 1024.0;

impl AimdConfig {
    /// Defaults for a pull next to a latency-sensitive neighbour. Start at
    /// 8 MiB/s (of cost) with a 128 KiB chunk, grow by a quarter per fast
    /// flush in slow start (about a doubling every 3 flushes, so seconds,
    /// not minutes, to full speed on an idle disk), then by 4 MiB/s, and
    /// halve on a slow tail. The chunk stays between 64 KiB and 256 KiB: it
    /// is what the neighbour may find queued ahead of it (with a 1 MiB
    /// ceiling, its p99 on a 30% update was 1.7x its baseline and its
    /// worst stall 2.9x; with 256 KiB, 1.4x and 1.0x: `cargo xtask bench io` at
    /// 83f8c0e). An object costs 16 KiB on top of its length: an XFS inode
    /// cluster write, its directory entry and their journal share. The
    /// rate floor (1 MiB/s) keeps the pull moving even on a saturated
    /// device.
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            initial_rate: 8.0 * MIB,
            min_rate: MIB,
            max_rate: 1024.0 * MIB,
            slow_start_growth: 1.25,
            rate_step: 4.0 * MIB,
            decrease: 0.5,
            initial_batch: 128 << 10,
            min_batch: 64 << 10,
            max_batch: 256 << 10,
            batch_step: 64 << 10,
            idle_share: 1.0,
            object_cost: 16 << 10,
            window: 8,
        }
    }

    /// With `--io-max-rate` (bytes/s): the ceiling, and a start no higher.
    pub fn with_max_rate(mut self, max_rate: Option<f64>) -> Self {
        if let Some(m) = max_rate {
            self.max_rate = m.max(self.min_rate);
            self.initial_rate = self.initial_rate.min(self.max_rate);
        }
        self
    }

    /// The cost of flushing `bytes` of `objects` objects.
    pub fn cost(&self, bytes: u64, objects: u64) -> u64 {
        bytes.saturating_add(objects.saturating_mul(self.object_cost))
    }
}

/// What one flush made the controller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The tail is within target: grow.
    Grow,
    /// The tail is over target but a decrease is in its round trip.
    Hold,
    /// The tail is over target: back off.
    Decrease,
}

/// Controller state.
#[derive(Debug, Clone, PartialEq)]
pub struct Aimd {
    pub config: AimdConfig,
    /// Current write rate limit, cost bytes per second.
    pub rate: f64,
    /// Cost bytes flushed at once.
    pub batch: u64,
    /// Still growing geometrically (no slow tail seen yet).
    pub slow_start: bool,
    /// The latest flush latencies, newest last, at most `window`.
    recent: VecDeque<Duration>,
    /// Flushes still to see before another decrease: what is measured
    /// right after a decrease was mostly written before it took effect.
    hold: usize,
}

impl Aimd {
    pub fn new(config: AimdConfig) -> Self {
        Self {
            rate: config.initial_rate,
            batch: config.initial_batch,
            slow_start: true,
            recent: VecDeque::with_capacity(config.window),
            hold: 0,
            config,
        }
    }

    /// The slowest recent flush.
    pub fn tail(&self) -> Duration {
        self.recent.iter().copied().max().unwrap_or_default()
    }

    /// Feeds one flush of `cost` bytes that took `latency`. A decrease
    /// starts from the lower of the rate limit and what the device just
    /// delivered: while the limit is far above what the device can do,
    /// halving the limit alone would take many slow flushes to bite.
    pub fn on_flush(&mut self, latency: Duration, cost: u64) -> Verdict {
        let c = &self.config;
        if self.recent.len() >= c.window.max(1) {
            self.recent.pop_front();
        }
        self.recent.push_back(latency);
        let over = self.tail() > c.target;
        let verdict = if !over {
            Verdict::Grow
        } else if self.hold > 0 {
            Verdict::Hold
        } else {
            Verdict::Decrease
        };
        self.hold = self.hold.saturating_sub(1);
        match verdict {
            Verdict::Grow if self.slow_start => {
                self.rate = (self.rate * c.slow_start_growth).min(c.max_rate);
                self.batch = (self.batch + c.batch_step).min(c.max_batch);
            }
            Verdict::Grow => {
                self.rate = (self.rate + c.rate_step).min(c.max_rate);
                self.batch = (self.batch + c.batch_step).min(c.max_batch);
            }
            Verdict::Hold => {}
            Verdict::Decrease => {
                let delivered = cost as f64 / latency.as_secs_f64().max(1e-6);
                self.rate = (self.rate.min(delivered) * c.decrease).max(c.min_rate);
                self.batch = ((self.batch as f64 * c.decrease) as u64).max(c.min_batch);
                self.slow_start = false;
                // The slow flushes that caused this one stay in the tail
                // for a window; forget them, and let the next two flushes
                // (written at the old rate) pass.
                self.recent.clear();
                self.hold = 2;
            }
        }
        verdict
    }

    /// How long to wait after a flush of `cost` bytes that took `latency`
    /// before the next one: the rate limit's share, and at least
    /// `idle_share` times the flush itself, so that we never hold the
    /// device more than 1 / (1 + idle_share) of the time and back off in
    /// proportion when it slows down.
    pub fn pace(&self, cost: u64, latency: Duration) -> Duration {
        Duration::from_secs_f64(cost as f64 / self.rate)
            .max(latency.mul_f64(self.config.idle_share))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A flush cost at which the device's delivered rate never binds.
    const BIG: u64 = 1 << 40;

    #[test]
    fn slow_start_then_tail_steered_aimd() {
        let cfg = AimdConfig::new(ms(10));
        // (flushes as (latency ms, cost) in order, expected rate in MiB/s,
        // expected chunk in KiB, still in slow start)
        type Case = (&'static [(u64, u64)], f64, u64, bool);
        let cases: &[Case] = &[
            (&[], 8.0, 128, true),
            // Slow start: x1.25 per fast flush.
            (&[(1, BIG)], 10.0, 192, true),
            (&[(1, BIG), (1, BIG)], 12.5, 256, true),
            (&[(10, BIG)], 10.0, 192, true),
            // A slow flush halves and ends slow start...
            (&[(11, BIG)], 4.0, 64, false),
            // ...the next two flushes are held (written at the old rate),
            (&[(11, BIG), (50, BIG), (50, BIG)], 4.0, 64, false),
            // the third acts.
            (
                &[(11, BIG), (50, BIG), (50, BIG), (50, BIG)],
                2.0,
                64,
                false,
            ),
            // After slow start, growth is additive (+4 MiB/s).
            (&[(11, BIG), (1, BIG)], 8.0, 128, false),
            (&[(50, BIG); 20], 1.0, 64, false),
            (&[(11, BIG), (1, BIG), (1, BIG), (1, BIG)], 16.0, 256, false),
            // The delivered rate bounds the decrease: 1 MiB in 100 ms is
            // 10 MiB/s, halved.
            (
                &[(1, BIG), (1, BIG), (1, BIG), (1, BIG), (100, 1 << 20)],
                5.0,
                128,
                false,
            ),
            (&[(1000, 1 << 20)], 1.0, 64, false),
            // Both grow to their ceilings (the chunk's: 256 KiB).
            (&[(1, BIG); 200], 1024.0, 256, true),
        ];
        for (flushes, rate, batch, slow) in cases {
            let mut a = Aimd::new(cfg.clone());
            for &(l, b) in *flushes {
                a.on_flush(ms(l), b);
            }
            assert_eq!(a.rate / MIB, *rate, "flushes {flushes:?}");
            assert_eq!(a.batch >> 10, *batch, "flushes {flushes:?}");
            assert_eq!(a.slow_start, *slow, "flushes {flushes:?}");
        }
    }

    #[test]
    fn the_tail_decides() {
        let mut cfg = AimdConfig::new(ms(10));
        cfg.window = 4;
        let mut a = Aimd::new(cfg);
        // Leave slow start, let the hold pass.
        for l in [20, 1, 1] {
            a.on_flush(ms(l), BIG);
        }
        // (flush latency ms, expected verdict)
        let steps: &[(u64, Verdict)] = &[
            (1, Verdict::Grow),
            (12, Verdict::Decrease),
            // Two flushes' round trip...
            (15, Verdict::Hold),
            (1, Verdict::Hold),
            // ...then the 15 ms still in the window acts, though the
            // latest flush was fast.
            (1, Verdict::Decrease),
            (1, Verdict::Grow),
        ];
        for (i, &(l, want)) in steps.iter().enumerate() {
            assert_eq!(a.on_flush(ms(l), BIG), want, "step {i}");
        }
    }

    #[test]
    fn max_rate_caps_start_and_growth() {
        // (--io-max-rate MiB/s, fast flushes, expected rate MiB/s)
        let cases: &[(Option<f64>, usize, f64)] = &[
            (None, 0, 8.0),
            (Some(2.0), 0, 2.0),
            (Some(2.0), 50, 2.0),
            (Some(20.0), 50, 20.0),
            // Never below the floor.
            (Some(0.1), 0, 1.0),
        ];
        for &(max, n, want) in cases {
            let cfg = AimdConfig::new(ms(10)).with_max_rate(max.map(|m| m * MIB));
            let mut a = Aimd::new(cfg);
            for _ in 0..n {
                a.on_flush(ms(1), BIG);
            }
            assert_eq!(a.rate / MIB, want, "max {max:?}, {n} flushes");
        }
    }

    #[test]
    fn objects_cost_more_than_their_bytes() {
        let c = AimdConfig::new(ms(10));
        // (bytes, objects, cost)
        let cases: &[(u64, u64, u64)] = &[
            (0, 0, 0),
            (4096, 1, 4096 + (16 << 10)),
            (1 << 20, 32, (1 << 20) + 32 * (16 << 10)),
            (u64::MAX, 1, u64::MAX),
        ];
        for &(b, o, want) in cases {
            assert_eq!(c.cost(b, o), want, "{b} bytes, {o} objects");
        }
    }

    #[test]
    fn pace_follows_rate_and_latency() {
        let a = Aimd::new(AimdConfig::new(ms(10)));
        // (cost, flush latency ms, expected wait ms) at 8 MiB/s
        let cases: &[(u64, u64, u64)] = &[
            (8 << 20, 0, 1000),
            (0, 0, 0),
            // 128 KiB at 8 MiB/s is 15.6 ms; a 40 ms flush waits 40 ms.
            (128 << 10, 40, 40),
            (8 << 20, 40, 1000),
        ];
        for &(cost, lat, want) in cases {
            assert_eq!(a.pace(cost, ms(lat)), ms(want), "{cost} bytes, {lat} ms");
        }
    }
}
