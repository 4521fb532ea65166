//! A request's output tokens over time, compact enough for every access-log line: the
//! `token_curve` field, which lets `analyze` place each request's tokens in time as the live
//! meter did.
//!
//! # What it holds
//!
//! The live meter spreads each token report over the time since the same request's previous
//! report (its first over the time since arrival), so the tokens it has credited to a request by
//! time `t`, `C(t)`, are a line through the request's events: 0 at arrival, the cumulative
//! count at each event, straight between events. The level attribution (`meter::levels`) only
//! ever asks how much of `C` falls between two instants. A log line cannot hold every event (a
//! 1,000-token answer has 1,000), but `C` is nearly straight while the engine decodes at one pace
//! and bends only where the pace changes (another request's prefill stalls the step, a level
//! change makes the step longer). So the line holds a polyline through some of the events,
//! chosen so that it stays within [`TOLERANCE_TOKENS`] of `C` at every event, hence everywhere
//! between (both are straight between events):
//!
//! * the first point is the first token event: its time since arrival and its tokens (credited to
//!   the time since arrival, as live);
//! * each further point is an event: the time since the previous point and the tokens between
//!   them, spread evenly over that time;
//! * times are whole milliseconds since arrival, rounded once per point (the differences are of
//!   rounded times, so rounding never accumulates).
//!
//! The points are picked on the fly by the swinging-door rule: from the last point kept, a
//! candidate end is acceptable while the straight line to it passes within the tolerance of every
//! event since; the last acceptable event becomes a point when the next one is not. Each event
//! costs a few float operations; the buffer grows by doubling (one allocation for most requests)
//! and stops growing at [`MAX_POINTS`]: beyond it the last point takes all further tokens.
//!
//! Measured on the demo's traffic (16 agents, 140 events per streamed answer): 14 points per
//! streamed request, about 110 bytes of JSON.

use crate::clock::UnixNanos;

/// The largest distance, in tokens, between the polyline and the stream's cumulative count at
/// any event (before the rounding of times to whole milliseconds).
pub const TOLERANCE_TOKENS: f64 = 0.1;

/// The most points a curve keeps; past it the last point takes every further token.
pub const MAX_POINTS: usize = 1024;

const NS_PER_MS: u64 = 1_000_000;

/// Builds one request's curve from its token events (the tracker owns one per request).
#[derive(Debug, Clone, Default)]
pub struct TokenCurveBuilder {
    origin: UnixNanos,
    /// `[ms, tokens]` pairs written so far (empty until the first event).
    out: Vec<u32>,
    /// The rounded time, in ms since arrival, and the cumulative count of the last point written.
    last_ms: u64,
    last_count: u64,
    /// The last point written (the door's hinge): time and cumulative count.
    anchor_ns: UnixNanos,
    anchor_count: u64,
    /// The latest event, not yet written, that the line from the anchor may end at.
    pending: Option<(UnixNanos, u64)>,
    /// The slopes (tokens per ns from the anchor) that keep every event since the anchor within
    /// the tolerance.
    lo: f64,
    hi: f64,
    count: u64,
    full: bool,
}

impl TokenCurveBuilder {
    /// A curve for a request that arrived at `origin`.
    pub fn new(origin: UnixNanos) -> Self {
        TokenCurveBuilder {
            origin,
            ..TokenCurveBuilder::default()
        }
    }

    /// `tokens` (> 0) passed at `now`; events come in time order.
    #[inline]
    pub fn push(&mut self, now: UnixNanos, tokens: u64) {
        self.count += tokens;
        if self.out.is_empty() {
            self.out.reserve_exact(32);
            self.write(now, self.count);
            return;
        }
        let now = now.max(self.pending.map_or(self.anchor_ns, |p| p.0));
        // Rises from the anchor, and one division per event (the slopes share it).
        let mut rise = (self.count - self.anchor_count) as f64;
        let mut per_ns = 1.0 / (now - self.anchor_ns) as f64;
        if let (Some(p), false) = (self.pending, self.full) {
            if !(self.lo..=self.hi).contains(&(rise * per_ns)) {
                self.write(p.0, p.1);
                rise = (self.count - self.anchor_count) as f64;
                per_ns = 1.0 / (now - self.anchor_ns) as f64;
            }
        }
        if now == self.anchor_ns {
            // Tokens at the hinge's own instant: the point takes them.
            self.write_again(self.count);
            return;
        }
        // Lines from the anchor must pass within the tolerance of this event.
        self.lo = self.lo.max((rise - TOLERANCE_TOKENS) * per_ns);
        self.hi = self.hi.min((rise + TOLERANCE_TOKENS) * per_ns);
        self.pending = Some((now, self.count));
    }

    /// Writes the point `(t, count)` and makes it the hinge.
    fn write(&mut self, t: UnixNanos, count: u64) {
        let ms = t.saturating_sub(self.origin).saturating_add(NS_PER_MS / 2) / NS_PER_MS;
        let dt = ms.saturating_sub(self.last_ms);
        self.out.push(u32::try_from(dt).unwrap_or(u32::MAX));
        self.out.push(clamp_u32(count - self.last_count));
        self.last_ms = ms;
        self.last_count = count;
        self.anchor_ns = t;
        self.anchor_count = count;
        self.pending = None;
        self.lo = f64::NEG_INFINITY;
        self.hi = f64::INFINITY;
        self.full = self.out.len() >= 2 * MAX_POINTS - 2;
    }

    /// The last point written also takes the tokens up to `count`.
    fn write_again(&mut self, count: u64) {
        if let Some(n) = self.out.last_mut() {
            *n = clamp_u32(u64::from(*n) + count - self.last_count);
        }
        self.last_count = count;
        self.anchor_count = count;
    }

