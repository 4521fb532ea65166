//! Time spent at each in-flight level, per second, so windows can report the share of their time
//! at each level (a second at one level costs one entry; only seconds with a level > 0 are kept).

use std::collections::{BTreeMap, VecDeque};

use crate::clock::NANOS_PER_SEC;

/// `(second, level, ns)` runs in time order; consecutive reports of the same second and level
/// are merged.
#[derive(Debug, Clone, Default)]
pub struct LevelTime {
    runs: VecDeque<(u64, u32, u32)>,
}

impl LevelTime {
    /// The level was `level` (> 0) for `ns` nanoseconds of second `sec`.
    pub fn observe(&mut self, sec: u64, level: u32, ns: u64) {
        if ns == 0 || level == 0 {
            return;
        }
        let ns = ns.min(NANOS_PER_SEC) as u32;
        // Reports come in time order, but a level can recur within one second: look back a few.
        for r in self.runs.iter_mut().rev().take(4) {
            if r.0 != sec {
                break;
            }
            if r.1 == level {
                r.2 = (r.2 + ns).min(NANOS_PER_SEC as u32);
                return;
            }
        }
        self.runs.push_back((sec, level, ns));
    }

    /// Forgets seconds before `min_sec`.
    pub fn evict_before(&mut self, min_sec: u64) {
        while self.runs.front().is_some_and(|r| r.0 < min_sec) {
            self.runs.pop_front();
        }
    }

    /// Nanoseconds at each level > 0 over seconds `[from, to)`.
    pub fn ns_by_level(&self, from: u64, to: u64) -> BTreeMap<u32, u64> {
        let start = self.runs.partition_point(|r| r.0 < from);
        let mut out = BTreeMap::new();
        for r in self.runs.range(start..).take_while(|r| r.0 < to) {
            *out.entry(r.1).or_insert(0) += r.2 as u64;
        }
        out
    }
}

/// How a window's time spread over levels: shares, the time-weighted median level and the mean
/// absolute deviation from it.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelMix {
    /// Share of the window's time at each level (level 0 included when there was idle time).
    pub shares: BTreeMap<u32, f64>,
    /// The time-weighted median level: half the time at or below it, half at or above.
    pub median: u32,
    /// Time-weighted mean of |level - median|, requests.
    pub deviation: f64,
}

/// The mix of a window of `window_ns` given the time at each level > 0 (the rest was level 0).
pub fn level_mix(by_level: &BTreeMap<u32, u64>, window_ns: u64) -> Option<LevelMix> {
    if window_ns == 0 {
        return None;
    }
    let busy: u64 = by_level.values().sum();
    let idle = window_ns.saturating_sub(busy);
    let total = (busy + idle) as f64;
    let mut all: Vec<(u32, u64)> = Vec::with_capacity(by_level.len() + 1);
    if idle > 0 {
        all.push((0, idle));
    }
    all.extend(by_level.iter().map(|(&l, &ns)| (l, ns)));
    let mut acc = 0u64;
    let mut median = 0;
    for &(l, ns) in &all {
        acc += ns;
        if acc as f64 >= total / 2.0 {
            median = l;
            break;
        }
    }
    let deviation = all
        .iter()
        .map(|&(l, ns)| (l as f64 - median as f64).abs() * ns as f64)
        .sum::<f64>()
        / total;
    let shares = all.iter().map(|&(l, ns)| (l, ns as f64 / total)).collect();
    Some(LevelMix {
        shares,
        median,
        deviation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_median_and_deviation() {
        let mut t = LevelTime::default();
        for sec in 0..10 {
            t.observe(sec, 16, 900_000_000);
            t.observe(sec, 15, 100_000_000);
        }
        t.observe(3, 16, 0);
        let by = t.ns_by_level(0, 10);
        assert_eq!(by[&16], 9_000_000_000);
        let m = level_mix(&by, 10 * NANOS_PER_SEC).unwrap();
        assert_eq!(m.median, 16);
        assert!((m.deviation - 0.1).abs() < 1e-9);
        assert!((m.shares[&15] - 0.1).abs() < 1e-9);
        assert!(!m.shares.contains_key(&0));
        t.evict_before(5);
        assert_eq!(t.ns_by_level(0, 10)[&15], 500_000_000);
        let idle = level_mix(&t.ns_by_level(0, 10), 20 * NANOS_PER_SEC).unwrap();
        assert_eq!(idle.median, 0);
        assert!((idle.shares[&0] - 0.75).abs() < 1e-9);
    }
}
