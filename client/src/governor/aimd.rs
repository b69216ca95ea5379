//! The governor's feedback loop, pure: flush latencies in, a write rate and
//! a batch size out. Additive increase while our own flushes complete
//! within the target; multiplicative decrease when they do not, which is
//! what the device looks like when a neighbour is using it.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct AimdConfig {
    /// Flush latency to stay under (`--io-latency-target`).
    pub target: Duration,
    /// Rate (bytes/s) at start.
    pub initial_rate: f64,
    pub min_rate: f64,
    pub max_rate: f64,
    /// Added to the rate after each flush within target.
    pub rate_step: f64,
    /// Multiplies rate and batch after a flush over target.
    pub decrease: f64,
    pub initial_batch: u64,
    pub min_batch: u64,
    pub max_batch: u64,
    /// Added to the batch after each flush within target.
    pub batch_step: u64,
    /// Idle time after each flush, as a multiple of its latency.
    pub idle_share: f64,
}

const MIB: f64 = 1024.0 * 1024.0;

impl AimdConfig {
    /// Defaults for a pull next to a latency-sensitive neighbour: start at
    /// a modest rate and a 256 KiB chunk, grow by 8 MiB/s and 64 KiB per
    /// good flush, halve on a bad one. The chunk stays between 64 KiB and
    /// 1 MiB: it is what the neighbour may find queued ahead of it, a
    /// fraction of a millisecond on an SSD. The rate floor (1 MiB/s) keeps
    /// the pull moving even on a saturated device; the ceiling (1 GiB/s)
    /// means "unpaced" on any disk a node has.
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            initial_rate: 64.0 * MIB,
            min_rate: MIB,
            max_rate: 1024.0 * MIB,
            rate_step: 8.0 * MIB,
            decrease: 0.5,
            initial_batch: 256 << 10,
            min_batch: 64 << 10,
            max_batch: 1 << 20,
            batch_step: 64 << 10,
            idle_share: 1.0,
        }
    }
}

/// Controller state.
#[derive(Debug, Clone, PartialEq)]
pub struct Aimd {
    pub config: AimdConfig,
    /// Current write rate limit, bytes per second.
    pub rate: f64,
    /// Bytes written between two waited flushes.
    pub batch: u64,
    /// Set by a decrease: the next slow flush mostly measured data written
    /// before the decrease took effect, so it does not decrease again
    /// (one reaction per round trip, as TCP does).
    hold: bool,
}

impl Aimd {
    pub fn new(config: AimdConfig) -> Self {
        Self {
            rate: config.initial_rate,
            batch: config.initial_batch,
            hold: false,
            config,
        }
    }

    /// Feeds one flush of `bytes` that took `latency`; returns whether it
    /// was over target. A decrease starts from the lower of the rate limit
    /// and what the device just delivered: while the limit is far above
    /// what the device can do, halving the limit alone would take many slow
    /// flushes to bite.
    pub fn on_flush(&mut self, latency: Duration, bytes: u64) -> bool {
        let c = &self.config;
        let over = latency > c.target;
        if over && self.hold {
            self.hold = false;
        } else if over {
            let delivered = bytes as f64 / latency.as_secs_f64();
            self.rate = (self.rate.min(delivered) * c.decrease).max(c.min_rate);
            self.batch = ((self.batch as f64 * c.decrease) as u64).max(c.min_batch);
            self.hold = true;
        } else {
            self.hold = false;
            self.rate = (self.rate + c.rate_step).min(c.max_rate);
            self.batch = (self.batch + c.batch_step).min(c.max_batch);
        }
        over
    }

    /// How long to wait after a flush of `bytes` that took `latency` before
    /// the next one: the rate limit's share, and at least `idle_share`
    /// times the flush itself, so that we never hold the device more than
    /// 1 / (1 + idle_share) of the time and back off in proportion when it
    /// slows down (a stalled device makes our flush slow, and the neighbour
    /// needs the time after the stall most).
    pub fn pace(&self, bytes: u64, latency: Duration) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.rate)
            .max(latency.mul_f64(self.config.idle_share))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn additive_increase_multiplicative_decrease() {
        let cfg = AimdConfig::new(ms(10));
        // A flush size at which the device's delivered rate never binds.
        const BIG: u64 = 1 << 40;
        // (flushes as (latency ms, bytes) in order, expected rate in MiB/s,
        // expected batch in KiB)
        type Case = (&'static [(u64, u64)], f64, u64);
        let cases: &[Case] = &[
            (&[], 64.0, 256),
            (&[(1, BIG)], 72.0, 320),
            (&[(10, BIG)], 72.0, 320),
            (&[(11, BIG)], 32.0, 128),
            // The second slow flush in a row is held, the third acts.
            (&[(11, BIG), (11, BIG)], 32.0, 128),
            (&[(11, BIG), (11, BIG), (11, BIG)], 16.0, 64),
            (&[(50, BIG); 7], 4.0, 64),
            (&[(50, BIG); 20], 1.0, 64),
            (&[(50, BIG), (1, BIG)], 40.0, 192),
            (&[(50, BIG), (1, BIG), (50, BIG)], 20.0, 96),
            (&[(1, BIG); 200], 1024.0, 1024),
            // The device delivered 1 MiB in 100 ms: the decrease starts
            // from its 10 MiB/s, not from the 64 MiB/s limit.
            (&[(100, 1 << 20)], 5.0, 128),
            // ...and never below the floor.
            (&[(1000, 1 << 20)], 1.0, 128),
        ];
        for (flushes, rate, batch) in cases {
            let mut a = Aimd::new(cfg.clone());
            for &(l, b) in *flushes {
                a.on_flush(ms(l), b);
            }
            assert_eq!(a.rate / MIB, *rate, "flushes {flushes:?}");
            assert_eq!(a.batch >> 10, *batch, "flushes {flushes:?}");
        }
    }

    #[test]
    fn pace_follows_rate_and_latency() {
        let a = Aimd::new(AimdConfig::new(ms(10)));
        // (bytes, flush latency ms, expected wait ms)
        let cases: &[(u64, u64, u64)] = &[
            (64 << 20, 0, 1000),
            (0, 0, 0),
            // 1 MiB at 64 MiB/s is 15.6 ms; a 40 ms flush waits 40 ms.
            (1 << 20, 40, 40),
            (64 << 20, 40, 1000),
        ];
        for &(bytes, lat, want) in cases {
            assert_eq!(a.pace(bytes, ms(lat)), ms(want), "{bytes} bytes, {lat} ms");
        }
    }
}
