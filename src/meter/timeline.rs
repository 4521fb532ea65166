//! Per-second accounting shared by the live meter and `analyze`: the bucket of one second, the
//! in-flight integration and the rules that attribute tokens to seconds.
//!
//! # Attribution rules
//!
//! * **Streamed tokens, live**: each delta goes to the second in which its event passed the proxy
//!   (the caller passes the delta with its `now`). This is exact when the upstream sends continuous
//!   usage, otherwise it is one token per content event.
//! * **Reconciliation at finish, live**: the record's final `completion_tokens` minus what was
//!   already attributed (possibly negative) is spread evenly over the decode interval
//!   `[ttft, end]`, or `[start, end]` when TTFT is unknown. `completion_tokens == null` leaves the
//!   attributed count as it is.
//! * **Non-streamed requests** (`stream == false`): completion tokens are spread evenly over the
//!   request's life `[start, end]`.
//! * **Replayed records** (no per-event times): streamed completion tokens are spread over
//!   `[ttft, end]` (`[start, end]` without TTFT), non-streamed over `[start, end]` — the live rules
//!   with nothing attributed beforehand. Records whose `stream` is `null` follow the streamed rule
//!   (they have no TTFT unless they streamed).
//! * **Prompt tokens** go to the second of the TTFT, or the end second when TTFT is unknown.
//! * **Spreading** gives each second a share proportional to its overlap with the interval; a
//!   zero-length interval puts everything in its one second. Only the last [`MAX_SPREAD_SECONDS`]
//!   of an interval receive shares (longer requests lose the earlier shares; none occur in
//!   practice). Tokens are `f64`, so sums are exact to well under 1e-6.
//!
//! # In-flight integration
//!
//! The level changes by +1 at a request's start and -1 at its end. Every second records the
//! minimum, maximum and integral (level x seconds) of the level over the part of the second that
//! was integrated. Level-0 stretches are never reported: the part of a *complete* second that no
//! integration covered was at level 0. A second is *steady at N* when it is complete and the level
//! was N > 0 for all of it (min == max == N, fully covered).

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::record::{Outcome, RequestRecord};

use super::histogram::LogHistogram;

/// Longest stretch (seconds, one day) an interval's tokens are spread over; earlier parts are dropped.
pub const MAX_SPREAD_SECONDS: u64 = 86_400;

/// The second (Unix seconds) a timestamp falls in.
pub fn second_of(ns: UnixNanos) -> u64 {
    ns / NANOS_PER_SEC
}

/// Minimum, sum, maximum and count of a per-request rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateStats {
    /// Smallest value seen (meaningless when `count == 0`).
    pub min: f64,
    /// Sum of values seen.
    pub sum: f64,
    /// Largest value seen (meaningless when `count == 0`).
    pub max: f64,
    /// Number of values seen.
    pub count: u64,
}

impl RateStats {
    /// Adds one value; non-finite values are ignored.
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.sum += v;
        self.count += 1;
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &RateStats) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
        self.count += other.count;
    }

    /// The mean, `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// Stats of the requests that finished in one second (boxed in [`SecondBucket`]: most seconds of
/// most scopes have none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinishedStats {
    /// `tok_s` of each finished request that had one.
    pub tok_s: RateStats,
    /// TTFT of each request whose first token passed in this second (a streamed request's, as
    /// vLLM observes it), or, for one without a token event (non-streamed), that finished in it;
    /// ms.
    pub ttft_ms: LogHistogram,
    /// TPOT of each finished request that had one, ms.
    pub tpot_ms: LogHistogram,
    /// End-to-end latency of each finished request that had one, ms.
    pub e2e_ms: LogHistogram,
    /// Every ITL gap that passed in this second (a streamed request's, as vLLM observes them),
    /// or of a request whose gaps were not reported live that finished in it; ms, each at its
    /// log bin's representative value.
    pub itl_ms: LogHistogram,
}

