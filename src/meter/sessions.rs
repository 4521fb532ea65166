//! The sessions view (docs/sessions.md, "The sessions view"): per agent session, from its
//! calls as they finish, the calls, turns, the time waited on the model against the time
//! between calls, tokens in and out, the context's growth, cached tokens, the prefix audit's
//! expected and lost tokens and the slowest wait. The live meter keeps at most
//! [`MAX_TRACKED_SESSIONS`] (a new session folds the least recently seen into `other`) and
//! `/stats` lists the [`TOP_SESSIONS`] by wait, the rest summed in `other`. `analyze` builds
//! the same rows from the log's session fields.

use std::collections::HashMap;

use serde::Serialize;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::record::{RequestRecord, SessionSource};

use super::prefix_audit::{AuditBook, AuditCall, AuditView};
use super::spread::{Spread, SpreadAcc};

/// Sessions the live meter keeps figures for; a new one beyond folds the least recently seen
/// into `other`.
pub const MAX_TRACKED_SESSIONS: usize = 1024;

/// Sessions `/stats` lists (by wait, descending); the rest are summed in `other`.
pub const TOP_SESSIONS: usize = 20;

/// A session is active while its last call ended at most this long ago, seconds (an agent's
/// tools and its human can take minutes between calls).
pub const ACTIVE_WINDOW_S: u64 = 300;

/// What the sessions view reads of one finished call (from a record, or a log line).
#[derive(Debug, Clone, Copy)]
pub struct SessionCallFigures<'a> {
    /// The session's pseudonym.
    pub session: &'a str,
    /// Where it came from.
    pub source: Option<SessionSource>,
    /// The call's user.
    pub user: &'a str,
    /// The call's turn.
    pub turn: Option<u32>,
    /// The call's end on the timeline.
    pub end_ns: UnixNanos,
    /// Arrival to the last byte, ms: the time the agent waited on the model.
    pub e2e_ms: Option<f64>,
    /// `session_gap_ms`: the time since the session's previous call ended.
    pub gap_ms: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens.
    pub completion_tokens: Option<u64>,
    /// Cached prompt tokens the server reported.
    pub cached_tokens: Option<u64>,
    /// The audit's expected cached tokens.
    pub prefix_expected_tokens: Option<u64>,
    /// The audit's lost tokens.
    pub prefix_lost_tokens: Option<u64>,
    /// The audit's verdict (`prefix_audit`).
    pub prefix_audit: Option<&'a str>,
    /// `in_flight_at_start`.
    pub in_flight_at_start: u32,
    /// TTFT, ms.
    pub ttft_ms: Option<f64>,
}

impl<'a> SessionCallFigures<'a> {
    /// A record's figures; `None` for a request without a session.
    pub fn of(r: &'a RequestRecord) -> Option<Self> {
        Some(SessionCallFigures {
            session: r.session.as_deref()?,
            source: r.session_source,
            user: &r.user,
            turn: r.turn,
            end_ns: r.end_ns(),
            e2e_ms: r.e2e_ms,
            gap_ms: r.session_gap_ms,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: r.cached_prompt_tokens,
            prefix_expected_tokens: r.prefix_expected_tokens,
            prefix_lost_tokens: r.prefix_lost_tokens,
            prefix_audit: r.prefix_audit.as_deref(),
            in_flight_at_start: r.in_flight_at_start,
            ttft_ms: r.ttft_ms,
        })
    }

    /// The call's part of its turn's wait (docs/sessions.md, "Wait per turn"): its turn and its
    /// `e2e_ms`, when both are known. A turn's wait is the sum over its calls.
    pub fn turn_wait(&self) -> Option<(u32, f64)> {
        self.turn
            .zip(self.e2e_ms.filter(|v| v.is_finite() && *v >= 0.0))
    }

