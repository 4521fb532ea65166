//! The measured outcome of one request and how it is derived.

use std::time::Duration;

use serde::Serialize;

use super::event::Usage;

/// Longest error text kept per failed request.
const MAX_ERROR_CHARS: usize = 500;

/// Where a request's completion token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokensFrom {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// No usage: streamed choices with non-empty text were counted (one delta may hold several
    /// tokens, so this can undercount).
    CountedEvents,
    /// Unknown.
    None,
}

/// The measured outcome of one request.
#[derive(Debug, Clone, Serialize)]
pub struct RequestResult {
    /// Slot in its batch (burst) or sequence number (sustained).
    pub slot: usize,
    /// 2xx status and, when streaming, no error event and a cleanly ended body.
    pub ok: bool,
    /// HTTP status; null when no response head arrived.
    pub status: Option<u16>,
    /// Milliseconds from sending the request to the first streamed event whose `choices` is
    /// non-empty; null when not streaming or no such event arrived.
    pub ttft_ms: Option<f64>,
    /// Milliseconds from sending the request to the end of its response body (or the failure).
    pub e2e_ms: f64,
    /// Completion tokens (see `tokens_from`); null when unknown.
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens`; null when the server sent no usage.
    pub prompt_tokens: Option<u64>,
    /// Source of `completion_tokens`.
    pub tokens_from: TokensFrom,
    /// Streamed choices with non-empty text (0 when not streaming).
    pub content_events: u64,
    /// `completion_tokens / (e2e_ms / 1000)` for ok requests with known tokens, else null.
    pub tok_s: Option<f64>,
    /// Error message of a failed request (server's `error.message` when it sent one).
    pub error: Option<String>,
    /// The session the call belongs to (`--agents`); null outside sessions.
    pub session_id: Option<String>,
    /// The API the session speaks; null outside sessions.
    pub session_api: Option<&'static str>,
    /// Its turn in the session, from 1; null outside sessions.
    pub turn: Option<u32>,
    /// Cached prompt tokens its usage reported (chat `prompt_tokens_details.cached_tokens`,
    /// Responses `input_tokens_details.cached_tokens`, Messages `cache_read_input_tokens`);
    /// null when the field was absent (unknown, not 0) or outside sessions.
    pub cached_tokens: Option<u64>,
}

impl RequestResult {
    /// A request that failed before producing any measurement.
    pub fn failed(slot: usize, error: String) -> Self {
        Self {
            slot,
            ok: false,
            status: None,
            ttft_ms: None,
            e2e_ms: 0.0,
            completion_tokens: None,
            prompt_tokens: None,
            tokens_from: TokensFrom::None,
            content_events: 0,
            tok_s: None,
            error: Some(error),
            session_id: None,
            session_api: None,
            turn: None,
            cached_tokens: None,
        }
    }
}

/// State of a request in progress, kept outside the timed future so a timeout keeps it.
#[derive(Default)]
pub(super) struct Partial {
    pub(super) status: Option<u16>,
    pub(super) ttft: Option<Duration>,
    pub(super) usage: Option<Usage>,
    pub(super) content_events: u64,
    pub(super) error: Option<String>,
    /// The body was read as an event stream.
    pub(super) sse: bool,
}

/// The result of a request from its partial state and outcome.
pub(super) fn finish(
    slot: usize,
    p: Partial,
    outcome: Result<(), String>,
    e2e: Duration,
) -> RequestResult {
    let error = outcome.err().or(p.error).map(|mut e| {
        if let Some((i, _)) = e.char_indices().nth(MAX_ERROR_CHARS) {
            e.truncate(i);
        }
        e
    });
    let ok = error.is_none();
    let (completion_tokens, tokens_from) = match p.usage.and_then(|u| u.completion_tokens) {
        Some(n) => (Some(n), TokensFrom::Usage),
        None if p.sse && p.status.is_some_and(|s| (200..300).contains(&s)) => {
            (Some(p.content_events), TokensFrom::CountedEvents)
        }
        None => (None, TokensFrom::None),
    };
    let e2e_s = e2e.as_secs_f64();
    let tok_s = match completion_tokens {
        Some(n) if ok && e2e_s > 0.0 => Some(n as f64 / e2e_s),
        _ => None,
    };
    RequestResult {
        slot,
        ok,
        status: p.status,
        ttft_ms: p.ttft.map(|d| d.as_secs_f64() * 1e3),
        e2e_ms: e2e_s * 1e3,
        completion_tokens,
        prompt_tokens: p.usage.and_then(|u| u.prompt_tokens),
        tokens_from,
        content_events: p.content_events,
        tok_s,
        error,
        session_id: None,
        session_api: None,
        turn: None,
        cached_tokens: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_events_fallback_and_rate() {
        let p = Partial {
            status: Some(200),
            content_events: 10,
            sse: true,
            ..Default::default()
        };
        let r = finish(0, p, Ok(()), Duration::from_millis(500));
        assert_eq!(r.tokens_from, TokensFrom::CountedEvents);
        assert_eq!(r.completion_tokens, Some(10));
        assert!((r.tok_s.unwrap() - 20.0).abs() < 1e-9);
        let failed = finish(
            1,
            Partial::default(),
            Err("x".into()),
            Duration::from_millis(5),
        );
        assert!(!failed.ok && failed.tok_s.is_none() && failed.completion_tokens.is_none());
        // A 200 that was not an event stream and had no usage: unknown, not zero.
        let plain = Partial {
            status: Some(200),
            ..Default::default()
        };
        let r = finish(2, plain, Ok(()), Duration::from_millis(5));
        assert_eq!(
            (r.completion_tokens, r.tokens_from),
            (None, TokensFrom::None)
        );
    }
}
