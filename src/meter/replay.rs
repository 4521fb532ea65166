//! Rebuilding the per-second timeline from finished records (an access log), for `analyze`.
//!
//! # Order-independent accumulation
//!
//! Records may arrive in any order (several files, overlapping rotations), so nothing here
//! depends on it: every record only *adds* to the seconds it touches ([`SecondAcc`]):
//!
//! * its tokens, by the shared replay attribution rules ([`attribute_record`]);
//! * its start (+1) and end (-1) as level changes: a change exactly on a second's first instant
//!   sets the level carried into that second; a change strictly inside second `s` at `t` counts as
//!   an inside start or end and adds `delta x (end of s - t)` to the second's area.
//!
//! A sweep in time order then gives each second its carried-in level `L` (prefix sum of all
//! earlier changes), its exact time-weighted mean level `L + area_delta / 1 s`, and whether it was
//! steady: **a second is steady at L iff no start or end happened inside it and L > 0** — the
//! same definition as the live meter's "fully covered at one level". For seconds that are not
//! steady the order of events inside the second is unknown, so the minimum and maximum level are
//! reported as bounds: `min >= max(0, L - inside ends)` and `max <= L + inside starts`.
//! Zero-length requests (end == start) change no level, as in a sorted replay.
//!
//! # Per-request mean level
//!
//! The per-request tok/s min/max of the capacity curve files each request under the rounded
//! time-weighted mean level over its life. That needs the finished timeline, so the caller makes a
//! second pass over its records and asks [`ReplayTimeline::request_mean_level`]. The request's own
//! contribution (level 1 over its life) is exact; the others' area is exact over whole seconds and,
//! in the (at most two) partly covered boundary seconds, assumes the others' level was uniform over
//! that second: `others_s = (area_s - own_s) x overlap_s / 1 s`.

mod store;

use std::collections::BTreeMap;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::record::RequestRecord;

use super::capacity::{CapacityAccumulator, CapacityRow, RequestLevel};
use super::timeline::{attribute_record, end_ns, mean_level, second_of, SecondBucket};

pub use store::{SecondAcc, SecondStore};

/// Accumulates generation records, in any order, into per-second sums.
#[derive(Debug, Clone, Default)]
pub struct ReplayAccumulator {
    store: SecondStore,
}

impl ReplayAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        ReplayAccumulator::default()
    }

    /// Adds one generation record (the caller selects which records count).
    pub fn add(&mut self, r: &RequestRecord) {
        let (start, end) = (r.start_ns(), end_ns(r));
        let store = &mut self.store;
        store.at(second_of(start)).requests_started += 1;
        let fin = store.at(second_of(end));
        fin.requests_finished += 1;
        if r.outcome.is_error() {
            fin.errors += 1;
        }
        if end > start {
            store.at(second_of(start)).level_event(start, 1);
            store.at(second_of(end)).level_event(end, -1);
        }
        attribute_record(r, &mut |sec, gen, prompt| {
            let b = store.at(sec);
            b.gen_tokens += gen;
            b.prompt_tokens += prompt;
        });
    }

    /// Adds everything `other` accumulated.
    pub fn merge(&mut self, other: ReplayAccumulator) {
        self.store.merge(other.store);
    }

    /// Heap bytes held (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        self.store.heap_bytes()
    }

    /// Sweeps the seconds in time order into the finished timeline.
    pub fn finish(self) -> ReplayTimeline {
        let mut tl = ReplayTimeline::default();
        let mut level: i64 = 0;
        let mut prev: Option<u64> = None;
        let mut cum: i128 = 0;
        for (sec, acc) in self.store.iter() {
            // Seconds with nothing recorded while requests were running were steady.
            if let (Some(p), true) = (prev, level > 0) {
                for gap in p + 1..sec {
                    let quiet = SecondAcc::default();
                    cum = tl.push(gap, &quiet, level, cum);
                }
            }
            cum = tl.push(sec, acc, level, cum);
            level = tl.seconds.last().map_or(0, |r| r.level_out as i64);
            prev = Some(sec);
        }
        tl
    }
}

