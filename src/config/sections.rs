//! Config sections that stand alone: the timeouts and the per-API `ttft_for_non_streamed`
//! switches. A leaf of `config`, so it imports nothing from it.

use serde::{Deserialize, Serialize};

/// `ttft_for_non_streamed`: per API, whether its non-streamed requests are sent upstream as
/// streams to measure their TTFT. All off by default: the upstream then sees exactly the
/// client's request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeConfig {
    /// `POST /v1/chat/completions`.
    pub chat: bool,
    /// `POST /v1/completions`.
    pub completions: bool,
    /// `POST /v1/messages`.
    pub messages: bool,
    /// `POST /v1/responses`.
    pub responses: bool,
}

impl UpgradeConfig {
    /// Whether `api`'s non-streamed requests are upgraded.
    pub fn enabled(&self, api: crate::dialect::Api) -> bool {
        use crate::dialect::Api;
        match api {
            Api::Chat => self.chat,
            Api::Completions => self.completions,
            Api::Messages => self.messages,
            Api::Responses => self.responses,
        }
    }
}

/// Timeouts, in milliseconds. Defaults never cut a long generation or a long queue wait.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Establishing a TCP connection to the upstream (502 after it).
    pub connect_ms: u64,
    /// Reading a client's request head (slow-header clients are dropped after it).
    pub head_read_ms: u64,
    /// Reading a client's request body (408 after it).
    pub request_body_ms: u64,
    /// Waiting for the upstream's response headers (504 after it). Non-streamed responses only
    /// send headers when generation is done, so this bounds a whole non-streamed generation.
    pub upstream_headers_ms: u64,
    /// Longest silence between two response body frames (the response is cut after it).
    pub body_idle_ms: u64,
    /// How long an idle pooled upstream connection is kept. Below the upstream's own keep-alive
    /// (vLLM's HTTP server closes idle connections after 5 s), so the proxy never sends a
    /// request on a connection the upstream is closing at that moment, which would fail it.
    pub pool_idle_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 5_000,
            head_read_ms: 30_000,
            request_body_ms: 300_000,
            upstream_headers_ms: 3_600_000,
            body_idle_ms: 900_000,
            pool_idle_ms: 4_000,
        }
    }
}
