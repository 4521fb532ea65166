//! The pieces every API's wire writer shares (the writer's interface, ids, typed events, JSON
//! strings, a finished choice): a leaf, which the per-API wire files build on.

use std::collections::VecDeque;

use bytes::Bytes;

use super::engine::{Finish, Timings};

/// The events of one streamed answer, in its API's shape.
pub trait EventWrite: Send + std::fmt::Debug {
    /// The events sent as soon as the request is accepted, before any token (Responses'
    /// `response.created` and `response.in_progress`; nothing for the others).
    fn start(&mut self, _out: &mut VecDeque<Bytes>) {}

    /// The events for one token of `choice`.
    fn token(&mut self, choice: u32, finish: Option<Finish>, out: &mut VecDeque<Bytes>);

    /// The closing events (`timings`: the request's, when per-request metrics are on).
    fn done(&mut self, timings: Option<&Timings>, out: &mut VecDeque<Bytes>);
}

/// Who answers and how: what every answer of one request shares.
#[derive(Debug, Clone, Copy)]
pub struct Answering<'a> {
    /// The served model's name.
    pub model: &'a str,
    /// The answer's `created`, Unix seconds.
    pub created_s: u64,
    /// Attach vLLM's per-request `metrics` (chat and completions).
    pub per_request_metrics: bool,
    /// Stamp each event with `tm_sent_ns` (CLOCK_MONOTONIC when it was built).
    pub stamp: bool,
    /// Report cached prompt tokens where vLLM does only with `--enable-prompt-tokens-details`
    /// (chat's `prompt_tokens_details`, Messages' `cache_read_input_tokens`).
    pub prompt_tokens_details: bool,
}

/// Chat's `prompt_tokens_details` value: vLLM sets it only with the switch on and some prompt
/// tokens cached.
pub fn prompt_tokens_details(on: bool, cached_tokens: u64) -> Option<String> {
    (on && cached_tokens > 0).then(|| format!("{{\"cached_tokens\":{cached_tokens}}}"))
}

/// `prefix` followed by 16 random hex digits (vLLM's id form).
pub fn prefixed(prefix: &str) -> String {
    format!("{prefix}{:016x}", rand::random::<u64>())
}

/// One `event: <name>\ndata: <json>\n\n` event of the typed-event APIs.
pub fn typed_event(name: &str, json: &str) -> Bytes {
    let mut s = String::with_capacity(name.len() + json.len() + 16);
    s.push_str("event: ");
    s.push_str(name);
    s.push_str("\ndata: ");
    s.push_str(json);
    s.push_str("\n\n");
    Bytes::from(s)
}

/// One finished choice of a non-streaming response.
#[derive(Debug, Clone)]
pub struct ChoiceOut {
    /// Concatenated token texts.
    pub text: String,
    /// Tokens generated.
    pub tokens: u64,
    /// Why it ended.
    pub finish: Finish,
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}
