//! The sessions the proxy has seen, each with its last call, and the prefix-cache audit of each
//! new call against it: did the call extend the previous one, how many prompt tokens could the
//! server have kept cached, how many it reported cached, and how long the agent spent between
//! the two calls. Consulted once per generation request, when it finishes (never on the
//! per-event path); bounded by [`MAX_SESSIONS`], the least recently seen forgotten first.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::clock::UnixNanos;

use super::session::SessionCall;

/// Sessions remembered at most; a session forgotten and seen again starts over (its next call
/// is audited as a first call).
pub const MAX_SESSIONS: usize = 4096;

/// The prefix cache's block size, in tokens: vLLM keeps only full blocks (its default, 16).
pub const BLOCK_TOKENS: u64 = 16;

/// What the session table remembers of a session's last call.
#[derive(Debug, Clone, Copy)]
struct LastCall {
    /// Calls seen in the session so far.
    calls: u32,
    /// Whether a call of the session has reported cached prompt tokens: the server's switch is
    /// on, so a later call without the field had none cached (vLLM writes it only when > 0).
    reports_cached: bool,
    /// Its turn, and Codex's `turn_id` (hashed) when sent.
    turn: Option<u32>,
    turn_key: Option<u64>,
    /// The conversation's item count and its whole hash.
    items: usize,
    hash: u64,
    prompt: Option<u64>,
    completion: Option<u64>,
    end_ns: UnixNanos,
    /// When it was last touched, for eviction.
    seen: u64,
}

/// What the audit found for one call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallAudit {
    /// The call's rank in its session, from 1 (as far as this proxy remembers).
    pub call: u32,
    /// The call's turn: the previous call's when both carry the same Codex `turn_id`, the next
    /// one when both carry one and they differ, else the conversation's rule
    /// ([`SessionCall::turn`]).
    pub turn: Option<u32>,
    /// Milliseconds from the end of the session's previous call to this call's arrival (tools,
    /// thinking, the human); `null` for a first call or when the calls overlapped.
    pub gap_ms: Option<f64>,
    /// Prompt tokens the server could have had cached: the previous call's prompt and output,
    /// rounded down to whole blocks and at most this prompt less one token, rounded down the
    /// same way; `null` unless the call extends the previous one and both usages are known.
    pub expected_cached: Option<u64>,
    /// `expected_cached` less what the server reported cached, at least 0: prompt tokens
    /// prefilled again; `null` when either is unknown.
    pub lost: Option<u64>,
    /// The audit's verdict: `kept`, `lost`, `first_call`, `not_an_extension`, `usage_unknown`
    /// (a usage of this or the previous call is missing), `cached_unknown` (the server did not
    /// report cached tokens, and neither did an earlier call of the session nor any call the
    /// same upstream answered: vLLM needs
    /// `--enable-prompt-tokens-details`, and leaves the field out when it is 0).
    pub verdict: &'static str,
}

/// One call's figures the audit needs, from its record.
#[derive(Debug, Clone, Copy)]
pub struct CallFigures {
    /// Arrival and end on the timeline.
    pub start_ns: UnixNanos,
    /// End of the call.
    pub end_ns: UnixNanos,
    /// Prompt tokens from the usage.
    pub prompt: Option<u64>,
    /// Completion tokens from the usage.
    pub completion: Option<u64>,
    /// Cached prompt tokens from the usage.
    pub cached: Option<u64>,
    /// The index of the upstream that answered, when one did.
    pub upstream: Option<usize>,
}

/// The sessions seen, by pseudonym.
#[derive(Default)]
pub struct SessionTable {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, LastCall>,
    tick: u64,
    /// Bit i: a call answered by upstream i (of the first 64) has reported cached tokens, so
    /// that server's switch is on.
    reporting_upstreams: u64,
}

