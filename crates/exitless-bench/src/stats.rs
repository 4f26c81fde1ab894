//! The statistics of `exitless bench` over rounds: the median, its order-statistic (binomial)
//! confidence interval, a bootstrap interval for a ratio of medians over paired rounds, the
//! order in which each round runs its boots, and a target's verdict from an interval.
//!
//! Nothing here measures: it takes figures, one per round, and says what they establish.

use serde::Serialize;

/// The confidence every interval aims for.
pub const CONFIDENCE: f64 = 0.95;

/// Bootstrap resamples per ratio interval.
const RESAMPLES: usize = 2000;

/// The bootstrap's fixed seed: the same figures give the same interval, run after run.
const SEED: u64 = 0x5eed_b007_57a7_1575;

/// The median of `xs` (the mean of the middle two for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// An interval for the median of rounds, and the probability it holds the true median.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MedianInterval {
    /// Lower end.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
    /// Its coverage: at least [`CONFIDENCE`] from 6 rounds on; below that, the min..max
    /// interval's `1 - 2/2^n`.
    pub coverage: f64,
}

/// `P(X <= k)` for `X ~ Binomial(n, 1/2)`.
fn binomial_half_cdf(n: usize, k: usize) -> f64 {
    let mut term = 0.5f64.powf(n as f64); // C(n, 0) / 2^n
    let mut sum = 0.0;
    for i in 0..=k.min(n) {
        sum += term;
        term = term * (n - i) as f64 / (i + 1) as f64;
    }
    sum
}

/// The order-statistic interval of the median: the sorted rounds' `k`-th from each end,
/// `k` as large as still covers [`CONFIDENCE`] (coverage `1 - 2 P(Bin(n, 1/2) <= k - 1)`,
/// distribution-free). Under 6 rounds no such `k` exists: the interval is min..max and its
/// coverage, `1 - 2/2^n`, is what it is (5 rounds: 93.75%; 1 round: 0).
pub fn median_ci(xs: &[f64]) -> MedianInterval {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return MedianInterval {
            lo: f64::NAN,
            hi: f64::NAN,
            coverage: 0.0,
        };
    }
    let coverage = |k: usize| 1.0 - 2.0 * binomial_half_cdf(n, k - 1);
    let mut k = 1;
    while k < n.div_ceil(2) && coverage(k + 1) >= CONFIDENCE {
        k += 1;
    }
    MedianInterval {
        lo: s[k - 1],
        hi: s[n - k],
        coverage: if n == 1 { 0.0 } else { coverage(k) },
    }
}

/// xorshift64*: small, seeded, good enough to pick rounds for a bootstrap.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as usize % n
    }
}

/// A 95% interval for `median(num) / median(den)`, by the percentile bootstrap over paired
/// rounds (round `i` of both resampled together, so drift shared by a round cancels), with a
/// fixed seed. One round (or none): the point ratio at both ends.
pub fn ratio_ci(num: &[f64], den: &[f64]) -> (f64, f64) {
    let n = num.len().min(den.len());
    let point = median(&num[..n]) / median(&den[..n]);
    if n < 2 {
        return (point, point);
    }
    let mut rng = XorShift(SEED);
    let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for i in 0..n {
                let j = rng.below(n);
                (a[i], b[i]) = (num[j], den[j]);
            }
            median(&a) / median(&b)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    // 2.5% in each tail (CONFIDENCE): the 50th resample from each end of 2000.
    let tail = RESAMPLES / 40;
    (ratios[tail], ratios[RESAMPLES - 1 - tail])
}

/// The order round `round` (from 0) runs `n` boots in: rotated one place per round
/// (A B C, B C A, C A B, ...), so that drift in the host's load hits every boot alike.
pub fn rotation(n: usize, round: usize) -> Vec<usize> {
    (0..n).map(|i| (i + round) % n.max(1)).collect()
}

/// What the figures say about a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Met, the whole interval on the right side of the threshold.
    #[serde(rename = "met")]
    Met,
    /// Missed, the whole interval on the wrong side.
    #[serde(rename = "missed")]
    Missed,
    /// The interval spans the threshold: the difference is within the noise.
    #[serde(rename = "not established")]
    NotEstablished,
}

impl Verdict {
    /// A check with no interval (counts, or a single figure): met or missed.
    pub fn of(met: bool) -> Verdict {
        if met { Verdict::Met } else { Verdict::Missed }
    }

    /// The verdict on `value <= threshold` (`at_most`) or `value >= threshold` given the
    /// value's interval `(lo, hi)`.
    pub fn of_interval((lo, hi): (f64, f64), threshold: f64, at_most: bool) -> Verdict {
        let (good, bad) = if at_most {
            (hi <= threshold, lo > threshold)
        } else {
            (lo >= threshold, hi < threshold)
        };
        match (good, bad) {
            (true, _) => Verdict::Met,
            (_, true) => Verdict::Missed,
            _ => Verdict::NotEstablished,
        }
    }