    /// The curve, `[ms, tokens]` pairs; `None` when no token passed.
    pub fn finish(mut self) -> Option<Vec<u32>> {
        if let Some((t, c)) = self.pending {
            self.write(t, c);
        }
        (!self.out.is_empty()).then_some(self.out)
    }

    /// Takes the curve so far (for a record built while the builder stays with its owner).
    pub fn take(&mut self) -> Option<Vec<u32>> {
        std::mem::take(self).finish()
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One stretch of a curve: `tokens` made evenly over `[from, to]` (Unix ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Piece {
    /// Start of the stretch.
    pub from: UnixNanos,
    /// End of the stretch.
    pub to: UnixNanos,
    /// Tokens made over it.
    pub tokens: f64,
}

/// The stretches of the curve `pairs` of a request that arrived at `origin`: the first from the
/// arrival to the first point, then one between consecutive points. Odd trailing values are
/// ignored (a valid curve has none: [`valid`]).
pub fn pieces(origin: UnixNanos, pairs: &[u32]) -> impl Iterator<Item = Piece> + '_ {
    let mut at = origin;
    let mut from = origin;
    pairs.chunks_exact(2).map(move |p| {
        at = at.saturating_add(u64::from(p[0]) * NS_PER_MS);
        let piece = Piece {
            from,
            to: at,
            tokens: f64::from(p[1]),
        };
        from = at;
        piece
    })
}

/// The first point's instant (the first token event, to the ms), if any.
pub fn first_point(origin: UnixNanos, pairs: &[u32]) -> Option<UnixNanos> {
    pairs
        .first()
        .map(|&ms| origin.saturating_add(u64::from(ms) * NS_PER_MS))
}

/// Tokens the curve holds.
pub fn total(pairs: &[u32]) -> u64 {
    pairs.chunks_exact(2).map(|p| u64::from(p[1])).sum()
}

/// Whether `pairs` is a curve: whole pairs, at least one.
pub fn valid(pairs: &[u32]) -> bool {
    !pairs.is_empty() && pairs.len() % 2 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = NS_PER_MS;

    /// The cumulative count the polyline gives at `t`.
    fn at(origin: UnixNanos, pairs: &[u32], t: UnixNanos) -> f64 {
        let mut c = 0.0;
        for p in pieces(origin, pairs) {
            if t >= p.to {
                c += p.tokens;
            } else if t > p.from {
                c += p.tokens * (t - p.from) as f64 / (p.to - p.from) as f64;
            }
        }
        c
    }

    fn build(origin: UnixNanos, events: &[(UnixNanos, u64)]) -> Vec<u32> {
        let mut b = TokenCurveBuilder::new(origin);
        for &(t, n) in events {
            b.push(t, n);
        }
        b.finish().unwrap()
    }

    #[test]
    fn a_steady_stream_is_two_points() {
        // 100 tokens one per 30 ms after a 200 ms first token.
        let events: Vec<_> = (0..100u64).map(|i| (200 * MS + i * 30 * MS, 1)).collect();
        let c = build(0, &events);
        assert_eq!(c, vec![200, 1, 2970, 99]);
        assert_eq!(total(&c), 100);
        assert_eq!(first_point(0, &c), Some(200 * MS));
    }

    #[test]
    fn a_stall_bends_the_curve_where_it_happens() {
        // 30 ms steps, then a 190 ms prefill stall, then 30 ms steps again.
        let mut events: Vec<_> = (0..20u64).map(|i| (100 * MS + i * 30 * MS, 1)).collect();
        let t = events.last().unwrap().0;
        events.extend((1..=20u64).map(|i| (t + 160 * MS + i * 30 * MS, 1)));
        let c = build(0, &events);
        for &(t, _) in &events {
            let want = events.iter().filter(|e| e.0 <= t).count() as f64;
            assert!((at(0, &c, t) - want).abs() <= TOLERANCE_TOKENS + 1e-9);
        }
        assert!(c.len() / 2 <= 5, "{c:?}");
    }

    #[test]
    fn every_event_is_within_the_tolerance() {
        // Irregular gaps and token counts (a deterministic pseudo-random walk), whole ms so the
        // rounding of times adds nothing.
        let mut x = 7u64;
        let mut t = 50 * MS;
        let mut events = Vec::new();
        for _ in 0..800 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            t += ((x >> 33) % 80 + 1) * MS;
            events.push((t, (x >> 20) % 4 + 1));
        }
        let c = build(0, &events);
        let mut sum = 0;
        for &(t, n) in &events {
            sum += n;
            let got = at(0, &c, t);
            assert!(
                (got - sum as f64).abs() <= TOLERANCE_TOKENS + 1e-9,
                "{got} vs {sum}"
            );
        }
        assert_eq!(total(&c), sum);
    }

    #[test]
    fn tokens_at_one_instant_stay_at_that_instant_and_the_buffer_stops_growing() {
        let c = build(0, &[(10 * MS, 1), (10 * MS, 2), (20 * MS, 1)]);
        assert_eq!(c, vec![10, 3, 10, 1]);
        // Alternating paces make a point at nearly every event; past the cap the last point takes
        // the rest.
        let mut events = Vec::new();
        let mut t = 0;
        for i in 0..10_000u64 {
            t += if i % 2 == 0 { MS } else { 50 * MS };
            events.push((t, 5));
        }
        let c = build(0, &events);
        assert_eq!(c.len(), 2 * MAX_POINTS);
        assert_eq!(total(&c), 50_000);
        assert_eq!(at(0, &c, t), 50_000.0);
    }
}
