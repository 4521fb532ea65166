//! A sparse ring of 1-second buckets: only seconds that saw something are stored, in order.

use std::collections::VecDeque;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::scrape::crosscheck::{pro_rata, ProxyTokens};

use super::timeline::SecondBucket;

/// Seconds of one scope, sorted by second, oldest first; absent seconds were idle.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    buckets: VecDeque<(u64, SecondBucket)>,
}

impl Ring {
    /// An empty ring.
    pub fn new() -> Self {
        Ring::default()
    }

    /// The bucket of `sec`, created when absent (appending is O(1); inserting an older second
    /// than the newest one is a binary search plus a shift, which only late events cause).
    pub fn bucket_mut(&mut self, sec: u64) -> &mut SecondBucket {
        let idx = match self.buckets.back() {
            Some(&(last, _)) if last == sec => self.buckets.len() - 1,
            Some(&(last, _)) if last > sec => {
                match self.buckets.binary_search_by_key(&sec, |(s, _)| *s) {
                    Ok(i) => i,
                    Err(i) => {
                        self.buckets.insert(i, (sec, SecondBucket::default()));
                        i
                    }
                }
            }
            _ => {
                self.buckets.push_back((sec, SecondBucket::default()));
                self.buckets.len() - 1
            }
        };
        &mut self.buckets[idx].1
    }

    /// Removes seconds before `min_sec`.
    pub fn evict_before(&mut self, min_sec: u64) {
        while self.buckets.front().is_some_and(|(s, _)| *s < min_sec) {
            self.buckets.pop_front();
        }
    }

    /// The stored seconds in `[from, to)`, oldest first.
    pub fn range(&self, from: u64, to: u64) -> impl Iterator<Item = &(u64, SecondBucket)> {
        let start = self.buckets.partition_point(|(s, _)| *s < from);
        self.buckets
            .range(start..)
            .take_while(move |(s, _)| *s < to)
    }

    /// Number of stored seconds.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no second is stored.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// Completion tokens of `ring` attributed to `[t0, t1]`, each second weighted by its overlap.
pub fn proxy_tokens(ring: &Ring, t0: UnixNanos, t1: UnixNanos) -> f64 {
    let (a, b) = (t0 / NANOS_PER_SEC, t1.div_ceil(NANOS_PER_SEC));
    pro_rata(ring.range(a, b).map(|(s, b)| (*s, b.gen_tokens)), t0, t1)
}

impl ProxyTokens for Ring {
    fn proxy_tokens(&self, t0: UnixNanos, t1: UnixNanos) -> f64 {
        proxy_tokens(self, t0, t1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_seconds_sorted_and_evicts_old_ones() {
        let mut r = Ring::new();
        r.bucket_mut(10).gen_tokens = 1.0;
        r.bucket_mut(12).gen_tokens = 2.0;
        r.bucket_mut(11).gen_tokens = 3.0;
        r.bucket_mut(12).gen_tokens += 1.0;
        let secs: Vec<_> = r.range(0, 100).map(|(s, b)| (*s, b.gen_tokens)).collect();
        assert_eq!(secs, vec![(10, 1.0), (11, 3.0), (12, 3.0)]);
        assert_eq!(r.range(11, 12).count(), 1);
        r.evict_before(12);
        assert_eq!(r.len(), 1);
    }
}
