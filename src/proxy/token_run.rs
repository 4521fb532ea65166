//! Token reports coalesced per request and second, where that changes no measurement.
//!
//! Observers hear of a stream's tokens as [`Observer::tokens`](crate::observe::Observer::tokens)
//! calls, and the meter spreads each call's tokens over the time since the same request's
//! previous call (its decode steps) and credits them to the second of the call. Per event, that
//! is one hand-off to the meter thread and one pass of its accounting for every streamed event.
//!
//! Two reports merge into one without changing any number when nothing the meter splits time at
//! happened between them and they fall in the same second: the merged tokens are spread over the
//! two intervals together, all inside one stretch of one level, and land in the same second's
//! bucket. What the meter splits time at is an arrival, a first token, a departure, and a guard
//! that closes by itself (its cap, for a request with no token yet, or its extra time). So:
//!
//! - every tracker counts those events in one shared word ([`LevelChanges`]), with the number of
//!   announced requests that have reported no token yet;
//! - a request's first token is reported at once (it closes a guard);
//! - a later event joins the request's pending run when the word is what it was at the
//!   request's previous event, no request is waiting for its first token (no cap can close a
//!   guard), and the event is in the run's second;
//! - otherwise the pending run is reported, and the event either starts a new run (only the
//!   second changed) or, when the word changed, is reported alone: its own interval holds the
//!   boundary, which the meter then splits exactly as before;
//! - the run is reported before the request's end and before a fallback restart;
//! - a run's ITL gaps share one log bin and vLLM bucket (the meter observes them there, as the
//!   request's own histogram holds them): an event whose gap falls in another reports the
//!   pending run and starts a new one;
//! - an event whose tokens start a new KV block of the upstream (`block_size` known from its
//!   scrape) reports the pending run and itself at once, so the meter's live KV estimate
//!   (`docs/kv-cache.md`) counts each request's blocks as they pass.
//!
//! With `capacity_guard_extra_ms` above 0 guards also close at times no event marks, so every
//! event is reported on its own. The cost of a run: a stream's last tokens of a second reach the
//! meter at its next event or at its end, not as they pass.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::itl::{Gap, Gaps};

/// One change in the high half of [`LevelChanges`]'s word.
const ONE_CHANGE: u64 = 1 << 32;
/// The low half: announced requests with no token reported yet.
const AWAITING_MASK: u64 = ONE_CHANGE - 1;

/// What all requests of one proxy share for coalescing: a count of the events the meter splits
/// time at (high 32 bits) and of the requests waiting for their first token (low 32 bits), in
/// one word so that one load reads both.
#[derive(Debug)]
pub struct LevelChanges {
    word: AtomicU64,
    enabled: bool,
}

impl LevelChanges {
    /// Coalescing on (`enabled`) or every event reported alone.
    pub fn new(enabled: bool) -> Self {
        LevelChanges {
            word: AtomicU64::new(0),
            enabled,
        }
    }

    /// An announced arrival: a change, and one more request waiting for its first token.
    pub(super) fn arrival(&self) {
        self.word.fetch_add(ONE_CHANGE + 1, Ordering::SeqCst);
    }

    /// A waiting request's first token was reported, or it ended without one.
    pub(super) fn no_longer_waiting(&self) {
        self.word.fetch_add(ONE_CHANGE - 1, Ordering::SeqCst);
    }

    /// Any other change: a departure after tokens, or a replica's observer hearing of a start.
    pub(super) fn change(&self) {
        self.word.fetch_add(ONE_CHANGE, Ordering::SeqCst);
    }

    fn load(&self) -> u64 {
        self.word.load(Ordering::SeqCst)
    }
}

impl Default for LevelChanges {
    fn default() -> Self {
        LevelChanges::new(true)
    }
}

/// A token report: (time, tokens, the ITL gaps passed with them).
pub(super) type Report = (UnixNanos, u64, Gaps);

/// One request's tokens that passed and are not reported yet, and their ITL gaps (one log bin
/// and vLLM bucket per run: a gap in another starts a new run, so the meter observes each gap
/// in the bin the request's own histogram holds it in).
#[derive(Debug, Default)]
pub(super) struct TokenRun {
    tokens: u64,
    gaps: Gaps,
    last_ns: UnixNanos,
    second: u64,
    /// The shared word at this request's previous event.
    seen: u64,
}

impl TokenRun {
    /// An event was just reported alone (the first token): later ones compare with now.
    pub(super) fn reported_alone(&mut self, changes: &LevelChanges) {
        self.seen = changes.load();
    }

    /// `tokens` passed at `now_ns`, after the ITL `gap` (none at a first output):
    /// what to report now, in order (a pending run first). `alone` reports them at once (they
    /// start a KV block).
    #[inline]
    pub(super) fn add(
        &mut self,
        changes: &LevelChanges,
        now_ns: UnixNanos,
        (tokens, gap): (u64, Option<Gap>),
        alone: bool,
    ) -> [Option<Report>; 2] {
        let word = changes.load();
        let unchanged = !alone && changes.enabled && word == self.seen && word & AWAITING_MASK == 0;
        self.seen = word;
        let second = now_ns / NANOS_PER_SEC;
        let fits = gap.is_none_or(|g| self.gaps.fits(g));
        if unchanged && self.pending() && second == self.second && fits {
            self.tokens += tokens;
            if let Some(g) = gap {
                self.gaps.add(g);
            }
            self.last_ns = now_ns;
            return [None, None];
        }
        let pending = self.take();
        if unchanged {
            self.tokens = tokens;
            self.gaps = Gaps::of(gap);
            self.last_ns = now_ns;
            self.second = second;
            [pending, None]
        } else {
            [pending, Some((now_ns, tokens, Gaps::of(gap)))]
        }
    }

