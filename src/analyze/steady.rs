//! analyze's tolerant steady seconds: the live windows' `steady` definition applied to each second
//! of the log. A second is steady at N when its time-weighted median in-flight level N is > 0 and
//! the time-weighted mean |level − N| over it is at most `steady_tolerance_pct` % of N.
//!
//! The per-second buckets of the first pass cannot tell this: they do not depend on the order of
//! events inside a second, so they know each second's mean level but not how its time spread over
//! levels. The second pass replays arrivals and ends in time order (for the production-traffic
//! curve), and that exact step function is fed here ([`SecondMixes::change`]).
//!
//! A run of consecutive seconds steady at the same N is steady over its whole length by the live
//! definition too: each second has at least half its time at or below N and at least half at or
//! above, so the run has, and the run's mean |level − N| is the mean of its seconds'.

use std::collections::BTreeMap;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::meter::level_time::level_mix;

/// How one second's time spread over levels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecondMix {
    /// Time-weighted median level over the second (0 when idle half of it or more).
    pub median: u32,
    /// Time-weighted mean |level − median| over the second, requests.
    pub deviation: f64,
}

impl SecondMix {
    /// N when the second is steady at N under `tolerance_pct`.
    pub fn steady_level(&self, tolerance_pct: f64) -> Option<u32> {
        (self.median > 0 && self.deviation <= tolerance_pct / 100.0 * self.median as f64)
            .then_some(self.median)
    }
}

/// Builds every second's [`SecondMix`] from the in-flight level's changes, fed in time order.
#[derive(Debug, Clone, Default)]
pub struct SecondMixes {
    level: u32,
    since: UnixNanos,
    sec: u64,
    /// Nanoseconds at each level > 0 in second `sec` so far.
    by_level: BTreeMap<u32, u64>,
    mixes: BTreeMap<u64, SecondMix>,
}

impl SecondMixes {
    /// Nothing seen: level 0.
    pub fn new() -> Self {
        SecondMixes::default()
    }

    /// The level is `level` from `t` on (`t` never before an earlier change).
    pub fn change(&mut self, t: UnixNanos, level: u32) {
        self.run_to(t);
        self.level = level;
    }

    /// Accounts `[since, to)` at the current level.
    fn run_to(&mut self, to: UnixNanos) {
        if to <= self.since {
            return;
        }
        if self.level == 0 {
            // Idle time adds nothing but the idle share, which the mix derives from the rest.
            self.since = to;
            return;
        }
        while self.since < to {
            let sec = self.since / NANOS_PER_SEC;
            if sec != self.sec {
                self.close_second();
                self.sec = sec;
            }
            // Saturating: the last second of the u64 range ends at u64::MAX, not past it.
            let end = to.min((sec + 1).saturating_mul(NANOS_PER_SEC));
            *self.by_level.entry(self.level).or_insert(0) += end - self.since;
            self.since = end;
        }
    }

    fn close_second(&mut self) {
        if self.by_level.is_empty() {
            return;
        }
        if let Some(m) = level_mix(&self.by_level, NANOS_PER_SEC) {
            self.mixes.insert(
                self.sec,
                SecondMix {
                    median: m.median,
                    deviation: m.deviation,
                },
            );
        }
        self.by_level.clear();
    }

    /// Every second with time at a level > 0, by Unix second (the level is 0 after the last
    /// change fed).
    pub fn finish(mut self) -> BTreeMap<u64, SecondMix> {
        self.close_second();
        self.mixes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;
    const MS: u64 = 1_000_000;

    #[test]
    fn hand_overs_keep_a_second_steady_and_an_empty_slot_does_not() {
        let mut m = SecondMixes::new();
        m.change(10 * S, 16);
        // Second 11: a request ends and its successor arrives 20 ms later.
        m.change(11 * S + 300 * MS, 15);
        m.change(11 * S + 320 * MS, 16);
        // Second 12: a slot stays empty for 400 ms.
        m.change(12 * S + 100 * MS, 15);
        m.change(12 * S + 500 * MS, 16);
        m.change(13 * S + 500 * MS, 0);
        let mixes = m.finish();
        assert_eq!(mixes[&10].steady_level(5.0), Some(16));
        let s11 = mixes[&11];
        assert_eq!(s11.median, 16);
        assert!((s11.deviation - 0.02).abs() < 1e-9);
        assert_eq!(s11.steady_level(5.0), Some(16));
        // 0.4 of a request off for the second: 2.5 % of 16, steady at 5 %, not at 2 %.
        assert_eq!(mixes[&12].steady_level(5.0), Some(16));
        assert_eq!(mixes[&12].steady_level(2.0), None);
        // Half the second idle: the time-weighted median ties and takes the lower level, 0.
        assert_eq!(mixes[&13].median, 0);
        assert_eq!(mixes[&13].steady_level(5.0), None);
        assert!(!mixes.contains_key(&14));
    }
}
