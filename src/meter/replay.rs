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
//! steady: **a second is steady at L iff L > 0 and no start or end happened inside it** — the
//! same definition as the live meter's "fully covered at one level". Starts and ends at the same
//! nanosecond that cancel out (one request ending as the next begins) change the level for no
//! time, so they do not count; an order-independent check sum ([`SecondAcc::net_check`]) detects
//! them. For seconds that are not steady the order of events inside the second is unknown, so
//! the minimum and maximum level are reported as bounds: `min >= max(0, L - inside ends)` and
//! `max <= L + inside starts`.
//! Zero-length requests (end == start) change no level, as in a sorted replay.
//!
//! # Per-request mean level
//!
//! The per-request tok/s min/max of the capacity curve files each request under the rounded
//! time-weighted mean level over its life, which depends on the order of events inside seconds.
//! [`LevelSweep`] computes it exactly with the shared [`InFlightIntegrator`] and [`mean_level`]:
//! requests are fed in arrival order (the caller sorts them, e.g. by an external merge of sorted
//! runs), ends are replayed before a start at the same instant, and only the requests in flight
//! are held (memory follows the concurrency, not the number of requests).

mod store;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::record::RequestRecord;

use super::capacity::{CapacityAccumulator, CapacityRow, RequestLevel};
use super::inflight::{mean_level, InFlightIntegrator};
use super::timeline::{attribute_record, end_ns, second_of, SecondBucket, MAX_SPREAD_SECONDS};

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
        if r.outcome == crate::record::Outcome::ClientError {
            fin.client_errors += 1;
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
        for (sec, acc) in self.store.iter() {
            // Seconds with nothing recorded while requests were running were steady.
            if let (Some(p), true) = (prev, level > 0) {
                // Like the integrator, report at most the last MAX_SPREAD_SECONDS of a stretch
                // (only a corrupt record keeps requests open that long).
                for gap in (p + 1).max(sec.saturating_sub(MAX_SPREAD_SECONDS))..sec {
                    let quiet = SecondAcc::default();
                    tl.push(gap, &quiet, level);
                }
            }
            tl.push(sec, acc, level);
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
    /// Sum of the run's seconds' in-flight integrals (request-seconds).
    pub in_flight_area: f64,
}

/// The timeline after the sweep: every active second (level > 0 at some point, or anything
/// attributed to it) in ascending order; absent seconds were idle.
#[derive(Debug, Clone, Default)]
pub struct ReplayTimeline {
    /// The active seconds, ascending.
    pub seconds: Vec<ReplaySecond>,
}

impl ReplayTimeline {
    /// Appends second `sec` with carried level `before`.
    fn push(&mut self, sec: u64, acc: &SecondAcc, before: i64) {
        let ns = NANOS_PER_SEC as i64;
        let level_in = (before + acc.boundary_delta).max(0);
        let area_ns = (level_in * ns + acc.area_delta_ns).max(0);
        let (starts, ends) = (acc.inside_starts as i64, acc.inside_ends as i64);
        let level_out = (level_in + starts - ends).max(0);
        // Changes that cancel at the same instant leave the level constant (the sorted replay and
        // the live meter see a zero-length dip that covers no time).
        let constant = starts == ends && acc.net_check == 0;
        let (lo, hi) = if constant {
            (level_in as u32, level_in as u32)
        } else {
            ((level_in - ends).max(0) as u32, (level_in + starts) as u32)
        };
        let bucket = SecondBucket {
            gen_tokens: acc.gen_tokens,
            prompt_tokens: acc.prompt_tokens,
            requests_started: acc.requests_started,
            requests_finished: acc.requests_finished,
            errors: acc.errors,
            client_errors: acc.client_errors,
            in_flight_min: lo,
            in_flight_max: hi,
            in_flight_area: area_ns as f64 / NANOS_PER_SEC as f64,
            // Exact for steady seconds; for others a bound (fully covered when the level never
            // could reach 0).
            in_flight_covered_ns: if lo > 0 { NANOS_PER_SEC } else { 0 },
            finished: None,
        };
        self.seconds.push(ReplaySecond {
            sec,
            bucket,
            level_in: level_in as u32,
            level_out: level_out as u32,
            inside_events: (starts + ends) as u32,
        });
    }

    /// Maximal runs of at least `min_len` consecutive seconds steady at the same level.
    pub fn steady_runs(&self, min_len: u64) -> Vec<SteadyRun> {
        self.runs_by(min_len, |s| s.bucket.steady_level())
    }

    /// Maximal runs of at least `min_len` consecutive seconds at the same level by `level`
    /// (`None`: the second is not steady).
    pub fn runs_by(
        &self,
        min_len: u64,
        level: impl Fn(&ReplaySecond) -> Option<u32>,
    ) -> Vec<SteadyRun> {
        let mut out = Vec::new();
        let mut cur: Option<SteadyRun> = None;
        for s in &self.seconds {
            let level = level(s);
            let extends = matches!((&cur, level), (Some(c), Some(n))
                if c.in_flight == n && c.start_sec + c.seconds == s.sec);
            if extends {
                if let Some(c) = cur.as_mut() {
                    c.seconds += 1;
                    c.gen_tokens += s.bucket.gen_tokens;
                    c.in_flight_area += s.bucket.in_flight_area;
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
                in_flight_area: s.bucket.in_flight_area,
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
        records.sort_by_key(|r| r.start_ns());
        let mut requests = Vec::with_capacity(records.len());
        let mut sweep = LevelSweep::new();
        let mut visit = |r: &RequestRecord, mean: f64| {
            requests.push((
                end_ns(r),
                RequestLevel {
                    level: mean.round() as u32,
                    tok_s: r.tok_s,
                    ttft_ms: r.ttft_ms,
                    in_flight_at_start: r.in_flight_at_start,
                    cold_start: r.cold_start,
                },
            ));
        };
        for r in &records {
            sweep.push(
                r.start_ns(),
                end_ns(r),
                r.in_flight_at_start,
                *r,
                &mut visit,
            );
        }
        sweep.finish(&mut visit);
        requests.sort_by_key(|(end, _)| *end);
        let requests = requests.into_iter().map(|(_, l)| l).collect();
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

/// A request in flight during a [`LevelSweep`].
#[derive(Debug)]
struct Open<T> {
    end: UnixNanos,
    seq: u64,
    start: UnixNanos,
    area_start: u128,
    fallback: u32,
    payload: T,
}

impl<T> PartialEq for Open<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.end, self.seq) == (other.end, other.seq)
    }
}
impl<T> Eq for Open<T> {}
impl<T> PartialOrd for Open<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Open<T> {
    /// Reversed, so the max-heap pops the earliest end first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.end, other.seq).cmp(&(self.end, self.seq))
    }
}

/// Exact time-weighted mean in-flight level of every request over its life, from requests fed in
/// arrival order; holds only the requests in flight.
#[derive(Debug)]
pub struct LevelSweep<T> {
    integrator: InFlightIntegrator,
    open: BinaryHeap<Open<T>>,
    seq: u64,
}

impl<T> Default for LevelSweep<T> {
    fn default() -> Self {
        LevelSweep {
            integrator: InFlightIntegrator::new(),
            open: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<T> LevelSweep<T> {
    /// An empty sweep.
    pub fn new() -> Self {
        LevelSweep::default()
    }

    /// Replays every end at or before `t`, reporting each finished request.
    fn close_until(&mut self, t: UnixNanos, visit: &mut impl FnMut(T, f64)) {
        while self.open.peek().is_some_and(|o| o.end <= t) {
            let Some(o) = self.open.pop() else { break };
            self.integrator.change(o.end, -1, 0, &mut |_, _, _| {});
            let mean = mean_level(
                o.area_start,
                self.integrator.area_ns(),
                o.start,
                o.end,
                o.fallback,
            );
            visit(o.payload, mean);
        }
    }

    /// Feeds the next request (arrivals must not decrease); `visit(payload, mean level)` is called
    /// for every request as soon as its level is known. A zero-length request changes no level and
    /// gets `fallback`.
    pub fn push(
        &mut self,
        start: UnixNanos,
        end: UnixNanos,
        fallback: u32,
        payload: T,
        visit: &mut impl FnMut(T, f64),
    ) {
        self.close_until(start, visit);
        if end <= start {
            visit(payload, fallback as f64);
            return;
        }
        self.integrator.change(start, 1, 0, &mut |_, _, _| {});
        self.seq += 1;
        self.open.push(Open {
            end,
            seq: self.seq,
            start,
            area_start: self.integrator.area_ns(),
            fallback,
            payload,
        });
    }

    /// Replays the remaining ends.
    pub fn finish(mut self, visit: &mut impl FnMut(T, f64)) {
        self.close_until(UnixNanos::MAX, visit);
    }
}
