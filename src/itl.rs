//! One request's inter-token latencies (ITL) as `vllm bench serve` defines them: one sample per
//! gap between two consecutive events that carry generated output. Kept in a fixed-size histogram
//! inside the request's tracker, so the per-event path neither allocates nor grows.

/// vLLM's bucket bounds for `vllm:inter_token_latency_seconds`, in seconds (as its `/metrics`
/// shows them): the one table in [`crate::exposition`], so the two compare bucket for bucket.
pub use crate::exposition::ITL_BUCKETS as VLLM_ITL_BOUNDS_S;

/// Lower edge of log bin 1, in nanoseconds (0.25 ms); shorter gaps fall into bin 0.
const FIRST_EDGE_NS: f64 = 250_000.0;
/// Log bins per doubling: each bin is 2^(1/8) = 9.05 % wide, so its geometric midpoint is within
/// 4.4 % of any value inside it.
const BINS_PER_OCTAVE: f64 = 8.0;
/// Number of log bins: 0.25 ms · 2^(127/8) ≈ 15 s; longer gaps fall into the last bin.
pub const LOG_BINS: usize = 128;

/// A request's ITL samples: exact count, sum and maximum; quantiles from log bins; counts per
/// vLLM bucket for Prometheus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItlHistogram {
    count: u32,
    sum_ns: u64,
    max_ns: u64,
    bins: [u32; LOG_BINS],
    /// Samples at or below each of [`VLLM_ITL_BOUNDS_S`] but above the previous bound; the last
    /// entry counts those above 80 s.
    vllm: [u32; VLLM_ITL_BOUNDS_S.len() + 1],
}

impl Default for ItlHistogram {
    fn default() -> Self {
        ItlHistogram {
            count: 0,
            sum_ns: 0,
            max_ns: 0,
            bins: [0; LOG_BINS],
            vllm: [0; VLLM_ITL_BOUNDS_S.len() + 1],
        }
    }
}

/// The log bin of a gap of `ns` nanoseconds.
fn bin_of(ns: u64) -> usize {
    let ns = ns as f64;
    if ns < FIRST_EDGE_NS {
        return 0;
    }
    let i = ((ns / FIRST_EDGE_NS).log2() * BINS_PER_OCTAVE).floor() as usize + 1;
    i.min(LOG_BINS - 1)
}

/// The representative value of log bin `i` in milliseconds: its geometric midpoint (bin 0: half
/// its upper edge).
pub fn bin_value_ms(i: usize) -> f64 {
    if i == 0 {
        return FIRST_EDGE_NS / 2e6;
    }
    FIRST_EDGE_NS / 1e6 * ((i as f64 - 0.5) / BINS_PER_OCTAVE).exp2()
}

/// The vLLM bucket of a gap of `ns` nanoseconds: its index in [`VLLM_ITL_BOUNDS_S`] (`le`), or
/// the bounds' length above the last.
fn vllm_bucket_of(ns: u64) -> usize {
    let s = ns as f64 / 1e9;
    VLLM_ITL_BOUNDS_S.partition_point(|&bound| bound < s)
}

/// One ITL gap with its log bin and vLLM bucket, found once: the tracker's histogram and the
/// token run both place it, and finding a bin takes a logarithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The gap, nanoseconds.
    pub ns: u64,
    bin: u8,
    bucket: u8,
}

impl Gap {
    /// A gap of `ns` nanoseconds.
    pub fn of(ns: u64) -> Gap {
        Gap {
            ns,
            bin: bin_of(ns) as u8,
            bucket: vllm_bucket_of(ns) as u8,
        }
    }
}

/// Gaps that passed together in one token report to the meter, all in one log bin and one vLLM
/// bucket, so the meter observes them as the request's own histogram holds them: the live ITL
/// (`docs/monitoring.md`). Fixed size: the per-event path neither allocates nor grows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Number of gaps.
    pub count: u32,
    /// Their sum, nanoseconds.
    pub sum_ns: u64,
    /// Their log bin (see [`bin_value_ms`]).
    pub bin: u8,
    /// Their vLLM bucket: index in [`VLLM_ITL_BOUNDS_S`], its length above the last bound.
    pub bucket: u8,
}

impl Gaps {
    /// One gap (none for `None`).
    pub fn of(gap: Option<Gap>) -> Gaps {
        let mut g = Gaps::default();
        if let Some(gap) = gap {
            g.add(gap);
        }
        g
    }