/// One second of the finished timeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplaySecond {
    /// The Unix second.
    pub sec: u64,
    /// The second in the shared bucket form; `in_flight_min`/`max` are bounds unless steady.
    pub bucket: SecondBucket,
    /// Level carried into the second (after changes on its first instant).
    pub level_in: u32,
    /// Level at the end of the second.
    pub level_out: u32,
    /// Starts plus ends strictly inside the second (0 for a steady second).
    pub inside_events: u32,
}

/// A maximal run of consecutive seconds steady at one level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SteadyRun {
    /// First second of the run (Unix seconds).
    pub start_sec: u64,
    /// Number of seconds.
    pub seconds: u64,
    /// The level N.
    pub in_flight: u32,
    /// Completion tokens attributed to the run's seconds.
    pub gen_tokens: f64,
}

/// The timeline after the sweep: every active second (level > 0 at some point, or anything
/// attributed to it) in ascending order; absent seconds were idle.
#[derive(Debug, Clone, Default)]
pub struct ReplayTimeline {
    /// The active seconds, ascending.
    pub seconds: Vec<ReplaySecond>,
    /// `cum_area[i]`: level x ns integrated before `seconds[i]` (one more entry at the end).
    cum_area: Vec<i128>,
}

impl ReplayTimeline {
    /// Appends second `sec` with carried level `before`; returns the cumulative area after it.
    fn push(&mut self, sec: u64, acc: &SecondAcc, before: i64, cum: i128) -> i128 {
        let ns = NANOS_PER_SEC as i64;
        let level_in = (before + acc.boundary_delta).max(0);
        let area_ns = (level_in * ns + acc.area_delta_ns).max(0);
        let (starts, ends) = (acc.inside_starts as i64, acc.inside_ends as i64);
        let level_out = (level_in + starts - ends).max(0);
        let lo = (level_in - ends).max(0) as u32;
        let hi = (level_in + starts) as u32;
        let bucket = SecondBucket {
            gen_tokens: acc.gen_tokens,
            prompt_tokens: acc.prompt_tokens,
            requests_started: acc.requests_started,
            requests_finished: acc.requests_finished,
            errors: acc.errors,
            in_flight_min: lo,
            in_flight_max: hi,
            in_flight_area: area_ns as f64 / NANOS_PER_SEC as f64,
            // Exact for steady seconds; for others a bound (fully covered when the level never
            // could reach 0).
            in_flight_covered_ns: if lo > 0 { NANOS_PER_SEC } else { 0 },
            finished: None,
        };
        if self.cum_area.is_empty() {
            self.cum_area.push(cum);
        }
        self.seconds.push(ReplaySecond {
            sec,
            bucket,
            level_in: level_in as u32,
            level_out: level_out as u32,
            inside_events: (starts + ends) as u32,
        });
        let after = cum + area_ns as i128;
        self.cum_area.push(after);
        after
    }

    /// Index of second `sec` among the active seconds.
    fn index_of(&self, sec: u64) -> Option<usize> {
        self.seconds.binary_search_by_key(&sec, |s| s.sec).ok()
    }

    /// Area (level x ns) of second `sec`; 0 for an idle second.
    fn area_of(&self, sec: u64) -> i128 {
        self.index_of(sec)
            .map_or(0, |i| self.cum_area[i + 1] - self.cum_area[i])
    }

    /// Area over the whole seconds `from..to` (exclusive), from the cumulative sums.
    fn area_between(&self, from: u64, to: u64) -> i128 {
        if to <= from {
            return 0;
        }
        let lo = self.seconds.partition_point(|s| s.sec < from);
        let hi = self.seconds.partition_point(|s| s.sec < to);
        self.cum_area[hi] - self.cum_area[lo]
    }

