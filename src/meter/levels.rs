//! Level attribution: throughput per in-flight level from all the time spent at each level, not
//! only from seconds in which the level never changed. Shared by the live meter and `analyze`.
//!
//! # The method
//!
//! * The in-flight level is a step function of time. Every change (an arrival, a departure) and
//!   every guard boundary starts a new *segment*: a stretch of time at one level, either guarded
//!   or clean.
//! * Tokens are spread over the time that produced them and credited to the segments they
//!   overlap, in proportion to the overlap: live, each streamed event's tokens over the gap since
//!   the same request's previous event (the decode steps that made them), so bursts of events
//!   arriving together do not favour the segment they land in; a finished request's remainder
//!   (final usage minus what was seen) over its decode interval; a record replayed from a log
//!   (no per-event times) over its whole decode interval `[TTFT, end]`.
//! * **The guard.** An arrival opens a guard that lasts until the newcomer's first token: that is
//!   the newcomer's queueing and prefill, during which the engine runs one fewer sequence than
//!   the proxy counts and its prefill step stalls everyone's decode. A request that has passed no
//!   token after the cap (a non-streamed one, whose tokens the proxy sees only at the end) closes
//!   its guard then. The cap is `guard_max_ns`, or twice the longest of the last
//!   [`RECENT_TTFTS`] first-token delays seen when that is longer. A capped request whose first
//!   token does come later (a streamed one with a long prefill, e.g. a burst of arrivals that
//!   the engine prefills in one step) makes the time from the cap to that token guarded after
//!   all: that time is not final yet (see below), so nothing reported ever counted it as clean.
//!   Without this, the start of a run, where all agents arrive at once and wait seconds for
//!   their joint prefill, put seconds without a single token into the top level's clean time.
//!   `guard_extra_ns` (default 0) extends the guard after the first token and opens one after
//!   each departure. Time under any guard is *guarded*; the rest is *clean*.
//! * Per level N: clean seconds, the tokens credited to them, the aggregate rate
//!   `clean tokens / clean seconds`, and (to measure the guard's effect) the same over all the
//!   time at N, guarded included.
//! * Per level N also the streamed sequences' own pace ([`LevelSums::pace`]): the tokens of the
//!   requests past a first token over their sequence-seconds of clean time. A non-streamed
//!   request's tokens are spread evenly over its life, guarded stalls included, so
//!   `clean tokens / clean s` reads low when a share of the traffic is non-streamed.
//!
//! A segment is final once no request can still credit tokens to it: it ended before every open
//! request's spreading start (its previous event, or its arrival before the first one). Then its
//! time and tokens join the per-level sums. The live history holds the segments since then (at
//! most [`MAX_SEGMENTS`]; a remainder that would reach further back is credited to the oldest
//! segment kept, so tokens are never lost).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::clock::{UnixNanos, NANOS_PER_SEC};

use super::id_hash::{IdMap, IdSet};

pub use super::level_batches::LevelSums;
pub use super::production_rows::{
    production_rows, ProductionPerRequest, ProductionRow, RequestFiguresAt,
};

/// First-token delays remembered for the guard's cap.
pub const RECENT_TTFTS: usize = 64;

/// Most segments kept unfinalized; beyond that the oldest are finalized early.
pub const MAX_SEGMENTS: usize = 200_000;

/// How long guards last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardConfig {
    /// An arrival's guard closes at this age when no token of the newcomer has passed, ns (at
    /// least; see the module's guard rule).
    pub guard_max_ns: u64,
    /// Added after the newcomer's first token, and opened after each departure, ns.
    pub guard_extra_ns: u64,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            guard_max_ns: NANOS_PER_SEC,
            guard_extra_ns: 0,
        }
    }
}

/// A guard opened by an arrival, closed by [`LevelAttribution::first_token`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuardKey(u64);