    /// How the tables write it.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "MISSED",
            Verdict::NotEstablished => "not established",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn under_six_rounds_the_interval_is_min_to_max_with_its_real_coverage() {
        let ci = median_ci(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((ci.lo, ci.hi), (1.0, 5.0));
        assert!((ci.coverage - (1.0 - 2.0 / 32.0)).abs() < 1e-12, "{ci:?}");
        let ci = median_ci(&[2.0, 1.0]);
        assert_eq!((ci.lo, ci.hi, ci.coverage), (1.0, 2.0, 0.5));
        let one = median_ci(&[7.0]);
        assert_eq!((one.lo, one.hi, one.coverage), (7.0, 7.0, 0.0));
    }

    #[test]
    fn from_six_rounds_the_interval_covers_95_percent() {
        // n = 6: k = 1 (min..max) covers 1 - 2/64 = 0.96875; k = 2 only 0.78125.
        let ci = median_ci(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!((ci.lo, ci.hi), (1.0, 6.0));
        assert!((ci.coverage - 0.968_75).abs() < 1e-12);
        // n = 9: k = 2 gives 1 - 2 * 10/512 = 0.9609; k = 3 gives 0.8203.
        let xs: Vec<f64> = (1..=9).map(f64::from).collect();
        let ci = median_ci(&xs);
        assert_eq!((ci.lo, ci.hi), (2.0, 8.0));
        assert!((ci.coverage - (1.0 - 20.0 / 512.0)).abs() < 1e-12);
        // n = 20: the textbook interval is the 6th to the 15th (coverage 0.9586).
        let xs: Vec<f64> = (1..=20).map(f64::from).collect();
        let ci = median_ci(&xs);
        assert_eq!((ci.lo, ci.hi), (6.0, 15.0));
        assert!((ci.coverage - 0.958_6).abs() < 1e-4, "{ci:?}");
    }

    #[test]
    fn binomial_tails() {
        assert!((binomial_half_cdf(5, 0) - 1.0 / 32.0).abs() < 1e-15);
        assert!((binomial_half_cdf(5, 2) - 0.5).abs() < 1e-15);
        assert!((binomial_half_cdf(5, 5) - 1.0).abs() < 1e-15);
    }

    #[test]
    fn a_ratio_interval_holds_the_point_and_is_reproducible() {
        let num = [10.0, 11.0, 9.0, 10.5, 9.5];
        let den = [20.0, 21.0, 19.0, 20.0, 22.0];
        let (lo, hi) = ratio_ci(&num, &den);
        let point = median(&num) / median(&den);
        assert!(lo <= point && point <= hi, "{lo} {point} {hi}");
        assert!(lo >= 9.0 / 22.0 && hi <= 11.0 / 19.0, "{lo} {hi}");
        assert_eq!(ratio_ci(&num, &den), (lo, hi));
        // Identical rounds: no spread at all.
        assert_eq!(ratio_ci(&[2.0; 5], &[4.0; 5]), (0.5, 0.5));
        assert_eq!(ratio_ci(&[3.0], &[6.0]), (0.5, 0.5));
    }

    #[test]
    fn rounds_rotate_the_boot_order() {
        assert_eq!(rotation(3, 0), [0, 1, 2]);
        assert_eq!(rotation(3, 1), [1, 2, 0]);
        assert_eq!(rotation(3, 2), [2, 0, 1]);
        assert_eq!(rotation(3, 3), [0, 1, 2]);
        assert_eq!(rotation(1, 4), [0]);
        // Over n rounds every boot runs once in every position.
        for pos in 0..4 {
            let mut seen: Vec<usize> = (0..4).map(|r| rotation(4, r)[pos]).collect();
            seen.sort();
            assert_eq!(seen, [0, 1, 2, 3]);
        }
    }

    #[test]
    fn a_verdict_is_not_established_when_the_interval_spans_the_threshold() {
        assert_eq!(Verdict::of_interval((0.90, 0.98), 1.0, true), Verdict::Met);
        assert_eq!(
            Verdict::of_interval((1.02, 1.10), 1.0, true),
            Verdict::Missed
        );
        assert_eq!(
            Verdict::of_interval((0.95, 1.03), 1.0, true),
            Verdict::NotEstablished
        );
        // The same point estimate (0.945x against ">= 1"), first with rounds that agree, then
        // with rounds whose spread reaches past 1: the verdict flips to not established.
        let tight = ratio_ci(&[0.94, 0.945, 0.95, 0.945, 0.944], &[1.0; 5]);
        assert_eq!(Verdict::of_interval(tight, 1.0, false), Verdict::Missed);
        let wide = ratio_ci(&[0.80, 0.945, 1.05, 1.10, 0.90], &[1.0; 5]);
        assert!(wide.0 < 1.0 && wide.1 > 1.0, "{wide:?}");
        assert_eq!(
            Verdict::of_interval(wide, 1.0, false),
            Verdict::NotEstablished
        );
        let serialized = serde_json::to_string(&Verdict::NotEstablished).unwrap();
        assert_eq!(serialized, "\"not established\"");
    }
}
