//! The pieces every API's wire writer shares (ids, typed events, JSON strings, a finished
//! choice): a leaf, so `wire.rs` can dispatch to the per-API writers without them importing it
//! back.

use bytes::Bytes;

use super::engine::Finish;
use crate::dialect::Api;

/// A fresh response id: `chatcmpl-<16 hex>` (chat and, as vLLM, Messages), `cmpl-<16 hex>` or
/// `resp_<16 hex>`.
pub fn new_id(endpoint: Api) -> String {
    match endpoint {
        Api::Chat | Api::Messages => prefixed("chatcmpl-"),
        Api::Completions => prefixed("cmpl-"),
        Api::Responses => prefixed("resp_"),
    }
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
