//! In-flight integration: the level over time, reported per second (see the rules in
//! [`super::timeline`]).

use crate::clock::{UnixNanos, NANOS_PER_SEC};

use super::timeline::{second_of, MAX_SPREAD_SECONDS};

/// Integrates the in-flight level over time.
#[derive(Debug, Clone, Default)]
pub struct InFlightIntegrator {
    level: u32,
    last_ns: Option<UnixNanos>,
    area_ns: u128,
}

impl InFlightIntegrator {
    /// A level-0 integrator.
    pub fn new() -> Self {
        InFlightIntegrator::default()
    }

    /// The current level.
    pub fn level(&self) -> u32 {
        self.level
    }

    /// Integral of the level since the first event, in level x nanoseconds.
    pub fn area_ns(&self) -> u128 {
        self.area_ns
    }

    /// Integrates up to `to`, reporting `sink(second, level, covered_ns)` for every second (from
    /// `floor_sec` on) that had a level > 0. Time never goes back: an earlier `to` is a no-op.
    pub fn advance(&mut self, to: UnixNanos, floor_sec: u64, sink: &mut impl FnMut(u64, u32, u64)) {
        let from = match self.last_ns {
            Some(t) if t < to => t,
            Some(_) => return,
            None => {
                self.last_ns = Some(to);
                return;
            }
        };
        self.last_ns = Some(to);
        if self.level == 0 {
            return;
        }
        self.area_ns += self.level as u128 * (to - from) as u128;
        // Per-second reports cover at most the last MAX_SPREAD_SECONDS of one step (only a
        // corrupt record keeps a request open that long); the area stays exact.
        let recent = to.saturating_sub(MAX_SPREAD_SECONDS * NANOS_PER_SEC);
        let mut t = from
            .max(floor_sec.saturating_mul(NANOS_PER_SEC))
            .max(recent);
        while t < to {
            let sec = second_of(t);
            let seg_end = to.min((sec + 1).saturating_mul(NANOS_PER_SEC));
            sink(sec, self.level, seg_end - t);
            t = seg_end;
        }
    }

    /// Advances to `now` and then changes the level by `delta` (saturating at 0).
    pub fn change(
        &mut self,
        now: UnixNanos,
        delta: i32,
        floor_sec: u64,
        sink: &mut impl FnMut(u64, u32, u64),
    ) {
        self.advance(now, floor_sec, sink);
        self.level = self.level.saturating_add_signed(delta);
    }
}

/// Time-weighted mean level between two integrator readings, or `fallback` for an empty interval.
pub fn mean_level(
    area_start: u128,
    area_end: u128,
    start: UnixNanos,
    end: UnixNanos,
    fallback: u32,
) -> f64 {
    if end <= start {
        return fallback as f64;
    }
    area_end.saturating_sub(area_start) as f64 / (end - start) as f64
}