    fn pending(&self) -> bool {
        self.tokens > 0 || self.gaps.count > 0
    }

    /// The pending run, to report now (before the end or a restart).
    pub(super) fn take(&mut self) -> Option<Report> {
        self.pending().then(|| {
            let gaps = std::mem::take(&mut self.gaps);
            (self.last_ns, std::mem::take(&mut self.tokens), gaps)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_GAPS: Gaps = Gaps {
        count: 0,
        sum_ns: 0,
        bin: 0,
        bucket: 0,
    };

    const S: u64 = NANOS_PER_SEC;

    #[test]
    fn a_quiet_second_is_one_report_and_a_change_splits_exactly_there() {
        let c = LevelChanges::new(true);
        let mut run = TokenRun::default();
        c.arrival();
        // The first token is reported alone by the tracker.
        c.no_longer_waiting();
        run.reported_alone(&c);
        assert_eq!(run.add(&c, 10 * S + 1, (1, None), false), [None, None]);
        assert_eq!(run.add(&c, 10 * S + 2, (2, None), false), [None, None]);
        // A new second: the run so far, and the event opens the next one.
        assert_eq!(
            run.add(&c, 11 * S, (1, None), false),
            [Some((10 * S + 2, 3, NO_GAPS)), None]
        );
        // Another request arrives: the run, then this event alone (its interval holds the
        // arrival); it waits for its first token, so events are reported one by one.
        c.arrival();
        assert_eq!(
            run.add(&c, 11 * S + 5, (4, None), false),
            [Some((11 * S, 1, NO_GAPS)), Some((11 * S + 5, 4, NO_GAPS))]
        );
        assert_eq!(
            run.add(&c, 11 * S + 6, (1, None), false),
            [None, Some((11 * S + 6, 1, NO_GAPS))]
        );
        c.no_longer_waiting();
        assert_eq!(
            run.add(&c, 11 * S + 7, (1, None), false),
            [None, Some((11 * S + 7, 1, NO_GAPS))]
        );
        assert_eq!(run.add(&c, 11 * S + 8, (1, None), false), [None, None]);
        assert_eq!(run.take(), Some((11 * S + 8, 1, NO_GAPS)));
        assert_eq!(run.take(), None);
        c.change();
        assert_eq!(
            run.add(&c, 11 * S + 9, (1, None), false),
            [None, Some((11 * S + 9, 1, NO_GAPS))]
        );
    }

    #[test]
    fn disabled_reports_every_event() {
        let c = LevelChanges::new(false);
        let mut run = TokenRun::default();
        run.reported_alone(&c);
        for t in 1..5 {
            assert_eq!(
                run.add(&c, t, (1, None), false),
                [None, Some((t, 1, NO_GAPS))]
            );
        }
        assert_eq!(run.take(), None);
    }

    #[test]
    fn a_token_starting_a_kv_block_is_reported_at_once_with_the_pending_run() {
        let c = LevelChanges::default();
        let mut run = TokenRun::default();
        run.reported_alone(&c);
        assert_eq!(run.add(&c, 10 * S + 1, (1, None), false), [None, None]);
        assert_eq!(
            run.add(&c, 10 * S + 2, (1, None), true),
            [
                Some((10 * S + 1, 1, NO_GAPS)),
                Some((10 * S + 2, 1, NO_GAPS))
            ]
        );
        // Then runs form again.
        assert_eq!(run.add(&c, 10 * S + 3, (1, None), false), [None, None]);
        assert_eq!(run.take(), Some((10 * S + 3, 1, NO_GAPS)));
    }

    #[test]
    fn gaps_join_a_run_in_their_bin_and_one_in_another_starts_the_next() {
        let c = LevelChanges::default();
        let mut run = TokenRun::default();
        run.reported_alone(&c);
        let ms = 1_000_000;
        assert_eq!(
            run.add(&c, S + 1, (1, Some(Gap::of(20 * ms))), false),
            [None, None]
        );
        assert_eq!(
            run.add(&c, S + 2, (1, Some(Gap::of(20 * ms + 1))), false),
            [None, None]
        );
        // 60 ms: another bin and vLLM bucket.
        let [pending, alone] = run.add(&c, S + 3, (1, Some(Gap::of(60 * ms))), false);
        assert_eq!(alone, None);
        let (t, n, g) = pending.unwrap();
        assert_eq!((t, n, g.count, g.sum_ns), (S + 2, 2, 2, 40 * ms + 1));
        let (_, _, g) = run.take().unwrap();
        assert_eq!((g.count, g.sum_ns), (1, 60 * ms));
        // A gap on an event without tokens is kept and reported too.
        assert_eq!(
            run.add(&c, S + 4, (0, Some(Gap::of(60 * ms))), false),
            [None, None]
        );
        assert_eq!(run.take().map(|(_, n, g)| (n, g.count)), Some((0, 1)));
    }
}