impl SessionTable {
    /// Audits `call` (finished with `figures`) against its session's previous call, and makes
    /// it the session's last.
    pub fn audit(&self, call: &SessionCall, figures: CallFigures) -> CallAudit {
        let Ok(mut inner) = self.inner.lock() else {
            return CallAudit::default();
        };
        inner.tick += 1;
        let tick = inner.tick;
        let previous = inner.sessions.get(&call.name).copied();
        let bit = figures
            .upstream
            .filter(|i| *i < 64)
            .map_or(0, |i| 1u64 << i);
        let server_reports = inner.reporting_upstreams & bit != 0;
        if figures.cached.is_some() {
            inner.reporting_upstreams |= bit;
        }
        let audit = judge(call, &figures, previous.as_ref(), server_reports);
        if previous.is_none() && inner.sessions.len() >= MAX_SESSIONS {
            let oldest = inner
                .sessions
                .iter()
                .min_by_key(|(_, c)| c.seen)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                inner.sessions.remove(&k);
            }
        }
        // A call without a usage (refused, failed) is counted, but the session's reusable
        // prefix stays its last answered call's.
        if let (Some(prev), None) = (previous, figures.prompt) {
            if let Some(slot) = inner.sessions.get_mut(&call.name) {
                *slot = LastCall {
                    calls: audit.call,
                    reports_cached: prev.reports_cached || figures.cached.is_some(),
                    turn: audit.turn,
                    turn_key: call.turn_key,
                    seen: tick,
                    ..prev
                };
            }
            return audit;
        }
        let last = LastCall {
            calls: audit.call,
            reports_cached: previous.is_some_and(|p| p.reports_cached) || figures.cached.is_some(),
            turn: audit.turn,
            turn_key: call.turn_key,
            items: call.prefix.len(),
            hash: call.prefix.last().copied().unwrap_or(0),
            prompt: figures.prompt,
            completion: figures.completion,
            end_ns: figures.end_ns,
            seen: tick,
        };
        match inner.sessions.get_mut(&call.name) {
            Some(slot) => *slot = last,
            None => {
                inner.sessions.insert(call.name.clone(), last);
            }
        }
        audit
    }

    /// Sessions remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.sessions.len()).unwrap_or(0)
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn judge(
    call: &SessionCall,
    f: &CallFigures,
    previous: Option<&LastCall>,
    server_reports: bool,
) -> CallAudit {
    let Some(prev) = previous else {
        return CallAudit {
            call: 1,
            turn: call.turn,
            verdict: "first_call",
            ..CallAudit::default()
        };
    };
    let turn = match (call.turn_key, prev.turn_key, prev.turn) {
        (Some(now), Some(before), Some(t)) => Some(if now == before { t } else { t + 1 }),
        _ => call.turn,
    };
    let mut audit = CallAudit {
        call: prev.calls.saturating_add(1),
        turn,
        gap_ms: (f.start_ns >= prev.end_ns).then(|| (f.start_ns - prev.end_ns) as f64 / 1e6),
        ..CallAudit::default()
    };
    let extends = prev.items > 0
        && call.prefix.len() > prev.items
        && call.prefix[prev.items - 1] == prev.hash;
    if !extends {
        audit.verdict = "not_an_extension";
        return audit;
    }
    let (Some(pp), Some(pc), Some(prompt)) = (prev.prompt, prev.completion, f.prompt) else {
        audit.verdict = "usage_unknown";
        return audit;
    };
    let expected = expected_cached(pp + pc, prompt);
    audit.expected_cached = Some(expected);
    // vLLM leaves the cached count out when it is 0: once the session's calls or the server
    // that answered have shown it, its absence is 0 (a total loss), not unknown.
    match f
        .cached
        .or((prev.reports_cached || server_reports).then_some(0))
    {
        None => audit.verdict = "cached_unknown",
        Some(cached) => {
            let lost = expected.saturating_sub(cached);
            audit.lost = Some(lost);
            audit.verdict = if lost == 0 { "kept" } else { "lost" };
        }
    }
    audit
}

