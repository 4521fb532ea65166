//! The agent sessions' Prometheus series (docs/sessions.md): bounded, with no session label (a
//! session's figures are in its log lines): calls by the prefix audit's verdict, the prompt
//! tokens the prefix cache could have served and those prefilled again, the time agents
//! spent between calls, and the wait per turn.

use crate::exposition::{Metric, Text, Unit, REQUEST_BUCKETS};
use crate::record::{RequestRecord, PREFIX_AUDIT_VERDICTS};

/// Agent calls by the audit's verdict.
pub const AGENT_CALLS_TOTAL: Metric = Metric::counter(
    "tokenmeter_agent_calls_total",
    "Generation requests that belong to an agent session, by the prefix-cache audit's verdict \
     (kept, lost, first_call, not_an_extension, usage_unknown, cached_unknown).",
    Unit::Count("{request}"),
    &["prefix_audit"],
);

/// The audit's expected cached tokens, summed.
pub const PREFIX_EXPECTED_TOKENS_TOTAL: Metric = Metric::counter(
    "tokenmeter_prefix_expected_tokens_total",
    "Prompt tokens the prefix cache could have served to calls that extend their session's \
     previous call (the previous prompt and output in whole blocks).",
    Unit::Count("{token}"),
    &[],
);

/// The audit's lost tokens, summed.
pub const PREFIX_LOST_TOKENS_TOTAL: Metric = Metric::counter(
    "tokenmeter_prefix_lost_tokens_total",
    "Of the expected cached prompt tokens, those the server did not report cached: prefilled \
     again (calls whose server reported cached tokens only).",
    Unit::Count("{token}"),
    &[],
);

/// The time between a session's calls.
pub const AGENT_CALL_GAP_SECONDS: Metric = Metric::histogram(
    "tokenmeter_agent_call_gap_seconds",
    "End of a session's call to the arrival of its next one (the agent's tools, thinking, the \
     human), seconds.",
    Unit::Seconds,
    &[],
    REQUEST_BUCKETS,
);

/// The wait of a closed turn.
pub const AGENT_TURN_WAIT_SECONDS: Metric = Metric::histogram(
    "tokenmeter_agent_turn_wait_seconds",
    "Time a turn of an agent session waited on the model: the sum of its calls' e2e, seconds; \
     observed when the turn closes (its session's next turn begins, its session is idle for \
     the active window, or leaves the live table).",
    Unit::Seconds,
    &[],
    REQUEST_BUCKETS,
);

/// A histogram over [`REQUEST_BUCKETS`], its buckets allocated with its first value.
#[derive(Debug, Clone, Default)]
struct SecondsHist {
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl SecondsHist {
    fn observe_ms(&mut self, ms: f64) {
        if !(ms.is_finite() && ms >= 0.0) {
            return;
        }
        let s = ms / 1e3;
        if self.counts.is_empty() {
            self.counts = vec![0; REQUEST_BUCKETS.len()];
        }
        if let Some(i) = REQUEST_BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += s;
    }

    fn render(&self, w: &mut Text<'_>, m: &Metric) {
        w.header(m);
        let empty = vec![0; REQUEST_BUCKETS.len()];
        let counts = if self.counts.is_empty() {
            &empty
        } else {
            &self.counts
        };
        w.histogram(
            m,
            crate::exposition::NO_LABELS,
            counts,
            self.count,
            self.sum,
        );
    }
}

/// The sessions' counters and histograms.
#[derive(Debug, Clone, Default)]
pub struct SessionSeries {
    verdicts: [u64; PREFIX_AUDIT_VERDICTS.len()],
    expected: u64,
    lost: u64,
    gaps: SecondsHist,
    turn_waits: SecondsHist,
}

impl SessionSeries {
    /// Counts a finished request's session figures (nothing for a request without a session).
    pub fn add_record(&mut self, r: &RequestRecord) {
        let Some(verdict) = r.prefix_audit.as_deref() else {
            return;
        };
        if let Some(i) = PREFIX_AUDIT_VERDICTS.iter().position(|v| *v == verdict) {
            self.verdicts[i] += 1;
        }
        self.expected += r.prefix_expected_tokens.unwrap_or(0);
        self.lost += r.prefix_lost_tokens.unwrap_or(0);
        if let Some(ms) = r.session_gap_ms {
            self.gaps.observe_ms(ms);
        }
    }

    /// Observes a closed turn's wait, ms.
    pub fn turn_closed(&mut self, wait_ms: f64) {
        self.turn_waits.observe_ms(wait_ms);
    }

    /// Appends the series.
    pub fn render(&self, w: &mut Text<'_>) {
        let m = &AGENT_CALLS_TOTAL;
        w.header(m);
        for (v, n) in PREFIX_AUDIT_VERDICTS.iter().zip(&self.verdicts) {
            // A series appears with its first call and stays.
            if *n > 0 {
                w.sample(m, [Some(*v)], *n);
            }
        }
        for (m, v) in [
            (&PREFIX_EXPECTED_TOKENS_TOTAL, self.expected),
            (&PREFIX_LOST_TOKENS_TOTAL, self.lost),
        ] {
            w.header(m);
            w.sample(m, crate::exposition::NO_LABELS, v);
        }
        self.gaps.render(w, &AGENT_CALL_GAP_SECONDS);
        self.turn_waits.render(w, &AGENT_TURN_WAIT_SECONDS);
    }
}