#[derive(Debug, Clone, Copy)]
struct Segment {
    start: UnixNanos,
    end: UnixNanos,
    level: u32,
    guarded: bool,
    tokens: f64,
    /// Requests in flight whose tokens the proxy sees as they are made (past a first token).
    seen: u32,
    /// Tokens of those requests credited here.
    seen_tokens: f64,
}

/// The attribution of one scope's tokens to its in-flight levels.
#[derive(Debug, Clone)]
pub struct LevelAttribution {
    cfg: GuardConfig,
    level: u32,
    /// Segments not yet final, oldest first; the last one is open (its `end` is the latest time seen).
    history: VecDeque<Segment>,
    /// Guards opened by arrivals and not yet closed.
    open_guards: IdSet,
    /// Arrival times of requests whose first token has not passed (their guard may be closed).
    arrivals: IdMap<UnixNanos>,
    /// Requests of `arrivals` whose guard the cap closed, with the time it closed: their first
    /// token, if it comes, makes the time since then guarded.
    capped: IdMap<UnixNanos>,
    /// The last first-token delays, ns.
    recent_ttft: VecDeque<u64>,
    /// Deadlines: (when, key); key 0 is an anonymous extra guard.
    deadlines: BinaryHeap<Reverse<(UnixNanos, u64)>>,
    /// Anonymous extra guards running.
    extra_guards: u32,
    next_key: u64,
    now: UnixNanos,
    sums: BTreeMap<u32, LevelSums>,
}

impl LevelAttribution {
    /// An attribution at level 0 whose time starts at `origin`.
    pub fn new(cfg: GuardConfig, origin: UnixNanos) -> Self {
        let mut history = VecDeque::new();
        history.push_back(Segment {
            start: origin,
            end: origin,
            level: 0,
            guarded: false,
            tokens: 0.0,
            seen: 0,
            seen_tokens: 0.0,
        });
        LevelAttribution {
            cfg,
            level: 0,
            history,
            open_guards: IdSet::default(),
            arrivals: IdMap::default(),
            capped: IdMap::default(),
            recent_ttft: VecDeque::new(),
            deadlines: BinaryHeap::new(),
            extra_guards: 0,
            next_key: 1,
            now: origin,
            sums: BTreeMap::new(),
        }
    }

    fn guarded(&self) -> bool {
        !self.open_guards.is_empty() || self.extra_guards > 0
    }

    /// Extends the open segment to `t` and starts a new one there with the current state.
    fn split(&mut self, t: UnixNanos) {
        let guarded = self.guarded();
        let level = self.level;
        // In flight and past a first token: every request in flight but those awaiting one.
        let seen = level.saturating_sub(self.arrivals.len() as u32);
        if let Some(last) = self.history.back_mut() {
            last.end = last.end.max(t);
            if last.start >= t {
                // An empty segment takes the new state instead of leaving a zero-length one.
                last.level = level;
                last.guarded = guarded;
                last.seen = seen;
                return;
            }
        }
        self.history.push_back(Segment {
            start: t,
            end: t,
            level,
            guarded,
            tokens: 0.0,
            seen,
            seen_tokens: 0.0,
        });
        if self.history.len() > MAX_SEGMENTS {
            self.finalize_front();
        }
    }

    /// Moves time to `now` (never backwards), closing guards whose deadline passed.
    pub fn advance(&mut self, now: UnixNanos) {
        while let Some(&Reverse((t, key))) = self.deadlines.peek() {
            if t > now {
                break;
            }
            self.deadlines.pop();
            let closes = if key == 0 {
                self.extra_guards = self.extra_guards.saturating_sub(1);
                true
            } else {
                self.open_guards.remove(&key)
            };
            if closes {
                let t = t.max(self.now);
                self.now = t;
                self.split(t);
                if key != 0 && self.arrivals.contains_key(&key) {
                    self.capped.insert(key, t);
                }
            }
        }
        if now > self.now {
            self.now = now;
            if let Some(last) = self.history.back_mut() {
                last.end = last.end.max(now);
            }
        }
    }

