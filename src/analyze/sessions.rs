//! `analyze`'s agent sessions (docs/sessions.md): the sessions table from the log's session
//! fields (the live view's rows, `meter::sessions`), the distribution of the wait per turn,
//! and the prefix-cache audit summed, with the TTFT of the calls that kept their prefix cached
//! against those that lost it.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::clock::UnixNanos;
use crate::meter::histogram::{nearest_rank, LogHistogram};
use crate::meter::sessions::{
    SessionBook, SessionCallFigures, SessionRow, SessionsOther, TOP_SESSIONS,
};

use super::grid::{grid, num, Grid};
use super::parse::LeanRecord;

/// Nearest-rank percentiles and the maximum of a set of values, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Values.
    pub count: u64,
    /// Their mean.
    pub mean_ms: Option<f64>,
    /// Nearest-rank percentiles.
    pub p50_ms: Option<f64>,
    /// 90th.
    pub p90_ms: Option<f64>,
    /// 99th.
    pub p99_ms: Option<f64>,
    /// The largest.
    pub max_ms: Option<f64>,
}

/// TTFTs kept in bounded memory: a log histogram (percentiles within 0.5 %), their sum and
/// maximum.
#[derive(Debug, Default)]
struct TtftAcc {
    hist: LogHistogram,
    sum: f64,
    max: Option<f64>,
}

impl TtftAcc {
    fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.hist.record(v);
        self.sum += v;
        self.max = Some(self.max.map_or(v, |m| m.max(v)));
    }

    fn merge(&mut self, o: &TtftAcc) {
        self.hist.merge(&o.hist);
        self.sum += o.sum;
        self.max = match (self.max, o.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    fn spread(&self) -> Spread {
        let n = self.hist.count();
        Spread {
            count: n,
            mean_ms: (n > 0).then(|| self.sum / n as f64),
            p50_ms: self.hist.percentile(0.5),
            p90_ms: self.hist.percentile(0.9),
            p99_ms: self.hist.percentile(0.99),
            max_ms: self.max,
        }
    }
}

impl Spread {
    /// The spread of `v` (sorted here).
    pub fn of(mut v: Vec<f64>) -> Spread {
        v.retain(|x| x.is_finite());
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let rank = |q: f64| nearest_rank(&v, q);
        Spread {
            count: n as u64,
            mean_ms: (n > 0).then(|| v.iter().sum::<f64>() / n as f64),
            p50_ms: rank(0.5),
            p90_ms: rank(0.9),
            p99_ms: rank(0.99),
            max_ms: v.last().copied(),
        }
    }
}

/// The prefix-cache audit over the log's agent calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditSummary {
    /// Calls by `prefix_audit` verdict.
    pub by_verdict: BTreeMap<String, u64>,
    /// Σ `prefix_expected_tokens` of the calls judged `kept` or `lost`.
    pub expected_tokens: u64,
    /// Σ `cached_prompt_tokens` of those calls.
    pub cached_tokens: u64,
    /// Σ `prefix_lost_tokens` (the prompt tokens prefilled again).
    pub lost_tokens: u64,
    /// TTFT of the `kept` calls (percentiles from a log histogram, within 0.5 %).
    pub ttft_kept: Spread,
    /// TTFT of the `lost` calls.
    pub ttft_lost: Spread,
}

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
    /// The prefix-cache audit.
    pub audit: AuditSummary,
}

/// What pass 1 gathers of the sessions (order-independent, merged across workers).
#[derive(Debug)]
pub struct SessionsAcc {
    book: SessionBook,
    turn_waits: HashMap<(String, u32), f64>,
    audit: AuditSummary,
    ttft_kept: TtftAcc,
    ttft_lost: TtftAcc,
    last_end: UnixNanos,
}

impl Default for SessionsAcc {
    fn default() -> Self {
        SessionsAcc {
            book: SessionBook::new(usize::MAX),
            turn_waits: HashMap::new(),
            audit: AuditSummary::default(),
            ttft_kept: TtftAcc::default(),
            ttft_lost: TtftAcc::default(),
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
        self.book.add(&SessionCallFigures {
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
        });
        if let (Some(t), Some(w)) = (s.turn, r.e2e_ms) {
            *self.turn_waits.entry((s.name.to_string(), t)).or_default() += w;
        }
        let verdict = s.audit.as_deref().unwrap_or("none");
        match self.audit.by_verdict.get_mut(verdict) {
            Some(n) => *n += 1,
            None => {
                self.audit.by_verdict.insert(verdict.to_string(), 1);
            }
        }
        if matches!(verdict, "kept" | "lost") {
            self.audit.expected_tokens += s.expected.unwrap_or(0);
            self.audit.cached_tokens += r.cached_prompt_tokens.unwrap_or(0);
            self.audit.lost_tokens += s.lost.unwrap_or(0);
            if let Some(t) = r.ttft_ms {
                match verdict {
                    "kept" => self.ttft_kept.add(t),
                    _ => self.ttft_lost.add(t),
                }
            }
        }
    }

    /// Adds another worker's.
    pub fn merge(&mut self, o: SessionsAcc) {
        self.book.merge(o.book);
        for (k, w) in o.turn_waits {
            *self.turn_waits.entry(k).or_default() += w;
        }
        for (k, n) in o.audit.by_verdict {
            *self.audit.by_verdict.entry(k).or_default() += n;
        }
        self.audit.expected_tokens += o.audit.expected_tokens;
        self.audit.cached_tokens += o.audit.cached_tokens;
        self.audit.lost_tokens += o.audit.lost_tokens;
        self.ttft_kept.merge(&o.ttft_kept);
        self.ttft_lost.merge(&o.ttft_lost);
        self.last_end = self.last_end.max(o.last_end);
    }

    /// The report's object.
    pub fn finish(&self) -> AnalyzeSessions {
        let view = self.book.view(self.last_end, TOP_SESSIONS);
        let mut audit = self.audit.clone();
        audit.ttft_kept = self.ttft_kept.spread();
        audit.ttft_lost = self.ttft_lost.spread();
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
            wait_per_turn: Spread::of(self.turn_waits.values().copied().collect()),
            audit,
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
    let a = &s.audit;
    let verdicts = a
        .by_verdict
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
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
                a.expected_tokens, a.cached_tokens, a.lost_tokens
            ),
            grid(
                &["", "Count", "Mean ms", "p50 ms", "p90 ms", "p99 ms", "Max ms"],
                &[turn, kept, lost],
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s = Spread::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms),
            (Some(50.0), Some(90.0), Some(99.0), Some(100.0))
        );
        assert_eq!(Spread::of(vec![]).p50_ms, None);
        assert_eq!(Spread::of(vec![7.0]).p99_ms, Some(7.0));
    }
}
