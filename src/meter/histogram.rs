//! A log-bucketed histogram of millisecond values with bounded relative error, small enough to
//! keep one per second per scope.

/// Smallest value with its own bin, in milliseconds (1 µs); smaller values go to bin 0.
pub const MIN_MS: f64 = 1e-3;
/// Largest value with its own bin, in milliseconds (10^5 s); larger values go to the last bin.
pub const MAX_MS: f64 = 1e8;
/// Ratio between the upper and lower edge of every bin: each bin is 1% wide.
pub const BIN_RATIO: f64 = 1.01;

/// Number of bins covering [`MIN_MS`] .. [`MAX_MS`] (ceil(ln(1e11) / ln(1.01)) = 2546).
pub const BIN_COUNT: usize = 2546;

/// The `q`-quantile (0 <= q <= 1) of `sorted` (ascending) by nearest rank: the
/// `ceil(q * len)`-th smallest value (rank at least 1), as [`LogHistogram::percentile`] ranks;
/// `None` when empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// A histogram of non-negative millisecond values in log-spaced bins.
///
/// Bin `i` holds values in `[MIN_MS * 1.01^i, MIN_MS * 1.01^(i+1))`; its representative value is
/// the geometric midpoint `MIN_MS * 1.01^(i + 0.5)`, so any value inside the range is reported
/// within a relative error of `sqrt(1.01) - 1` (< 0.5%, well inside the promised 1%). Values below
/// 1 µs are counted in bin 0, values above 10^5 s in the last bin (their error is unbounded, but
/// such latencies do not occur in practice). Negative and non-finite values are ignored.
///
/// Storage is sparse: a sorted list of `(bin, count)` pairs, so an empty histogram allocates
/// nothing and a second with three finished requests holds three pairs (24 bytes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogHistogram {
    bins: Vec<(u16, u32)>,
    count: u64,
}

/// The bin index of `v` milliseconds, or `None` for negative or non-finite values.
pub fn bin_of(v: f64) -> Option<u16> {
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    if v < MIN_MS {
        return Some(0);
    }
    let i = ((v / MIN_MS).ln() / BIN_RATIO.ln()).floor();
    Some((i as usize).min(BIN_COUNT - 1) as u16)
}

/// The representative value (geometric midpoint) of bin `bin`, in milliseconds.
pub fn bin_value(bin: u16) -> f64 {
    MIN_MS * BIN_RATIO.powf(bin as f64 + 0.5)
}

