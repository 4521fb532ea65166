//! `analyze`'s agent sessions (docs/sessions.md): the sessions table from the log's session
//! fields (the live view's rows, `meter::sessions`), the distribution of the wait per turn,
//! and the prefix-cache audit summed, with the TTFT of the calls that kept their prefix cached
//! against those that lost it.

use std::collections::HashMap;

use serde::Serialize;

use crate::clock::UnixNanos;
use crate::meter::prefix_audit::{AuditRow, AuditView};
use crate::meter::sessions::{
    SessionBook, SessionCallFigures, SessionRow, SessionsOther, TOP_SESSIONS,
};
use crate::meter::spread::{Spread, SpreadAcc};

use super::grid::{grid, num, Grid};
use super::parse::LeanRecord;

/// The report's `sessions` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AnalyzeSessions {
    /// Sessions in the selected lines.
    pub sessions: u64,
    /// Their calls (generation requests with a session, any outcome).
    pub calls: u64,
    /// Σ turns of the sessions.
    pub turns: u64,
    /// The sessions with the most time waited on the model, at most [`TOP_SESSIONS`];
    /// `idle_s` is counted back from the log's last call end.
    pub top: Vec<SessionRow>,
    /// The others, summed.
    pub other: SessionsOther,
    /// The wait per turn: Σ `e2e_ms` of each (session, turn)'s calls.
    pub wait_per_turn: Spread,
    /// The prefix-cache audit: in total, per user, per in-flight level.
    pub audit: AuditView,
}

/// What pass 1 gathers of the sessions (order-independent, merged across workers).
#[derive(Debug)]
pub struct SessionsAcc {
    book: SessionBook,
    turn_waits: HashMap<(String, u32), f64>,
    last_end: UnixNanos,
}

impl Default for SessionsAcc {
    fn default() -> Self {
        SessionsAcc {
            book: SessionBook::new(usize::MAX, usize::MAX),
            turn_waits: HashMap::new(),
            last_end: 0,
        }
    }
}

impl SessionsAcc {
    /// Adds a generation request's line that ended at `end_ns` (nothing without a session).
    pub fn add(&mut self, r: &LeanRecord<'_>, end_ns: UnixNanos) {
        let Some(s) = &r.session else {
            return;
        };
        self.last_end = self.last_end.max(end_ns);
        let f = SessionCallFigures {
            session: &s.name,
            source: s.source,
            user: &r.user,
            turn: s.turn,
            end_ns,
            e2e_ms: r.e2e_ms,
            gap_ms: s.gap_ms,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: r.cached_prompt_tokens,
            prefix_expected_tokens: s.expected,
            prefix_lost_tokens: s.lost,
            prefix_audit: s.audit.as_deref(),
            in_flight_at_start: r.in_flight_at_start,
            ttft_ms: r.ttft_ms,
        };
        self.book.add(&f);
        // Summed per (session, turn) over the whole log, not by the book's open turn: a turn
        // may be split across files (and workers).
        if let Some((t, w)) = f.turn_wait() {
            *self.turn_waits.entry((s.name.to_string(), t)).or_default() += w;
        }
    }

    /// Adds another worker's.
    pub fn merge(&mut self, o: SessionsAcc) {
        self.book.merge(o.book);
        for (k, w) in o.turn_waits {
            *self.turn_waits.entry(k).or_default() += w;
        }
        self.last_end = self.last_end.max(o.last_end);
    }

    /// The report's object.
    pub fn finish(&self) -> AnalyzeSessions {
        let view = self.book.view(self.last_end, TOP_SESSIONS, None);
        let mut turns = SpreadAcc::default();
        for w in self.turn_waits.values() {
            turns.add(*w);
        }
        AnalyzeSessions {
            sessions: view.seen,
            calls: self.book.rows().map(|r| r.calls).sum(),
            turns: self
                .book
                .rows()
                .map(|r| u64::from(r.turns.unwrap_or(0)))
                .sum(),
            top: view.top,
            other: view.other,
            wait_per_turn: turns.spread(),
            audit: view.audit,
        }
    }
}