    /// Time-weighted mean in-flight level over `[start, end]` of a request that is part of this
    /// timeline (see the module docs for the boundary-second approximation); `fallback` for a
    /// zero-length request.
    pub fn request_mean_level(&self, start: UnixNanos, end: UnixNanos, fallback: u32) -> f64 {
        if end <= start || self.cum_area.is_empty() {
            return fallback as f64;
        }
        let ns = NANOS_PER_SEC as f64;
        let own = (end - start) as f64;
        let (a, b) = (second_of(start), second_of(end - 1));
        let partial = |sec: u64| {
            let lo = start.max(sec.saturating_mul(NANOS_PER_SEC));
            let hi = end.min((sec + 1).saturating_mul(NANOS_PER_SEC));
            let overlap = hi.saturating_sub(lo) as f64;
            ((self.area_of(sec) as f64 - overlap) * overlap / ns).max(0.0)
        };
        let others = if a == b {
            partial(a)
        } else {
            let whole = self.area_between(a + 1, b) - (b - a - 1) as i128 * NANOS_PER_SEC as i128;
            partial(a) + partial(b) + (whole.max(0) as f64)
        };
        mean_level(0, (own + others) as u128, start, end, fallback)
    }

    /// Maximal runs of at least `min_len` consecutive seconds steady at the same level.
    pub fn steady_runs(&self, min_len: u64) -> Vec<SteadyRun> {
        let mut out = Vec::new();
        let mut cur: Option<SteadyRun> = None;
        for s in &self.seconds {
            let level = s.bucket.steady_level();
            let extends = matches!((&cur, level), (Some(c), Some(n))
                if c.in_flight == n && c.start_sec + c.seconds == s.sec);
            if extends {
                if let Some(c) = cur.as_mut() {
                    c.seconds += 1;
                    c.gen_tokens += s.bucket.gen_tokens;
                }
                continue;
            }
            if let Some(c) = cur.take().filter(|c| c.seconds >= min_len.max(1)) {
                out.push(c);
            }
            cur = level.map(|n| SteadyRun {
                start_sec: s.sec,
                seconds: 1,
                in_flight: n,
                gen_tokens: s.bucket.gen_tokens,
            });
        }
        if let Some(c) = cur.filter(|c| c.seconds >= min_len.max(1)) {
            out.push(c);
        }
        out
    }

    /// Files every steady second into `acc` (other seconds are ignored by the curve).
    pub fn add_seconds_to(&self, acc: &mut CapacityAccumulator) {
        self.seconds.iter().for_each(|s| acc.add_second(&s.bucket));
    }
}

/// Seconds rebuilt from records, plus what the capacity curve needs about each request.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Every second something happened in (absent seconds were idle: level 0, no tokens).
    pub seconds: BTreeMap<u64, SecondBucket>,
    /// One entry per generation record, in order of finish.
    pub requests: Vec<RequestLevel>,
}

impl Timeline {
    /// Replays in-memory generation records (others are skipped) with the same accumulation and
    /// two passes `analyze` uses on files.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a RequestRecord>) -> Timeline {
        let mut records: Vec<&RequestRecord> =
            records.into_iter().filter(|r| r.is_generation()).collect();
        let mut acc = ReplayAccumulator::new();
        records.iter().for_each(|r| acc.add(r));
        let replay = acc.finish();
        records.sort_by_key(|r| end_ns(r));
        let requests = records
            .iter()
            .map(|r| RequestLevel {
                level: replay
                    .request_mean_level(r.start_ns(), end_ns(r), r.in_flight_at_start)
                    .round() as u32,
                tok_s: r.tok_s,
                ttft_ms: r.ttft_ms,
                in_flight_at_start: r.in_flight_at_start,
                cold_start: r.cold_start,
            })
            .collect();
        let seconds = replay
            .seconds
            .into_iter()
            .map(|s| (s.sec, s.bucket))
            .collect();
        Timeline { seconds, requests }
    }

    /// The capacity curve of the replayed timeline.
    pub fn capacity(&self) -> Vec<CapacityRow> {
        super::capacity::capacity_curve(self.seconds.values(), &self.requests)
    }
}