impl LogHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        LogHistogram::default()
    }

    /// Counts one value (milliseconds); negative or non-finite values are ignored.
    pub fn record(&mut self, v: f64) {
        if let Some(bin) = bin_of(v) {
            self.add_to_bin(bin, 1);
        }
    }

    /// Counts `n` values of `v` milliseconds at once (merging coarser histograms).
    pub fn record_n(&mut self, v: f64, n: u32) {
        if let Some(bin) = bin_of(v) {
            if n > 0 {
                self.add_to_bin(bin, n);
            }
        }
    }

    /// Counts `n` values of ITL bin `itl_bin`'s value ([`crate::itl::bin_value_ms`]), as
    /// `record_n` would, from a table made once: the per-event path counts a gap without a
    /// logarithm and an exponential.
    pub fn record_itl_n(&mut self, itl_bin: usize, n: u32) {
        static ITL_TO_LOG: std::sync::LazyLock<[u16; crate::itl::LOG_BINS]> =
            std::sync::LazyLock::new(|| {
                std::array::from_fn(|i| bin_of(crate::itl::bin_value_ms(i)).unwrap_or(0))
            });
        match ITL_TO_LOG.get(itl_bin) {
            Some(&bin) if n > 0 => self.add_to_bin(bin, n),
            Some(_) => {}
            None => self.record_n(crate::itl::bin_value_ms(itl_bin), n),
        }
    }

    fn add_to_bin(&mut self, bin: u16, n: u32) {
        // Fast path: values mostly arrive into new or recent bins; a sorted insert keeps merges linear.
        match self.bins.binary_search_by_key(&bin, |&(b, _)| b) {
            Ok(i) => self.bins[i].1 = self.bins[i].1.saturating_add(n),
            Err(i) => self.bins.insert(i, (bin, n)),
        }
        self.count += n as u64;
    }

    /// Adds every count of `other` into `self`.
    pub fn merge(&mut self, other: &LogHistogram) {
        if other.bins.is_empty() {
            return;
        }
        if self.bins.is_empty() {
            self.bins.clone_from(&other.bins);
            self.count = other.count;
            return;
        }
        let mut out = Vec::with_capacity(self.bins.len() + other.bins.len());
        let (mut a, mut b) = (self.bins.iter().peekable(), other.bins.iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (Some(&&(ba, ca)), Some(&&(bb, cb))) => {
                    if ba == bb {
                        out.push((ba, ca.saturating_add(cb)));
                        a.next();
                        b.next();
                    } else if ba < bb {
                        out.push((ba, ca));
                        a.next();
                    } else {
                        out.push((bb, cb));
                        b.next();
                    }
                }
                (Some(&&x), None) => {
                    out.push(x);
                    a.next();
                }
                (None, Some(&&x)) => {
                    out.push(x);
                    b.next();
                }
                (None, None) => break,
            }
        }
        self.bins = out;
        self.count += other.count;
    }

    /// Number of values counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `q`-quantile (0 <= q <= 1) by nearest rank: the representative value of the bin holding
    /// the `ceil(q * count)`-th smallest value (rank at least 1). Within 0.5% of the true sample
    /// value for values in range. `None` when empty or `q` is outside [0, 1].
    pub fn percentile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for &(bin, c) in &self.bins {
            seen += c as u64;
            if seen >= rank {
                return Some(bin_value(bin));
            }
        }
        self.bins.last().map(|&(bin, _)| bin_value(bin))
    }

    /// Heap bytes held (for memory accounting in tests and benches).
    pub fn heap_bytes(&self) -> usize {
        self.bins.capacity() * std::mem::size_of::<(u16, u32)>()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_itl_bin_counts_where_its_value_would() {
        for i in 0..crate::itl::LOG_BINS + 2 {
            let (mut by_table, mut by_value) = (LogHistogram::new(), LogHistogram::new());
            by_table.record_itl_n(i, 3);
            by_value.record_n(crate::itl::bin_value_ms(i), 3);
            assert_eq!(by_table, by_value, "ITL bin {i}");
        }
    }

    use super::*;

    #[test]
    fn bin_count_covers_the_range() {
        let needed = ((MAX_MS / MIN_MS).ln() / BIN_RATIO.ln()).ceil() as usize;
        assert_eq!(needed, BIN_COUNT);
        assert_eq!(bin_of(MAX_MS * 0.999), Some((BIN_COUNT - 1) as u16));
        assert_eq!(bin_of(1e12), Some((BIN_COUNT - 1) as u16));
        assert_eq!(bin_of(0.0), Some(0));
        assert_eq!(bin_of(-1.0), None);
        assert_eq!(bin_of(f64::NAN), None);
    }

    #[test]
    fn every_value_in_range_is_within_half_a_percent() {
        let mut v = MIN_MS;
        while v < MAX_MS * 0.99 {
            let rep = bin_value(bin_of(v).unwrap());
            assert!((rep - v).abs() / v <= 0.005 + 1e-9, "v={v} rep={rep}");
            v *= 1.0037;
        }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut h = LogHistogram::new();
        for i in 1..=100 {
            h.record(i as f64);
        }
        assert_eq!(h.count(), 100);
        for (q, want) in [
            (0.5, 50.0),
            (0.9, 90.0),
            (0.99, 99.0),
            (1.0, 100.0),
            (0.0, 1.0),
        ] {
            let got = h.percentile(q).unwrap();
            assert!((got - want).abs() / want <= 0.005, "q={q} got={got}");
        }
        assert_eq!(h.percentile(1.5), None);
        assert_eq!(LogHistogram::new().percentile(0.5), None);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let (mut a, mut b, mut all) = (
            LogHistogram::new(),
            LogHistogram::new(),
            LogHistogram::new(),
        );
        for i in 0..500 {
            let v = (i as f64 * 7.3) % 900.0 + 0.5;
            if i % 3 == 0 {
                a.record(v);
            } else {
                b.record(v);
            }
            all.record(v);
        }
        a.merge(&b);
        assert_eq!(a, all);
        let mut empty = LogHistogram::new();
        empty.merge(&all);
        assert_eq!(empty, all);
    }
}