    /// What the audit reads of the call.
    fn audit(&self) -> AuditCall<'a> {
        AuditCall {
            user: self.user,
            level: self.in_flight_at_start,
            verdict: self.prefix_audit,
            expected: self.prefix_expected_tokens,
            cached: self.cached_tokens,
            lost: self.prefix_lost_tokens,
            ttft_ms: self.ttft_ms,
        }
    }
}

/// One session's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionRow {
    /// The pseudonym, as in the access log.
    pub session: String,
    /// Where it came from (its first call's source).
    pub source: Option<SessionSource>,
    /// Its last call's user (the call that ended last).
    pub user: String,
    /// Calls finished (any outcome).
    pub calls: u64,
    /// max(turn) − min(turn) + 1 over its calls with a turn.
    pub turns: Option<u32>,
    /// Σ `e2e_ms`: the time the agent waited on the model.
    pub wait_ms: f64,
    /// Σ `session_gap_ms`: the time between its calls (tools, thinking, the human).
    pub between_ms: f64,
    /// Σ `prompt_tokens`.
    pub prompt_tokens: u64,
    /// Σ `completion_tokens`.
    pub completion_tokens: u64,
    /// The `prompt_tokens` of the call that ended first (of the calls with one).
    pub context_first_tokens: Option<u64>,
    /// The `prompt_tokens` of the call that ended last.
    pub context_last_tokens: Option<u64>,
    /// (last − first) / (calls with a prompt count − 1): the context's growth per call.
    pub context_growth_per_call: Option<f64>,
    /// Σ `cached_prompt_tokens`; `null` when no call reported it.
    pub cached_tokens: Option<u64>,
    /// Σ `prefix_expected_tokens`.
    pub prefix_expected_tokens: u64,
    /// Σ `prefix_lost_tokens`.
    pub prefix_lost_tokens: u64,
    /// max `e2e_ms`.
    pub slowest_wait_ms: Option<f64>,
    /// Seconds since its last call ended (at the view's instant).
    pub idle_s: f64,
    #[serde(skip)]
    first_turn: Option<u32>,
    #[serde(skip)]
    last_turn: Option<u32>,
    #[serde(skip)]
    prompts: u64,
    /// When the calls whose prompt is `context_first_tokens` and `context_last_tokens` ended.
    #[serde(skip)]
    first_prompt_ns: UnixNanos,
    #[serde(skip)]
    last_prompt_ns: UnixNanos,
    #[serde(skip)]
    last_end_ns: UnixNanos,
    /// The turn of its last call (with a wait), still open, and its wait so far.
    #[serde(skip)]
    open_turn: Option<(u32, f64)>,
}

impl SessionRow {
    fn new(f: &SessionCallFigures<'_>) -> Self {
        SessionRow {
            session: f.session.to_string(),
            source: f.source,
            ..SessionRow::default()
        }
    }

    /// Adds one finished call (in any order: first and last go by the calls' ends).
    pub fn add(&mut self, f: &SessionCallFigures<'_>) {
        self.merge_as(&SessionRow::of_call(f), f.user);
    }

