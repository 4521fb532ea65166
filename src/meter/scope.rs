//! One accounting scope (the aggregate, a user or a model): its seconds, its in-flight level and
//! its totals since it appeared.

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::clock::UnixNanos;
use crate::record::{Outcome, RequestRecord};

use super::inflight::InFlightIntegrator;
use super::level_time::LevelTime;
use super::ring::Ring;
use super::timeline::{attribute_finish, second_of};

/// Finished requests per outcome; serialized as an object with every outcome's name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeCounts(pub [u64; Outcome::ALL.len()]);

impl OutcomeCounts {
    /// Counts one request of outcome `o`.
    pub fn add(&mut self, o: Outcome) {
        if let Some(i) = Outcome::ALL.iter().position(|x| *x == o) {
            self.0[i] += 1;
        }
    }

    /// The count for outcome `o`.
    pub fn get(&self, o: Outcome) -> u64 {
        Outcome::ALL
            .iter()
            .position(|x| *x == o)
            .map_or(0, |i| self.0[i])
    }
}

impl Serialize for OutcomeCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(Outcome::ALL.len()))?;
        for (o, n) in Outcome::ALL.iter().zip(self.0) {
            m.serialize_entry(o.as_str(), &n)?;
        }
        m.end()
    }
}

/// Counts since the scope appeared (the aggregate: since the meter started).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Totals {
    /// Generation requests started.
    pub requests_started: u64,
    /// Generation requests finished.
    pub requests: u64,
    /// Finished requests by outcome.
    pub outcomes: OutcomeCounts,
    /// Finished requests whose outcome is an error (`Outcome::is_error`).
    pub errors: u64,
    /// Sum of `prompt_tokens` of finished requests (unknown counts add nothing).
    pub prompt_tokens: u64,
    /// Sum of `completion_tokens` of finished requests (unknown counts add nothing).
    pub completion_tokens: u64,
    /// Finished requests flagged as cold starts.
    pub cold_starts: u64,
}

/// The seconds, level and totals of one scope.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// 1-second buckets within the horizon.
    pub ring: Ring,
    /// In-flight level of this scope.
    pub in_flight: InFlightIntegrator,
    /// Time at each level per second (window shares), within the horizon.
    pub level_time: LevelTime,
    /// Counts since the scope appeared.
    pub totals: Totals,
    /// Time of the last start or finish in this scope.
    pub last_event_ns: UnixNanos,
    /// Contexts of its finished requests within the horizon.
    pub contexts: super::kv::ContextSizes,
}

impl Scope {
    /// A scope whose in-flight integration starts at `now`.
    pub fn new(now: UnixNanos) -> Self {
        let mut s = Scope {
            last_event_ns: now,
            ..Default::default()
        };
        s.advance(now, 0);
        s
    }

    /// Integrates the in-flight level up to `now` into the buckets from `floor_sec` on.
    pub fn advance(&mut self, now: UnixNanos, floor_sec: u64) {
        let (ring, lt) = (&mut self.ring, &mut self.level_time);
        self.in_flight
            .advance(now, floor_sec, &mut |sec, level, ns| {
                ring.bucket_mut(sec).observe_level(level, ns);
                lt.observe(sec, level, ns);
            });
    }

    fn change_level(&mut self, now: UnixNanos, delta: i32, floor_sec: u64) {
        let (ring, lt) = (&mut self.ring, &mut self.level_time);
        self.in_flight
            .change(now, delta, floor_sec, &mut |sec, level, ns| {
                ring.bucket_mut(sec).observe_level(level, ns);
                lt.observe(sec, level, ns);
            });
    }

    /// Forgets seconds before `min_sec`.
    pub fn evict_before(&mut self, min_sec: u64) {
        self.ring.evict_before(min_sec);
        self.level_time.evict_before(min_sec);
        self.contexts.evict_before(min_sec);
    }

    /// A request started at `now`.
    pub fn start(&mut self, now: UnixNanos, floor_sec: u64) {
        self.change_level(now, 1, floor_sec);
        self.ring.bucket_mut(second_of(now)).requests_started += 1;
        self.totals.requests_started += 1;
        self.last_event_ns = self.last_event_ns.max(now);
    }

    /// `delta` completion tokens passed the proxy at `now`.
    pub fn tokens(&mut self, now: UnixNanos, delta: f64, floor_sec: u64) {
        let sec = second_of(now);
        if sec >= floor_sec {
            self.ring.bucket_mut(sec).gen_tokens += delta;
        }
    }

    /// A request's first token passed at `now`, `ttft_ms` after its start: its TTFT counts in
    /// this second.
    pub fn first_token(&mut self, now: UnixNanos, ttft_ms: f64, floor_sec: u64) {
        let sec = second_of(now);
        if sec >= floor_sec {
            self.ring.bucket_mut(sec).add_first_token(ttft_ms);
        }
    }

    /// ITL `gaps` passed at `now`: they count in this second.
    pub fn gaps(&mut self, now: UnixNanos, gaps: crate::itl::Gaps, floor_sec: u64) {
        let sec = second_of(now);
        if sec >= floor_sec {
            self.ring.bucket_mut(sec).add_gaps(gaps);
        }
    }

    /// A request finished at `now`; `attributed` tokens went to seconds live, `was_started`
    /// says whether its start was seen (only then does the level drop), `ttft_live` and
    /// `itl_live` whether its TTFT and ITL gaps were counted as they passed
    /// ([`Scope::first_token`], [`Scope::gaps`]).
    pub fn finish(
        &mut self,
        now: UnixNanos,
        record: &RequestRecord,
        attributed: f64,
        (was_started, ttft_live, itl_live): (bool, bool, bool),
        floor_sec: u64,
    ) {
        if was_started {
            self.change_level(now, -1, floor_sec);
        } else {
            self.advance(now, floor_sec);
        }
        let ring = &mut self.ring;
        attribute_finish(
            record,
            attributed,
            now,
            floor_sec,
            &mut |sec, gen, prompt| {
                let b = ring.bucket_mut(sec);
                b.gen_tokens += gen;
                b.prompt_tokens += prompt;
            },
        );
        if second_of(now) >= floor_sec {
            self.ring
                .bucket_mut(second_of(now))
                .add_finished(record, (ttft_live, itl_live));
        }
        let t = &mut self.totals;
        t.requests += 1;
        t.outcomes.add(record.outcome);
        t.errors += record.outcome.is_error() as u64;
        t.prompt_tokens += record.prompt_tokens.unwrap_or(0);
        t.completion_tokens += record.completion_tokens.unwrap_or(0);
        t.cold_starts += record.cold_start as u64;
        self.contexts.add(now, record);
        self.last_event_ns = self.last_event_ns.max(now);
    }
}