impl FinishedStats {
    /// Adds the per-request figures of `record`; its TTFT and its ITL gaps only when they were
    /// not counted as they passed (`ttft_live`, `itl_live`).
    pub fn add_record(&mut self, record: &RequestRecord, (ttft_live, itl_live): (bool, bool)) {
        if let Some(v) = record.tok_s {
            self.tok_s.add(v);
        }
        if let Some(v) = record.ttft_ms.filter(|_| !ttft_live) {
            self.ttft_ms.record(v);
        }
        if let Some(v) = record.tpot_ms {
            self.tpot_ms.record(v);
        }
        if let Some(v) = record.e2e_ms {
            self.e2e_ms.record(v);
        }
        if let Some(itl) = record.itl.as_ref().filter(|_| !itl_live) {
            for (bin, n) in itl.bins() {
                self.itl_ms.record_itl_n(bin, n);
            }
        }
    }

    /// Adds everything in `other`.
    pub fn merge(&mut self, other: &FinishedStats) {
        self.tok_s.merge(&other.tok_s);
        self.ttft_ms.merge(&other.ttft_ms);
        self.tpot_ms.merge(&other.tpot_ms);
        self.e2e_ms.merge(&other.e2e_ms);
        self.itl_ms.merge(&other.itl_ms);
    }
}

/// Everything accounted to one second of one scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SecondBucket {
    /// Completion tokens attributed to this second (see the module's attribution rules).
    pub gen_tokens: f64,
    /// Prompt tokens attributed to this second.
    pub prompt_tokens: f64,
    /// Requests that started in this second.
    pub requests_started: u32,
    /// Requests that finished in this second.
    pub requests_finished: u32,
    /// Finished requests whose outcome counts as an error of the box (`Outcome::is_error`).
    pub errors: u32,
    /// Finished requests refused for the client's own fault (`client_error`).
    pub client_errors: u32,
    /// Lowest in-flight level over the integrated part of the second.
    pub in_flight_min: u32,
    /// Highest in-flight level over the integrated part of the second.
    pub in_flight_max: u32,
    /// Integral of the in-flight level over the second, level x seconds.
    pub in_flight_area: f64,
    /// Nanoseconds of this second covered by a level > 0.
    pub in_flight_covered_ns: u64,
    /// Per-request stats of the requests that finished in this second.
    pub finished: Option<Box<FinishedStats>>,
}

impl SecondBucket {
    /// Records that the level was `level` (> 0) for `covered_ns` nanoseconds of this second.
    pub fn observe_level(&mut self, level: u32, covered_ns: u64) {
        if covered_ns == 0 {
            return;
        }
        if self.in_flight_covered_ns == 0 {
            self.in_flight_min = level;
            self.in_flight_max = level;
        } else {
            self.in_flight_min = self.in_flight_min.min(level);
            self.in_flight_max = self.in_flight_max.max(level);
        }
        self.in_flight_area += level as f64 * covered_ns as f64 / NANOS_PER_SEC as f64;
        self.in_flight_covered_ns = (self.in_flight_covered_ns + covered_ns).min(NANOS_PER_SEC);
    }

    /// (min, max, mean) of the level over this second, assuming it is complete (uncovered parts
    /// were at level 0, so mean = area / 1 s).
    pub fn in_flight_complete(&self) -> (u32, u32, f64) {
        let min = if self.in_flight_covered_ns < NANOS_PER_SEC {
            0
        } else {
            self.in_flight_min
        };
        (min, self.in_flight_max, self.in_flight_area)
    }

    /// `Some(N)` when this (complete) second was steady at N > 0: fully covered at one level.
    pub fn steady_level(&self) -> Option<u32> {
        let (min, max, _) = self.in_flight_complete();
        (min == max && min > 0).then_some(min)
    }

    /// Counts a TTFT observed at a request's first token, in this second (`docs/measurement.md`).
    pub fn add_first_token(&mut self, ttft_ms: f64) {
        self.finished
            .get_or_insert_with(Default::default)
            .ttft_ms
            .record(ttft_ms);
    }

    /// Counts ITL gaps that passed in this second, at their bin's value (as the request's own
    /// histogram holds them).
    pub fn add_gaps(&mut self, gaps: crate::itl::Gaps) {
        self.finished
            .get_or_insert_with(Default::default)
            .itl_ms
            .record_itl_n(usize::from(gaps.bin), gaps.count);
    }

    /// Counts a finished request and its per-request figures into this second; `live`: its
    /// TTFT, and its ITL gaps, were counted as they passed ([`SecondBucket::add_first_token`],
    /// [`SecondBucket::add_gaps`]).
    pub fn add_finished(&mut self, record: &RequestRecord, live: (bool, bool)) {
        self.requests_finished += 1;
        if record.outcome.is_error() {
            self.errors += 1;
        }
        if record.outcome == Outcome::ClientError {
            self.client_errors += 1;
        }
        self.finished
            .get_or_insert_with(Default::default)
            .add_record(record, live);
    }
}