    /// One call's figures, without its names (empty strings do not allocate): what
    /// [`SessionRow::merge_as`] adds.
    fn of_call(f: &SessionCallFigures<'_>) -> SessionRow {
        let valid = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0);
        let wait = valid(f.e2e_ms);
        let prompt_ns = f.prompt_tokens.map_or(0, |_| f.end_ns);
        SessionRow {
            calls: 1,
            first_turn: f.turn,
            last_turn: f.turn,
            wait_ms: wait.unwrap_or(0.0),
            slowest_wait_ms: wait,
            between_ms: valid(f.gap_ms).unwrap_or(0.0),
            prompt_tokens: f.prompt_tokens.unwrap_or(0),
            completion_tokens: f.completion_tokens.unwrap_or(0),
            prompts: u64::from(f.prompt_tokens.is_some()),
            context_first_tokens: f.prompt_tokens,
            context_last_tokens: f.prompt_tokens,
            first_prompt_ns: prompt_ns,
            last_prompt_ns: prompt_ns,
            cached_tokens: f.cached_tokens,
            prefix_expected_tokens: f.prefix_expected_tokens.unwrap_or(0),
            prefix_lost_tokens: f.prefix_lost_tokens.unwrap_or(0),
            last_end_ns: f.end_ns,
            ..SessionRow::default()
        }
    }

    /// Adds a call's wait to its turn: a call of another turn than the open one closes it,
    /// returning its wait.
    fn turn_step(&mut self, call: Option<(u32, f64)>) -> Option<f64> {
        let (turn, wait) = call?;
        match &mut self.open_turn {
            Some((t, w)) if *t == turn => {
                *w += wait;
                None
            }
            // A call of a turn already closed (turns overlapped) opens no turn again.
            Some((t, _)) if turn < *t => None,
            open => open.replace((turn, wait)).map(|(_, w)| w),
        }
    }

    /// The figures derived from the sums.
    fn settle(&mut self) {
        self.turns = self.first_turn.zip(self.last_turn).map(|(a, b)| b - a + 1);
        self.context_growth_per_call = self
            .context_first_tokens
            .zip(self.context_last_tokens)
            .filter(|_| self.prompts > 1)
            .map(|(first, last)| (last as f64 - first as f64) / (self.prompts - 1) as f64);
    }

    /// Adds the calls of the same session counted apart (`analyze`'s parallel passes).
    fn merge(&mut self, b: &SessionRow) {
        self.merge_as(b, &b.user);
    }

    /// Adds `b`'s calls, whose last call's user is `user`.
    fn merge_as(&mut self, b: &SessionRow, user: &str) {
        if self.calls == 0 || b.last_end_ns >= self.last_end_ns {
            if self.user != user {
                self.user.clear();
                self.user.push_str(user);
            }
            self.last_end_ns = b.last_end_ns;
        }
        self.calls += b.calls;
        self.first_turn = match (self.first_turn, b.first_turn) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        self.last_turn = self.last_turn.max(b.last_turn);
        self.wait_ms += b.wait_ms;
        self.between_ms += b.between_ms;
        self.prompt_tokens += b.prompt_tokens;
        self.completion_tokens += b.completion_tokens;
        self.prompts += b.prompts;
        if b.context_first_tokens.is_some()
            && (self.context_first_tokens.is_none() || b.first_prompt_ns < self.first_prompt_ns)
        {
            (self.context_first_tokens, self.first_prompt_ns) =
                (b.context_first_tokens, b.first_prompt_ns);
        }
        if b.context_last_tokens.is_some()
            && (self.context_last_tokens.is_none() || b.last_prompt_ns >= self.last_prompt_ns)
        {
            (self.context_last_tokens, self.last_prompt_ns) =
                (b.context_last_tokens, b.last_prompt_ns);
        }
        self.cached_tokens = match (self.cached_tokens, b.cached_tokens) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
        };
        self.prefix_expected_tokens += b.prefix_expected_tokens;
        self.prefix_lost_tokens += b.prefix_lost_tokens;
        self.slowest_wait_ms = match (self.slowest_wait_ms, b.slowest_wait_ms) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        self.settle();
    }
}

/// Sessions summed: those beyond the listed top, and those the meter folded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionsOther {
    /// Sessions summed here.
    pub sessions: u64,
    /// Their calls.
    pub calls: u64,
    /// Σ wait, ms.
    pub wait_ms: f64,
    /// Σ time between calls, ms.
    pub between_ms: f64,
    /// Σ prompt tokens.
    pub prompt_tokens: u64,
    /// Σ completion tokens.
    pub completion_tokens: u64,
    /// Σ cached prompt tokens; `null` when none reported.
    pub cached_tokens: Option<u64>,
    /// Σ the audit's expected tokens.
    pub prefix_expected_tokens: u64,
    /// Σ the audit's lost tokens.
    pub prefix_lost_tokens: u64,
}

