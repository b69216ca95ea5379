//! Flush latencies, kept for the governor's stats (p50, p99, max) with a
//! bound on memory. Shared by the inline modes ([`super::Governor`]) and
//! the paced mode's [`super::flusher`].

use std::time::Duration;

/// Flush latencies kept for percentiles (older ones beyond are dropped
/// from the percentile, not from count and max).
const MAX_SAMPLES: usize = 1 << 16;

/// Flush latencies, bounded in memory.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    ms: Vec<f64>,
    max_ms: f64,
}

impl Samples {
    pub fn push(&mut self, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        self.max_ms = self.max_ms.max(ms);
        if self.ms.len() < MAX_SAMPLES {
            self.ms.push(ms);
        }
    }

    pub fn len(&self) -> usize {
        self.ms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ms.is_empty()
    }

    /// (p50, p99, max) in milliseconds.
    pub(super) fn summary(&self) -> (f64, f64, f64) {
        let mut v = self.ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        (percentile(&v, 0.50), percentile(&v, 0.99), self.max_ms)
    }
}

/// Nearest-rank percentile of sorted samples (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let cases: &[(&[f64], f64, f64)] = &[
            (&[], 0.5, 0.0),
            (&[3.0], 0.5, 3.0),
            (&[1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
            (&[1.0, 2.0, 3.0, 4.0], 0.99, 4.0),
            (&[1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
        ];
        for (v, q, want) in cases {
            assert_eq!(percentile(v, *q), *want, "{v:?} q={q}");
        }
    }
}