    /// Whether `gap` may join these: none yet, or the same bin and bucket.
    pub fn fits(&self, gap: Gap) -> bool {
        self.count == 0 || (gap.bin == self.bin && gap.bucket == self.bucket)
    }

    /// Adds `gap` (call [`Gaps::fits`] first: its bin and bucket replace these otherwise).
    pub fn add(&mut self, gap: Gap) {
        self.bin = gap.bin;
        self.bucket = gap.bucket;
        self.count = self.count.saturating_add(1);
        self.sum_ns = self.sum_ns.saturating_add(gap.ns);
    }
}

impl ItlHistogram {
    /// Counts one gap of `ns` nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.record_gap(Gap::of(ns));
    }

    /// Counts one gap whose bin and bucket are already found.
    #[inline]
    pub fn record_gap(&mut self, gap: Gap) {
        self.count = self.count.saturating_add(1);
        self.sum_ns = self.sum_ns.saturating_add(gap.ns);
        self.max_ns = self.max_ns.max(gap.ns);
        let b = usize::from(gap.bin);
        self.bins[b] = self.bins[b].saturating_add(1);
        let v = usize::from(gap.bucket);
        self.vllm[v] = self.vllm[v].saturating_add(1);
    }

    /// Number of gaps.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Mean gap, ms; `None` without gaps.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64 / 1e6)
    }

    /// Largest gap, ms (exact); `None` without gaps.
    pub fn max_ms(&self) -> Option<f64> {
        (self.count > 0).then(|| self.max_ns as f64 / 1e6)
    }

    /// The `q` quantile (0..=1) in ms: the representative value of the bin holding the sample of
    /// rank ceil(q · count), capped at the exact maximum; `None` without gaps.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count as u64);
        let mut seen = 0u64;
        for (i, &c) in self.bins.iter().enumerate() {
            seen += c as u64;
            if seen >= rank {
                return Some(bin_value_ms(i).min(self.max_ms().unwrap_or(f64::MAX)));
            }
        }
        self.max_ms()
    }

    /// Non-empty log bins as (bin, count), for merging into wider histograms.
    pub fn bins(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.bins
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i, c))
    }

    /// Samples per vLLM bucket (not cumulative): entry `i` counts gaps in
    /// (`VLLM_ITL_BOUNDS_S[i-1]`, `VLLM_ITL_BOUNDS_S[i]`], the last entry those above 80 s.
    pub fn vllm_buckets(&self) -> &[u32; VLLM_ITL_BOUNDS_S.len() + 1] {
        &self.vllm
    }

    /// Sum of all gaps, seconds.
    pub fn sum_s(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_moments_and_bounded_quantiles() {
        let mut h = ItlHistogram::default();
        assert_eq!(
            (h.mean_ms(), h.quantile_ms(0.5), h.max_ms()),
            (None, None, None)
        );
        // 1..=100 ms.
        for ms in 1..=100u64 {
            h.record(ms * 1_000_000);
        }
        assert_eq!(h.count(), 100);
        assert!((h.mean_ms().unwrap() - 50.5).abs() < 1e-9);
        assert_eq!(h.max_ms(), Some(100.0));
        for (q, exact) in [(0.5, 50.0), (0.99, 99.0), (0.01, 1.0)] {
            let got = h.quantile_ms(q).unwrap();
            assert!((got / exact - 1.0).abs() < 0.045, "q {q}: {got} vs {exact}");
        }
        assert_eq!(
            h.quantile_ms(1.0),
            Some(100.0f64.min(h.quantile_ms(1.0).unwrap()))
        );
    }

    #[test]
    fn every_bin_value_lies_inside_its_bin() {
        for ms in [0.3, 1.0, 4.9, 17.0, 250.0, 3_000.0, 14_000.0] {
            let ns = (ms * 1e6) as u64;
            let v = bin_value_ms(bin_of(ns));
            assert!((v / ms - 1.0).abs() < 0.045, "{ms} -> {v}");
        }
        assert_eq!(bin_of(0), 0);
        assert_eq!(bin_of(u64::MAX), LOG_BINS - 1);
    }

    #[test]
    fn vllm_buckets_use_le_bounds() {
        let mut h = ItlHistogram::default();
        h.record(10_000_000); // exactly 0.01 s: le="0.01"
        h.record(10_000_001); // just above: le="0.025"
        h.record(100_000_000_000); // 100 s: +Inf only
        let b = h.vllm_buckets();
        assert_eq!((b[0], b[1], b[VLLM_ITL_BOUNDS_S.len()]), (1, 1, 1));
        assert_eq!(b.iter().sum::<u32>(), 3);
    }
}