/// Spreads `amount` over `[from, to]` in proportion to each second's overlap, calling
/// `sink(second, share)`; seconds before `floor_sec` are skipped (their share is dropped).
pub fn spread(
    from: UnixNanos,
    to: UnixNanos,
    amount: f64,
    floor_sec: u64,
    sink: &mut impl FnMut(u64, f64),
) {
    if amount == 0.0 || !amount.is_finite() {
        return;
    }
    if to <= from {
        let sec = second_of(from);
        if sec >= floor_sec {
            sink(sec, amount);
        }
        return;
    }
    let len = (to - from) as f64;
    let (first, last) = (second_of(from), second_of(to - 1));
    let lo = first
        .max(floor_sec)
        .max(last.saturating_sub(MAX_SPREAD_SECONDS - 1));
    let whole = lo == first;
    let mut given = 0.0;
    for sec in lo..=last {
        let a = from.max(sec * NANOS_PER_SEC);
        let b = to.min((sec + 1).saturating_mul(NANOS_PER_SEC));
        // The last second takes the remainder so an unclipped spread sums exactly to `amount`.
        let share = if sec == last && whole {
            amount - given
        } else {
            amount * (b - a) as f64 / len
        };
        given += share;
        sink(sec, share);
    }
}

/// Nanoseconds of a millisecond figure; negative and non-finite values count as 0.
fn ms_to_ns(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1e6).round() as u64
    } else {
        0
    }
}

/// A record's end (arrival + e2e, or arrival when e2e is unknown), saturating on corrupt input.
pub fn end_ns(record: &RequestRecord) -> UnixNanos {
    record
        .ts_ns
        .saturating_add(record.e2e_ms.map_or(0, ms_to_ns))
}

/// A record's TTFT instant when known, saturating on corrupt input.
pub fn ttft_ns(record: &RequestRecord) -> Option<UnixNanos> {
    record
        .ttft_ms
        .map(|ms| record.ts_ns.saturating_add(ms_to_ns(ms)))
}

/// The interval a finished request's (remaining) completion tokens are spread over, ending at `end`.
pub fn generation_interval(record: &RequestRecord, end: UnixNanos) -> (UnixNanos, UnixNanos) {
    let start = record.start_ns().min(end);
    let from = if record.stream == Some(false) {
        start
    } else {
        ttft_ns(record).unwrap_or(start)
    };
    (from.clamp(start, end), end)
}

/// The instant prompt tokens are attributed to: the TTFT, else `end`.
pub fn prompt_instant(record: &RequestRecord, end: UnixNanos) -> UnixNanos {
    ttft_ns(record).map(|t| t.min(end)).unwrap_or(end)
}

/// Attributes a finished request's tokens given that `already_attributed` completion tokens went
/// to seconds live; `end` is the finish time. Calls `sink(second, gen, prompt)`.
pub fn attribute_finish(
    record: &RequestRecord,
    already_attributed: f64,
    end: UnixNanos,
    floor_sec: u64,
    sink: &mut impl FnMut(u64, f64, f64),
) {
    if let Some(total) = record.completion_tokens {
        let (from, to) = generation_interval(record, end);
        spread(
            from,
            to,
            total as f64 - already_attributed,
            floor_sec,
            &mut |s, g| sink(s, g, 0.0),
        );
    }
    if let Some(p) = record.prompt_tokens {
        let sec = second_of(prompt_instant(record, end));
        if p > 0 && sec >= floor_sec {
            sink(sec, 0.0, p as f64);
        }
    }
}

/// Attributes a record replayed from a log (no per-event times): `sink(second, gen, prompt)`.
pub fn attribute_record(record: &RequestRecord, sink: &mut impl FnMut(u64, f64, f64)) {
    attribute_finish(record, 0.0, end_ns(record), 0, sink);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_stays_small() {
        // 1,000 users x 3,600 busy seconds x (8-byte key + bucket) must stay in the low hundreds of MB.
        assert!(
            std::mem::size_of::<SecondBucket>() <= 64,
            "{}",
            std::mem::size_of::<SecondBucket>()
        );
    }
}
