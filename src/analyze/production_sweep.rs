//! The production-traffic curve replayed from the log: the live meter's level attribution fed
//! each record's arrival, first token, token curve and end in time order (pass 2).

use std::collections::{BTreeMap, BinaryHeap, HashMap};

use crate::clock::UnixNanos;
use crate::meter::levels::{GuardConfig, LevelAttribution, LevelSums};
use crate::token_curve;

use super::spill::SpillEntry;
use super::steady::{SecondMix, SecondMixes};

/// A record in flight during the production sweep.
struct OpenRecord {
    key: crate::meter::levels::GuardKey,
    start: UnixNanos,
    /// Where the tokens the curve does not hold are spread from (to the end).
    from: UnixNanos,
    /// Completion tokens minus the curve's; NaN when unknown.
    rest: f64,
    curve: Vec<u32>,
    /// Its entry in `decode_from`: the earliest instant it may still credit tokens to.
    floor: UnixNanos,
}

/// The live meter's level attribution replayed from records fed in arrival order: each record's
/// guard closes at its first token (its curve's first point, else arrival + TTFT). A record with
/// a token curve credits its curve's stretches as the live meter credited its events (the first
/// at its first token, the rest at its end), and the tokens the curve does not hold over its
/// decode interval; a record without one spreads all its tokens over its decode interval at its
/// end.
pub(super) struct ProductionSweep {
    attr: LevelAttribution,
    /// The same level changes, per second.
    mixes: SecondMixes,
    pending: BinaryHeap<std::cmp::Reverse<(UnixNanos, u8, u64)>>,
    open: HashMap<u64, OpenRecord>,
    decode_from: std::collections::BTreeSet<(UnixNanos, u64)>,
    seq: u64,
}

impl ProductionSweep {
    pub(super) fn new() -> Self {
        ProductionSweep {
            attr: LevelAttribution::new(GuardConfig::default(), 0),
            mixes: SecondMixes::new(),
            pending: BinaryHeap::new(),
            open: HashMap::new(),
            decode_from: Default::default(),
            seq: 0,
        }
    }

    /// Replays every first token and end at or before `t` (ends and first tokens before a start
    /// at the same instant, like the level sweep).
    fn until(&mut self, t: UnixNanos) {
        while let Some(&std::cmp::Reverse((at, kind, seq))) = self.pending.peek() {
            if at > t {
                break;
            }
            self.pending.pop();
            let Some(o) = self.open.get_mut(&seq) else {
                continue;
            };
            if kind == 0 {
                self.attr.first_token(at, o.key);
                let mut pieces = token_curve::pieces(o.start, &o.curve);
                // The first event's tokens were made since the arrival, as live.
                if let Some(p) = pieces.next() {
                    self.attr.tokens(o.key, o.start, at, p.tokens);
                }
                // From its first token on, the request's tokens reach back to here only (its
                // curve's next stretch starts at the first point, to the ms).
                let floor = pieces.next().map_or(at, |p| p.from.min(at)).min(o.from);
                self.decode_from.remove(&(o.floor, seq));
                self.decode_from.insert((floor, seq));
                o.floor = floor;
                continue;
            }
            let Some(o) = self.open.remove(&seq) else {
                continue;
            };
            self.decode_from.remove(&(o.floor, seq));
            self.attr.advance(at);
            for p in token_curve::pieces(o.start, &o.curve).skip(1) {
                self.attr.tokens(o.key, p.from, p.to, p.tokens);
            }
            if o.rest.is_finite() {
                self.attr.tokens(o.key, o.from, at, o.rest);
            }
            self.attr.depart(at, o.key);
            self.mixes.change(at, self.attr.level());
            let floor = self.decode_from.first().map_or(at, |&(f, _)| f);
            self.attr.finalize_before(floor);
        }
    }

    pub(super) fn push(&mut self, e: &SpillEntry, curve: &[u32]) {
        self.until(e.start);
        if e.end <= e.start {
            return;
        }
        if self.seq == 0 {
            self.attr = LevelAttribution::new(GuardConfig::default(), e.start);
        }
        self.seq += 1;
        let key = self.attr.arrive(e.start);
        self.mixes.change(e.start, self.attr.level());
        // As live: without a first token the tokens were made after the guard's cap.
        let from = if e.first_token > 0 {
            e.gen_from
        } else {
            e.start.saturating_add(GuardConfig::default().guard_max_ns)
        }
        .clamp(e.start, e.end);
        let rest = e.completion_tokens - token_curve::total(curve) as f64;
        // Until its first token is replayed, nothing after its arrival is final: a first token
        // after the guard's cap makes the time since the cap guarded (see meter::levels). A
        // first token at the end still closes the guard there, as live.
        let pending_first = e.first_token > 0 && e.first_token <= e.end;
        let floor = if pending_first { e.start } else { from };
        self.decode_from.insert((floor, self.seq));
        self.open.insert(
            self.seq,
            OpenRecord {
                key,
                start: e.start,
                from,
                rest,
                curve: curve.to_vec(),
                floor,
            },
        );
        if pending_first {
            self.pending
                .push(std::cmp::Reverse((e.first_token.max(e.start), 0, self.seq)));
        }
        self.pending.push(std::cmp::Reverse((e.end, 1, self.seq)));
    }

    pub(super) fn finish(mut self) -> (BTreeMap<u32, LevelSums>, BTreeMap<u64, SecondMix>) {
        self.until(UnixNanos::MAX);
        self.attr.finalize_before(UnixNanos::MAX);
        (self.attr.sums().clone(), self.mixes.finish())
    }
}