impl SessionsOther {
    fn absorb(&mut self, r: &SessionRow) {
        self.merge(&SessionsOther {
            sessions: 1,
            calls: r.calls,
            wait_ms: r.wait_ms,
            between_ms: r.between_ms,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: r.cached_tokens,
            prefix_expected_tokens: r.prefix_expected_tokens,
            prefix_lost_tokens: r.prefix_lost_tokens,
        });
    }

    fn merge(&mut self, o: &SessionsOther) {
        self.sessions += o.sessions;
        self.calls += o.calls;
        self.wait_ms += o.wait_ms;
        self.between_ms += o.between_ms;
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        if let Some(c) = o.cached_tokens {
            self.cached_tokens = Some(self.cached_tokens.unwrap_or(0) + c);
        }
        self.prefix_expected_tokens += o.prefix_expected_tokens;
        self.prefix_lost_tokens += o.prefix_lost_tokens;
    }
}

/// The `sessions` object of `/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionsView {
    /// Tracked sessions whose last call ended within `active_window_s`.
    pub active: u64,
    /// [`ACTIVE_WINDOW_S`].
    pub active_window_s: u64,
    /// Sessions seen since start (one folded into `other` and seen again counts again).
    pub seen: u64,
    /// Sessions with figures of their own now.
    pub tracked: u64,
    /// [`MAX_TRACKED_SESSIONS`].
    pub max_tracked: u64,
    /// Sessions folded into `other` because the table was full (since start).
    pub folded: u64,
    /// The sessions with the most time waited on the model, at most [`TOP_SESSIONS`].
    pub top: Vec<SessionRow>,
    /// Every other session seen: tracked beyond the top, and folded.
    pub other: SessionsOther,
    /// The wait per turn: Σ `e2e_ms` of each (session, turn)'s calls, over every turn seen
    /// (closed, and each tracked session's open one).
    pub wait_per_turn: Spread,
    /// The prefix-cache audit in total, per user and per in-flight level.
    pub audit: AuditView,
}

/// The sessions seen and their figures.
#[derive(Debug, Clone)]
pub struct SessionBook {
    rows: HashMap<String, SessionRow>,
    cap: usize,
    seen: u64,
    folded: u64,
    folded_sum: SessionsOther,
    /// The waits of the turns closed (by a later turn of their session, idleness, folding).
    closed_turns: SpreadAcc,
    audit: AuditBook,
}

impl SessionBook {
    /// A book keeping at most `cap` sessions' own figures and, in its audit, at most
    /// `user_cap` users by name.
    pub fn new(cap: usize, user_cap: usize) -> Self {
        SessionBook {
            rows: HashMap::new(),
            cap: cap.max(1),
            seen: 0,
            folded: 0,
            folded_sum: SessionsOther::default(),
            closed_turns: SpreadAcc::default(),
            audit: AuditBook::new(user_cap),
        }
    }

    /// Adds a finished call; returns the wait of the turn it closed (its session's previous
    /// turn, or the open turn of the session it folded out of the table), ms.
    pub fn add(&mut self, f: &SessionCallFigures<'_>) -> Option<f64> {
        self.audit.add(&f.audit());
        if let Some(row) = self.rows.get_mut(f.session) {
            row.add(f);
            let closed = row.turn_step(f.turn_wait());
            if let Some(w) = closed {
                self.closed_turns.add(w);
            }
            return closed;
        }
        let mut closed = None;
        if self.rows.len() >= self.cap {
            // A scan only when a new session finds the table full.
            let oldest = self
                .rows
                .iter()
                .min_by_key(|(_, r)| r.last_end_ns)
                .map(|(k, _)| k.clone());
            if let Some(row) = oldest.and_then(|k| self.rows.remove(&k)) {
                self.folded += 1;
                self.folded_sum.absorb(&row);
                closed = row.open_turn.map(|(_, w)| w);
                if let Some(w) = closed {
                    self.closed_turns.add(w);
                }
            }
        }
        self.seen += 1;
        let mut row = SessionRow::new(f);
        row.add(f);
        row.turn_step(f.turn_wait());
        self.rows.insert(row.session.clone(), row);
        closed
    }