    fn extra_guard(&mut self, now: UnixNanos) {
        if self.cfg.guard_extra_ns > 0 {
            self.extra_guards += 1;
            self.deadlines
                .push(Reverse((now.saturating_add(self.cfg.guard_extra_ns), 0)));
        }
    }

    /// An arrival at `now`: the level rises and a guard opens until [`Self::first_token`].
    pub fn arrive(&mut self, now: UnixNanos) -> GuardKey {
        self.advance(now);
        let key = self.next_key;
        self.next_key += 1;
        self.level += 1;
        self.open_guards.insert(key);
        self.arrivals.insert(key, now);
        let longest = self.recent_ttft.iter().max().copied().unwrap_or(0);
        let cap = self.cfg.guard_max_ns.max(longest.saturating_mul(2));
        self.deadlines.push(Reverse((now.saturating_add(cap), key)));
        self.split(self.now);
        GuardKey(key)
    }

    /// The newcomer of `key` passed its first token at `now`: its guard closes (plus the extra).
    pub fn first_token(&mut self, now: UnixNanos, key: GuardKey) {
        self.advance(now);
        if let Some(arrival) = self.arrivals.remove(&key.0) {
            if self.recent_ttft.len() == RECENT_TTFTS {
                self.recent_ttft.pop_front();
            }
            self.recent_ttft.push_back(now.saturating_sub(arrival));
            self.split(self.now);
        }
        if let Some(closed) = self.capped.remove(&key.0) {
            self.guard_since(closed);
            self.extra_guard(self.now);
            self.split(self.now);
        }
        if self.open_guards.remove(&key.0) {
            self.extra_guard(self.now);
            self.split(self.now);
        }
    }

    /// Marks the time from `since` (a segment boundary: the cap's close) to now guarded. None of
    /// it is final: finalization waits for every open request's first token.
    fn guard_since(&mut self, since: UnixNanos) {
        for s in self.history.iter_mut().rev() {
            if s.start < since {
                break;
            }
            s.guarded = true;
        }
    }

    /// A departure at `now` of the request of `key`: the level drops (its guard, if still open,
    /// closes).
    pub fn depart(&mut self, now: UnixNanos, key: GuardKey) {
        self.advance(now);
        self.open_guards.remove(&key.0);
        self.arrivals.remove(&key.0);
        self.capped.remove(&key.0);
        self.level = self.level.saturating_sub(1);
        self.extra_guard(self.now);
        self.split(self.now);
    }

    /// Credits `amount` tokens of the request of `key`, produced over `[from, to]`, to the
    /// segments it overlaps (`to` at most the latest time seen). A zero-length interval credits
    /// the segment holding `to`.
    pub fn tokens(&mut self, key: GuardKey, from: UnixNanos, to: UnixNanos, amount: f64) {
        if amount == 0.0 || !amount.is_finite() || self.history.is_empty() {
            return;
        }
        // Past its first token: no longer awaiting one.
        let seen = !self.arrivals.contains_key(&key.0);
        let oldest = self.history.front().map_or(0, |s| s.start);
        let to = to.min(self.now).max(oldest);
        let from = from.clamp(oldest, to);
        if to == from {
            let idx = self
                .history
                .iter()
                .rposition(|s| s.start <= to)
                .unwrap_or(0);
            self.history[idx].tokens += amount;
            if seen {
                self.history[idx].seen_tokens += amount;
            }
            return;
        }
        let len = (to - from) as f64;
        for s in self.history.iter_mut().rev() {
            if s.end <= from {
                break;
            }
            let a = s.start.max(from);
            let b = s.end.min(to);
            if b > a {
                let share = amount * (b - a) as f64 / len;
                s.tokens += share;
                if seen {
                    s.seen_tokens += share;
                }
            }
        }
    }

