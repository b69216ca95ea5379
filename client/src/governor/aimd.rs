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
}

const MIB: f64 = 1024.0 * 1024.0;

impl AimdConfig {
    /// Defaults for a pull next to a latency-sensitive neighbour: start at
    /// a modest rate and a 1 MiB batch, grow by 8 MiB/s and 256 KiB per good
    /// flush, halve on a bad one. The floor (1 MiB/s, 128 KiB) keeps the pull
    /// moving even on a saturated device; the ceiling (1 GiB/s, 16 MiB)
    /// means "unpaced" on any disk a node has.
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            initial_rate: 64.0 * MIB,
            min_rate: MIB,
            max_rate: 1024.0 * MIB,
            rate_step: 8.0 * MIB,
            decrease: 0.5,
            initial_batch: 1 << 20,
            min_batch: 128 << 10,
            max_batch: 16 << 20,
            batch_step: 256 << 10,
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

    /// Feeds one measured flush latency; returns whether it was over target.
    pub fn on_flush(&mut self, latency: Duration) -> bool {
        let c = &self.config;
        let over = latency > c.target;
        if over && self.hold {
            self.hold = false;
        } else if over {
            self.rate = (self.rate * c.decrease).max(c.min_rate);
            self.batch = ((self.batch as f64 * c.decrease) as u64).max(c.min_batch);
            self.hold = true;
        } else {
            self.hold = false;
            self.rate = (self.rate + c.rate_step).min(c.max_rate);
            self.batch = (self.batch + c.batch_step).min(c.max_batch);
        }
        over
    }

    /// How long writing `bytes` should take at the current rate.
    pub fn pace(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.rate)
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
        // (latencies fed in order, expected rate in MiB/s, expected batch in KiB)
        let cases: &[(&[u64], f64, u64)] = &[
            (&[], 64.0, 1024),
            (&[1], 72.0, 1280),
            (&[10], 72.0, 1280),
            (&[11], 32.0, 512),
            // The second slow flush in a row is held, the third acts.
            (&[11, 11], 32.0, 512),
            (&[11, 11, 11], 16.0, 256),
            (&[50; 7], 4.0, 128),
            (&[50; 20], 1.0, 128),
            (&[50, 1], 40.0, 768),
            (&[50, 1, 50], 20.0, 384),
            (&[1; 200], 1024.0, 16384),
        ];
        for (lat, rate, batch) in cases {
            let mut a = Aimd::new(cfg.clone());
            for &l in *lat {
                a.on_flush(ms(l));
            }
            assert_eq!(a.rate / MIB, *rate, "latencies {lat:?}");
            assert_eq!(a.batch >> 10, *batch, "latencies {lat:?}");
        }
    }

    #[test]
    fn pace_follows_rate() {
        let a = Aimd::new(AimdConfig::new(ms(10)));
        assert_eq!(a.pace(64 << 20), Duration::from_secs(1));
        assert_eq!(a.pace(0), Duration::ZERO);
    }
}
