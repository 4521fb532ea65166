//! A distribution of durations in bounded memory, and its summary: count, mean, nearest-rank
//! p50/p90/p99 from a log histogram (bins 1 % wide, the value reported within 0.5 %) and the
//! exact maximum. One definition for the sessions' wait per turn and the prefix audit's TTFT,
//! live (`/stats`) and offline (`analyze`), so the two give the same figures from the same values.

use serde::Serialize;

use super::histogram::LogHistogram;

/// Count, mean, nearest-rank percentiles (within 0.5 %) and the maximum of a set of values, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Values.
    pub count: u64,
    /// Their mean.
    pub mean_ms: Option<f64>,
    /// Nearest-rank median (the value at rank ⌈0.5·n⌉, within 0.5 %).
    pub p50_ms: Option<f64>,
    /// 90th.
    pub p90_ms: Option<f64>,
    /// 99th.
    pub p99_ms: Option<f64>,
    /// The largest (exact).
    pub max_ms: Option<f64>,
}

/// Values kept in bounded memory: a log histogram, their sum and maximum.
#[derive(Debug, Clone, Default)]
pub struct SpreadAcc {
    hist: LogHistogram,
    sum: f64,
    max: Option<f64>,
}

impl SpreadAcc {
    /// Adds one value, ms (ignored unless finite and ≥ 0).
    pub fn add(&mut self, v: f64) {
        if !(v.is_finite() && v >= 0.0) {
            return;
        }
        self.hist.record(v);
        self.sum += v;
        self.max = Some(self.max.map_or(v, |m| m.max(v)));
    }

    /// Adds another's values.
    pub fn merge(&mut self, o: &SpreadAcc) {
        self.hist.merge(&o.hist);
        self.sum += o.sum;
        self.max = match (self.max, o.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// The summary.
    pub fn spread(&self) -> Spread {
        let n = self.hist.count();
        Spread {
            count: n,
            mean_ms: (n > 0).then(|| self.sum / n as f64),
            p50_ms: self.hist.percentile(0.5),
            p90_ms: self.hist.percentile(0.9),
            p99_ms: self.hist.percentile(0.99),
            max_ms: self.max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_within_half_a_percent() {
        let mut a = SpreadAcc::default();
        for v in 1..=100 {
            a.add(f64::from(v));
        }
        a.add(f64::NAN);
        a.add(-1.0);
        let s = a.spread();
        assert_eq!(
            (s.count, s.mean_ms, s.max_ms),
            (100, Some(50.5), Some(100.0))
        );
        for (got, want) in [(s.p50_ms, 50.0), (s.p90_ms, 90.0), (s.p99_ms, 99.0)] {
            let got = got.unwrap();
            assert!((got / want - 1.0).abs() <= 0.005, "{got} vs {want}");
        }
        assert_eq!(SpreadAcc::default().spread().p50_ms, None);
        let mut b = SpreadAcc::default();
        b.add(7.0);
        let mut c = SpreadAcc::default();
        c.merge(&b);
        assert_eq!(c.spread().max_ms, Some(7.0));
    }
}