    /// Closes the open turn of every session whose last call ended more than
    /// [`ACTIVE_WINDOW_S`] before `now`, handing each closed turn's wait (ms) to `closed`.
    pub fn close_idle(&mut self, now: UnixNanos, mut closed: impl FnMut(f64)) {
        let before = now.saturating_sub(ACTIVE_WINDOW_S * NANOS_PER_SEC);
        for r in self.rows.values_mut() {
            if r.last_end_ns < before {
                if let Some((_, w)) = r.open_turn.take() {
                    self.closed_turns.add(w);
                    closed(w);
                }
            }
        }
    }

    /// Every session with figures of its own.
    pub fn rows(&self) -> impl Iterator<Item = &SessionRow> {
        self.rows.values()
    }

    /// The view at `now`: the `top` sessions by wait and the rest summed.
    /// With `user`, `active`, `top` and `other` cover that user's sessions (by their last
    /// call's user; folded sessions have no user and stay out) and the audit its row alone.
    pub fn view(&self, now: UnixNanos, top: usize, user: Option<&str>) -> SessionsView {
        let since = now.saturating_sub(ACTIVE_WINDOW_S * NANOS_PER_SEC);
        let mut rows: Vec<&SessionRow> = (self.rows.values())
            .filter(|r| user.is_none_or(|u| r.user == u))
            .collect();
        rows.sort_by(|a, b| {
            b.wait_ms
                .total_cmp(&a.wait_ms)
                .then_with(|| a.session.cmp(&b.session))
        });
        let mut other = match user {
            None => self.folded_sum.clone(),
            Some(_) => SessionsOther::default(),
        };
        for r in rows.iter().skip(top) {
            other.absorb(r);
        }
        SessionsView {
            active: rows.iter().filter(|r| r.last_end_ns >= since).count() as u64,
            active_window_s: ACTIVE_WINDOW_S,
            seen: self.seen,
            tracked: self.rows.len() as u64,
            max_tracked: self.cap as u64,
            folded: self.folded,
            top: rows
                .iter()
                .take(top)
                .map(|r| SessionRow {
                    idle_s: now.saturating_sub(r.last_end_ns) as f64 / NANOS_PER_SEC as f64,
                    ..(*r).clone()
                })
                .collect(),
            other,
            wait_per_turn: {
                let mut turns = self.closed_turns.clone();
                for (_, w) in self.rows.values().filter_map(|r| r.open_turn) {
                    turns.add(w);
                }
                turns.spread()
            },
            audit: {
                let mut audit = self.audit.view();
                if let Some(u) = user {
                    audit.by_user.retain(|r| r.user == u);
                }
                audit
            },
        }
    }