/// Prompt tokens a prefix cache of [`BLOCK_TOKENS`]-token blocks can serve to a prompt of
/// `prompt` tokens whose first `reusable` tokens an earlier request computed: whole blocks only,
/// and never the prompt's last token (vLLM computes at least one).
pub fn expected_cached(reusable: u64, prompt: u64) -> u64 {
    let whole = |t: u64| t / BLOCK_TOKENS * BLOCK_TOKENS;
    whole(reusable).min(whole(prompt.saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::session::SessionSource;

    fn call(prefix: &[u64]) -> SessionCall {
        SessionCall {
            name: "s-1".into(),
            source: SessionSource::ClaudeHeader,
            turn: Some(1),
            turn_key: None,
            prefix: prefix.to_vec(),
        }
    }

    fn figs(start: u64, end: u64, p: u64, c: u64, cached: Option<u64>) -> CallFigures {
        CallFigures {
            start_ns: start,
            end_ns: end,
            prompt: Some(p),
            completion: Some(c),
            cached,
            upstream: None,
        }
    }

    #[test]
    fn codex_turn_ids_decide_the_turn_where_sent() {
        let t = SessionTable::default();
        let keyed = |prefix: &[u64], turn: u32, key: Option<u64>| SessionCall {
            turn: Some(turn),
            turn_key: key,
            ..call(prefix)
        };
        let f = figs(0, 1, 10, 1, Some(0));
        // The conversation says 1, 1, 1; the turn ids say a new turn at the third call.
        assert_eq!(t.audit(&keyed(&[1], 1, Some(7)), f).turn, Some(1));
        assert_eq!(t.audit(&keyed(&[1, 2], 1, Some(7)), f).turn, Some(1));
        assert_eq!(t.audit(&keyed(&[1, 2, 3], 1, Some(8)), f).turn, Some(2));
        // Without one, the conversation's rule.
        assert_eq!(t.audit(&keyed(&[1, 2, 3, 4], 5, None), f).turn, Some(5));
    }

    #[test]
    fn blocks_and_the_last_token() {
        assert_eq!(expected_cached(100, 200), 96);
        assert_eq!(expected_cached(100, 97), 96);
        assert_eq!(expected_cached(100, 96), 80);
        assert_eq!(expected_cached(15, 200), 0);
    }

    #[test]
    fn a_session_audited_call_by_call() {
        let t = SessionTable::default();
        let a = t.audit(&call(&[1, 2]), figs(0, 1_000_000, 100, 20, Some(0)));
        assert_eq!((a.call, a.verdict), (1, "first_call"));
        // Extends [1, 2]: 120 reusable tokens -> 112 in whole blocks; 96 reported.
        let b = t.audit(
            &call(&[1, 2, 3, 4]),
            figs(4_000_000, 9_000_000, 150, 10, Some(96)),
        );
        assert_eq!(b.call, 2);
        assert_eq!(b.gap_ms, Some(3.0));
        assert_eq!(
            (b.expected_cached, b.lost, b.verdict),
            (Some(112), Some(16), "lost")
        );
        let c = t.audit(
            &call(&[1, 2, 3, 4, 5]),
            figs(9_000_000, 10_000_000, 170, 1, Some(160)),
        );
        assert_eq!(
            (c.expected_cached, c.lost, c.verdict),
            (Some(160), Some(0), "kept")
        );
        let d = t.audit(
            &call(&[9, 9, 9, 9, 9, 9]),
            figs(10_000_000, 11_000_000, 5, 1, None),
        );
        assert_eq!(
            (d.call, d.verdict, d.expected_cached),
            (4, "not_an_extension", None)
        );
        let e = t.audit(
            &call(&[9, 9, 9, 9, 9, 9, 7]),
            figs(12_000_000, 13_000_000, 50, 1, None),
        );
        // The session's calls reported cached tokens before: none reported now is 0.
        assert_eq!(
            (e.verdict, e.expected_cached, e.lost),
            ("kept", Some(0), Some(0))
        );
        assert_eq!(t.len(), 1);
        // A session whose calls reported cached tokens: a call without the field had none.
        let t2 = SessionTable::default();
        t2.audit(&call(&[1]), figs(0, 1, 100, 20, None));
        let f = t2.audit(&call(&[1, 2]), figs(2, 3, 120, 10, None));
        assert_eq!(
            (f.verdict, f.lost),
            ("cached_unknown", None),
            "no report yet"
        );
        let g = t2.audit(&call(&[1, 2, 2]), figs(2, 3, 150, 10, Some(128)));
        assert_eq!(g.verdict, "kept");
        let h = t2.audit(&call(&[1, 2, 2, 3]), figs(4, 5, 200, 10, None));
        assert_eq!(
            (h.verdict, h.expected_cached, h.lost),
            ("lost", Some(160), Some(160))
        );
        // Another session on an upstream that has reported cached tokens: absent is 0.
        let on = |start, cached| CallFigures {
            upstream: Some(3),
            ..figs(start, start + 1, 100, 20, cached)
        };
        let other = |prefix: &[u64]| SessionCall {
            name: "s-2".into(),
            ..call(prefix)
        };
        let third = SessionCall {
            name: "s-3".into(),
            ..call(&[9])
        };
        t2.audit(&third, on(8, Some(0)));
        t2.audit(&other(&[5]), on(10, None));
        let i = t2.audit(&other(&[5, 6]), on(12, None));
        assert_eq!((i.verdict, i.lost), ("lost", Some(96)));
        for v in [a, b, c, d, e] {
            assert!(crate::record::PREFIX_AUDIT_VERDICTS.contains(&v.verdict));
        }
    }
}
