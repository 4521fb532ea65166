//! Builders shared by the meter tests.
#![allow(dead_code)]

use tokenmeter::clock::{format_rfc3339_micros, UnixNanos, NANOS_PER_SEC};
use tokenmeter::record::{DerivedRates, Outcome, RequestRecord, TokensSource, UserSource};

/// A fixed base time: 2026-11-29T18:00:00Z, on a second boundary.
pub const T0: UnixNanos = 1_795_975_200 * NANOS_PER_SEC;

/// `T0 + s` seconds.
pub fn at(s: f64) -> UnixNanos {
    T0 + (s * 1e9).round() as u64
}

/// A successful generation record; rates derived from the given figures.
pub fn record(
    start: UnixNanos,
    e2e_ms: f64,
    ttft_ms: Option<f64>,
    completion: Option<u64>,
    prompt: Option<u64>,
    stream: bool,
) -> RequestRecord {
    let rates = DerivedRates::compute(ttft_ms, Some(e2e_ms), completion);
    RequestRecord {
        kind: "request".into(),
        schema: 1,
        ts: format_rfc3339_micros(start),
        ts_ns: start,
        request_id: "r".into(),
        user: "alice".into(),
        user_source: UserSource::Header,
        model: Some("tiny-llama".into()),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        status: Some(200),
        stream: Some(stream),
        outcome: Outcome::Ok,
        prompt_tokens: prompt,
        completion_tokens: completion,
        tokens_source: TokensSource::Usage,
        n: None,
        first_byte_ms: ttft_ms,
        ttft_ms,
        e2e_ms: Some(e2e_ms),
        tpot_ms: rates.tpot_ms,
        itl_max_ms: None,
        tok_s: rates.tok_s,
        decode_tok_s: rates.decode_tok_s,
        in_flight_at_start: 1,
        cold_start: false,
        finish_reason: Some("length".into()),
        bytes_in: 100,
        bytes_out: 1000,
        error: None,
        server_queue_ms: None,
        server_ttft_ms: None,
        server_mean_itl_ms: None,
    }
}

/// Whether two floats agree to 1e-9 relative (or absolute near 0).
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}