    /// Adds another book's sessions (`analyze`'s per-file passes); a session in both is summed.
    /// Turns are not merged (a turn split across the books would count twice): `analyze` sums
    /// each (session, turn)'s wait itself.
    pub fn merge(&mut self, o: SessionBook) {
        self.folded += o.folded;
        self.folded_sum.merge(&o.folded_sum);
        self.audit.merge(&o.audit);
        for (k, row) in o.rows {
            match self.rows.get_mut(&k) {
                Some(mine) => mine.merge(&row),
                None => {
                    self.seen += 1;
                    self.rows.insert(k, row);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(
        session: &'a str,
        turn: u32,
        end_s: u64,
        e2e: f64,
        prompt: u64,
    ) -> SessionCallFigures<'a> {
        SessionCallFigures {
            session,
            source: Some(SessionSource::CodexHeader),
            user: "u",
            turn: Some(turn),
            end_ns: end_s * NANOS_PER_SEC,
            e2e_ms: Some(e2e),
            gap_ms: (prompt > 100).then_some(50.0),
            prompt_tokens: Some(prompt),
            completion_tokens: Some(10),
            cached_tokens: (prompt > 100).then_some(96),
            prefix_expected_tokens: (prompt > 100).then_some(112),
            prefix_lost_tokens: (prompt > 100).then_some(16),
            prefix_audit: Some(if prompt > 100 { "lost" } else { "first_call" }),
            in_flight_at_start: 1,
            ttft_ms: Some(e2e / 2.0),
        }
    }

    #[test]
    fn a_session_summed_and_the_book_bounded() {
        let mut b = SessionBook::new(2, 10);
        assert_eq!(b.add(&call("a", 1, 10, 100.0, 100)), None);
        assert_eq!(b.add(&call("a", 1, 11, 300.0, 150)), None);
        // Turn 2 closes turn 1: 100 + 300 ms.
        assert_eq!(b.add(&call("a", 2, 12, 200.0, 200)), Some(400.0));
        assert_eq!(b.add(&call("b", 1, 400, 50.0, 80)), None);
        let v = b.view(400 * NANOS_PER_SEC, 1, None);
        // Turns: a/1 closed (400), a/2 and b/1 open (200, 50).
        let w = &v.wait_per_turn;
        assert_eq!((w.count, w.max_ms), (3, Some(400.0)));
        assert!((w.mean_ms.unwrap() - 650.0 / 3.0).abs() < 1e-9);
        assert_eq!(
            (v.audit.total.by_verdict.lost, v.audit.total.lost_tokens),
            (2, Some(32))
        );
        let a = &v.top[0];
        assert_eq!((a.calls, a.turns, a.wait_ms), (3, Some(2), 600.0));
        assert_eq!((a.between_ms, a.slowest_wait_ms), (100.0, Some(300.0)));
        assert_eq!(
            (a.context_first_tokens, a.context_last_tokens),
            (Some(100), Some(200))
        );
        assert_eq!(a.context_growth_per_call, Some(50.0));
        assert_eq!((a.cached_tokens, a.prefix_lost_tokens), (Some(192), 32));
        assert_eq!(
            (v.active, v.seen, v.other.sessions, v.other.calls),
            (1, 2, 1, 1)
        );
        // A third session folds the least recently seen ("a") into other, closing its turn 2.
        assert_eq!(b.add(&call("c", 1, 401, 10.0, 80)), Some(200.0));
        // "b" idle past the active window: its turn closes, once.
        let mut idle = Vec::new();
        b.close_idle((401 + ACTIVE_WINDOW_S) * NANOS_PER_SEC, |w| idle.push(w));
        b.close_idle((402 + ACTIVE_WINDOW_S) * NANOS_PER_SEC, |w| idle.push(w));
        assert_eq!(idle, [50.0, 10.0]);
        let v = b.view(401 * NANOS_PER_SEC, 5, None);
        assert_eq!((v.tracked, v.folded, v.seen), (2, 1, 3));
        assert_eq!(
            (v.other.sessions, v.other.calls, v.other.wait_ms),
            (1, 3, 600.0)
        );
        assert_eq!(v.top.iter().map(|r| r.calls).sum::<u64>(), 2);
        let mut late = SessionBook::new(2, 10); // a call of turn 1 after turn 2 began: no 3rd turn
        late.add(&call("x", 1, 10, 100.0, 100));
        assert_eq!(late.add(&call("x", 2, 11, 200.0, 150)), Some(100.0));
        assert_eq!(late.add(&call("x", 1, 12, 50.0, 200)), None);
        assert_eq!(
            late.view(12 * NANOS_PER_SEC, 1, None).wait_per_turn.count,
            2
        );
    }
}
