//! Bootstrap confidence intervals for the ratio of an arm's median to the
//! baseline's median, each resampled on its own (trials are independent
//! runs). Pure, with a seeded RNG, so a report can be recomputed exactly.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Resamples per interval: enough for stable 2.5/97.5 percentiles.
pub const RESAMPLES: usize = 2000;
/// The RNG seed (fixed: the same trials give the same interval).
pub const SEED: u64 = 16;

/// A ratio with its 95% percentile-bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Interval {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Default for Interval {
    fn default() -> Self {
        Self {
            median: f64::NAN,
            lo: f64::NAN,
            hi: f64::NAN,
        }
    }
}

impl Interval {
    /// `value [lo–hi]`, or `n/a`.
    pub fn show(&self) -> String {
        if !self.median.is_finite() {
            return "n/a".into();
        }
        format!("{:.2} [{:.2}–{:.2}]", self.median, self.lo, self.hi)
    }
}

/// The median of a sample (mean of the middle two when even); NaN if
/// empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// median(`arm`) / median(`base`), with the 2.5th and 97.5th percentiles
/// of that ratio over `resamples` bootstrap resamples. NaN values are
/// dropped first; NaN everywhere if either side is then empty.
pub fn ratio_of_medians(arm: &[f64], base: &[f64], resamples: usize, seed: u64) -> Interval {
    let clean = |v: &[f64]| {
        v.iter()
            .copied()
            .filter(|x| !x.is_nan())
            .collect::<Vec<_>>()
    };
    let (arm, base) = (clean(arm), clean(base));
    if arm.is_empty() || base.is_empty() {
        return Interval::default();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draw = |v: &[f64]| {
        let s: Vec<f64> = (0..v.len()).map(|_| v[rng.gen_range(0..v.len())]).collect();
        median(&s)
    };
    let mut ratios: Vec<f64> = (0..resamples)
        .map(|_| {
            let a = draw(&arm);
            a / draw(&base)
        })
        .filter(|r| !r.is_nan())
        .collect();
    ratios.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        if ratios.is_empty() {
            return f64::NAN;
        }
        ratios[((q * (ratios.len() - 1) as f64).round() as usize).min(ratios.len() - 1)]
    };
    Interval {
        median: median(&arm) / median(&base),
        lo: pick(0.025),
        hi: pick(0.975),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        let cases: &[(&[f64], f64)] = &[
            (&[3.0], 3.0),
            (&[3.0, 1.0, 2.0], 2.0),
            (&[4.0, 1.0, 2.0, 3.0], 2.5),
            (&[f64::NAN, 1.0], 1.0),
        ];
        for (v, want) in cases {
            assert_eq!(median(v), *want, "{v:?}");
        }
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn intervals() {
        // (arm, base, point, lo, hi): constant samples give a point
        // interval; one side's spread widens it around the point.
        type Case = (&'static [f64], &'static [f64], f64, f64, f64);
        let cases: &[Case] = &[
            (&[2.0; 5], &[1.0; 5], 2.0, 2.0, 2.0),
            (&[3.0, 3.0, 3.0], &[2.0, 2.0], 1.5, 1.5, 1.5),
            // Resamples of {1,2,3} have medians 1, 2 or 3 (1 and 3 with
            // probability 7/27 each): the interval is [1, 3].
            (&[1.0, 2.0, 3.0], &[1.0], 2.0, 1.0, 3.0),
        ];
        for &(arm, base, point, lo, hi) in cases {
            let i = ratio_of_medians(arm, base, RESAMPLES, SEED);
            assert_eq!(
                (i.median, i.lo, i.hi),
                (point, lo, hi),
                "{arm:?} / {base:?}"
            );
        }
        assert!(ratio_of_medians(&[], &[1.0], RESAMPLES, SEED)
            .median
            .is_nan());
        assert!(ratio_of_medians(&[1.0], &[f64::NAN], RESAMPLES, SEED)
            .lo
            .is_nan());
    }

    #[test]
    fn seeded_and_separating() {
        let arm = [5.0, 6.0, 4.5, 7.0, 5.5, 6.5];
        let base = [1.0, 1.2, 0.9, 1.1, 1.0, 0.95];
        let a = ratio_of_medians(&arm, &base, RESAMPLES, SEED);
        assert_eq!(a, ratio_of_medians(&arm, &base, RESAMPLES, SEED));
        // Clearly apart: the whole interval is above 3x.
        assert!(a.lo > 3.0 && a.hi < 8.0, "{a:?}");
        assert!(a.lo <= a.median && a.median <= a.hi, "{a:?}");
        assert_eq!(
            a.show(),
            format!("{:.2} [{:.2}–{:.2}]", a.median, a.lo, a.hi)
        );
    }
}