/// The report's sessions sections: the sessions table, the wait per turn, the audit.
pub fn sections(s: &AnalyzeSessions) -> Vec<(String, Grid)> {
    if s.sessions == 0 {
        return Vec::new();
    }
    let opt = |v: Option<u64>| v.map_or("—".to_string(), |v| v.to_string());
    let mut rows: Vec<Vec<String>> = s
        .top
        .iter()
        .map(|r| {
            vec![
                r.session.clone(),
                r.user.clone(),
                r.calls.to_string(),
                r.turns.map_or("—".into(), |t| t.to_string()),
                num(Some(r.wait_ms / 1e3), 2),
                num(Some(r.between_ms / 1e3), 2),
                format!("{} / {}", r.prompt_tokens, r.completion_tokens),
                num(r.context_growth_per_call, 0),
                opt(r.cached_tokens),
                r.prefix_lost_tokens.to_string(),
                num(r.slowest_wait_ms, 0),
            ]
        })
        .collect();
    if s.other.sessions > 0 {
        let o = &s.other;
        rows.push(vec![
            format!("other ({} sessions)", o.sessions),
            String::new(),
            o.calls.to_string(),
            String::new(),
            num(Some(o.wait_ms / 1e3), 2),
            num(Some(o.between_ms / 1e3), 2),
            format!("{} / {}", o.prompt_tokens, o.completion_tokens),
            String::new(),
            opt(o.cached_tokens),
            o.prefix_lost_tokens.to_string(),
            String::new(),
        ]);
    }
    let w = &s.wait_per_turn;
    let spread = |x: &Spread| {
        vec![
            x.count.to_string(),
            num(x.mean_ms, 0),
            num(x.p50_ms, 0),
            num(x.p90_ms, 0),
            num(x.p99_ms, 0),
            num(x.max_ms, 0),
        ]
    };
    let a = &s.audit.total;
    let v = &a.by_verdict;
    let verdicts = format!(
        "kept {}, lost {}, first_call {}, not_an_extension {}, usage_unknown {}, cached_unknown {}",
        v.kept, v.lost, v.first_call, v.not_an_extension, v.usage_unknown, v.cached_unknown
    );
    let mut kept = vec!["TTFT of kept calls".to_string()];
    kept.extend(spread(&a.ttft_kept));
    let mut lost = vec!["TTFT of lost calls".to_string()];
    lost.extend(spread(&a.ttft_lost));
    let mut turn = vec!["Wait per turn".to_string()];
    turn.extend(spread(w));
    vec![
        (
            format!(
                "Agent sessions ({} sessions, {} turns, {} calls; the top {} by time waited on the model)",
                s.sessions,
                s.turns,
                s.calls,
                s.top.len()
            ),
            grid(
                &[
                    "Session",
                    "User",
                    "Calls",
                    "Turns",
                    "Wait s",
                    "Between s",
                    "Tokens in / out",
                    "Context +/call",
                    "Cached",
                    "Lost",
                    "Slowest wait ms",
                ],
                &rows,
            ),
        ),
        (
            format!(
                "Wait per turn and the prefix-cache audit (calls: {verdicts}; expected {} cached tokens, reported {}, lost {})",
                a.expected_tokens,
                unknown(a.cached_tokens),
                unknown(a.lost_tokens)
            ),
            grid(
                &["", "Count", "Mean ms", "p50 ms", "p90 ms", "p99 ms", "Max ms"],
                &[turn, kept, lost],
            ),
        ),
        (
            "Prefix-cache audit by in-flight level (in_flight_at_start; cached and lost over the calls judged kept or lost)".to_string(),
            audit_grid(
                "In flight",
                s.audit
                    .by_level
                    .iter()
                    .map(|l| (l.in_flight.to_string(), &l.row))
                    .collect(),
            ),
        ),
        (
            format!(
                "Prefix-cache audit by user (the top {} by lost tokens)",
                s.audit.by_user.len()
            ),
            audit_grid(
                "User",
                s.audit
                    .by_user
                    .iter()
                    .map(|u| (u.user.clone(), &u.row))
                    .chain(
                        (s.audit.users_other.users > 0).then(|| {
                            (
                                format!("other ({} users)", s.audit.users_other.users),
                                &s.audit.users_other.row,
                            )
                        }),
                    )
                    .collect(),
            ),
        ),
    ]
}

/// One audit row per group: verdicts, tokens, and the TTFT kept against lost.
fn audit_grid(first: &str, rows: Vec<(String, &AuditRow)>) -> Grid {
    let opt = unknown;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(name, r)| {
            vec![
                name,
                r.by_verdict.kept.to_string(),
                r.by_verdict.lost.to_string(),
                r.by_verdict.cached_unknown.to_string(),
                r.expected_tokens.to_string(),
                opt(r.cached_tokens),
                opt(r.lost_tokens),
                num(r.lost_pct, 1),
                format!(
                    "{} / {}",
                    num(r.ttft_kept.mean_ms, 0),
                    num(r.ttft_kept.p50_ms, 0)
                ),
                format!(
                    "{} / {}",
                    num(r.ttft_lost.mean_ms, 0),
                    num(r.ttft_lost.p50_ms, 0)
                ),
            ]
        })
        .collect();
    grid(
        &[
            first,
            "Kept",
            "Lost",
            "Cached unknown",
            "Expected",
            "Cached",
            "Lost tokens",
            "Lost %",
            "TTFT kept mean / p50 ms",
            "TTFT lost mean / p50 ms",
        ],
        &rows,
    )
}

/// A count, or `unknown` (never 0) when the server did not say.
fn unknown(v: Option<u64>) -> String {
    v.map_or("unknown".to_string(), |v| v.to_string())
}
