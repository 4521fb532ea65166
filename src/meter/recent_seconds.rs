//! `/stats/timeline`: the aggregate's last seconds, one value per complete second, for the
//! dashboard's rate-and-concurrency plot. Columns rather than objects: 3,600 seconds stay small.

use serde::Serialize;

use crate::clock::UnixNanos;

use super::engine::Meter;
use super::timeline::second_of;

/// The last complete seconds of the aggregate, oldest first; second `i` starts at
/// `from_s + i` (Unix seconds). Seconds in which nothing was in flight and nothing was
/// attributed are zeros.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// Unix second of the first entry.
    pub from_s: u64,
    /// Completion tokens attributed to each second (= tok/s over that second).
    pub gen_tok_s: Vec<f64>,
    /// Time-weighted mean in-flight level over each second.
    pub in_flight_mean: Vec<f64>,
    /// Lowest in-flight level in each second.
    pub in_flight_min: Vec<u32>,
    /// Highest in-flight level in each second.
    pub in_flight_max: Vec<u32>,
    /// Whether the level held at one value N > 0 for the whole second (a steady second, the
    /// kind the capacity curve files under N).
    pub steady: Vec<bool>,
    /// The saturation state over the shortest window ending with each second: 0 ok, 1
    /// queueing, 2 preempting, `null` unknown (`windows.*.saturation`, `docs/kv-cache.md`).
    pub saturation: Vec<Option<u8>>,
}

impl Meter {
    /// The last `seconds` complete seconds at `now` (fewer while the meter is younger, never
    /// beyond the horizon).
    pub fn timeline(&mut self, now: UnixNanos, seconds: u64) -> Timeline {
        self.tick(now);
        let now_sec = second_of(now);
        let floor = self.floor(now_sec);
        self.aggregate.advance(now, floor);
        let earliest = second_of(self.origin).max(floor);
        let from = now_sec.saturating_sub(seconds).max(earliest);
        let n = now_sec.saturating_sub(from) as usize;
        let mut t = Timeline {
            from_s: from,
            gen_tok_s: vec![0.0; n],
            in_flight_mean: vec![0.0; n],
            in_flight_min: vec![0; n],
            in_flight_max: vec![0; n],
            steady: vec![false; n],
            saturation: vec![None; n],
        };
        for (sec, b) in self.aggregate.ring.range(from, now_sec) {
            let i = (sec - from) as usize;
            let (min, max, mean) = b.in_flight_complete();
            t.gen_tok_s[i] = b.gen_tokens;
            t.in_flight_mean[i] = mean;
            t.in_flight_min[i] = min;
            t.in_flight_max[i] = max;
            t.steady[i] = b.steady_level().is_some();
        }
        if let Some(len) = self.config.windows_s.iter().min().copied() {
            for (i, sec) in (from..now_sec).enumerate() {
                t.saturation[i] = self
                    .saturation_window(sec + 1, len)
                    .state
                    .map(super::saturation::SaturationState::level);
            }
        }
        t
    }
}