    fn finalize_front(&mut self) {
        if let Some(s) = self.history.pop_front() {
            if s.level > 0 {
                let e = self.sums.entry(s.level).or_default();
                let ns = s.end.saturating_sub(s.start);
                if s.guarded {
                    e.guard_ns += ns;
                    e.guard_tokens += s.tokens;
                } else {
                    e.clean_ns += ns;
                    e.clean_tokens += s.tokens;
                    e.batches.add(ns, s.tokens);
                    let seq_s = ns as f64 * f64::from(s.seen) / NANOS_PER_SEC as f64;
                    e.seen_seq_s += seq_s;
                    e.seen_tokens += s.seen_tokens;
                    e.seen_batches.add_weighted(ns, seq_s, s.seen_tokens);
                }
            }
        }
    }

    /// Finalizes every segment that ended at or before `before` (no request can still credit
    /// tokens to it); the open segment is never finalized.
    pub fn finalize_before(&mut self, before: UnixNanos) {
        while self.history.len() > 1 && self.history.front().is_some_and(|s| s.end <= before) {
            self.finalize_front();
        }
    }

    /// The current level.
    pub fn level(&self) -> u32 {
        self.level
    }

    /// The final per-level sums, by level.
    pub fn sums(&self) -> &BTreeMap<u32, LevelSums> {
        &self.sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::summary::Percentiles;

    const S: u64 = NANOS_PER_SEC;
    const MS: u64 = 1_000_000;

    #[test]
    fn clean_time_and_guard_are_split_at_the_first_token() {
        let mut a = LevelAttribution::new(GuardConfig::default(), 0);
        let k1 = a.arrive(0);
        a.first_token(100 * MS, k1);
        // 10 tokens per second, spread over the gaps that produced them.
        for i in 1..=20u64 {
            let t = 100 * MS + i * 100 * MS;
            a.tokens(k1, t - 100 * MS, t, 1.0);
        }
        a.depart(2100 * MS, k1);
        a.advance(3 * S);
        a.finalize_before(3 * S);
        let s = a.sums()[&1];
        assert_eq!(s.guard_ns, 100 * MS);
        assert_eq!(s.clean_ns, 2000 * MS);
        assert!((s.clean_tokens - 20.0).abs() < 1e-9);
        assert_eq!(s.guard_tokens, 0.0);
    }

    #[test]
    fn the_pace_counts_only_sequences_whose_tokens_were_placed() {
        let mut a = LevelAttribution::new(GuardConfig::default(), 0);
        let k1 = a.arrive(0);
        a.first_token(0, k1);
        let k2 = a.arrive(0);
        a.advance(S);
        // k2 (non-streamed) is spread over 1..3 s; k1 made 10 tokens a second.
        a.advance(3 * S);
        a.tokens(k1, S, 3 * S, 20.0);
        a.tokens(k2, S, 3 * S, 12.0);
        a.depart(3 * S, k1);
        a.depart(3 * S, k2);
        a.finalize_before(3 * S);
        let s = a.sums()[&2];
        assert_eq!(s.clean_ns, 2 * S);
        assert!((s.seen_seq_s - 2.0).abs() < 1e-9);
        let (pace, _) = s.pace(2, 0.5).unwrap();
        assert!((pace - 10.0).abs() < 1e-9, "{pace}");
    }

    #[test]
    fn spread_tokens_follow_the_level_they_were_made_at() {
        let mut a = LevelAttribution::new(GuardConfig::default(), 0);
        let k1 = a.arrive(0);
        a.first_token(0, k1);
        let k2 = a.arrive(S);
        a.first_token(S, k2);
        a.advance(2 * S);
        // Request 1's tokens over [0, 2 s]: half at level 1, half at level 2.
        a.tokens(k1, 0, 2 * S, 10.0);
        a.depart(2 * S, k1);
        a.depart(2 * S, k2);
        a.finalize_before(2 * S);
        assert!((a.sums()[&1].clean_tokens - 5.0).abs() < 1e-9);
        assert!((a.sums()[&2].clean_tokens - 5.0).abs() < 1e-9);
        assert_eq!(a.sums()[&2].clean_ns, S);
    }

    #[test]
    fn a_request_without_tokens_closes_its_guard_at_the_cap() {
        let cfg = GuardConfig {
            guard_max_ns: 300 * MS,
            guard_extra_ns: 50 * MS,
        };
        let mut a = LevelAttribution::new(cfg, 0);
        let k = a.arrive(0);
        a.advance(S);
        a.depart(S, k);
        a.advance(2 * S);
        a.finalize_before(2 * S);
        let s = a.sums()[&1];
        assert_eq!(s.guard_ns, 300 * MS);
        assert_eq!(s.clean_ns, 700 * MS);
    }

    #[test]
    fn the_cap_follows_slow_first_tokens() {
        let mut a = LevelAttribution::new(GuardConfig::default(), 0);
        let k = a.arrive(0);
        a.first_token(1500 * MS, k);
        a.depart(2 * S, k);
        // The first guard closed at the 1 s cap, and its first token at 1.5 s made the time
        // since guarded; the next request passes no token, and its guard lasts twice the 1.5 s
        // first-token delay seen.
        let k = a.arrive(10 * S);
        a.advance(20 * S);
        a.depart(20 * S, k);
        a.advance(21 * S);
        a.finalize_before(21 * S);
        assert_eq!(a.sums()[&1].guard_ns, 1500 * MS + 3 * S);
    }

    #[test]
    fn a_first_token_after_the_cap_guards_the_time_since_the_cap() {
        // Two requests arrive together and wait 2.5 s for their joint prefill (a cold burst):
        // the cap closes both guards at 1 s, their first tokens at 2.5 s take that back.
        let mut a = LevelAttribution::new(GuardConfig::default(), 0);
        let k1 = a.arrive(0);
        let k2 = a.arrive(0);
        a.advance(1200 * MS);
        a.first_token(2500 * MS, k1);
        a.first_token(2500 * MS, k2);
        a.tokens(k1, 0, 2500 * MS, 2.0);
        for i in 1..=10u64 {
            let t = 2500 * MS + i * 100 * MS;
            a.tokens(k1, t - 100 * MS, t, 2.0);
        }
        a.depart(3500 * MS, k1);
        a.depart(3500 * MS, k2);
        a.finalize_before(4 * S);
        let s = a.sums()[&2];
        assert_eq!(s.guard_ns, 2500 * MS);
        assert_eq!(s.clean_ns, S);
        assert!((s.clean_tokens - 20.0).abs() < 1e-9);
        assert!((s.guard_tokens - 2.0).abs() < 1e-9);
    }

    #[test]
    fn thin_rows_carry_no_rate() {
        let mut sums = BTreeMap::new();
        sums.insert(
            1,
            LevelSums {
                clean_ns: 30 * S,
                clean_tokens: 2100.0,
                guard_ns: S,
                guard_tokens: 10.0,
                ..Default::default()
            },
        );
        sums.insert(
            2,
            LevelSums {
                clean_ns: 2 * S,
                clean_tokens: 240.0,
                ..Default::default()
            },
        );
        let none = |_| RequestFiguresAt {
            tok_s_min: None,
            tok_s_max: None,
            ttft_ms: Percentiles {
                p50: None,
                p90: None,
                p99: None,
            },
        };
        let rows = production_rows(&sums, 10.0, none);
        assert_eq!(rows[0].gen_tok_s, Some(70.0));
        assert_eq!(rows[0].scaling, Some(1.0));
        assert!((rows[0].gen_tok_s_unguarded.unwrap() - 2110.0 / 31.0).abs() < 1e-9);
        assert!(rows[1].thin);
        assert_eq!(rows[1].gen_tok_s, None);
        assert_eq!(rows[1].per_request_tok_s.avg, None);
    }
}
