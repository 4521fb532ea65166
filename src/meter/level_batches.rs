//! The sums the production attribution keeps per level (`LevelSums`: clean and guarded time and
//! tokens, the streamed sequences' pace), and the rate's confidence interval: the clean time cut
//! into consecutive batches of at least a second, whose spread gives the ratio estimator's
//! standard error.

use crate::clock::NANOS_PER_SEC;

use super::summary::Z95;

/// Clean time at one level is cut into consecutive batches of at least this much: the samples
/// whose spread gives the rate's confidence interval (shorter pieces are correlated with their
/// neighbours and would understate it).
pub const BATCH_NS: u64 = NANOS_PER_SEC;

/// Sums over the closed batches of one level's clean time (tokens `t`, seconds `s`), and the
/// batch being filled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchSums {
    /// Closed batches.
    pub n: u32,
    /// Σs over closed batches, seconds.
    pub s: f64,
    /// Σt.
    pub t: f64,
    /// Σs².
    pub ss: f64,
    /// Σt².
    pub tt: f64,
    /// Σts.
    pub ts: f64,
    /// The open batch's time, ns.
    pub open_ns: u64,
    /// The open batch's weight (its seconds, or sequence-seconds).
    pub open_weight: f64,
    /// The open batch's tokens.
    pub open_tokens: f64,
}

impl BatchSums {
    /// Adds a clean piece of `ns` with `tokens`; closes the batch once it holds [`BATCH_NS`].
    pub fn add(&mut self, ns: u64, tokens: f64) {
        self.add_weighted(ns, ns as f64 / NANOS_PER_SEC as f64, tokens);
    }

    /// Adds a clean piece of `ns` worth `weight` units of the rate's denominator (seconds, or
    /// sequence-seconds for a per-sequence pace) with `tokens`; batches still close by time.
    pub fn add_weighted(&mut self, ns: u64, weight: f64, tokens: f64) {
        self.open_ns += ns;
        self.open_weight += weight;
        self.open_tokens += tokens;
        if self.open_ns >= BATCH_NS {
            let s = self.open_weight;
            let t = self.open_tokens;
            self.n += 1;
            self.s += s;
            self.t += t;
            self.ss += s * s;
            self.tt += t * t;
            self.ts += t * s;
            self.open_ns = 0;
            self.open_weight = 0.0;
            self.open_tokens = 0.0;
        }
    }

    /// Half-width of the 95 % confidence interval of the rate `Σt / Σs`, tokens/s: the ratio
    /// estimator's standard error over the closed batches,
    /// `SE² = Σ(tᵢ − R·sᵢ)² / (n (n − 1) s̄²)`, times 1.96; `None` with fewer than 2 batches.
    pub fn rate_ci95(&self) -> Option<f64> {
        if self.n < 2 || self.s <= 0.0 {
            return None;
        }
        let n = self.n as f64;
        let r = self.t / self.s;
        let resid = (self.tt - 2.0 * r * self.ts + r * r * self.ss).max(0.0);
        let mean_s = self.s / n;
        Some(Z95 * (resid / (n * (n - 1.0) * mean_s * mean_s)).sqrt())
    }
}

/// Time and tokens at one level.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LevelSums {
    /// Clean time, ns.
    pub clean_ns: u64,
    /// Tokens credited to clean time.
    pub clean_tokens: f64,
    /// Guarded time, ns.
    pub guard_ns: u64,
    /// Tokens credited to guarded time.
    pub guard_tokens: f64,
    /// The clean time in batches of at least [`BATCH_NS`], for the rate's confidence interval.
    pub batches: BatchSums,
    /// Clean time × the requests in flight past a first token (streamed ones, whose tokens
    /// are placed where they were made), sequence-seconds.
    pub seen_seq_s: f64,
    /// Tokens of those requests credited to clean time.
    pub seen_tokens: f64,
    /// The same in batches of at least [`BATCH_NS`] of clean time, for the pace's interval.
    pub seen_batches: BatchSums,
}

impl LevelSums {
    /// Per-sequence decode pace over the clean time, tokens/s: from the requests whose tokens
    /// were placed where they were made (past a first token), when they had at least
    /// `min_seq_s` sequence-seconds; else from every token, `clean tokens / clean s / N`.
    /// A non-streamed request's tokens are spread evenly over its life, guarded stalls
    /// included, which puts too few of them in clean time.
    pub fn pace(&self, n: u32, min_seq_s: f64) -> Option<(f64, Option<f64>)> {
        if self.seen_seq_s >= min_seq_s && self.seen_seq_s > 0.0 {
            return Some((
                self.seen_tokens / self.seen_seq_s,
                self.seen_batches.rate_ci95(),
            ));
        }
        let secs = self.clean_ns as f64 / NANOS_PER_SEC as f64;
        (secs > 0.0 && n > 0).then(|| {
            (
                self.clean_tokens / secs / n as f64,
                self.batches.rate_ci95().map(|c| c / n as f64),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;

    #[test]
    fn the_rate_interval_comes_from_the_batches_spread() {
        let mut b = BatchSums::default();
        // Identical seconds: no spread, a zero-width interval.
        for _ in 0..5 {
            b.add(S / 2, 50.0);
            b.add(S / 2, 50.0);
        }
        assert_eq!(b.n, 5);
        assert!(b.rate_ci95().unwrap().abs() < 1e-9);
        // 90 and 110 tokens in alternate seconds: R = 100, residuals ±10, n = 4,
        // SE = sqrt(400 / (4 × 3 × 1)) = 5.77, half-width 1.96 × SE.
        let mut b = BatchSums::default();
        for t in [90.0, 110.0, 90.0, 110.0] {
            b.add(S, t);
        }
        let want = 1.96 * (400.0f64 / 12.0).sqrt();
        assert!((b.rate_ci95().unwrap() - want).abs() < 1e-9);
        let mut one = BatchSums::default();
        one.add(S, 10.0);
        assert_eq!(one.rate_ci95(), None);
    }
}
